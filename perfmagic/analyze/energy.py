"""The report's ``energy`` section: the GPUs' joules over the steady steps, by stage, and their cost.

Joules come from NVML's total-energy counter where the GPU has one (Volta and newer), sampled
each tick as ``gpuN.energy_j``; where the counter went back (a driver reload) a new segment
starts, and where it stalled for a second or more while the GPU drew power, that stretch is
power × time. Without the counter, ``gpuN.power_w`` is integrated over time.

By stage: each sample interval's joules are split among the stages open in it. A stage that held
at least ``MEASURED_INTERVALS`` intervals alone (``ALONE_SHARE`` of each) has its power measured
there; a shorter one gets the power model's figure: power fitted as linear in the GPU's sampled
utilization (``idle_w`` at 0, ``busy_w`` at 1) at the stage's own mean utilization. The modelled
stages are then scaled so that the stages add up to the measured total.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmagic.contract import StageEnergy
from perfmagic.contract.energy import EnergySource
from perfmagic.timeline import Timeline

MEASURED_INTERVALS = 10
"""Sample intervals a stage must hold alone for its power to count as measured…"""
ALONE_SHARE = 0.9
"""…holding at least this share of each."""
STALL_S = 1.0
"""A counter flat this long while the GPU draws power has stalled: power × time stands in."""
COUNTER_UNIT_J = 1e-3
"""The counter counts millijoules: a change under one is no change."""
MIN_UTIL_SPREAD = 0.2
"""The utilization samples must spread this much for the power model to be fitted."""
CAP_HEADROOM = 0.9
"""A suggested power cap leaves the GPU this share of the step to finish its work in."""

POWER_MODEL = "power linear in sampled GPU utilization, fitted on this run (idle_w at 0, busy_w at 1)"
MEAN_POWER_MODEL = "the window's mean power (the utilization samples did not vary enough to fit a model)"


@dataclass(frozen=True)
class Intervals:
    """One GPU's sample intervals over a window: bounds, joules, and its mean utilization in each."""

    start: np.ndarray
    end: np.ndarray
    joules: np.ndarray
    util: np.ndarray | None  # in [0, 1]; None where utilization was not sampled
    source: EnergySource
    segments: int

    @property
    def seconds(self) -> np.ndarray:
        out: np.ndarray = self.end - self.start
        return out


def gpu_intervals(tl: Timeline, index: int, start: float, end: float) -> Intervals | None:
    """GPU ``index``'s joules in each sample interval, clipped to [start, end] (None: no power figures)."""
    g = f"gpu{index}."
    tc, e = _finite(tl, g + "energy_j")
    tp, p = _finite(tl, g + "power_w")
    if len(tc) >= 2:
        a, b, joules, source, segments = _from_counter(tc, e, tp, p)
    elif len(tp) >= 2:
        a, b = tp[:-1], tp[1:]
        joules, source, segments = (p[1:] + p[:-1]) / 2 * (b - a), "power_integral", 1
    else:
        return None
    lo, hi = np.maximum(a, start), np.minimum(b, end)
    keep = hi > lo
    share = (hi - lo)[keep] / (b - a)[keep]
    tu, u = _finite(tl, g + "util")
    util = _interval_means(tu, u, lo[keep], hi[keep]) if len(tu) else None
    return Intervals(lo[keep], hi[keep], joules[keep] * share, util, source, segments)


def _finite(tl: Timeline, metric: str) -> tuple[np.ndarray, np.ndarray]:
    t, v = tl.series(metric)
    ok = np.isfinite(v)
    return t[ok], v[ok]


def _from_counter(
    t: np.ndarray, e: np.ndarray, tp: np.ndarray, p: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, EnergySource, int]:
    """Intervals between counter readings; power × time where the counter went back or stalled."""
    a, b = t[:-1], t[1:]
    joules = np.diff(e)
    went_back = joules <= -COUNTER_UNIT_J
    watts = _interval_means(tp, p, a, b) if len(tp) else np.full(len(a), np.nan)
    stalled = _stalled(joules, b - a, watts)
    patch = went_back | stalled
    fallback = np.nan_to_num(watts) * (b - a)
    joules = np.where(patch, fallback, joules)
    source: EnergySource = "counter_and_power" if patch.any() else "counter"
    return a, b, joules, source, 1 + int(went_back.sum())


def _stalled(joules: np.ndarray, seconds: np.ndarray, watts: np.ndarray) -> np.ndarray:
    """Intervals in runs of a flat counter lasting ``STALL_S`` or more while power was above zero."""
    flat = (np.abs(joules) < COUNTER_UNIT_J) & (np.nan_to_num(watts) > 0)
    edges = np.flatnonzero(np.diff(np.concatenate(([0], flat.astype(np.int8), [0]))))
    starts, ends = edges[::2], edges[1::2]  # each run of flat intervals: [start, end)
    csum = np.concatenate(([0.0], np.cumsum(seconds)))
    long_runs = csum[ends] - csum[starts] >= STALL_S
    marks = np.zeros(len(flat) + 1, dtype=np.int64)
    np.add.at(marks, starts[long_runs], 1)
    np.add.at(marks, ends[long_runs], -1)
    out: np.ndarray = np.cumsum(marks[:-1]) > 0
    return out


