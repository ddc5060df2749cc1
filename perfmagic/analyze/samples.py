"""Statistics of sampled metrics: over the whole window, or over the steady steps.

A sample that could not be read is NaN in the timeline; every statistic here
ignores it, and is ``None`` when no sample is left.
"""

from __future__ import annotations

import numpy as np

from perfmagic.schema import THREAD_PREFIX
from perfmagic.timeline import Timeline


def finite(timeline: Timeline, metric: str) -> np.ndarray:
    """The metric's readable samples, in time order."""
    v = timeline.series(metric)[1]
    out: np.ndarray = v[np.isfinite(v)]
    return out


def mean(timeline: Timeline, metric: str) -> float | None:
    v = finite(timeline, metric)
    return float(v.mean()) if v.size else None


def p95(timeline: Timeline, metric: str) -> float | None:
    v = finite(timeline, metric)
    return float(np.percentile(v, 95)) if v.size else None


def maximum(timeline: Timeline, metric: str) -> float | None:
    v = finite(timeline, metric)
    return float(v.max()) if v.size else None


def minimum(timeline: Timeline, metric: str) -> float | None:
    v = finite(timeline, metric)
    return float(v.min()) if v.size else None


def last(timeline: Timeline, metric: str) -> float | None:
    """The final value of a counter that starts at zero with the window."""
    v = finite(timeline, metric)
    return float(v[-1]) if v.size else None


def as_int(value: float | None) -> int | None:
    return None if value is None else round(value)


def window_means(timeline: Timeline, start: float | None, end: float | None) -> dict[str, float]:
    """Each metric's mean over ``[start, end]`` (seconds on the timeline's clock).

    A metric with fewer than two samples in the window (steps shorter than the
    sampling interval) gets its mean over the whole timeline; so does every
    metric when no window is given. The profiled thread's per-step counters are
    cumulative (a mean means nothing) and are read per step instead: left out.
    """
    out: dict[str, float] = {}
    for metric in timeline.metrics:
        if metric.startswith(THREAD_PREFIX):
            continue
        t, v = timeline.series(metric)
        ok = np.isfinite(v)
        t, v = t[ok], v[ok]
        if not len(v):
            continue
        if start is not None and end is not None:
            inside = (t >= start) & (t <= end)
            if inside.sum() >= 2:
                v = v[inside]
        out[metric] = float(v.mean())
    return out
