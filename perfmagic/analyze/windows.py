"""Stage seconds from the fully recorded steps, the rhythm from all (``collect.schedule``).

Outside the recording windows a step's end is marked but its stages are not: its fetches, forward,
backward and copies read as ``other``. Each such step keeps its own duration and the stages that are
recorded on every step (checkpoints, logging and syncs: rare, long, and not to be averaged away). The
rest of it is estimated: each stage takes its mean seconds in the fully recorded steps nearest the step,
and the step's difference from their sum goes to the stages in the proportions the fully recorded steps'
stages grew with their length (least-squares slopes); what passes the longest of those steps, which
nothing recorded explains, goes in the stages' typical shares. A stall of the loop's own code that the
windows missed is then ``other``'s, as the stalls they saw were, not spread over the stages. A fully
recorded step that stands alone far past all others (a collection, a preemption) keeps its own stages
but sets neither the typical seconds, the slopes nor the reach. Per-step sums still make the step's
time, and every reader of the breakdown (stage shares, bottleneck, plan, step table) reads the same
estimate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from perfmagic.collect.schedule import (
    BOUNDARY_CALLS_PER_STEP,
    FULL_CALLS_PER_STEP,
    FULL_STEP_COST_S,
    MEASURED_PERIODS,
    SETTLING_STEPS,
    WINDOW,
    WINDOW_STEP_COST_S,
    estimated_cost_s,
    median_and_error,
)
from perfmagic.schema import RECORDING

if TYPE_CHECKING:
    from perfmagic.analyze.steps import StepBreakdown
    from perfmagic.contract import Recording
    from perfmagic.timeline import Timeline

EVERY_STEP_STAGES = frozenset({"checkpoint", "logging"})
"""Stages whose hooks stay in place on every step: measured in each step, never estimated."""

NEAREST = 2 * WINDOW
"""Fully recorded steps on each side of a step that was not whose shares it takes: two windows' worth,
so a run whose stages drift (loading that slows, a warm-up) is estimated from its own stretch."""

MEASURED_SHARE_ERROR = 0.0025
"""The largest standard error, as a share of the step, with which the windows' measured cost replaces the
estimate in ``overhead_fraction`` (a busy machine's steps vary too much for it to say more)."""

ALONE = 2.0
"""How many times farther from the usual length than any other a fully recorded step must be for the
estimate to leave it out (:func:`_usual`)."""

_TOLERANCE_S = 1e-6
"""A change of recording this close to a step's end is at its end (folded steps' ends are float32 sums)."""


def full_steps(timeline: Timeline, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per step: whether every stage hook was in place from its start to its end (``schema.RECORDING``)."""
    t, v = timeline.series(RECORDING)
    return full_between(t, v > 0.5, start, end)


def full_between(
    times: Sequence[float] | np.ndarray, full: Sequence[bool] | np.ndarray, start: np.ndarray, end: np.ndarray
) -> np.ndarray:
    """Per step: whether it was recorded fully, from the changes of recording at ``times`` (in order) to
    ``full`` or not; a step before the first change was."""
    if not len(times):
        return np.ones(len(start), dtype=bool)
    t, on = np.asarray(times, dtype=np.float64), np.asarray(full, dtype=bool)
    before = np.searchsorted(t, start + _TOLERANCE_S, side="right")  # the last change at or before it
    state = np.where(before > 0, on[np.maximum(before - 1, 0)], True)
    changed_inside = np.searchsorted(t, end - _TOLERANCE_S, side="left") > before
    steps: np.ndarray = state & ~changed_inside
    return steps


def from_windows(b: StepBreakdown, full: np.ndarray) -> StepBreakdown:
    """``b`` with the stage seconds of its steps that were not fully recorded estimated from the fully
    recorded steps (see the module's doc); ``b.full`` says which were. Unchanged where no step is fully
    recorded."""
    b = replace(b, full=full)
    # the window's first step is warm-up: its stages are not the steady ones
    model = np.flatnonzero(full)
    if len(model) > 1 and model[0] == 0:
        model = model[1:]
    partial = np.flatnonzero(~full)
    if not len(partial) or not len(model):
        return b
    kept = np.array([s in EVERY_STEP_STAGES for s in b.stages], dtype=bool)
    seconds = b.seconds.copy()
    rest = np.maximum(b.durations - seconds[:, kept].sum(axis=1), 0.0)
    model = model[_usual(rest[model])]
    recorded = seconds[model][:, ~kept]
    # per partial step, each stage's mean seconds over the NEAREST fully recorded steps on each side
    at = np.searchsorted(model, partial)
    lo, hi = np.maximum(at - NEAREST, 0), np.minimum(at + NEAREST, len(model))
    cumulative = np.vstack((np.zeros((1, recorded.shape[1])), np.cumsum(recorded, axis=0)))
    typical = (cumulative[hi] - cumulative[lo]) / (hi - lo)[:, None]
    # a step longer or shorter than those is so in the stages whose seconds moved with the fully
    # recorded steps' length: a hiccup in the loop's own code is ``other``'s, a slow fetch ``data``'s
    # the slopes leave out the first window's steps: a warm-up's slow first forwards would claim the
    # length of every longer step
    after = slice(WINDOW, None) if len(model) >= 4 * WINDOW else slice(None)
    lengths = rest[model][after]
    growth = _growth(recorded[after], lengths)
    # past the longest the fully recorded steps were, nothing says where the time went: that part of
    # a step goes to the stages in their typical shares (a preemption lands in a stage as often as the
    # stage runs)
    reach = float(np.abs(lengths - lengths.mean()).max())
    typical_s = typical.sum(axis=1)
    excess = rest[partial] - typical_s
    seen = np.minimum(excess, reach)
    shares = typical / np.where(typical_s > 0, typical_s, np.inf)[:, None]
    guess = typical + np.outer(seen, growth) + (excess - seen)[:, None] * shares
    guess = np.maximum(guess, 0.0)
    total = guess.sum(axis=1)
    scale = np.divide(rest[partial], total, out=np.zeros_like(total), where=total > 0)
    guess *= scale[:, None]
    guess[total <= 0, -1] = rest[partial][total <= 0]  # nothing to go by: the step is ``other``
    seconds[np.ix_(partial, ~kept)] = guess
    return replace(b, seconds=seconds)


def _usual(lengths: np.ndarray) -> np.ndarray:
    """Which fully recorded steps the estimate goes by: all but the few farthest from their median
    length that stand alone, each more than :data:`ALONE` times as far as the next (at most one in 50).
    One step that a collection or a preemption made a thousand times longer would otherwise set the
    typical seconds of the steps near it and send every longer step's extra time to its stage; a stall
    the loop makes again and again is its rhythm, and stays."""
    usual = np.ones(len(lengths), dtype=bool)
    far = np.abs(lengths - np.median(lengths))
    order = np.argsort(far)[::-1]
    for k in range(min(max(1, len(lengths) // 50), len(lengths) - 1)):
        if far[order[k]] <= ALONE * far[order[k + 1]]:
            break
        usual[order[k]] = False
    return usual


def _growth(seconds: np.ndarray, rest: np.ndarray) -> np.ndarray:
    """Per stage, the seconds it gains per second a fully recorded step is longer (a least-squares
    slope; the slopes sum to 1, as a step's stages sum to its length); in proportion to the stages'
    totals where the steps are all of one length."""
    longer = rest - rest.mean()
    spread = float(longer @ longer)
    totals = seconds.sum(axis=0)
    if spread <= 1e-12 * max(float(rest @ rest), 1e-300):
        share: np.ndarray = (
            totals / totals.sum() if totals.sum() > 0 else np.full(len(totals), 1 / len(totals))
        )
        return share
    slopes: np.ndarray = (seconds - seconds.mean(axis=0)).T @ longer / spread
    return slopes


def windowed(timeline: Timeline) -> bool:
    """Whether some of the timeline's steps were recorded at their ends only."""
    _, v = timeline.series(RECORDING)
    return bool((v < 0.5).any())


def step_stage_clocks(b: StepBreakdown) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per stage, the knots of its cumulative seconds over the steps, each step's (estimated) seconds
    spread evenly over it: what splits a sampled figure (power) among stages where the spans alone
    would leave the steps outside the windows to ``other`` (as ``steps.stage_clocks``, ``other`` left
    for the rest)."""
    if not b.count:
        return {}
    order = np.argsort(b.start)
    knots = np.column_stack((b.start[order], b.end[order])).ravel()
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for j, name in enumerate(b.stages):
        if name == "other":
            continue
        cumulative = np.cumsum(b.seconds[order, j])
        before = np.concatenate(([0.0], cumulative[:-1]))
        out[name] = (knots, np.column_stack((before, cumulative)).ravel())
    return out


def recording_section(timeline: Timeline, b: StepBreakdown, step_s: float | None) -> Recording:
    """``recording``: how the steps were recorded, and what the hooks cost them: the calls a plain step's
    hooks add (as counted by ``benchmarks/hot_path_calls.py``), and their seconds in place, estimated
    (``collect.schedule``: :data:`FULL_STEP_COST_S` a step where all are recorded fully; else
    :func:`estimated_cost_s` of the windows' share); where the windows were measured
    (:func:`window_cost`) within :data:`MEASURED_SHARE_ERROR`, a window step's part is the measured one."""
    full = b.full if b.full is not None else np.ones(b.count, dtype=bool)
    n_full, is_windowed = int(full.sum()), windowed(timeline)
    measured = window_cost(b)
    section: Recording = {
        "mode": "windowed" if is_windowed else "full",
        "full_steps": n_full,
        "steps": b.count,
        "calls_per_step": None,
        "window_cost_s": measured[0] if measured is not None else None,
        "window_cost_error_s": measured[1] if measured is not None else None,
        "overhead_fraction": None,
    }
    if not b.count:
        return section
    section["calls_per_step"] = (
        n_full * FULL_CALLS_PER_STEP + (b.count - n_full) * BOUNDARY_CALLS_PER_STEP
    ) / b.count
    overhead_s = FULL_STEP_COST_S
    if is_windowed:
        window_step_s = WINDOW_STEP_COST_S
        if (
            measured is not None
            and step_s
            and n_full * measured[1] / b.count <= MEASURED_SHARE_ERROR * step_s
        ):
            window_step_s = measured[0]  # the windows' part measured closely enough
        overhead_s = estimated_cost_s(n_full / b.count, window_step_s)
    section["overhead_fraction"] = overhead_s / step_s if step_s else None
    return section


def window_cost(b: StepBreakdown) -> tuple[float, float] | None:
    """What recording a step fully added to it, measured: for each step of a window (:data:`WINDOW` steps
    after the start) and each of the :data:`SETTLING_STEPS` after it (the hooks' removal), its median
    over the windows, less the median step outside the windows (the ones before each window, less their
    first :data:`SETTLING_STEPS`); summed, per window step, with its standard error. Medians, as a busy
    machine's slow steps fall on any step: a mean of the steps outside would take them in, while most
    windows miss them. Without the stages recorded on every step (a checkpoint falls outside the windows
    nine times in ten). None under :data:`MEASURED_PERIODS` windows."""
    if b.full is None or b.full.all():
        return None
    seconds = b.durations - sum(
        (b.column(name) for name in EVERY_STEP_STAGES if name in b.stages), np.zeros(b.count)
    )
    edges = np.flatnonzero(np.diff(b.full.astype(np.int8))) + 1  # where a run of steps begins
    runs = np.split(np.arange(b.count), edges)[1:]  # the start's run left out
    settle = SETTLING_STEPS
    measured = [
        (before[settle:], np.concatenate((window, after[:settle])))
        for before, window, after in zip(runs, runs[1:], runs[2:], strict=False)
        if not b.full[before[0]] and len(window) == WINDOW and len(before) > settle and len(after) >= settle
    ]
    if len(measured) < MEASURED_PERIODS:
        return None
    paid = seconds[np.array([steps for _, steps in measured])]  # per window, its steps and the settling
    by_position = [median_and_error(paid[:, j].tolist()) for j in range(paid.shape[1])]
    outside, outside_error = median_and_error(seconds[np.concatenate([o for o, _ in measured])].tolist())
    added = (sum(m for m, _ in by_position) - paid.shape[1] * outside) / WINDOW
    error = math.sqrt(sum(e * e for _, e in by_position) + (paid.shape[1] * outside_error) ** 2) / WINDOW
    return added, error
