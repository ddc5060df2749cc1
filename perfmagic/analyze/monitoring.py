"""What a ``%gpumonitor`` saw, for the summary it leaves when it stops: each GPU's utilization (mean
and peak), memory peak and mean power, and the host's CPU, over the time it ran."""

from __future__ import annotations

from dataclasses import dataclass

from perfmagic.analyze import samples
from perfmagic.analyze.devices import gpu_indices
from perfmagic.contract import DeviceInfo
from perfmagic.timeline import Timeline


@dataclass(frozen=True)
class GpuFigures:
    """One GPU over the monitor's time; a figure NVML did not give is None."""

    index: int
    name: str | None
    util_mean: float | None
    util_peak: float | None
    mem_peak_bytes: int | None
    mem_total_bytes: int | None
    power_mean_w: float | None


@dataclass(frozen=True)
class MonitorSummary:
    """The monitor's time, its GPUs (or why there were none) and the host's CPU, a fraction of all cores."""

    seconds: float
    gpus: list[GpuFigures]
    no_gpu: str | None
    """Why there are no GPU figures (NVML's reason); None where there are."""
    cpu_mean: float | None
    cpu_peak: float | None


def monitor_summary(timeline: Timeline, seconds: float) -> MonitorSummary:
    """The summary of a monitor's ``timeline``, which ran for ``seconds``."""
    nvml = timeline.meta["nvml"] if "nvml" in timeline.meta else None
    facts = {int(d["index"]): d for d in timeline.meta.get("devices") or []}
    indices = gpu_indices(timeline) if nvml and nvml["available"] else []
    gpus = [_gpu(timeline, i, facts.get(i) or {}) for i in indices]
    return MonitorSummary(
        seconds,
        gpus,
        None if gpus else str((nvml and nvml["reason"]) or "NVML did not answer"),
        samples.mean(timeline, "host.cpu_util"),
        samples.maximum(timeline, "host.cpu_util"),
    )


def _gpu(timeline: Timeline, i: int, fact: DeviceInfo) -> GpuFigures:
    return GpuFigures(
        i,
        fact.get("name"),
        samples.mean(timeline, f"gpu{i}.util"),
        samples.maximum(timeline, f"gpu{i}.util"),
        samples.as_int(samples.maximum(timeline, f"gpu{i}.mem_used_bytes")),
        fact.get("mem_total_bytes"),
        samples.mean(timeline, f"gpu{i}.power_w"),
    )
