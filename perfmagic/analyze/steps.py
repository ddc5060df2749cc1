"""Steps and the per-step stage breakdown, from a timeline's stage spans.

Where steps begin and end is :mod:`perfmagic.step_policy`'s to say. Every instant
of a step belongs to exactly one stage: the innermost stage open at that instant,
or ``other`` when none is. So per-step stage times always add up to the step
time, and fractions to 1.

On long runs the session folds old steps into rows (:func:`plan_fold`): the
breakdown is then those rows followed by the steps of the spans still held,
cut at the same boundary kind.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from perfmagic.analyze.windows import from_windows, full_steps
from perfmagic.schema import (
    STAGES,
    STEP_BOUNDARY_PREFIX,
    THREAD_CPU,
    THREAD_GC,
    THREAD_PREFIX,
    THREAD_WAIT,
)
from perfmagic.step_policy import boundary_times, step_bounds
from perfmagic.timeline import Spans, Timeline
from perfmagic.timeline.folds import Fold, FoldedSteps


@dataclass(frozen=True)
class StepBreakdown:
    """Steps of one process and the time each stage took in each step."""

    boundary: str | None  # which kind of boundary delimited the steps
    start: np.ndarray  # (n,) step start times, seconds on the timeline clock
    end: np.ndarray  # (n,)
    stages: list[str]  # column names: built-in stages in order, then user stages, "other" last
    seconds: np.ndarray  # (n, len(stages)) exclusive seconds of each stage in each step
    # per step, measured on the profiled thread (None where unmeasured): its CPU seconds, its seconds
    # runnable but waiting for a CPU, and the seconds Python's garbage collector ran on it
    cpu_s: np.ndarray | None = None
    wait_s: np.ndarray | None = None
    gc_s: np.ndarray | None = None
    # per step, whether its stages were recorded fully (None: all were); the others' stage seconds are
    # estimates from those (``analyze.windows``)
    full: np.ndarray | None = None

    @property
    def count(self) -> int:
        return len(self.start)

    @property
    def durations(self) -> np.ndarray:
        durations: np.ndarray = self.end - self.start
        return durations

    def column(self, stage: str) -> np.ndarray:
        return self.seconds[:, self.stages.index(stage)]


def step_breakdown(timeline: Timeline) -> StepBreakdown:
    """Find the steps of a timeline and split each one into stages (from the fully recorded steps where
    stages were recorded in windows: ``analyze.windows``)."""
    point = timeline.fold_point
    if point is None:
        b = _breakdown(timeline, timeline.spans)
    else:
        held = _breakdown(timeline, timeline.spans, kind=point[0], since=point[1])
        folded = timeline.folded
        b = held if folded is None else _join(folded, held)
    return from_windows(b, full_steps(timeline, b.start, b.end))


def plan_fold(
    timeline: Timeline, keep: int, settled: int, settled_samples: Callable[[str], int]
) -> Fold | None:
    """A fold of the oldest whole steps into rows, keeping at least the newest ``keep`` spans.

    Only spans before the logical index ``settled`` (on disk, times final) and samples before
    ``settled_samples(metric)`` may go. None when no whole step can.
    """
    point = timeline.fold_point
    spans = timeline.spans
    base = timeline.span_base
    limit = min(settled - base, len(spans) - keep)
    if limit <= 0:
        return None
    b = _breakdown(timeline, spans, *(point or (None, None)))
    if b.count < 2 or b.boundary is None:
        return None
    names = spans.names
    is_boundary = np.array([n.startswith(STEP_BOUNDARY_PREFIX) for n in names], dtype=bool)[spans.name_id]
    batch_id = names.index(STEP_BOUNDARY_PREFIX + "batch") if b.boundary == "batch" else -1

    def prefix(until: float) -> int:
        """How many leading spans lie wholly before ``until`` (a batch boundary at it starts the next step)."""
        gone = np.where(
            is_boundary,
            (spans.start < until) | ((spans.start == until) & (spans.name_id != batch_id)),
            spans.end <= until,
        )
        return int(np.argmin(gone)) if not gone.all() else len(gone)

    lo, hi = -1, b.count - 1  # the last step stays: it may still grow
    read_at, _ = timeline.series(THREAD_CPU)
    if len(read_at):  # steps after the thread clock's last reading stay until one covers them
        hi = min(hi, int(np.searchsorted(b.end, read_at[-1], side="right")))
    while hi - lo > 1:  # the last step j whose spans fit in the limit
        mid = (lo + hi) // 2
        if prefix(float(b.end[mid])) <= limit:
            lo = mid
        else:
            hi = mid
    if lo < 0:
        return None
    until = float(b.end[lo])
    count = prefix(until)
    n = lo + 1
    samples: dict[str, int] = {}
    for metric in timeline.metrics:
        if metric.startswith(THREAD_PREFIX):
            t, _ = timeline.series(metric)
            # the last sample at or before the cut stays: the next step's counters start from it
            gone = int(np.searchsorted(t, until, side="right")) - 1
            samples[metric] = max(0, min(gone, settled_samples(metric) - timeline.sample_base(metric)))

    def per_step(column: np.ndarray | None) -> np.ndarray:
        return column[:n] if column is not None else np.full(n, np.nan)

    rows = FoldedSteps(
        kind=b.boundary,
        until=until,
        start=b.start[:n],
        duration=b.durations[:n],
        stages={stage: b.seconds[:n, j] for j, stage in enumerate(b.stages[:-1])},  # "other": the rest
        cpu_s=per_step(b.cpu_s),
        wait_s=per_step(b.wait_s),
        gc_s=per_step(b.gc_s),
    )
    return Fold(spans=count, steps=rows, samples=samples)


def _breakdown(
    timeline: Timeline, spans: Spans, kind: str | None = None, since: float | None = None
) -> StepBreakdown:
    """The steps of the spans held, of boundary ``kind`` (else the first kind found), after ``since``."""
    names = spans.names
    is_boundary = np.array([n.startswith(STEP_BOUNDARY_PREFIX) for n in names], dtype=bool)
    span_is_boundary = is_boundary[spans.name_id] if len(spans) else np.zeros(0, dtype=bool)
    stage_mask = ~span_is_boundary

    kind, starts, ends = step_bounds(spans, span_is_boundary, stage_mask, kind, since)
    columns, seconds = _stage_seconds(spans, is_boundary, stage_mask, starts, ends)
    cpu_s = _per_step(timeline, THREAD_CPU, starts, ends)
    wait_s = _per_step(timeline, THREAD_WAIT, starts, ends)
    gc_s = _per_step(timeline, THREAD_GC, starts, ends)
    if wait_s is not None:
        # on a CPU and waiting for one are disjoint, and both within the step. The kernel's run delay
        # can outgrow the wall clock between two readings (a wait timed on two CPUs' unsynchronised
        # scheduler clocks, seen in VMs: 5.7 ms of it in 1.1 ms): the wait is what the step leaves
        wait_s = np.minimum(wait_s, np.maximum(ends - starts - (cpu_s if cpu_s is not None else 0.0), 0.0))
    return StepBreakdown(kind, starts, ends, columns, seconds, cpu_s, wait_s, gc_s)


def ended_steps(spans: Spans, kind: str | None = None, since: float | None = None) -> StepBreakdown:
    """The steps among ``spans`` (a tail of a timeline's) that a boundary has ended, after ``since``.

    What a live view adds up while a run goes on: the step still running is left for next time,
    and only stage times are split out (no thread clocks).
    """
    names = spans.names
    is_boundary = np.array([n.startswith(STEP_BOUNDARY_PREFIX) for n in names], dtype=bool)
    span_is_boundary = is_boundary[spans.name_id] if len(spans) else np.zeros(0, dtype=bool)
    stage_mask = ~span_is_boundary
    kind, starts, ends = step_bounds(spans, span_is_boundary, stage_mask, kind, since)
    if kind is not None:
        last = boundary_times(spans, span_is_boundary, kind)
        ended = ends <= last[-1]
        starts, ends = starts[ended], ends[ended]
    columns, seconds = _stage_seconds(spans, is_boundary, stage_mask, starts, ends)
    return StepBreakdown(kind, starts, ends, columns, seconds)


def stage_clocks(timeline: Timeline) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per stage, the knots of its cumulative exclusive seconds over the spans the timeline holds.

    A stage's seconds in [a, b] are ``np.interp(b, *knots) - np.interp(a, *knots)``: what lets a
    sampled figure (power, energy) be split among the stages open while it was sampled.
    """
    spans = timeline.spans
    names = spans.names
    is_boundary = np.array([n.startswith(STEP_BOUNDARY_PREFIX) for n in names], dtype=bool)
    stage_mask = ~is_boundary[spans.name_id] if len(spans) else np.zeros(0, dtype=bool)
    if not stage_mask.any():
        return {}
    return {names[sid]: knots for sid, knots in _exclusive_cumulative(spans, stage_mask).items()}


def _stage_seconds(
    spans: Spans, is_boundary: np.ndarray, stage_mask: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[list[str], np.ndarray]:
    """The stage columns and each step's exclusive seconds in each (``other``: the rest of the step)."""
    names = spans.names
    columns = _stage_columns(names, is_boundary, spans.name_id[stage_mask])
    seconds = np.zeros((len(starts), len(columns)))
    if len(starts):
        cumulative = _exclusive_cumulative(spans, stage_mask)
        for j, stage in enumerate(columns[:-1]):
            xp_fp = cumulative.get(names.index(stage))
            if xp_fp is not None:
                xp, fp = xp_fp
                seconds[:, j] = np.interp(ends, xp, fp) - np.interp(starts, xp, fp)
        seconds = np.maximum(seconds, 0.0)
        seconds[:, -1] = np.maximum((ends - starts) - seconds[:, :-1].sum(axis=1), 0.0)
    return columns, seconds


def _join(folded: FoldedSteps, held: StepBreakdown) -> StepBreakdown:
    """Folded rows, then the steps of the spans held."""
    used = set(folded.stages) | set(held.stages)
    columns = [*(s for s in STAGES if s != "other" and s in used), *sorted(used - set(STAGES)), "other"]
    seconds = np.zeros((len(folded) + held.count, len(columns)))
    for j, stage in enumerate(columns):
        if stage in folded.stages:
            seconds[: len(folded), j] = folded.stages[stage]
        if stage in held.stages:
            seconds[len(folded) :, j] = held.column(stage)
    rows = seconds[: len(folded)]
    rows[:, -1] = np.maximum(folded.duration - rows[:, :-1].sum(axis=1), 0.0)

    def joined(rows: np.ndarray, steps: np.ndarray | None) -> np.ndarray | None:
        # a counter measured over part of the run only says nothing of the whole
        if (steps is None and held.count) or np.isnan(rows).any():
            return None
        return np.concatenate((rows, steps if steps is not None else np.zeros(0)))

    return StepBreakdown(
        boundary=folded.kind,
        start=np.concatenate((folded.start, held.start)),
        end=np.concatenate((folded.start + folded.duration, held.end)),
        stages=columns,
        seconds=seconds,
        cpu_s=joined(folded.cpu_s, held.cpu_s),
        wait_s=joined(folded.wait_s, held.wait_s),
        gc_s=joined(folded.gc_s, held.gc_s),
    )


def _per_step(timeline: Timeline, metric: str, starts: np.ndarray, ends: np.ndarray) -> np.ndarray | None:
    """A cumulative per-thread counter's growth in each step; None where it was not sampled."""
    t, v = timeline.series(metric)
    ok = np.isfinite(v)
    if ok.sum() < 2 or not len(starts):
        return None
    t, v = t[ok], v[ok]
    per: np.ndarray = np.maximum(np.interp(ends, t, v) - np.interp(starts, t, v), 0.0)
    return per


def _stage_columns(names: list[str], is_boundary: np.ndarray, used_ids: np.ndarray) -> list[str]:
    used = {names[i] for i in np.unique(used_ids)}
    builtin = [s for s in STAGES if s != "other" and s in used]
    user = sorted(n for n in used if n not in STAGES and not is_boundary[names.index(n)])
    return [*builtin, *user, "other"]


def _exclusive_cumulative(spans: Spans, stage_mask: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per stage id, the knots of its cumulative exclusive time C(t) (piecewise linear).

    A stage's time in [a, b] is then ``interp(b) - interp(a)``.
    """
    idx = np.flatnonzero(stage_mask)
    order = idx[np.lexsort((spans.depth[idx], spans.start[idx]))]
    # flat (a, b) pairs in arrays: a long run's hundreds of thousands of segments stay out of the heap
    segments: dict[int, array[float]] = {}

    # A span that overlaps no other is its own exclusive time: most spans, where no stage nests in
    # another. Taken at once here; the walk below takes the runs of overlapping spans (a run ends
    # where a span starts at or after every earlier end).
    first, last = spans.start[order], spans.end[order]
    begins_run = np.ones(len(order), dtype=bool)
    begins_run[1:] = first[1:] >= np.maximum.accumulate(last)[:-1]
    run = np.cumsum(begins_run) - 1
    alone = np.bincount(run)[run] == 1
    solo = alone & (last > first)
    solo_ids = spans.name_id[order][solo]
    for sid in np.unique(solo_ids):
        mine = solo_ids == sid
        ends_of_mine = np.column_stack((first[solo][mine], last[solo][mine]))
        segments[int(sid)] = array("d", ends_of_mine.astype(np.float64).tobytes())
    order = order[~alone]

    def emit(sid: int, a: float, b: float) -> None:
        if b > a:
            pairs = segments.get(sid)
            if pairs is None:
                pairs = segments[sid] = array("d")
            pairs.append(a)
            pairs.append(b)

    # stack entries: [stage id, end, cursor]; a parent's exclusive time pauses while a child runs
    stack: list[list[float]] = []
    starts, ends, ids = spans.start, spans.end, spans.name_id
    for i in order:
        s, e, sid = float(starts[i]), float(ends[i]), int(ids[i])
        while stack and stack[-1][1] <= s:
            top = stack.pop()
            emit(int(top[0]), top[2], top[1])
            if stack:
                stack[-1][2] = top[1]
        if stack:
            parent = stack[-1]
            emit(int(parent[0]), parent[2], s)
            e = min(e, parent[1])
            parent[2] = e
        stack.append([sid, e, s])
    while stack:
        top = stack.pop()
        emit(int(top[0]), top[2], top[1])
        if stack:
            stack[-1][2] = max(stack[-1][2], top[1])

    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for sid, pairs in segments.items():
        arr = np.frombuffer(pairs, dtype=np.float64).reshape(-1, 2)
        arr = arr[np.lexsort((arr[:, 1], arr[:, 0]))]
        lengths = arr[:, 1] - arr[:, 0]
        before = np.concatenate(([0.0], np.cumsum(lengths)[:-1]))
        xp = arr.reshape(-1)
        fp = np.column_stack((before, before + lengths)).reshape(-1)
        out[sid] = (xp, fp)
    return out
