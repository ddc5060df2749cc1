"""The report's ``energy`` section for a job: each node's GPUs over the steady steps, summed, and
their cost where the user gave a price (see :mod:`perfmagic.analyze.energy` for the measuring)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from perfmagic.analyze.devices import devices_summary
from perfmagic.analyze.energy import (
    MEAN_POWER_MODEL,
    POWER_MODEL,
    Intervals,
    fit_power,
    gpu_intervals,
    idle_energy,
    power_cap,
    stage_energy,
    stage_seconds,
)
from perfmagic.analyze.steady import Steady
from perfmagic.analyze.steps import stage_clocks, step_breakdown
from perfmagic.analyze.windows import step_stage_clocks, windowed
from perfmagic.contract import Device, Energy, StageEnergy
from perfmagic.contract.energy import GpusBasis
from perfmagic.schema import gpu_metric
from perfmagic.timeline import Timeline


def energy_of_job(
    timelines: list[Timeline],
    tl: Timeline,
    steady: Steady | None,
    rates: tuple[float | None, float | None],
    model_device: str | None,
    epoch_samples: int | None,
    means: dict[str, float],
    input_bound: bool,
) -> tuple[Energy | None, list[str]]:
    """The steady steps' energy over every node's GPU sampler, ``tl`` holding the primary rank's stages
    and ``rates`` its (samples, tokens) per second; None without steady steps or GPU power."""
    samplers = _gpu_samplers(timelines)
    if steady is None or not samplers:
        return None, []
    price = next((p for t in (tl, *samplers) if (p := t.meta.get("price_per_gpu_hour")) is not None), None)
    nodes = []
    for sampled in samplers:
        devices = devices_summary(sampled)
        offset = float(tl.meta.get("epoch", 0.0)) - float(sampled.meta.get("epoch", 0.0))
        utils = [u for d in devices if (u := means.get(f"gpu{d['index']}.util")) is not None]
        nodes.append(
            EnergyInputs(
                sampled=sampled,
                staged=tl,
                window=(steady.start + offset, steady.end + offset),
                offset=offset,
                steps=steady.count,
                samples_per_s=rates[0],
                tokens_per_s=rates[1],
                devices=devices,
                framework_device=_cuda_index(model_device),
                input_bound=input_bound,
                busy_share=float(np.mean(utils)) if utils else None,
                price_per_gpu_hour=price,
                epoch_samples=epoch_samples,
            )
        )
    return job_energy(nodes)


def _gpu_samplers(timelines: list[Timeline]) -> list[Timeline]:
    """The timelines holding GPU samples: each node's ``perfmagic run`` sampler (no stages of its own),
    else the one process that sampled them."""
    sampling = [t for t in timelines if any(gpu_metric(m) for m in t.metrics)]
    samplers = [t for t in sampling if not t.span_count]
    return samplers or sorted(sampling, key=lambda t: -len(t.metrics))[:1]


def _cuda_index(device: Any) -> int | None:
    """The index of a CUDA device named as torch names it (``cuda``, ``cuda:1``); None otherwise."""
    text = str(device or "")
    if text == "cuda":
        return 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    return None


def counted_gpus(devices: list[Device], framework_device: int | None) -> tuple[list[int], GpusBasis]:
    """The GPUs the training uses: those running its processes, else the framework's, else all."""
    live = [d for d in devices if not d["lost"]]
    used = [d["index"] for d in live if any(p.get("in_tree") for p in d["processes"])]
    if used:
        return used, "processes"
    known = {d["index"] for d in live}
    if framework_device is not None and framework_device in known:
        return [framework_device], "framework"
    return sorted(known), "all"


def merge_stages(per_gpu: list[dict[str, StageEnergy]], seconds: dict[str, float]) -> dict[str, StageEnergy]:
    """The GPUs' stage joules summed; a stage is measured only where it was on every GPU."""
    out: dict[str, StageEnergy] = {}
    for name in {k for d in per_gpu for k in d}:
        parts = [d[name] for d in per_gpu if name in d]
        joules = sum(p["joules"] for p in parts)
        measured = len(parts) == len(per_gpu) and all(p["basis"] == "measured" for p in parts)
        out[name] = {
            "joules": joules,
            "watts": joules / seconds[name] if seconds.get(name) else 0.0,
            "basis": "measured" if measured else "model",
        }
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["joules"]))


