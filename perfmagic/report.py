"""Report: the result of a profiled window, as the JSON contract of docs/schema.md.

A report is its dictionary (``to_dict``) plus, when it was built in this
process, the analysis and the timelines behind it (the Chrome trace export shows
every recorded interval). Everything a renderer needs is in the dictionary, so a
report read back from JSON renders the same way. :func:`build_report` makes one.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard, cast

import numpy as np

from perfmagic.advise import advise
from perfmagic.advise.plan import Plan
from perfmagic.analyze import Analysis, RankAnalysis, StageStats, StepStats, analyze
from perfmagic.analyze.evaluation import EvaluationStats
from perfmagic.analyze.loading import LoadingAccount
from perfmagic.analyze.ranks import Straggler
from perfmagic.analyze.steps import StepBreakdown
from perfmagic.contract import (
    Card,
    Evaluation,
    GpuSection,
    Loading,
    NodeClock,
    PlanSection,
    Rank,
    ReportBody,
    ReportData,
    Source,
    Stage,
    Steps,
    StepTable,
)
from perfmagic.contract import Straggler as StragglerSection
from perfmagic.schema import TORCH_TRACE_MARK
from perfmagic.timeline import Timeline
from perfmagic.timeline.file import unfolded

if TYPE_CHECKING:
    from perfmagic.compare import Comparison

SCHEMA = "perfmagic.report/1"
SOURCES = ("live", "run", "trace")


class ReportFormatError(ValueError):
    """A file that is not a perfmagic report."""


class Report:
    """The report of one profiled window."""

    def __init__(
        self, data: ReportData, analysis: Analysis | None = None, timelines: Sequence[Timeline] = ()
    ) -> None:
        if data.get("schema") != SCHEMA:
            raise ReportFormatError(
                f"not a perfmagic report: schema is {data.get('schema')!r}, expected {SCHEMA!r}"
            )
        self._data = data
        self.analysis = analysis
        self.timelines = tuple(timelines)

    # -- the contract ----------------------------------------------------

    def to_dict(self) -> ReportData:
        return copy.deepcopy(self._data)

    def to_json(self, path: str | os.PathLike[str] | None = None, indent: int | None = 2) -> str:
        """The report as JSON text; also written to ``path`` when given."""
        text = json.dumps(self._data, indent=indent, allow_nan=False)
        if path is not None:
            Path(path).write_text(text + "\n", encoding="utf-8")
        return text

    def to_html(self, path: str | os.PathLike[str]) -> Path:
        """One self-contained HTML file (charts and BokehJS inline) that opens offline."""
        from perfmagic.render.html import write_html

        return write_html(self._data, path)

    def to_chrome_trace(self, path: str | os.PathLike[str]) -> Path:
        """A Trace Event Format file for Perfetto / chrome://tracing (``.gz`` compresses)."""
        from perfmagic.render.chrome import write_chrome_trace

        return write_chrome_trace(self._data, path, [unfolded(t) for t in self.timelines])

    def to_tensorboard(self, logdir: str | os.PathLike[str]) -> Path:
        """Step time, stage times and utilization as TensorBoard scalars in ``logdir``."""
        from perfmagic.render.tensorboard import write_tensorboard

        return write_tensorboard(self._data, logdir)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from perfmagic.render.notebook import report_bundle

        return report_bundle(self._data)

    @classmethod
    def from_json(cls, text: str) -> Report:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ReportFormatError(
                f"not a perfmagic report: invalid JSON ({e.msg} at line {e.lineno})"
            ) from e
        if not isinstance(data, dict):
            raise ReportFormatError("not a perfmagic report: JSON is not an object")
        return cls(cast(ReportData, data))  # JSON from disk: __init__ checks its schema

    def save(self, path: str | os.PathLike[str]) -> None:
        tmp = Path(str(path) + ".tmp")
        self.to_json(tmp)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Report:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise ReportFormatError(f"cannot read report {path}: {e.strerror}") from e
        return cls.from_json(text)

    def compare(self, other: Report) -> Comparison:
        """This report (before) against ``other`` (after a change): per-stage times, speed-up, advice."""
        from perfmagic.compare import compare

        return compare(self._data, other._data)

    # -- convenient views --------------------------------------------------

    @property
    def steps(self) -> Steps:
        return self._data["steps"].copy()

    @property
    def stages(self) -> dict[str, Stage]:
        return copy.deepcopy(self._data["stages"])

    @property
    def bottleneck(self) -> str | None:
        value = self._data.get("bottleneck")
        return str(value) if value is not None else None

    @property
    def advice(self) -> list[Card]:
        return copy.deepcopy(self._data["advice"])

    @property
    def warnings(self) -> list[str]:
        return list(self._data["warnings"])

    def __getitem__(self, key: str) -> Any:
        return copy.deepcopy({**self._data}[key])

    def __str__(self) -> str:
        from perfmagic.render.text import render_text

        return render_text(self._data)

    def __repr__(self) -> str:
        from perfmagic.units import fmt_seconds

        steps = self._data["steps"]
        median = fmt_seconds(steps.get("median_s"))
        return (
            f"<perfmagic.Report {steps.get('count', 0)} steps, median {median}, bottleneck={self.bottleneck}>"
        )


