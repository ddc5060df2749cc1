"""Plain-text rendering of a report, for terminals and ``print(report)``."""

from __future__ import annotations

from perfmagic.advise.headline import caused
from perfmagic.contract import CollectiveSkew, Rank, ReportData, Steps
from perfmagic.render.energy import energy_kpi, energy_lines
from perfmagic.render.memory import memory_lines
from perfmagic.render.wording import (
    evaluation_line,
    hotspot_lines,
    memory_words,
    minor_line,
    most_to_gain,
    origin_words,
    plan_line,
    rank_stages,
    recording_line,
    saving_words,
)
from perfmagic.units import fmt_bytes, fmt_fraction, fmt_rate, fmt_seconds

_BAR_WIDTH = 30


def throughput_words(steps: Steps) -> str:
    """ ", 2,050 samples/s, 65,600 tokens/s" where the batches told them."""
    words = [
        f", {fmt_rate(rate)} {unit}/s"
        for rate, unit in ((steps["samples_per_s"], "samples"), (steps["tokens_per_s"], "tokens"))
        if rate
    ]
    return "".join(words)


def tuning_lines(report: ReportData) -> list[str]:
    """One line per knob tuning tried: its settings' measured times, and the best against the baseline."""
    lines = []
    for knob in report["tuning"]:
        base, best = knob["baseline"], knob["best"]
        if knob["knob"] == "step" and best and base:
            settings = ", ".join(f"{k}={v}" for k, v in best["value"].items())
            lines.append(
                f"predicted step with {settings}: {fmt_seconds(best['seconds'])} against "
                f"{fmt_seconds(base['seconds'])} observed (~{knob['speedup']:.2g}× faster)"
            )
        elif best and base:
            tried = ", ".join(f"{t['value']}: {fmt_seconds(t['seconds'])}" for t in knob["tried"])
            lines.append(
                f"{knob['knob']} (measured, {knob['unit']}): {tried}; best {best['value']} "
                f"(~{knob['speedup']:.2g}× against {base['value']})"
            )
        else:
            lines.append(f"{knob['knob']}: not compared ({'; '.join(knob['notes'])})")
    return lines


def render_text(report: ReportData) -> str:
    """The report as plain text: what it opens with, then each section that has something to say."""
    sections = [
        _stage_lines(report),
        hotspot_lines(report),
        _gpu_trace_lines(report),
        _device_lines(report),
        energy_lines(report),
        memory_lines(report),
        _host_lines(report),
        _rank_lines(report),
        _advice_lines(report),
        _line(plan_line(report)),
        _line(minor_line(report)),
        _tuning_section(report),
        _warning_lines(report),
        _line(recording_line(report)),
    ]
    lines = _summary_lines(report)
    for section in sections:
        if section:
            lines += ["", *section]
    return "\n".join(lines)


def _line(said: str | None) -> list[str]:
    """One line where there is something to say, else none."""
    return [said] if said else []


def _summary_lines(report: ReportData) -> list[str]:
    """The title, the steps, the evaluation passes and the bottleneck."""
    head = f"perfmagic report ({origin_words(report)}) — {fmt_seconds(report['wall_s'])} profiled"
    return [
        head,
        "=" * len(head),
        *_steps_lines(report["steps"]),
        *([f"{kpi[0]}: {kpi[1]}"] if (kpi := energy_kpi(report)) else []),
        *_line(evaluation_line(report)),
        *_bottleneck_lines(report),
    ]


def _steps_lines(steps: Steps) -> list[str]:
    """How many steps, how long and how fast; or that none was seen, and where to mark them."""
    if not steps["count"]:
        return ["steps: none seen" + (f" ({steps['hint']})" if steps["hint"] else "")]
    lines = [
        f"steps: {steps['count']}, median {fmt_seconds(steps['median_s'])}, "
        f"p90 {fmt_seconds(steps['p90_s'])}, {fmt_rate(steps['per_s'])} steps/s{throughput_words(steps)}, "
        f"first step done after {fmt_seconds(steps['first_s'])}"
    ]
    if steps["warmup"]:
        lines.append(f"figures below: the {steps['count'] - steps['warmup']} steps after the first (warm-up)")
    return lines


def _bottleneck_lines(report: ReportData) -> list[str]:
    """The straggler rank, else the bottleneck stage with its cause, and where more is to gain."""
    straggler = report["straggler"]
    if straggler:
        return [
            f"bottleneck: {straggler['stage']} on rank {straggler['rank']}, a straggler: "
            f"+{fmt_seconds(straggler['excess_s'])} per step that the other ranks wait for in comm"
        ]
    if not report["bottleneck"]:
        return []
    stage = report["stages"].get(report["bottleneck"] or "")
    share = stage["fraction"] if stage else None
    tail = f" ({fmt_fraction(share)} of step time)" if share is not None else ""
    return [
        caused(f"bottleneck: {report['bottleneck']}{tail}", report, report["bottleneck"]),
        *_line(most_to_gain(report)),
    ]


def _stage_lines(report: ReportData) -> list[str]:
    """Each stage's share of the step as a bar, largest first."""
    if not report["stages"]:
        return []
    lines = ["stage breakdown (share of step time, mean per step):"]
    width = max(len(n) for n in report["stages"])
    for name, s in sorted(report["stages"].items(), key=lambda kv: -kv[1]["total_s"]):
        bar = "█" * round(s["fraction"] * _BAR_WIDTH)
        lines.append(
            f"  {name:<{width}}  {fmt_fraction(s['fraction']):>4}  {bar:<{_BAR_WIDTH}}  "
            f"{fmt_seconds(s['mean_s'])}"
        )
    return lines