def empty_energy() -> Energy:
    """An ``energy`` section to fill in (every figure unmeasured)."""
    return {
        "joules": 0.0,
        "seconds": 0.0,
        "joules_per_step": None,
        "joules_per_sample": None,
        "joules_per_token": None,
        "watts_mean": 0.0,
        "gpus": [],
        "gpu_count": 0,
        "nodes": 1,
        "gpus_basis": "all",
        "source": "counter",
        "segments": 1,
        "by_stage": {},
        "by_stage_model": None,
        "idle_w": None,
        "busy_w": None,
        "idle_joules": None,
        "power_cap_w": None,
        "price_per_gpu_hour": None,
        "cost_per_hour": None,
        "cost_per_sample": None,
        "cost_per_epoch": None,
    }


@dataclass(frozen=True)
class EnergyInputs:
    """What the energy section is computed from (``analyze`` gathers it)."""

    sampled: Timeline  # the process that sampled the GPUs
    staged: Timeline  # the primary rank's, with the stages
    window: tuple[float, float]  # the steady steps, on the sampled timeline's clock
    offset: float  # the sampled clock less the staged one
    steps: int  # steady steps in the window
    samples_per_s: float | None
    tokens_per_s: float | None
    devices: list[Device]
    framework_device: int | None  # the model's CUDA device index, where known
    input_bound: bool  # the step waits for its data: a power cap may cost nothing
    busy_share: float | None  # the counted GPUs' mean utilization over the window
    price_per_gpu_hour: float | None
    epoch_samples: int | None  # the dataset's length, where known


def job_energy(nodes: list[EnergyInputs]) -> tuple[Energy | None, list[str]]:
    """The steady steps' energy on the GPUs the training used, summed over the nodes' samplers, and
    what to say about how it was counted (None: no GPU power or energy was sampled)."""
    found = [(e, x, notes) for x in nodes for e, notes in [node_energy(x)] if e is not None]
    if not found:
        return None, []
    sections = [e for e, _, _ in found]
    out = sections[0] if len(sections) == 1 else _summed(sections)
    _add_cost(out, found[0][1])
    return out, [n for _, _, notes in found for n in notes]


def _summed(sections: list[Energy]) -> Energy:
    """Several nodes' sections as one job's: joules add up, the rates follow from them."""
    first = sections[0]
    joules = sum(e["joules"] for e in sections)
    scale = joules / first["joules"] if first["joules"] else 1.0
    stages: dict[str, StageEnergy] = {}
    for e in sections:
        for name, part in e["by_stage"].items():
            mine = stages.setdefault(name, {"joules": 0.0, "watts": 0.0, "basis": part["basis"]})
            mine["joules"] += part["joules"]
            mine["watts"] += part["watts"]
            if part["basis"] == "model":
                mine["basis"] = "model"

    def total(key: Literal["idle_w", "busy_w", "idle_joules"]) -> float | None:
        values = [e[key] for e in sections]
        return None if any(v is None for v in values) else float(sum(v or 0.0 for v in values))

    return {
        **first,
        "joules": joules,
        "watts_mean": joules / first["seconds"],
        "gpus": [i for e in sections for i in e["gpus"]],
        "gpu_count": sum(e["gpu_count"] for e in sections),
        "segments": max(e["segments"] for e in sections),
        "joules_per_step": _scaled(first["joules_per_step"], scale),
        "joules_per_sample": _scaled(first["joules_per_sample"], scale),
        "joules_per_token": _scaled(first["joules_per_token"], scale),
        "by_stage": dict(sorted(stages.items(), key=lambda kv: -kv[1]["joules"])),
        "idle_w": total("idle_w"),
        "busy_w": total("busy_w"),
        "idle_joules": total("idle_joules"),
        "power_cap_w": None,  # a cap is per GPU, and the nodes' GPUs differ in load
        "nodes": len(sections),
    }


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value * scale


