"""One job's report from ``perfmagic run`` records: one node's directory, or several nodes'.

A record directory holds the ``perfmagic run`` process's samples (``sampler/``) and one
``proc-<pid>/`` per profiled process. Within a directory every time is on that host's
wall clock; across directories (nodes) the clocks are aligned from the collectives the
ranks left together (``analyze.clocks``), the node holding the lowest rank being the
reference. ``perfmagic run`` reads its own directory with :func:`read_node`;
``perfmagic merge`` reads several with :func:`merge_records`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from perfmagic.analyze import node_name
from perfmagic.analyze.clocks import clock_offset, collective_ends
from perfmagic.contract import NodeClock
from perfmagic.report import Report, report_from_timelines
from perfmagic.timeline import Timeline
from perfmagic.timeline.file import SPOOL_NAME, TimelineFormatError, read_timeline

SAMPLER_DIR = "sampler"


@dataclass
class NodeRecord:
    """One node's records: its sampling process's timeline (None where missing) and its processes'."""

    directory: Path
    sampler: Timeline | None
    processes: list[Timeline]
    warnings: list[str]

    @property
    def timelines(self) -> list[Timeline]:
        return [*([self.sampler] if self.sampler is not None else []), *self.processes]

    def lowest_rank(self) -> int | None:
        ranks = [rank for t in self.processes if (rank := t.meta.get("rank")) is not None]
        return min(ranks, default=None)


def read_node(directory: Path, sampler: Timeline | None = None) -> NodeRecord:
    """A record directory; an unreadable process record is skipped with a warning."""
    warnings: list[str] = []
    processes = []
    for spool in sorted(directory.glob(f"proc-*/{SPOOL_NAME}")):
        try:
            processes.append(read_timeline(spool))
        except TimelineFormatError as e:
            warnings.append(f"skipped an unreadable record: {e}")
    if sampler is None and (directory / SAMPLER_DIR / SPOOL_NAME).exists():
        try:
            sampler = read_timeline(directory / SAMPLER_DIR / SPOOL_NAME)
        except TimelineFormatError as e:
            warnings.append(f"no hardware samples: {e}")
    return NodeRecord(directory, sampler, processes, warnings)


def on_one_clock(timelines: Sequence[Timeline], epoch: float | None) -> None:
    """Rebase every timeline that knows its start onto ``epoch`` (None: the earliest start)."""
    epochs = [float(t.meta["epoch"]) for t in timelines if t.meta.get("epoch") is not None]
    if not epochs:
        return
    base = min(epochs) if epoch is None else epoch
    for timeline in timelines:
        if timeline.meta.get("epoch") is not None:
            timeline.rebase(base)


def node_report(node: NodeRecord) -> Report:
    """One node's report (``perfmagic run``): its processes on its sampler's clock."""
    timelines = node.timelines
    epoch = node.sampler.meta.get("epoch") if node.sampler is not None else None
    on_one_clock(timelines, None if epoch is None else float(epoch))
    for warning in node.warnings:
        timelines[0].meta.setdefault("warnings", []).append(warning)
    return report_from_timelines(timelines, source="run")


def merge_records(directories: Sequence[Path]) -> Report:
    """The job's report from several nodes' record directories, their clocks aligned.

    Raises ValueError when no directory holds a profiled process.
    """
    nodes = [read_node(d) for d in directories]
    nodes = [n for n in nodes if n.processes]
    if not nodes:
        raise ValueError("no profiled process in " + ", ".join(map(str, directories)))
    nodes.sort(key=lambda n: (n.lowest_rank() is None, n.lowest_rank() or 0))
    reference = [collective_ends(t) for t in nodes[0].processes]
    clocks: list[NodeClock] = []
    warnings = [w for n in nodes for w in n.warnings]
    for i, node in enumerate(nodes):
        found = clock_offset(reference, [collective_ends(t) for t in node.processes])
        if i and found is None:
            warnings.append(
                f"{node.directory}: too few collectives matched the reference node's to align its clock; "
                "its wall clock is taken as it is"
            )
        offset = found.offset_s if i and found is not None else 0.0
        for timeline in node.timelines:
            if timeline.meta.get("epoch") is not None:
                timeline.meta["epoch"] = float(timeline.meta["epoch"]) + offset
        clocks.append(
            {
                "directory": str(node.directory),
                "node": _node_of(node),
                "ranks": sorted(rank for t in node.processes if (rank := t.meta.get("rank")) is not None),
                "offset_s": offset,
                "uncertainty_s": 0.0 if not i else (found.uncertainty_s if found is not None else None),
                "matched": found.matched if found is not None else 0,
            }
        )
    samplers = [n.sampler for n in nodes if n.sampler is not None]
    timelines = [t for n in nodes for t in n.timelines]
    epoch = samplers[0].meta.get("epoch") if samplers else None
    on_one_clock(timelines, None if epoch is None else float(epoch))
    if len(samplers) > 1:
        warnings.append(
            f"devices and host figures are those of {clocks[0]['node']}; each node's own are in its "
            "directory's report.json"
        )
    if warnings:
        timelines[0].meta.setdefault("warnings", []).extend(warnings)
    return report_from_timelines(timelines, source="run", nodes=clocks)


def _node_of(node: NodeRecord) -> str | None:
    return next((node_name(t.meta) for t in node.processes if t.meta.get("rank") is not None), None)
