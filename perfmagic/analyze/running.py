"""Stage seconds added up while a run goes on: each look reads only the spans since the last one."""

from __future__ import annotations

import numpy as np

from perfmagic.analyze.steps import StepBreakdown, ended_steps
from perfmagic.timeline import Timeline


class RunningStages:
    """The steps a running timeline has ended so far and their seconds per stage, added up a few
    spans at a time: a look costs in proportion to the spans since the last one, not to the run."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}  # stage -> seconds over every step added
        self.steps = 0
        self._cursor = 0  # spans read up to this logical index…
        self._since: float | None = None  # …and steps added up to this time
        self._kind: str | None = None

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
        for j, name in enumerate(steps.stages):
            self.totals[name] = self.totals.get(name, 0.0) + float(steps.seconds[:, j].sum())
        self.steps += steps.count
        return steps
