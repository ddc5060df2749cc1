"""Stage seconds from the fully recorded steps, the rhythm from all (``collect.schedule``).

Outside the recording windows a step's end is marked but its stages are not: its fetches, forward,
backward and copies read as ``other``. Each such step keeps its own duration and the stages that
are recorded on every step (checkpoints, logging and syncs: rare, long, and not to be averaged
away); the rest of it is split among the other stages in the shares the fully recorded steps give
them. Per-step sums still make the step's time, and every reader of the breakdown (stage shares,
bottleneck, plan, step table) reads the same estimate.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from perfmagic.schema import RECORDING_MARK

if TYPE_CHECKING:
    from perfmagic.analyze.steps import StepBreakdown
    from perfmagic.contract import Recording
    from perfmagic.timeline import Timeline

EVERY_STEP_STAGES = frozenset({"checkpoint", "logging"})
"""Stages whose hooks stay in place on every step: measured in each step, never estimated."""

FULL_CALLS_PER_STEP = 35.0
"""Python calls the full stage hooks add to a plain step (DataLoader, forward, loss, backward, SGD):
``benchmarks/hot_path_calls.py``, the thread clock's periodic reads left out."""

BOUNDARY_CALLS_PER_STEP = 9.0
"""Python calls a plain step pays outside the windows: its optimizer step's hooks and its end."""

CALL_COST_S = 1.5e-6
"""What one added Python call costs a fast training loop in place (1 to 2 µs: README *Measured*)."""

_TOLERANCE_S = 1e-6
"""A change of recording this close to a step's end is at its end (folded steps' ends are float32 sums)."""


def full_steps(timeline: Timeline, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per step: whether every stage hook was in place from its start to its end (``RECORDING_MARK``s)."""
    marks = sorted(timeline.marks(RECORDING_MARK), key=lambda m: m.t)
    if not marks:
        return np.ones(len(start), dtype=bool)
    t = np.array([m.t for m in marks])
    on = np.array([bool(m.data.get("full")) for m in marks])
    before = np.searchsorted(t, start + _TOLERANCE_S, side="right")  # the last change at or before it
    state = np.where(before > 0, on[np.maximum(before - 1, 0)], True)
    changed_inside = np.searchsorted(t, end - _TOLERANCE_S, side="left") > before
    full: np.ndarray = state & ~changed_inside
    return full


def from_windows(b: StepBreakdown, full: np.ndarray) -> StepBreakdown:
    """``b`` with the stage seconds of its steps that were not fully recorded estimated from those that
    were (see the module's doc); ``b.full`` says which were. Unchanged where no step is fully recorded."""
    b = replace(b, full=full)
    partial = ~full
    # the window's first step is warm-up: its shares are not the steady ones
    model = full.copy()
    if model[1:].any():
        model[0] = False
    if not partial.any() or not model.any():
        return b
    kept = np.array([s in EVERY_STEP_STAGES for s in b.stages], dtype=bool)
    seconds = b.seconds.copy()
    rest = np.maximum(b.durations - seconds[:, kept].sum(axis=1), 0.0)
    rest_total = float(rest[model].sum())
    if rest_total <= 0:
        return b
    shares = seconds[model][:, ~kept].sum(axis=0) / rest_total
    seconds[np.ix_(partial, ~kept)] = rest[partial, None] * shares[None, :]
    return replace(b, seconds=seconds)


def recording_section(timeline: Timeline, b: StepBreakdown, step_s: float | None) -> Recording:
    """``recording``: how the steps were recorded, and what the hooks cost them (an estimate: the calls a
    plain step's hooks add, as counted by ``benchmarks/hot_path_calls.py``, at :data:`CALL_COST_S` each)."""
    full = b.full if b.full is not None else np.ones(b.count, dtype=bool)
    windowed = any(not m.data.get("full") for m in timeline.marks(RECORDING_MARK))
    n_full = int(full.sum())
    calls = (
        (n_full * FULL_CALLS_PER_STEP + (b.count - n_full) * BOUNDARY_CALLS_PER_STEP) / b.count
        if b.count
        else None
    )
    return {
        "mode": "windowed" if windowed else "full",
        "full_steps": n_full,
        "steps": b.count,
        "calls_per_step": calls,
        "overhead_fraction": calls * CALL_COST_S / step_s if calls is not None and step_s else None,
    }
