"""The comparison of two reports: ``Comparison.to_dict()``, the JSON ``perfmagic report --compare --json``
writes (docs/schema.md#comparing-reports). Times are mean seconds per steady step."""

from __future__ import annotations

from typing import Any, TypedDict

from perfmagic.contract.report import Severity


class StepChange(TypedDict):
    """``step``: the mean step before and after, and before over after (> 1: faster)."""

    before_s: float | None
    after_s: float | None
    speedup: float | None


class StageChangeData(TypedDict):
    """``stages[i]``: one stage before and after (0 where a report's steps never entered it)."""

    name: str
    before_s: float
    after_s: float
    delta_s: float


class FigureChange(TypedDict):
    """``gpu[figure]``: one GPU trace figure before and after."""

    before: Any
    after: Any
    delta: Any  # after less before; None where either is None


class KernelChangeData(TypedDict):
    """``kernels[i]``: one GPU event name in both traces (None where a table left it out)."""

    name: str
    kind: str
    count_before: int | None
    count_after: int | None
    before_s: float | None
    after_s: float | None
    delta_s: float | None


class ProblemData(TypedDict):
    """``problems[status][i]``: one problem matched by stage and cause across the two reports."""

    stages: list[str]
    cause: str
    title: str
    severity: Severity | None
    ids_before: list[str]
    ids_after: list[str]
    share_before: float | None
    share_after: float | None
    before_s: float | None
    after_s: float | None
    saving_s: float | None
    one_time_s: float | None
    said: str  # the line the text and the HTML show for it


class ComparisonData(TypedDict):
    """``Comparison.to_dict()``."""

    headline: str
    step: StepChange
    stages: list[StageChangeData]
    gpu: dict[str, FigureChange] | None  # None: not both reports have a GPU trace's figures
    kernels: list[KernelChangeData]
    problems: dict[str, list[ProblemData]]  # by status: "resolved", "open", "new"
