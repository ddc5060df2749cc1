"""What a training step is: the one policy the recorder, the folding and the analysis share.

Collectors mark step boundaries as zero-length ``step:<kind>`` spans. Several kinds may
be marked in one window; the strongest kind present delimits every step, in this order
of evidence (:data:`EVIDENCE`):

1. ``profiler_step``: a trace's ``ProfilerStep#N`` ranges (traces only);
2. ``user``: ``perfmagic.step()``, and the step annotations of JAX's profiler: the user
   said where a step ends;
3. ``optimizer``: the outermost optimizer step (torch optimizers, ``GradScaler.step``,
   Keras's train batches): with gradient accumulation, one step is one update;
4. ``batch``: a DataLoader (or tf.data) batch fetched: a step runs from one fetch to the
   next, and a fetch that finds the epoch over ends the epoch's last step;
5. ``backward``: the rhythm of a loop with neither (a manual ``p.data.add_`` update, as
   pytorch/examples' word_language_model does): each outermost backward pass ends a step.

Every kind but ``batch`` marks a step's end: the first step starts with the window's
first stage, each next one where the last ended; a trace's steps start where their
``ProfilerStep#N`` ranges began (``profiler_step_start``), so a gap between ranges is in
no step. The recorder writes ``backward`` boundaries only until a stronger kind appears, so a loop with an optimizer pays for one at most. An evaluation pass
(``eval_start``/``eval_end``) is no step: the step before it ends where it began, the
step after it starts where it ended.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Protocol

from perfmagic.schema import STEP_BOUNDARY_PREFIX

if TYPE_CHECKING:
    import numpy as np


class Spans(Protocol):
    """The span columns the policy reads (``perfmagic.timeline.Spans``): boundaries are zero-length spans."""

    @property
    def names(self) -> list[str]: ...
    @property
    def name_id(self) -> np.ndarray: ...
    @property
    def start(self) -> np.ndarray: ...
    @property
    def end(self) -> np.ndarray: ...
    @property
    def depth(self) -> np.ndarray: ...
    def __len__(self) -> int: ...


EVIDENCE = ("profiler_step", "user", "optimizer", "batch", "backward")
"""Kinds of step boundaries, strongest first: the first one present delimits the steps."""

NOT_STEP_ENDS = ("loader_end", "eval_start", "eval_end", "profiler_step_start")
"""Boundary kinds that end no step: a DataLoader pass ran out, an evaluation pass began or ended, a
trace's ``ProfilerStep#N`` range began."""

STEP_ENDS = frozenset({"profiler_step", "user", "optimizer", "backward"})
"""Kinds whose boundary is a step's end (a ``batch`` boundary is a step's start)."""

ENDS_BATCH_STEPS = frozenset({"user", "optimizer"})
"""Kinds that, once marked, leave DataLoader batches ending no step (the recorder's cue)."""

ENDS_RHYTHM = frozenset({"user", "optimizer", "batch"})
"""Kinds that, once marked, make the backward rhythm unnecessary: the recorder stops writing it."""

MARK_STEP_HINT = "perfmagic.step()"
"""The call that marks steps where no evidence does."""


def delimiting_kind(present: Collection[str]) -> str | None:
    """The kind that delimits the steps, of the boundary kinds ``present`` (None: no steps)."""
    return next((kind for kind in EVIDENCE if kind in present), None)


def boundary_times(spans: Spans, span_is_boundary: np.ndarray, kind: str) -> np.ndarray:
    """Sorted times of the ``kind`` boundaries among ``spans``."""
    import numpy as np

    key = STEP_BOUNDARY_PREFIX + kind
    if key not in spans.names:
        return np.zeros(0)
    return np.sort(spans.start[span_is_boundary & (spans.name_id == spans.names.index(key))])


