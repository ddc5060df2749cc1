"""The report's ``devices`` and ``host`` sections, from the samples in a timeline.

Pure functions over what :mod:`perfmagic.collect.nvml` and
:mod:`perfmagic.collect.host` recorded (metric names are documented there). Units:
seconds, bytes, watts, joules, MHz, degrees C; utilizations and fractions in [0, 1];
CPU of the process tree in cores. A figure that was not measured is ``None``.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from perfmagic.schema import THROTTLE_REASONS, gpu_metric
from perfmagic.timeline import Timeline


def _values(timeline: Timeline, metric: str) -> np.ndarray:
    v = timeline.series(metric)[1]
    finite: np.ndarray = v[np.isfinite(v)]
    return finite


def _mean(timeline: Timeline, metric: str) -> float | None:
    v = _values(timeline, metric)
    return float(v.mean()) if v.size else None


def _p95(timeline: Timeline, metric: str) -> float | None:
    v = _values(timeline, metric)
    return float(np.percentile(v, 95)) if v.size else None


def _max(timeline: Timeline, metric: str) -> float | None:
    v = _values(timeline, metric)
    return float(v.max()) if v.size else None


def _min(timeline: Timeline, metric: str) -> float | None:
    v = _values(timeline, metric)
    return float(v.min()) if v.size else None


def _last(timeline: Timeline, metric: str) -> float | None:
    """The final value of a counter that starts at zero with the window."""
    v = _values(timeline, metric)
    return float(v[-1]) if v.size else None


def _int(value: float | None) -> int | None:
    return None if value is None else round(value)


def gpu_indices(timeline: Timeline) -> list[int]:
    """Indices of the GPUs a timeline knows, from its facts or its samples."""
    known = {int(d["index"]) for d in timeline.meta.get("devices") or []}
    return sorted(known | {g[0] for name in timeline.metrics if (g := gpu_metric(name))})


def devices_summary(timeline: Timeline) -> list[dict[str, Any]]:
    """One entry per GPU, in index order; empty without GPU samples or facts."""
    statics = {int(d["index"]): d for d in timeline.meta.get("devices") or []}
    lost = {int(m.data["index"]): m for m in timeline.marks("gpu_lost")}
    processes = timeline.meta.get("gpu_processes") or []
    return [
        _device(timeline, i, statics.get(i, {}), lost.get(i), [p for p in processes if p.get("gpu") == i])
        for i in gpu_indices(timeline)
    ]


def _device(
    tl: Timeline, i: int, static: dict[str, Any], lost: Any, processes: list[dict[str, Any]]
) -> dict[str, Any]:
    g = f"gpu{i}."
    mem_total = static.get("mem_total_bytes")
    mem_peak = _int(_max(tl, g + "mem_used_bytes"))
    energy, energy_source = _energy(tl, g)
    throttle = _throttle(tl, g + "throttle_mask")
    tree = [p for p in processes if p.get("in_tree")]
    tree_mem = [p["used_memory_bytes"] for p in tree if p.get("used_memory_bytes") is not None]
    return {
        "index": i,
        "name": static.get("name"),
        "uuid": static.get("uuid"),
        "pci_bus_id": static.get("pci_bus_id"),
        "compute_capability": static.get("compute_capability"),
        "samples": int(_values(tl, g + "mem_used_bytes").size or _values(tl, g + "util").size),
        "util_mean": _mean(tl, g + "util"),
        "util_p95": _p95(tl, g + "util"),
        "mem_util_mean": _mean(tl, g + "mem_util"),
        "mem_used_peak_bytes": mem_peak,
        "mem_total_bytes": mem_total,
        "mem_used_peak_fraction": mem_peak / mem_total if mem_peak is not None and mem_total else None,
        "power_mean_w": _mean(tl, g + "power_w"),
        "power_max_w": _max(tl, g + "power_w"),
        "power_limit_w": static.get("power_limit_w"),
        "energy_j": energy,
        "energy_source": energy_source,
        "sm_clock_mean_mhz": _mean(tl, g + "sm_clock_mhz"),
        "mem_clock_mean_mhz": _mean(tl, g + "mem_clock_mhz"),
        "temperature_max_c": _max(tl, g + "temperature_c"),
        "throttle_reasons": [name for name in throttle if name != "gpu_idle"],
        "throttle_fraction": throttle,
        "pcie_tx_mean_bytes_per_s": _mean(tl, g + "pcie_tx_bytes_per_s"),
        "pcie_rx_mean_bytes_per_s": _mean(tl, g + "pcie_rx_bytes_per_s"),
        "nvlink_tx_mean_bytes_per_s": _mean(tl, g + "nvlink_tx_bytes_per_s"),
        "nvlink_rx_mean_bytes_per_s": _mean(tl, g + "nvlink_rx_bytes_per_s"),
        "sm_active_mean": _mean(tl, g + "sm_active"),
        "sm_occupancy_mean": _mean(tl, g + "sm_occupancy"),
        "tensor_active_mean": _mean(tl, g + "tensor_active"),
        "dram_bw_util_mean": _mean(tl, g + "dram_bw_util"),
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
            dict(m, mem_used_peak_bytes=_int(_max(tl, f"{g}mig{k}.mem_used_bytes")))
            for k, m in enumerate(static.get("mig_instances") or [])
        ],
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
    v = _values(tl, metric).astype(np.int64)
    if not v.size:
        return {}
    out = {name: float(np.mean((v & bit) != 0)) for bit, name in THROTTLE_REASONS.items()}
    return {name: f for name, f in out.items() if f > 0}


def _driver_samples(tl: Timeline, g: str) -> dict[str, Any] | None:
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
        "mem_util_mean": _mean(tl, g + "mem_util_driver"),
    }


def host_summary(timeline: Timeline) -> dict[str, Any]:
    """The machine and the profiled process tree over the window."""
    meta = timeline.meta.get("host") or {}
    tl = timeline
    cores = sorted(
        (int(m.group(1)), name) for name in tl.metrics if (m := re.fullmatch(r"host\.cpu(\d+)_util", name))
    )
    read_bytes = _last(tl, "host.read_bytes")
    read_ops = _last(tl, "host.read_ops")
    t = tl.series("host.read_bytes")[0]
    span = float(t[-1] - t[0]) if t.size > 1 else None
    return {
        "cpu_count": meta.get("cpu_count"),
        "physical_cores": meta.get("physical_cores"),
        "cpu_util_mean": _mean(tl, "host.cpu_util"),
        "cpu_util_p95": _p95(tl, "host.cpu_util"),
        "per_core_util_mean": [_mean(tl, name) for _, name in cores],
        "proc_cpu_util_mean": _mean(tl, "host.proc_cpu_cores"),
        "proc_cpu_util_p95": _p95(tl, "host.proc_cpu_cores"),
        "rss_peak_bytes": _int(_max(tl, "host.rss_bytes")),
        "uss_peak_bytes": _int(_max(tl, "host.uss_bytes")),
        "mem_available_min_bytes": _int(_min(tl, "host.mem_available_bytes")),
        "mem_total_bytes": meta.get("mem_total_bytes"),
        "read_bytes": _int(read_bytes),
        "write_bytes": _int(_last(tl, "host.write_bytes")),
        "read_ops": _int(read_ops),
        "write_ops": _int(_last(tl, "host.write_ops")),
        "avg_read_size_bytes": read_bytes / read_ops if read_bytes is not None and read_ops else None,
        "read_mean_bytes_per_s": read_bytes / span if read_bytes is not None and span else None,
        "proc_read_bytes": _int(_last(tl, "host.proc_read_bytes")),
        "proc_write_bytes": _int(_last(tl, "host.proc_write_bytes")),
        "iowait_mean": _mean(tl, "host.iowait"),
        "net_sent_bytes": _int(_last(tl, "host.net_sent_bytes")),
        "net_recv_bytes": _int(_last(tl, "host.net_recv_bytes")),
        "affinity": meta.get("affinity"),
        "numa_nodes": meta.get("numa_nodes"),
        "gpu_affinity": _gpu_affinity(meta.get("affinity"), timeline.meta.get("devices") or []),
    }


def _gpu_affinity(affinity: list[int] | None, devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each GPU: how many of the CPUs the process may use are NUMA-local to it."""
    out: list[dict[str, Any]] = []
    for d in devices:
        local = d.get("numa_cpus")
        if affinity is None or not local:
            continue
        allowed_local = len(set(affinity) & set(local))
        out.append(
            {
                "gpu": d["index"],
                "numa_node": d.get("numa_node"),
                "local_cpus": len(local),
                "allowed_cpus": len(affinity),
                "allowed_local_cpus": allowed_local,
                "allowed_local_fraction": allowed_local / len(affinity) if affinity else None,
            }
        )
    return out
