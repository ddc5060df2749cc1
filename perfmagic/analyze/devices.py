"""The report's ``devices`` section, from the GPU samples and facts in a timeline.

Pure functions over what :mod:`perfmagic.collect.nvml_source` recorded (metric names are
documented there). Units: seconds, bytes, watts, joules, MHz, degrees C; utilizations
and fractions in [0, 1]. A figure that was not measured is ``None``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from perfmagic.analyze import samples
from perfmagic.contract import AllocatorMeta, Device, DeviceInfo, GpuProcess
from perfmagic.contract.machine import Allocator, DriverSamples
from perfmagic.schema import ALLOCATOR, THROTTLE_REASONS, gpu_metric
from perfmagic.timeline import Timeline


def gpu_indices(timeline: Timeline) -> list[int]:
    """Indices of the GPUs a timeline knows, from its facts or its samples."""
    known = {int(d["index"]) for d in timeline.meta.get("devices") or []}
    return sorted(known | {g[0] for name in timeline.metrics if (g := gpu_metric(name))})


def devices_summary(timeline: Timeline) -> list[Device]:
    """One entry per GPU, in index order; empty without GPU samples or facts."""
    statics = {int(d["index"]): d for d in timeline.meta.get("devices") or []}
    lost = {int(m.data["index"]): m for m in timeline.marks("gpu_lost")}
    processes = timeline.meta.get("gpu_processes") or []
    allocators = {int(a["index"]): a for a in timeline.meta.get(ALLOCATOR) or []}
    return [
        _device(
            timeline,
            i,
            statics.get(i, {}),
            lost.get(i),
            [p for p in processes if p["gpu"] == i],
            _allocator(allocators.get(i)),
        )
        for i in gpu_indices(timeline)
    ]


def _allocator(figures: AllocatorMeta | None) -> Allocator | None:
    """PyTorch's caching allocator on the GPU over the window (None: it was not used there)."""
    if figures is None:
        return None
    return {
        "allocated_peak_bytes": int(figures["allocated_peak_bytes"]),
        "reserved_peak_bytes": int(figures["reserved_peak_bytes"]),
        "alloc_retries": int(figures["alloc_retries"]),
        "ooms": int(figures["ooms"]),
    }


def _device(
    tl: Timeline,
    i: int,
    static: DeviceInfo,
    lost: Any,
    processes: list[GpuProcess],
    allocator: Allocator | None,
) -> Device:
    g = f"gpu{i}."
    mem_total = static.get("mem_total_bytes")
    mem_peak = samples.as_int(samples.maximum(tl, g + "mem_used_bytes"))
    energy, energy_source = _energy(tl, g)
    throttle = _throttle(tl, g + "throttle_mask")
    tree = [p for p in processes if p.get("in_tree")]
    tree_mem = [used for p in tree if (used := p["used_memory_bytes"]) is not None]
    return {
        "index": i,
        "name": static.get("name"),
        "uuid": static.get("uuid"),
        "pci_bus_id": static.get("pci_bus_id"),
        "compute_capability": static.get("compute_capability"),
        "samples": int(samples.finite(tl, g + "mem_used_bytes").size or samples.finite(tl, g + "util").size),
        "util_mean": samples.mean(tl, g + "util"),
        "util_p95": samples.p95(tl, g + "util"),
        "mem_util_mean": samples.mean(tl, g + "mem_util"),
        "mem_used_peak_bytes": mem_peak,
        "mem_total_bytes": mem_total,
        "mem_used_peak_fraction": mem_peak / mem_total if mem_peak is not None and mem_total else None,
        "power_mean_w": samples.mean(tl, g + "power_w"),
        "power_max_w": samples.maximum(tl, g + "power_w"),
        "power_limit_w": static.get("power_limit_w"),
        "energy_j": energy,
        "energy_source": energy_source,
        "sm_clock_mean_mhz": samples.mean(tl, g + "sm_clock_mhz"),
        "mem_clock_mean_mhz": samples.mean(tl, g + "mem_clock_mhz"),
        "temperature_max_c": samples.maximum(tl, g + "temperature_c"),
        "throttle_reasons": [name for name in throttle if name != "gpu_idle"],
        "throttle_fraction": throttle,
        "pcie_tx_mean_bytes_per_s": samples.mean(tl, g + "pcie_tx_bytes_per_s"),
        "pcie_rx_mean_bytes_per_s": samples.mean(tl, g + "pcie_rx_bytes_per_s"),
        "nvlink_tx_mean_bytes_per_s": samples.mean(tl, g + "nvlink_tx_bytes_per_s"),
        "nvlink_rx_mean_bytes_per_s": samples.mean(tl, g + "nvlink_rx_bytes_per_s"),
        "sm_active_mean": samples.mean(tl, g + "sm_active"),
        "sm_occupancy_mean": samples.mean(tl, g + "sm_occupancy"),
        "tensor_active_mean": samples.mean(tl, g + "tensor_active"),
        "dram_bw_util_mean": samples.mean(tl, g + "dram_bw_util"),
        "driver_samples": _driver_samples(tl, g),
        "lost": lost is not None or bool(static.get("lost")),
        "lost_at_s": None if lost is None else lost.t,
        "lost_reason": None if lost is None else lost.data.get("reason"),
        "processes": processes,
        "tree_mem_used_bytes": sum(tree_mem) if tree_mem else None,
        "numa_node": static.get("numa_node"),
        "numa_cpus": static.get("numa_cpus"),
        "mig_enabled": static.get("mig_enabled"),
        "mig_instances": [
            {**m, "mem_used_peak_bytes": samples.as_int(samples.maximum(tl, f"{g}mig{k}.mem_used_bytes"))}
            for k, m in enumerate(static.get("mig_instances") or [])
        ],
        "allocator": allocator,
    }


def _energy(tl: Timeline, g: str) -> tuple[float | None, str | None]:
    """Joules over the window: the hardware counter, else power integrated over time."""
    t, v = tl.series(g + "energy_j")
    ok = np.isfinite(v)
    if ok.sum() >= 2:
        return float(v[ok][-1] - v[ok][0]), "counter"
    t, v = tl.series(g + "power_w")
    ok = np.isfinite(v)
    if ok.sum() >= 2:
        t, v = t[ok], v[ok]
        return float(np.sum((v[1:] + v[:-1]) / 2 * np.diff(t))), "power_integral"
    return None, None


def _throttle(tl: Timeline, metric: str) -> dict[str, float]:
    """Fraction of samples in which each clocks-event reason was active."""
    v = samples.finite(tl, metric).astype(np.int64)
    if not v.size:
        return {}
    out = {name: float(np.mean((v & bit) != 0)) for bit, name in THROTTLE_REASONS.items()}
    return {name: f for name, f in out.items() if f > 0}


def _driver_samples(tl: Timeline, g: str) -> DriverSamples | None:
    t, v = tl.series(g + "util_driver")
    if not t.size:
        return None
    return {
        "count": int(t.size),
        "period_s": float(np.median(np.diff(t))) if t.size > 1 else None,
        "from_s": float(t[0]),
        "to_s": float(t[-1]),
        "util_mean": float(np.nanmean(v)),
        "util_p95": float(np.nanpercentile(v, 95)),
        "mem_util_mean": samples.mean(tl, g + "mem_util_driver"),
    }