def step_bounds(
    spans: Spans,
    span_is_boundary: np.ndarray,
    stage_mask: np.ndarray,
    only: str | None = None,
    since: float | None = None,
) -> tuple[str | None, np.ndarray, np.ndarray]:
    """``(kind, starts, ends)`` of the steps among ``spans``: of kind ``only``, else of the strongest kind
    present, after ``since`` (where older steps were folded away)."""
    import numpy as np

    stage_start = spans.start[stage_mask & (spans.depth == 0)] if len(spans) else np.zeros(0)
    stage_end = spans.end[stage_mask] if len(spans) else np.zeros(0)
    for kind in EVIDENCE if only is None else (only,):
        t = boundary_times(spans, span_is_boundary, kind)
        if since is not None:  # steps before it were folded: a batch boundary at it starts the next one
            t = t[t >= since] if kind == "batch" else t[t > since]
        if not len(t):  # no such boundary (or a name interned without a span: a timeline built by hand)
            continue
        if kind == "batch":
            starts, ends = _batch_steps(spans, span_is_boundary, stage_mask, stage_end, t)
        else:
            before = stage_start[stage_start < t[0]]
            first = since if since is not None else float(before.min()) if len(before) else 0.0
            recorded = _recorded_starts(spans, span_is_boundary, kind, t)
            begun = np.concatenate(([first], t[:-1])) if recorded is None else recorded
            starts, ends = _around_evaluations(spans, span_is_boundary, begun, t)
        if len(starts):
            return kind, starts.astype(float), ends.astype(float)
    return None, np.zeros(0), np.zeros(0)


def _recorded_starts(
    spans: Spans, span_is_boundary: np.ndarray, kind: str, ends: np.ndarray
) -> np.ndarray | None:
    """A trace's ``ProfilerStep#N`` ranges as recorded: each step starts where its range began
    (``profiler_step_start``), so a gap between two ranges is no step's; None where the starts are not
    one per end, each at or before its end (a step then starts where the one before it ended)."""
    import numpy as np

    if kind != "profiler_step":
        return None
    starts = boundary_times(spans, span_is_boundary, "profiler_step_start")
    if len(starts) < len(ends):
        return None
    starts = starts[-len(ends) :]  # folded steps (older ones) leave their starts behind
    if np.any(starts > ends) or np.any(starts[1:] < ends[:-1]):
        return None
    return starts


def _batch_steps(
    spans: Spans, span_is_boundary: np.ndarray, stage_mask: np.ndarray, stage_end: np.ndarray, t: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """A batch boundary is the start of a fetch: step i runs from fetch i to fetch i+1, unless fetch i
    found its loader exhausted (a ``loader_end`` follows it): then it ends an epoch."""
    import numpy as np

    over = np.append(boundary_times(spans, span_is_boundary, "loader_end"), np.inf)
    following = np.append(t[1:], np.inf)
    keep = over[np.searchsorted(over, t)] >= following  # no loader_end before the next fetch
    starts, ends = t[:-1][keep[:-1]], t[1:][keep[:-1]]
    if keep[-1] and len(stage_end):
        data_id = spans.names.index("data") if "data" in spans.names else -1
        tail = stage_mask & (spans.start > t[-1]) & (spans.name_id != data_id)
        if tail.any():  # the loop left without exhausting the loader (break, max_steps)
            starts, ends = np.append(starts, t[-1]), np.append(ends, stage_end.max())
    return starts, ends


def _around_evaluations(
    spans: Spans, span_is_boundary: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Steps that end at boundaries, with the evaluation passes among them cut out."""
    import numpy as np

    evals = boundary_times(spans, span_is_boundary, "eval_end")
    if not len(evals):
        return starts, ends
    # a step that holds an evaluation pass starts where the last one ended
    last = np.searchsorted(evals, ends, side="right") - 1
    starts = np.where(last >= 0, np.maximum(starts, evals[np.maximum(last, 0)]), starts)
    # ...and the step before it ends where the pass began: what ran after its optimizer step and
    # before the pass (a checkpoint, logging) is that step's, not dropped with the pass
    began = boundary_times(spans, span_is_boundary, "eval_start")
    if len(began):
        following = np.append(ends[1:], np.inf)
        j = np.searchsorted(began, ends, side="right")
        nxt = began[np.minimum(j, len(began) - 1)]
        ends = np.where((j < len(began)) & (nxt < following), np.maximum(ends, nxt), ends)
    return starts, ends