def build_report(analysis: Analysis, source: str = "live", timelines: Sequence[Timeline] = ()) -> Report:
    """The report of an analysis: its figures, the advice on it, and what could not be measured.

    ``timelines`` are the records the analysis was made from, kept for exports that
    show every recorded interval.
    """
    if not _is_source(source):
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    b = analysis.breakdown
    advice = advise(analysis)
    body: ReportBody = {
        "schema": SCHEMA,
        "source": source,
        "framework": analysis.framework,
        "wall_s": analysis.wall_s,
        "steps": steps_section(analysis.steps),
        "stages": {name: stage_section(s) for name, s in analysis.stages.items()},
        "bottleneck": analysis.bottleneck,
        "devices": analysis.devices,
        "host": analysis.host,
        "gpu": analysis.gpu,
        "ranks": [rank_section(r) for r in analysis.ranks],
        "advice": [card.to_dict() for card in advice.cards],
        "warnings": [*analysis.warnings, *advice.warnings],
        # keys beyond the first contract (docs/schema.md lists every key)
        "trainer": analysis.trainer,
        "evaluation": evaluation_section(analysis.evaluation),
        "loading": loading_section(analysis.loading) if analysis.loading is not None else None,
        "disk_waits": analysis.disk_waits,
        "advice_minor": [
            {"id": c.id, "saving_s": c.saving_s, "step_s": c.metrics.get("step_s")} for c in advice.minor
        ],
        "plan": plan_section(advice.plan) if advice.plan is not None else None,
        "timeseries": analysis.timeseries,
        "hotspots": analysis.hotspots,
        "torch_traces": analysis.torch_traces,
        "tuning": analysis.tuning,
        "collective_skew": analysis.collective_skew,
        "nodes": analysis.nodes,
        "straggler": straggler_section(analysis.straggler) if analysis.straggler is not None else None,
        "energy": analysis.energy,
        "memory": analysis.memory,
        "gpu_memory": analysis.gpu_memory,
        "recording": analysis.recording,
    }
    clean: ReportBody = _clean(body)
    # the step table after _clean: its numbers made JSON-safe by numpy, not one by one
    data: ReportData = {**clean, "step_table": step_table(b)}
    if len(analysis.ranks) > 1:  # for the per-rank waterfall; the ranks share a long run's rows
        rows = max(MIN_RANK_ROWS, BINNED_ROWS // len(analysis.ranks))
        for entry, rank in zip(data["ranks"], analysis.ranks, strict=True):
            entry["step_table"] = step_table(rank.breakdown, rows, rows)
    return Report(data, analysis, timelines)


def _is_source(source: str) -> TypeGuard[Source]:
    return source in SOURCES


def rank_section(r: RankAnalysis) -> Rank:
    rank: Rank = {
        "rank": r.rank,
        "pid": r.pid,
        "node": r.node,
        "local_rank": r.local_rank,
        "steps": steps_section(r.steps),
        "stages": {name: stage_section(s) for name, s in r.stages.items()},
    }
    if r.gpu is not None:
        rank["gpu"] = r.gpu
    return rank


def steps_section(s: StepStats) -> Steps:
    return {
        "count": s.count,
        "median_s": s.median_s,
        "p90_s": s.p90_s,
        "first_s": s.first_s,
        "per_s": s.per_s,
        "warmup": s.warmup,
        "samples_per_s": s.samples_per_s,
        "tokens_per_s": s.tokens_per_s,
        "boundary": s.boundary,
        "hint": s.hint,
    }


def stage_section(s: StageStats) -> Stage:
    return {"total_s": s.total_s, "fraction": s.fraction, "median_s": s.median_s, "mean_s": s.mean_s}


def evaluation_section(e: EvaluationStats) -> Evaluation:
    return {
        "total_s": e.total_s,
        "fraction_of_wall": e.fraction_of_wall,
        "passes": e.passes,
        "every_steps": e.every_steps,
    }


def loading_section(account: LoadingAccount) -> Loading:
    return {
        "loaders": account.loaders,
        "cpu": account.cpu,
        "queued": account.queued,
        "blocked": account.blocked,
        "disk": account.disk,
        "sleep": account.sleep,
        "busy": account.busy,
        "batch_s": account.batch_s,
    }


def plan_section(p: Plan) -> PlanSection:
    return {
        "step_s": p.step_s,
        "predicted_step_s": p.predicted_step_s,
        "changes": [
            {
                "id": c.id,
                "saving_s": c.saving_s,
                "alone_s": c.alone_s,
                "interval_s": [c.low_s, c.high_s],
                "step_s": c.step_s,
                "uncertain": c.uncertain,
                "freed_bytes": c.freed_bytes,
            }
            for c in p.changes
        ],
        "set_aside": [{"id": a.id, "reason": a.reason} for a in p.set_aside],
    }


def straggler_section(s: Straggler) -> StragglerSection:
    return {
        "rank": s.rank,
        "stage": s.stage,
        "work_s": s.work_s,
        "others_work_s": s.others_work_s,
        "excess_s": s.excess_s,
        "stage_excess_s": dict(s.stage_excess_s),
        "others_comm_s": s.others_comm_s,
        "comm_s": s.comm_s,
        "ranks": s.ranks,
    }


MAX_STEP_ROWS = 100_000
"""Steps the step table holds one row each; a longer run gets ``BINNED_ROWS`` rows of several steps."""
BINNED_ROWS = 20_000
MIN_RANK_ROWS = 20
"""Rows each rank's step table holds at least, however many ranks share ``BINNED_ROWS``."""


def step_table(b: StepBreakdown, max_rows: int | None = None, binned_rows: int | None = None) -> StepTable:
    """Each step's start, end and seconds per stage, to the microsecond; a long run's in equal blocks.

    A run of more than ``max_rows`` steps (:data:`MAX_STEP_ROWS`) gets at most ``binned_rows``
    (:data:`BINNED_ROWS`) rows: a block of ``steps_per_row`` steps runs from its first step's start
    to its last step's end, and holds the mean seconds per step of each stage.
    """
    max_rows = MAX_STEP_ROWS if max_rows is None else max_rows
    binned_rows = BINNED_ROWS if binned_rows is None else binned_rows
    k = 1 if b.count <= max_rows else -(-b.count // binned_rows)
    rows = -(-b.count // k) if b.count else 0
    edges = np.arange(0, b.count, k)
    if k == 1:
        start, end, seconds = b.start, b.end, b.seconds
    else:
        last = np.minimum(edges + k, b.count) - 1
        start, end = b.start[edges], b.end[last]
        sums = np.add.reduceat(b.seconds, edges, axis=0) if b.count else b.seconds
        seconds = sums / (last - edges + 1)[:, None]
    assert len(start) == rows

    def column(values: np.ndarray) -> list[float]:
        out: list[float] = np.round(np.nan_to_num(values), 6).tolist()
        return out

    return {
        "boundary": b.boundary,
        "steps_per_row": k,
        "start": column(start),
        "end": column(end),
        "stages": {name: column(seconds[:, j]) for j, name in enumerate(b.stages)},
    }


def report_from_timelines(
    timelines: Sequence[Timeline], source: str = "live", nodes: list[NodeClock] | None = None
) -> Report:
    """Analyze the timelines of one window (one per process) and build its report.

    A window profiled with ``--trace`` wrote a torch.profiler trace: its GPU figures
    (busy, idle and why) feed the report as a trace's would. ``nodes``: the clocks of a
    job's nodes, as ``perfmagic merge`` aligned them.
    """
    analysis = analyze(list(timelines), gpu=traced_gpu(timelines))
    if nodes is not None:
        analysis = dataclasses.replace(analysis, nodes=nodes)
    return build_report(analysis, source, timelines)


def traced_gpu(timelines: Sequence[Timeline]) -> GpuSection | None:
    """The GPU figures of the first torch.profiler trace written in the window that has GPU events."""
    from perfmagic.analyze.gpu import trace_gpu
    from perfmagic.traces.kineto import TraceFormatError, read_trace

    for timeline in timelines:
        for mark in timeline.marks(TORCH_TRACE_MARK):
            try:
                gpu = trace_gpu(read_trace(mark.data["path"]))
            except (KeyError, OSError, TraceFormatError):
                continue  # moved, deleted or cut short: the report goes on without it
            if gpu is not None:
                return gpu
    return None


_PLAIN = (str, int, bool, type(None))  # JSON-safe as they are


def _clean(value: Any) -> Any:
    """JSON-safe: numpy scalars to Python, NaN and infinities to None."""
    if type(value) in _PLAIN:
        return value
    if type(value) is float:
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
