"""Evaluation passes (validation, test, prediction, sanity checks): time spent, how often, between steps.

The passes are no training steps (``analyze.steps`` cuts them out); this says
what they cost: their total, their share of the profiled window and the number
of training steps between two of them ("evaluation: 8% of wall time, every 10 steps").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmagic.analyze.steps import StepBreakdown
from perfmagic.schema import EVALUATION_MARK
from perfmagic.timeline import Timeline


@dataclass(frozen=True)
class EvaluationStats:
    total_s: float
    fraction_of_wall: float
    passes: int
    every_steps: float | None  # training steps between two passes (median); None without two to compare


def evaluation_stats(timeline: Timeline, breakdown: StepBreakdown, wall_s: float) -> EvaluationStats:
    marks = timeline.marks(EVALUATION_MARK)
    starts = np.array([m.t for m in marks], dtype=np.float64)
    total = float(sum(float(m.data.get("seconds") or 0.0) for m in marks))
    # steps trained before each pass; passes before any (a sanity check) set no interval
    trained = np.searchsorted(np.sort(breakdown.end), starts, side="right")
    during = np.unique(trained[trained > 0])
    if len(during) >= 2:
        every: float | None = float(np.median(np.diff(during)))
    elif len(during) == 1 and int(during[0]) < breakdown.count:  # one pass between steps: after that many
        every = float(during[0])
    else:
        every = None
    return EvaluationStats(
        total_s=total,
        fraction_of_wall=total / wall_s if wall_s > 0 else 0.0,
        passes=len(marks),
        every_steps=every,
    )
