"""What the training loop does around its stages, per steady step: the facts rules read.

- ``pre_forward_s``: time between a batch's arrival and the forward pass that is in
  no built-in stage: host work on the batch in the loop (transforms, augmentation,
  tokenization), or a user stage placed there;
- ``calls_per_step``: how many times per step each stage was entered;
- ``data_cpu_share``: the share of the ``data`` stage the training thread spent on a
  CPU: near 1 when it loads (or unpickles) batches itself, near 0 when it waits for
  storage or for DataLoader workers;
- ``data_wait_share``: the share it was runnable but waited for a CPU (other
  processes or threads held them): CPU demand, like ``data_cpu_share``, never I/O.
  What is left of the wait is blocked (storage, sleep, a lock, the workers).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from perfmagic.analyze.steady import Steady
from perfmagic.analyze.steps import StepBreakdown
from perfmagic.analyze.windows import EVERY_STEP_STAGES
from perfmagic.intervals import merge_intervals
from perfmagic.schema import STAGES, THREAD_DATA_CPU, THREAD_DATA_TIMED, THREAD_DATA_WAIT
from perfmagic.timeline import Timeline


@dataclass(frozen=True)
class LoopFacts:
    """Per steady step of the primary process; zeros where nothing was measured."""

    pre_forward_s: float = 0.0
    calls_per_step: dict[str, float] = field(default_factory=dict)
    data_cpu_share: float | None = None  # None: not measured
    data_wait_share: float | None = (
        None  # None: not measured (no schedstat: the CPU-versus-I/O split is unknown)
    )


def loop_facts(timeline: Timeline, breakdown: StepBreakdown, steady: Steady | None) -> LoopFacts:
    point = timeline.fold_point
    if steady is not None and point is not None:  # spans are held for the newest steps only
        steady = _held(steady, breakdown, point[1])
    if steady is None or not steady.count:
        return LoopFacts()
    # stages recorded in windows: counted in the fully recorded steady steps only (analyze.windows)
    full = breakdown.full[steady.first :] if breakdown.full is not None else np.ones(steady.count, bool)
    return LoopFacts(
        pre_forward_s(timeline, breakdown, steady, full),
        calls_per_step(timeline, steady, breakdown, full),
        fetch_share(timeline, steady, THREAD_DATA_CPU),
        fetch_share(timeline, steady, THREAD_DATA_WAIT),
    )


def _held(steady: Steady, breakdown: StepBreakdown, since: float) -> Steady | None:
    """The steady steps from ``since`` on (before it, steps were folded into rows without their spans)."""
    first = max(steady.first, int(np.searchsorted(breakdown.start, since)))
    cut = first - steady.first
    if cut >= steady.count:
        return None

    def tail(column: np.ndarray | None) -> np.ndarray | None:
        return column[cut:] if column is not None else None

    return replace(
        steady,
        first=first,
        durations=steady.durations[cut:],
        seconds=steady.seconds[cut:],
        start=float(breakdown.start[first]),
        cpu_s=tail(steady.cpu_s),
        wait_s=tail(steady.wait_s),
        gc_s=tail(steady.gc_s),
    )


def fetch_share(timeline: Timeline, steady: Steady, metric: str) -> float | None:
    """Seconds of ``metric`` (CPU, or waiting for a CPU) the training thread spent getting batches over the
    steady steps, per second it spent (of the fetches it timed: ``THREAD_DATA_TIMED``); None unmeasured."""
    t, counted = timeline.series(metric)
    t_wall, wall = timeline.series(THREAD_DATA_TIMED)
    if len(t) < 2 or len(t_wall) != len(t) or not np.isfinite(counted).all():
        return None
    window = [steady.start, steady.end]
    inside = np.interp(window, t, counted), np.interp(window, t_wall, wall)
    spent = float(inside[1][1] - inside[1][0])
    if spent <= 0:
        return None
    return min(1.0, max(0.0, float(inside[0][1] - inside[0][0]) / spent))


def calls_per_step(
    timeline: Timeline, steady: Steady, breakdown: StepBreakdown, full: np.ndarray
) -> dict[str, float]:
    """Spans of each stage that lie in the steady window, per steady step: of the stages recorded on
    every step over all of them, of the others over the fully recorded ones (``full``, per steady step)."""
    sp = timeline.spans
    inside = (sp.start >= steady.start) & (sp.end <= steady.end) & (sp.depth >= 0)
    counts = np.bincount(sp.name_id[inside], minlength=len(sp.names))
    starts, ends = breakdown.start[steady.first :], breakdown.end[steady.first :]
    step = np.searchsorted(starts, sp.start, side="right") - 1
    in_full = (step >= 0) & full[np.maximum(step, 0)] & (sp.end <= ends[np.maximum(step, 0)])
    full_counts = np.bincount(sp.name_id[inside & in_full], minlength=len(sp.names))
    n_full = max(int(full.sum()), 1)
    return {
        name: float(counts[i]) / steady.count
        if name in EVERY_STEP_STAGES or full.all()
        else float(full_counts[i]) / n_full
        for i, name in enumerate(sp.names)
        if counts[i]
    }


def pre_forward_s(timeline: Timeline, breakdown: StepBreakdown, steady: Steady, full: np.ndarray) -> float:
    """Mean seconds per steady step from the last batch's arrival to the first forward after it, less
    the built-in stages in between (over the fully recorded steady steps, ``full``)."""
    sp = timeline.spans
    names = sp.names
    if "data" not in names or "forward" not in names:
        return 0.0
    ids = sp.name_id
    data_end = np.sort(sp.end[ids == names.index("data")])
    fwd_start = np.sort(sp.start[ids == names.index("forward")])
    if not len(data_end) or not len(fwd_start):
        return 0.0
    # per steady step: the last batch to arrive in it, and the first forward after that, in the step
    lo, hi = breakdown.start[steady.first :][full], breakdown.end[steady.first :][full]
    j = np.searchsorted(data_end, hi, side="right") - 1
    arrive = data_end[np.maximum(j, 0)]
    f = np.searchsorted(fwd_start, arrive)
    fwd = fwd_start[np.minimum(f, len(fwd_start) - 1)]
    ok = (j >= 0) & (arrive >= lo) & (f < len(fwd_start)) & (fwd <= hi)
    arrive, fwd = arrive[ok], fwd[ok]
    # less the time in built-in stages: C(t), the built-in time up to t, is piecewise linear
    builtin = np.isin(ids, [names.index(n) for n in STAGES if n in names]) & (sp.depth >= 0)
    b_start, b_end = merge_intervals(sp.start[builtin], sp.end[builtin])
    covered = np.zeros(len(arrive))
    if len(b_start):
        lengths = b_end - b_start
        before = np.concatenate(([0.0], np.cumsum(lengths)[:-1]))
        xp = np.column_stack((b_start, b_end)).reshape(-1)
        fp = np.column_stack((before, before + lengths)).reshape(-1)
        covered = np.interp(fwd, xp, fp) - np.interp(arrive, xp, fp)
    return float(((fwd - arrive) - covered).sum()) / max(int(full.sum()), 1)
