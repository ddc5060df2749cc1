"""The energy section in words, for the text and HTML reports: joules per step and per sample, where
they go by stage, the GPU's idle share, the cost where a price was given, and a power cap to try."""

from __future__ import annotations

from perfmagic.contract import Card, Energy, ReportData
from perfmagic.units import fmt_fraction


def fmt_joules(j: float | None) -> str:
    """``615 J``, ``12.3 kJ``, ``4.1 MJ``."""
    if j is None:
        return "n/a"
    for unit, scale in (("MJ", 1e6), ("kJ", 1e3)):
        if abs(j) >= scale:
            return f"{j / scale:.3g} {unit}"
    return f"{j:.3g} J"


def fmt_money(x: float | None) -> str:
    """A cost in the user's currency (perfmagic knows no currency: the price's own unit)."""
    if x is None:
        return "n/a"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}" if abs(x) >= 0.01 else f"{x:.2e}"


def energy_of(report: ReportData) -> Energy | None:
    """The report's energy section (None: no GPU energy sampled over steady steps)."""
    return report["energy"]


def energy_kpi(report: ReportData) -> tuple[str, str] | None:
    """The headline figure: joules per sample, else per step."""
    e = energy_of(report)
    if e is None:
        return None
    if e["joules_per_sample"] is not None:
        return "energy/sample", fmt_joules(e["joules_per_sample"])
    if e["joules_per_step"] is not None:
        return "energy/step", fmt_joules(e["joules_per_step"])
    return None


def energy_lines(report: ReportData) -> list[str]:
    """What the steady steps drew, where it went, and what it cost."""
    e = energy_of(report)
    if e is None:
        return []
    gpus = ", ".join(str(i) for i in e["gpus"])
    source = {
        "counter": "NVML's energy counter",
        "power_integral": "power samples × time (this GPU has no energy counter)",
        "counter_and_power": "NVML's energy counter, power × time where it stalled or went back",
    }[e["source"]]
    per = [f"{fmt_joules(e['joules_per_step'])} per step"] if e["joules_per_step"] is not None else []
    if e["joules_per_sample"] is not None:
        per.append(f"{fmt_joules(e['joules_per_sample'])} per sample")
    if e["joules_per_token"] is not None:
        per.append(f"{fmt_joules(e['joules_per_token'])} per token")
    nodes = f" on {e['nodes']} nodes" if e["nodes"] > 1 else ""
    lines = [
        f"Energy: {fmt_joules(e['joules'])} over the steady steps on GPU {gpus}{nodes} "
        f"({e['watts_mean']:.0f} W mean): {', '.join(per)}; from {source}"
    ]
    lines += _stage_lines(e) + _cost_lines(e) + _cap_lines(e)
    return lines


def _stage_lines(e: Energy) -> list[str]:
    stages = e["by_stage"]
    if not stages:
        return []
    total = sum(s["joules"] for s in stages.values()) or 1.0
    parts = [f"{name} {fmt_fraction(s['joules'] / total)} ({s['watts']:.0f} W)" for name, s in stages.items()]
    lines = [f"  by stage: {', '.join(parts)}"]
    if e["by_stage_model"]:
        modelled = [name for name, s in stages.items() if s["basis"] == "model"]
        lines.append(f"  estimated for {', '.join(modelled)}: {e['by_stage_model']}")
    if e["idle_joules"] is not None and e["joules"] > 0:
        lines.append(
            f"  the GPU idle, waiting for work: ~{fmt_joules(e['idle_joules'])} "
            f"({fmt_fraction(e['idle_joules'] / e['joules'])} of it; an estimate at {e['idle_w'] or 0:.0f} W idle)"
        )
    return lines


def _cost_lines(e: Energy) -> list[str]:
    if e["cost_per_hour"] is None:
        return []
    parts = [f"{fmt_money(e['cost_per_hour'])} per hour ({e['gpu_count']} GPU × {e['price_per_gpu_hour']:g})"]
    if e["cost_per_sample"] is not None:
        parts.append(f"{fmt_money(e['cost_per_sample'])} per sample")
    if e["cost_per_epoch"] is not None:
        parts.append(f"{fmt_money(e['cost_per_epoch'])} per epoch")
    return [f"  cost: {', '.join(parts)}"]


def _cap_lines(e: Energy) -> list[str]:
    cap = e["power_cap_w"]
    if cap is None:
        return []
    gpus = ",".join(str(i) for i in e["gpus"])
    return [
        f"  the GPU waits for data: a power cap of ~{cap:.0f} W should leave the step as long (an estimate: "
        f"dynamic power taken as linear in the clock; measure the step after): "
        f"nvidia-smi -i {gpus} -pl {cap:.0f}  # needs root"
    ]


def energy_saving_words(card: Card) -> str | None:
    """What a card's change saves in energy (and money) per hour of training: an estimate."""
    metrics = card["metrics"]
    joules = metrics.get("saving_j_per_hour")
    if not joules:
        return None
    money = metrics.get("saving_cost_per_hour")
    cost = f", {fmt_money(money)} per hour" if money else ""
    return f"~{fmt_joules(joules)} per hour of training{cost} (an estimate at the measured power)"
