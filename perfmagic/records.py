"""A window's records on disk read back: its spool, its ``report.json``, its children's records."""

from __future__ import annotations

import os
from pathlib import Path

from perfmagic.children import CHILDREN_DIR
from perfmagic.merge import on_one_clock, read_node
from perfmagic.report import Report, report_from_timelines
from perfmagic.timeline import Timeline
from perfmagic.timeline.file import SPOOL_NAME, read_timeline

REPORT_NAME = "report.json"


def load(path: str | os.PathLike[str]) -> Report:
    """Rebuild a report from a session's output directory, its spool or a report file."""
    p = Path(path)
    if p.is_file() and p.name != SPOOL_NAME and p.suffix == ".json":
        return Report.load(p)
    if p.is_dir() and not (p / SPOOL_NAME).exists() and (p / REPORT_NAME).exists():
        return Report.load(p / REPORT_NAME)  # a perfmagic run directory: the records are per process
    timeline = read_timeline(p)
    timelines = with_children(timeline, p) if p.is_dir() else [timeline]
    return report_from_timelines(timelines, source=str(timeline.meta.get("source", "live")))


def with_children(timeline: Timeline, outdir: Path) -> list[Timeline]:
    """A window's timeline and those of the interpreters it started (``outdir/children``), on its clock."""
    directory = outdir / CHILDREN_DIR
    if not directory.is_dir():
        return [timeline]
    node = read_node(directory)
    if not node.processes:
        return [timeline]
    timeline.meta["warnings"] = [*timeline.meta.get("warnings", []), *node.warnings]
    timelines = [timeline, *node.processes]
    on_one_clock(timelines, timeline.meta.get("epoch"))
    return timelines


def window_report(timeline: Timeline, outdir: Path, source: str, warnings: list[str]) -> Report:
    """The report of a window that has ended (``warnings``: the session's own); where the analysis fails,
    a report that says so and keeps the record's place."""
    timeline.meta["warnings"] = list(warnings)
    try:
        return report_from_timelines(with_children(timeline, outdir), source=source)
    except Exception as e:  # a bug in perfmagic must not cost the user the block's results
        failed = (
            f"the analysis failed ({e!r}): this report has no figures; the record is in {outdir} "
            "(perfmagic.load() rebuilds the report once the bug is fixed)"
        )
        bare = Timeline({**timeline.meta, "warnings": [*warnings, failed]})
        return report_from_timelines([bare], source=source)
