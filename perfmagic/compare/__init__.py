"""Before/after comparison of two reports: step and stage times, speed-up, GPU kernels, and the
problems the change resolved, left open or brought (:class:`Comparison`)."""

from __future__ import annotations

from perfmagic.compare.comparison import Comparison, StageChange, compare
from perfmagic.compare.kernels import GPU_FIGURES, KernelChange
from perfmagic.compare.problems import STATUSES, Problem, ProblemMatch, Status, match_problems, problems_of
from perfmagic.compare.words import SECTIONS, said, speed_words

__all__ = [
    "GPU_FIGURES",
    "SECTIONS",
    "STATUSES",
    "Comparison",
    "KernelChange",
    "Problem",
    "ProblemMatch",
    "StageChange",
    "Status",
    "compare",
    "match_problems",
    "problems_of",
    "said",
    "speed_words",
]
