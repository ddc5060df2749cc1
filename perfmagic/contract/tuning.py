"""Tuning results: what ``perfmagic.tuning`` measured of each knob after the window (``tuning``)."""

from __future__ import annotations

from typing import Any, TypedDict


class _Trial(TypedDict):
    value: Any  # the knob's setting: a count, a flag, a dtype name, or (``step``) the settings used
    seconds: float  # per batch or per step, as the knob's ``unit`` says


class Trial(_Trial, total=False):
    """One setting of a knob, timed."""

    start_s: float  # num_workers: seconds to the first batch
    batches: int  # num_workers: batches timed
    peak_bytes: int  # batch_size on CUDA: the allocator's most in use over one step (all it held counted)


class Confirmation(TypedDict):
    """The best setting timed again beside the baseline, in alternating slices."""

    pairs: int  # adjacent (baseline, best) slices timed
    ratio: float  # median of best seconds / baseline seconds over the pairs
    low: float  # 10th percentile of the pairs' ratios
    high: float  # 90th percentile


class _KnobResult(TypedDict):
    knob: str  # "num_workers", "persistent_workers", "pin_memory", "num_threads", …, "step"
    unit: str | None  # what ``seconds`` measures
    baseline: Trial | None  # the setting the loop had
    tried: list[Trial]
    best: Trial | None  # None where nothing could be compared
    speedup: float | None  # baseline seconds / best seconds
    notes: list[str]


class KnobResult(_KnobResult, total=False):
    """One knob's result."""

    budget_s: float | None  # the seconds it was given
    confirmed: Confirmation  # num_workers: the best count against the baseline, in pairs
    interval_s: list[float]  # step: the predicted step's 10th and 90th percentiles
    device: str  # batch_size: the device the step ran on ("cuda:0", "cpu")
