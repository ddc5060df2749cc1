"""Stage seconds added up while a run goes on: each look reads only the spans since the last one."""

from __future__ import annotations

import numpy as np

from perfmagic.analyze.steps import StepBreakdown, ended_steps
from perfmagic.analyze.windows import EVERY_STEP_STAGES, full_between
from perfmagic.schema import RECORDING
from perfmagic.timeline import Timeline


class RunningStages:
    """The steps a running timeline has ended so far and their seconds per stage, added up a few
    spans at a time: a look costs in proportion to the spans since the last one, not to the run.

    Where stages are recorded in windows (``analyze.windows``), ``totals`` split the steps outside them
    in the shares of the fully recorded ones so far."""

    def __init__(self) -> None:
        self.steps = 0
        self._every_step: dict[str, float] = {}  # stages recorded on every step: seconds over all steps
        self._full: dict[str, float] = {}  # the other stages: seconds over the fully recorded steps…
        self._full_rest = 0.0  # …and those steps' seconds outside the every-step stages
        self._rest = 0.0  # every step's seconds outside the every-step stages
        self._cursor = 0  # spans read up to this logical index…
        self._since: float | None = None  # …and steps added up to this time
        self._kind: str | None = None
        self._read = 0  # changes of recording read up to this index…
        # …and of them, those (time, to full or not) a later step may fall after
        self._changes: list[tuple[float, bool]] = []

    @property
    def totals(self) -> dict[str, float]:
        """Stage -> seconds over every step added."""
        scale = self._rest / self._full_rest if self._full_rest > 0 else 1.0
        return {**{name: s * scale for name, s in self._full.items()}, **self._every_step}

    def add_ended(self, timeline: Timeline) -> StepBreakdown | None:
        """Add the steps ended since the last look; returns them (None when no step has ended)."""
        first, spans = timeline.spans_since(self._cursor)
        steps = ended_steps(spans, self._kind, self._since)
        if not steps.count:
            return None
        self._kind, self._since = steps.boundary, float(steps.end[-1])
        # the spans a later step may still need: those ending at or after the last step's end
        later = np.flatnonzero(spans.end >= self._since)
        self._cursor = first + (int(later[0]) if len(later) else len(spans))
        full = self._full_steps(timeline, steps.start, steps.end)
        kept = [j for j, name in enumerate(steps.stages) if name in EVERY_STEP_STAGES]
        rest = steps.durations - steps.seconds[:, kept].sum(axis=1)
        self._rest += float(rest.sum())
        self._full_rest += float(rest[full].sum())
        for j, name in enumerate(steps.stages):
            into, rows = (self._every_step, slice(None)) if j in kept else (self._full, full)
            into[name] = into.get(name, 0.0) + float(steps.seconds[rows, j].sum())
        self.steps += steps.count
        return steps

    def _full_steps(self, timeline: Timeline, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """``windows.full_steps`` of the steps added now, from the changes of recording since the last
        look and the last one before it: a run that records in windows makes two changes a window."""
        self._read, t, v = timeline.samples_since(RECORDING, self._read)
        self._changes += zip(t.tolist(), (v > 0.5).tolist(), strict=True)
        full = full_between([t for t, _ in self._changes], [on for _, on in self._changes], start, end)
        # a later step begins at or after these steps' last end: the last change before it is what it needs
        last = np.searchsorted([t for t, _ in self._changes], float(end[-1]), side="right")
        del self._changes[: max(0, int(last) - 1)]
        return full
