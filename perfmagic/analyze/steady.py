"""The steady state of a run: its steps after warm-up, the view every rule reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import numpy as np

from perfmagic.analyze.steps import StepBreakdown, step_breakdown
from perfmagic.timeline import Timeline
from perfmagic.tuning import BENCHMARKED


@dataclass(frozen=True)
class Steady:
    """The steps after warm-up (the first step is dropped when there are three or more)."""

    first: int  # index of the first steady step in the breakdown
    durations: np.ndarray
    seconds: np.ndarray  # (steps, stages)
    stages: list[str]
    start: float  # the steady window, on the clock of the breakdown's timeline
    end: float
    cpu_s: np.ndarray | None = None  # per step: the profiled thread's CPU seconds…
    wait_s: np.ndarray | None = None  # …its seconds waiting for a CPU (None: unmeasured)…
    gc_s: np.ndarray | None = None  # …and the garbage collector's seconds on it

    @property
    def count(self) -> int:
        return len(self.durations)

    @property
    def step_s(self) -> float:
        """Mean steady step time: stage means add up to it."""
        return float(self.durations.mean())

    @property
    def median_s(self) -> float:
        return float(np.median(self.durations))

    def stage_s(self, *names: str) -> float:
        """Mean seconds per step spent in the given stages."""
        return sum(float(self.seconds[:, self.stages.index(n)].mean()) for n in names if n in self.stages)

    def share(self, *names: str) -> float:
        return self.stage_s(*names) / self.step_s if self.step_s > 0 else 0.0


def steady_of(b: StepBreakdown) -> Steady | None:
    """The steady-state steps of one process's breakdown; ``None`` without steps."""
    if not b.count:
        return None
    first = 1 if b.count >= 3 else 0
    return Steady(
        first=first,
        durations=b.durations[first:],
        seconds=b.seconds[first:],
        stages=list(b.stages),
        start=float(b.start[first]),
        end=float(b.end[-1]),
        cpu_s=b.cpu_s[first:] if b.cpu_s is not None else None,
        wait_s=b.wait_s[first:] if b.wait_s is not None else None,
        gc_s=b.gc_s[first:] if b.gc_s is not None else None,
    )


class TuningBaseline(TypedDict):
    step_s: float | None
    data_s: float | None
    extra_s: float


def tuning_baseline(timeline: Timeline) -> TuningBaseline:
    """What tuning measures its trials against: the window's steady ``step_s``, its ``data_s``, and
    ``extra_s``, the step's time outside the stages a trial benchmarks (0 where no step was steady)."""
    steady = steady_of(step_breakdown(timeline))
    if steady is None:
        return {"step_s": None, "data_s": None, "extra_s": 0.0}
    return {
        "step_s": steady.step_s,
        "data_s": steady.stage_s("data"),
        "extra_s": steady.step_s - steady.stage_s(*BENCHMARKED),
    }