def node_energy(x: EnergyInputs) -> tuple[Energy | None, list[str]]:
    """One sampler's GPUs (one node) over the steady steps, with no money figures yet."""
    gpus, basis = counted_gpus(x.devices, x.framework_device)
    start, end = x.window
    found = [(i, w) for i in gpus if (w := gpu_intervals(x.sampled, i, start, end)) is not None]
    if not found or end <= start:
        return None, []
    joules = float(sum(w.joules.sum() for _, w in found))
    seconds = end - start
    sources = {w.source for _, w in found}
    out: Energy = {
        **empty_energy(),
        "joules": joules,
        "seconds": seconds,
        "watts_mean": joules / seconds,
        "gpus": [i for i, _ in found],
        "gpu_count": len(found),
        "nodes": 1,
        "gpus_basis": basis,
        "source": next(iter(sources)) if len(sources) == 1 else "counter_and_power",
        "segments": max(w.segments for _, w in found),
        "joules_per_step": joules / x.steps if x.steps else None,
        "joules_per_sample": joules / seconds / x.samples_per_s if x.samples_per_s else None,
        "joules_per_token": joules / seconds / x.tokens_per_s if x.tokens_per_s else None,
    }
    _add_stages(out, x, [w for _, w in found])
    return out, _basis_warnings(basis, out["gpus"])


def _add_stages(out: Energy, x: EnergyInputs, found: list[Intervals]) -> None:
    fits = [f for w in found if (f := fit_power(w)) is not None]
    if fits:
        out["idle_w"] = float(sum(f[0] for f in fits))
        out["busy_w"] = float(sum(f[1] for f in fits))
        idle = [idle_energy(w, fit_power(w)) for w in found]
        out["idle_joules"] = float(sum(v for v in idle if v is not None))
    if x.input_bound:
        limits = [d["power_limit_w"] for d in x.devices if d["index"] in out["gpus"]]
        out["power_cap_w"] = power_cap(fits, x.busy_share, min((v for v in limits if v), default=None))
    # outside the recording windows a step's stages are estimates: the power splits over those
    staged = x.staged
    clocks = step_stage_clocks(step_breakdown(staged)) if windowed(staged) else stage_clocks(staged)
    if not clocks or not x.steps:
        return
    point = x.staged.fold_point
    held_from = point[1] + x.offset if point is not None else -np.inf
    per_gpu: list[dict[str, StageEnergy]] = []
    totals: dict[str, float] = {}
    modelled = False
    for w in found:
        keep = w.start >= held_from
        held = Intervals(
            w.start[keep], w.end[keep], w.joules[keep], None if w.util is None else w.util[keep], w.source, 1
        )
        seconds = stage_seconds(clocks, held.start - x.offset, held.end - x.offset)
        stages, used_model = stage_energy(held, seconds)
        per_gpu.append(stages)
        modelled |= used_model
        totals = {name: float(s.sum()) for name, s in seconds.items()}
    out["by_stage"] = merge_stages(per_gpu, totals)
    if modelled:
        out["by_stage_model"] = POWER_MODEL if fits else MEAN_POWER_MODEL


def _add_cost(out: Energy, x: EnergyInputs) -> None:
    """Money figures, only where the user gave a price (never a guessed one)."""
    price = x.price_per_gpu_hour
    if price is None:
        return
    per_hour = price * out["gpu_count"]
    out["price_per_gpu_hour"] = price
    out["cost_per_hour"] = per_hour
    if x.samples_per_s:
        per_sample = per_hour / 3600.0 / x.samples_per_s
        out["cost_per_sample"] = per_sample
        if x.epoch_samples:
            out["cost_per_epoch"] = per_sample * x.epoch_samples


def _basis_warnings(basis: GpusBasis, gpus: list[int]) -> list[str]:
    listed = ", ".join(str(i) for i in gpus)
    if basis == "framework":
        return [
            "NVML listed none of the training's processes on a GPU (as in some containers): energy "
            f"counts GPU {listed}, the model's device"
        ]
    if basis == "all" and len(gpus) > 1:
        return [
            "NVML listed none of the training's processes on a GPU and the model's device is unknown: "
            f"energy counts every GPU ({listed})"
        ]
    return []