def _gpu_trace_lines(report: ReportData) -> list[str]:
    """How busy the GPU was in its trace, and the allocator's peaks where the trace has them."""
    g = report["gpu"]
    lines = (
        [f"GPU (trace): busy {fmt_fraction(g['busy_fraction'])}, idle {fmt_fraction(g['idle_fraction'])}"]
        if g
        else []
    )
    for peak in report["gpu_memory"] or []:
        lines.append(
            f"GPU {peak['device']} memory (trace): tensors peaked at {fmt_bytes(peak['allocated_peak_bytes'])}"
            + (
                f" in {fmt_bytes(peak['reserved_peak_bytes'])} reserved"
                if peak["reserved_peak_bytes"]
                else ""
            )
        )
    return lines


def _device_lines(report: ReportData) -> list[str]:
    """Each GPU's utilization, memory peak and power, as sampled."""
    if not report["devices"]:
        return []
    return [
        "GPUs:",
        *(
            f"  [{d['index']}] {d['name'] or '?'}: util {fmt_fraction(d['util_mean'])} "
            f"(p95 {fmt_fraction(d['util_p95'])}), memory peak {fmt_bytes(d['mem_used_peak_bytes'])}"
            f" / {fmt_bytes(d['mem_total_bytes'])}, power {_watts(d['power_mean_w'])}"
            for d in report["devices"]
        ),
    ]


def _host_lines(report: ReportData) -> list[str]:
    """The host's CPUs, their use, and the process tree's memory peak."""
    host = report["host"]
    if host["cpu_count"] is None:
        return []
    return [
        f"host: {host['cpu_count']} CPUs, CPU {fmt_fraction(host['cpu_util_mean'])}, {memory_words(host)}"
    ]


def _rank_lines(report: ReportData) -> list[str]:
    """The ranks side by side, and who reaches the collectives last; none for a single rank."""
    if len(report["ranks"]) <= 1:
        return []
    return [*rank_table(report), *_skew_lines(report["collective_skew"])]


def _skew_lines(skew: CollectiveSkew | None) -> list[str]:
    """How far apart the ranks start their collectives, and the five latest ranks."""
    if not skew:
        return []
    lines = [
        f"  collectives: {skew['instances']} matched across ranks, start skew mean "
        f"{fmt_seconds(skew['skew_mean_s'])} (p90 {fmt_seconds(skew['skew_p90_s'])}); "
        f"rank {skew['last_rank']} arrives last most often"
    ]
    for x in sorted(skew["ranks"], key=lambda x: -x["late_mean_s"])[:5]:
        lines.append(
            f"    rank {x['rank']}: late by {fmt_seconds(x['late_mean_s'])} on average "
            f"(p90 {fmt_seconds(x['late_p90_s'])}), last in {fmt_fraction(x['last_fraction'])}"
        )
    return lines


def _advice_lines(report: ReportData) -> list[str]:
    """Each card: severity, title and saving, then its evidence and its fix, indented."""
    if not report["advice"]:
        return []
    lines = ["advice:"]
    for card in report["advice"]:
        words = saving_words(card)
        saving = f" — {words}" if words else ""
        lines.append(f"  [{card['severity']}] {card['title']}{saving}")
        lines.append(f"      {card['evidence']}")
        lines += [f"      | {fix_line}" for fix_line in card["fix"].splitlines()]
    return lines


def _tuning_section(report: ReportData) -> list[str]:
    """What tuning measured, one knob a line."""
    tuned = tuning_lines(report)
    if not tuned:
        return []
    return ["tuning (tried after the window, on copies):", *(f"  {line}" for line in tuned)]


def _warning_lines(report: ReportData) -> list[str]:
    """What could not be measured, and why."""
    if not report["warnings"]:
        return []
    return ["not measured:", *(f"  - {w}" for w in report["warnings"])]


def _watts(w: float | None) -> str:
    return "n/a" if w is None else f"{w:.0f} W"


def rank_table(report: ReportData) -> list[str]:
    """The ranks' stage tables side by side: one row per rank, mean seconds per steady step."""
    ranks = report["ranks"]
    stages = rank_stages(ranks)
    busy = any(_busy(r) is not None for r in ranks)
    straggler = report["straggler"]["rank"] if report["straggler"] else None
    head = ["rank", "node", "steps", "step", *stages, *(["GPU busy"] if busy else [])]
    rows = []
    for r in ranks:
        step = sum(s["mean_s"] for s in r["stages"].values()) if r["stages"] else None
        rows.append(
            [
                f"{r['rank']}{'*' if r['rank'] == straggler else ''}",
                str(r["node"] or "-"),
                str(r["steps"]["count"]),
                fmt_seconds(step) if step is not None else "-",
                *(fmt_seconds(r["stages"][n]["mean_s"]) if n in r["stages"] else "-" for n in stages),
                *([fmt_fraction(_busy(r))] if busy else []),
            ]
        )
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    title = (
        "ranks (mean per step after warm-up" + ("; * the straggler" if straggler is not None else "") + "):"
    )
    return [
        title,
        *("  " + "  ".join(x.rjust(w) for x, w in zip(row, widths, strict=True)) for row in [head, *rows]),
    ]


def _busy(rank: Rank) -> float | None:
    return rank["gpu"]["busy_fraction"] if "gpu" in rank else None
