"""Reports from traces that ``torch.profiler`` already wrote (``perfmagic report``)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from perfmagic.analyze import analyze
from perfmagic.analyze.gpu import trace_gpu
from perfmagic.report import Report, build_report
from perfmagic.traces.kineto import TraceFormatError, read_trace
from perfmagic.traces.stages import trace_timeline


def report_from_traces(paths: Sequence[str | os.PathLike[str]]) -> Report:
    """One report from one trace per rank.

    The ``gpu`` section is the primary rank's (the one the step figures come from);
    each rank's own is in ``ranks[i]["gpu"]``. Raises :class:`TraceFormatError` on a
    file that is not a readable trace, or on two files of the same rank.
    """
    if not paths:
        raise TraceFormatError("no trace given")
    traces = [read_trace(p) for p in paths]
    ranks = [t.rank if t.rank is not None else i for i, t in enumerate(traces)]
    for i, rank in enumerate(ranks):
        if rank in ranks[:i]:
            other = traces[ranks.index(rank)].path
            raise TraceFormatError(
                f"{traces[i].path} and {other} are both rank {rank}: give one trace per rank"
            )
    timelines = []
    for trace, rank in zip(traces, ranks, strict=True):
        timeline = trace_timeline(trace, rank)
        if trace.dropped:
            reasons = ", ".join(f"{why}: {n}" for why, n in trace.dropped.items())
            timeline.meta["warnings"].append(
                f"{trace.path.name}: {sum(trace.dropped.values())} events left out, their fields unreadable ({reasons})"
            )
        gpu = trace_gpu(trace)
        if gpu is None:
            timeline.meta["warnings"].append(
                f"{trace.path.name}: no GPU events (kernels, memcpy, memset) in the trace, so no GPU "
                "figures: it was recorded on the CPU only or without ProfilerActivity.CUDA"
            )
        else:
            timeline.meta["gpu"] = gpu
            if len(timeline.meta["profiler_steps"]) < 2:
                timeline.meta["warnings"].append(
                    f"{trace.path.name}: fewer than two ProfilerStep# ranges, so the GPU figures cover "
                    "the whole trace rather than the complete steps (as HTA does)"
                )
        timelines.append(timeline)
    # analyze() takes the primary rank's GPU figures (and each rank's) from timeline.meta["gpu"]
    return build_report(analyze(timelines), source="trace")
