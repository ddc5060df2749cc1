"""Before/after comparison of two reports: did the fix work?

Works from report dictionaries alone (reports read back from JSON). Step and stage times are the
reports' own means over their steady steps (after the warm-up), the window every figure of a report
uses; that is what throughput follows, periodic checkpoints included. Advice is compared by problem
(:mod:`perfmagic.compare.problems`), not by card id. Reports with GPU trace figures (``perfmagic
report``, ``--trace`` runs) are also compared kernel by kernel (:mod:`perfmagic.compare.kernels`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfmagic.advise.headline import headline
from perfmagic.compare.kernels import GPU_FIGURES, KernelChange, kernel_changes
from perfmagic.compare.problems import STATUSES, ProblemMatch, match_problems
from perfmagic.compare.words import said, speed_words
from perfmagic.contract import ReportData
from perfmagic.contract.comparison import ComparisonData, KernelChangeData, ProblemData


@dataclass(frozen=True)
class StageChange:
    name: str
    before_s: float  # mean seconds per step
    after_s: float

    @property
    def delta_s(self) -> float:
        return self.after_s - self.before_s


class Comparison:
    """Per-stage times, speed-up, and the problems resolved, still open and new after a change."""

    def __init__(self, before: ReportData, after: ReportData) -> None:
        self.before, self.after = before, after
        self.step_before_s, stages_before = _per_step(before)
        self.step_after_s, stages_after = _per_step(after)
        names = [*stages_before, *(n for n in stages_after if n not in stages_before)]
        self.stages = [StageChange(n, stages_before.get(n, 0.0), stages_after.get(n, 0.0)) for n in names]
        self.problems: list[ProblemMatch] = match_problems(before, after)
        # GPU figures and kernels where both reports have a GPU trace's
        self.gpu: dict[str, tuple[Any, Any]] = {}
        self.kernels: list[KernelChange] = []
        gpu_before, gpu_after = before.get("gpu"), after.get("gpu")
        if gpu_before and gpu_after:
            self.gpu = {k: (gpu_before.get(k), gpu_after.get(k)) for k in GPU_FIGURES}
            self.kernels = kernel_changes(gpu_before, gpu_after)

    @property
    def speedup(self) -> float | None:
        """Mean step time before over after (> 1: faster)."""
        if self.step_before_s is None or not self.step_after_s:
            return None
        return self.step_before_s / self.step_after_s

    @property
    def resolved(self) -> list[ProblemMatch]:
        return [m for m in self.problems if m.status == "resolved"]

    @property
    def still_open(self) -> list[ProblemMatch]:
        return [m for m in self.problems if m.status == "open"]

    @property
    def new(self) -> list[ProblemMatch]:
        return [m for m in self.problems if m.status == "new"]

    @property
    def headline(self) -> str:
        """The speed-up and the after report's top problem, as its own headline says it."""
        words = speed_words(self.speedup)
        lead = words or "speed not compared (a report has no steady steps)"
        return f"{lead[0].upper()}{lead[1:]}; after the change: {headline(self.after)}"

    def to_dict(self) -> ComparisonData:
        return {
            "headline": self.headline,
            "step": {"before_s": self.step_before_s, "after_s": self.step_after_s, "speedup": self.speedup},
            "stages": [
                {"name": c.name, "before_s": c.before_s, "after_s": c.after_s, "delta_s": c.delta_s}
                for c in self.stages
            ],
            "gpu": {
                k: {"before": a, "after": b, "delta": None if a is None or b is None else b - a}
                for k, (a, b) in self.gpu.items()
            }
            or None,
            "kernels": [
                KernelChangeData(
                    name=k.name,
                    kind=k.kind,
                    count_before=k.count_before,
                    count_after=k.count_after,
                    before_s=k.before_s,
                    after_s=k.after_s,
                    delta_s=k.delta_s,
                )
                for k in self.kernels
            ],
            "problems": {
                status: [_problem_dict(m) for m in self.problems if m.status == status] for status in STATUSES
            },
        }

    def __str__(self) -> str:
        from perfmagic.compare.text import comparison_text

        return comparison_text(self)


def compare(before: ReportData, after: ReportData) -> Comparison:
    return Comparison(before, after)


def _per_step(report: ReportData) -> tuple[float | None, dict[str, float]]:
    """Mean step time and mean seconds per stage over the steady steps: the report's own figures."""
    steps = report.get("steps") or {}
    steady = (steps.get("count") or 0) - (steps.get("warmup") or 0)
    if steady <= 0:
        return None, {}
    per_s = steps.get("per_s")
    stages = report.get("stages") or {}
    return (1 / per_s if per_s else None), {
        name: s["mean_s"] if s.get("mean_s") is not None else s["total_s"] / steady
        for name, s in stages.items()
    }


def _problem_dict(m: ProblemMatch) -> ProblemData:
    """A match as JSON: its words (``said``, as the text and HTML show it) and its figures."""
    now = m.now
    return {
        "stages": list(now.stages),
        "cause": now.about.cause,
        "title": now.title,
        "severity": now.severity,
        "ids_before": m.before.ids if m.before else [],
        "ids_after": m.after.ids if m.after else [],
        "share_before": m.share_before,
        "share_after": m.share_after,
        "before_s": m.seconds_before,
        "after_s": m.seconds_after,
        "saving_s": now.saving_s,
        "one_time_s": now.one_time_s,
        "said": said(m),
    }