def _interval_means(t: np.ndarray, v: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The mean of the samples in each (a, b]; the value interpolated at its middle where none fall."""
    if not len(t):
        return np.full(len(a), np.nan)
    csum = np.concatenate(([0.0], np.cumsum(v)))
    i, j = np.searchsorted(t, a, side="right"), np.searchsorted(t, b, side="right")
    n = j - i
    middle = np.interp((a + b) / 2, t, v)
    out: np.ndarray = np.where(n > 0, (csum[j] - csum[i]) / np.maximum(n, 1), middle)
    return out


def stage_seconds(
    clocks: dict[str, tuple[np.ndarray, np.ndarray]], start: np.ndarray, end: np.ndarray
) -> dict[str, np.ndarray]:
    """Each stage's exclusive seconds in each interval; ``other``: the rest of it."""
    out = {name: np.interp(end, *knots) - np.interp(start, *knots) for name, knots in clocks.items()}
    named = sum(out.values(), np.zeros(len(start)))
    out["other"] = np.maximum((end - start) - named, 0.0) + out.get("other", 0.0)
    return out


def fit_power(w: Intervals) -> tuple[float, float] | None:
    """(idle_w, busy_w): power fitted as linear in utilization; None where utilization hardly varied."""
    if w.util is None:
        return None
    ok = np.isfinite(w.util) & (w.seconds > 0)
    u, watts = w.util[ok], w.joules[ok] / w.seconds[ok]
    if len(u) < 3 or float(u.max() - u.min()) < MIN_UTIL_SPREAD:
        return None
    slope, idle = np.polyfit(u, watts, 1)
    return max(float(idle), 0.0), max(float(idle + slope), 0.0)


def stage_energy(w: Intervals, seconds: dict[str, np.ndarray]) -> tuple[dict[str, StageEnergy], bool]:
    """One GPU's joules by stage; True where some stage's figure came from the power model."""
    dt = w.seconds
    total = float(w.joules.sum())
    fit = fit_power(w)
    measured: dict[str, StageEnergy] = {}
    modelled: dict[str, float] = {}
    for name, s in seconds.items():
        stage_s = float(s.sum())
        if stage_s <= 0:
            continue
        alone = s >= ALONE_SHARE * dt
        if int(alone.sum()) >= MEASURED_INTERVALS:
            watts = float(w.joules[alone].sum() / dt[alone].sum())
            measured[name] = {"joules": watts * stage_s, "watts": watts, "basis": "measured"}
        elif fit is not None and w.util is not None:
            util = float(np.nansum(s * w.util) / stage_s)
            modelled[name] = (fit[0] + (fit[1] - fit[0]) * util) * stage_s
        else:
            modelled[name] = total / max(float(dt.sum()), 1e-12) * stage_s
    left = total - sum(v["joules"] for v in measured.values())
    raw = sum(modelled.values())
    scale = left / raw if raw > 0 and left > 0 else 1.0
    out = dict(measured)
    for name, joules in modelled.items():
        stage_s = float(seconds[name].sum())
        out[name] = {"joules": joules * scale, "watts": joules * scale / stage_s, "basis": "model"}
    return out, bool(modelled)


def idle_energy(w: Intervals, fit: tuple[float, float] | None) -> float | None:
    """Joules the GPU drew with no kernel to run: its idle power over its unbusy time (estimate)."""
    if fit is None or w.util is None:
        return None
    util = np.nan_to_num(w.util, nan=1.0)
    return float(fit[0] * (w.seconds * (1.0 - np.clip(util, 0.0, 1.0))).sum())


def power_cap(
    fits: list[tuple[float, float]], busy_share: float | None, limit_w: float | None
) -> float | None:
    """An input-bound GPU's cap that leaves the step as long (estimate: dynamic power linear in clock).

    Busy ``busy_share`` of the step, the GPU could run that much slower and still finish within it;
    the cap keeps ``CAP_HEADROOM`` of margin. None where it would save under 10% of the busy power.
    """
    if not fits or busy_share is None or busy_share <= 0:
        return None
    idle, busy = (float(np.mean(v)) for v in zip(*fits, strict=True))
    cap = idle + (busy - idle) * min(1.0, busy_share / CAP_HEADROOM)
    if busy <= 0 or cap > 0.9 * busy:
        return None
    return min(cap, limit_w) if limit_w else cap
