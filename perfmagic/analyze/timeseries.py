"""Compact utilization time series for a report: charts that survive a JSON round trip.

The sampled metrics a person looks at next to the steps (GPU utilization, memory and
power, host CPU, RSS and I/O rates) are averaged into at most ``max_points`` time
buckets each, so a report of an hour-long run stays small. Cumulative counters
(``host.read_bytes``, ``host.write_bytes``) become rates (``..._per_s``) first.
Also here: the ``torch.profiler`` traces recorded in the window (``--trace``), which
the Chrome-trace export merges.
"""

from __future__ import annotations

import re

import numpy as np

from perfmagic.contract import Series, Timeseries, TorchTrace
from perfmagic.schema import TORCH_TRACE_MARK
from perfmagic.timeline import Timeline

MAX_POINTS = 1000

_GAUGES = re.compile(
    r"^(gpu\d+\.(util|mem_used_bytes|power_w)|host\.(cpu_util|proc_cpu_cores|rss_bytes|pss_bytes))$"
)
_COUNTERS = ("host.read_bytes", "host.write_bytes")


def timeseries(tl: Timeline, max_points: int = MAX_POINTS) -> Timeseries:
    """``{"epoch": ..., "metrics": {name: {"t": [...], "v": [...]}}}`` of the sampling process's timeline."""
    metrics: dict[str, Series] = {}
    for name in tl.metrics:
        if _GAUGES.match(name):
            t, v = tl.series(name)
        elif name in _COUNTERS:
            name, (t, v) = name + "_per_s", _rate(*tl.series(name))
        else:
            continue
        if len(t):
            bt, bv = downsample(t, v, max_points)
            metrics[name] = {"t": bt.tolist(), "v": bv.tolist()}
    return {"epoch": tl.meta.get("epoch"), "metrics": metrics}


def profiler_traces(timelines: list[Timeline]) -> list[TorchTrace]:
    """The torch.profiler traces written during the window, with what aligns their clock.

    ``clock_t`` is the mark's own time, so it follows the timeline when it is rebased.
    """
    traces: list[TorchTrace] = []
    for tl in timelines:
        for m in tl.marks(TORCH_TRACE_MARK):
            trace: TorchTrace = {
                "path": m.data["path"],
                "clock_name": m.data["clock_name"],
                "steps": m.data["steps"],
                "clock_t": m.t,
            }
            if "profiler" in m.data:  # TensorFlow's or JAX's own profiler
                trace["profiler"] = m.data["profiler"]
            if "input_fraction" in m.data:
                trace["input_fraction"], trace["data_fraction"] = (
                    m.data["input_fraction"],
                    m.data["data_fraction"],
                )
            traces.append(trace)
    return traces


def downsample(t: np.ndarray, v: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Means over equal time buckets (NaN samples ignored; empty buckets dropped)."""
    if len(t) <= max_points:
        return t, v
    edges = np.linspace(t[0], t[-1], max_points + 1)
    bucket = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, max_points - 1)
    ok = ~np.isnan(v)
    counts = np.bincount(bucket[ok], minlength=max_points)
    sums = np.bincount(bucket[ok], weights=v[ok], minlength=max_points)
    t_sums = np.bincount(bucket, weights=t, minlength=max_points)
    t_counts = np.bincount(bucket, minlength=max_points)
    keep = t_counts > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return (t_sums[keep] / t_counts[keep]), means[keep]


def _rate(t: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(t) < 2:
        return np.zeros(0), np.zeros(0)
    dt = np.diff(t)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(dt > 0, np.diff(v) / dt, np.nan)
    return t[1:], rate
