"""Chrome Trace Event Format export, for Perfetto and chrome://tracing.

One process track "perfmagic" with a "steps" thread (one complete event per step)
and a "stages" thread (each stage's time in the step as one span; stages are laid
end to end in pipeline order, since a report keeps each stage's total per step,
not its every interval), plus counter tracks for the sampled metrics. A report
built in this process still has its timelines: then every recorded stage
interval is there too, nested as it ran, one process track per profiled process.
When the window ran with ``--trace``, the torch.profiler trace is merged in,
shifted onto the same clock. Times are microseconds since the profiled window
started.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from perfmagic.collect.clock_pin import marker_midpoint_us
from perfmagic.contract import ReportData, TorchTrace
from perfmagic.schema import STEP_BOUNDARY_PREFIX, gpu_metric, memory_name
from perfmagic.timeline import Timeline

PID = 0x7FFF0000
"""Our process id in the trace: apart from real pids and from the GPU ids kineto uses as pids."""
_STEPS_TID = 1
_STAGES_TID = 2
_GPU_COUNTERS = {
    "util": ("utilization (%)", 100.0),
    "mem_used_bytes": ("memory used (MiB)", 1 / 2**20),
    "power_w": ("power (W)", 1.0),
}
_HOST_COUNTERS = {
    "host.cpu_util": ("host CPU (%)", 100.0),
    "host.proc_cpu_cores": ("process CPU (cores)", 1.0),
    # both measures where both were sampled, each named as the reports name the one they show
    "host.pss_bytes": (f"{memory_name('PSS')} (MiB)", 1 / 2**20),
    "host.rss_bytes": (f"{memory_name('RSS')} (MiB)", 1 / 2**20),
    "host.read_bytes_per_s": ("disk read (MiB/s)", 1 / 2**20),
    "host.write_bytes_per_s": ("disk write (MiB/s)", 1 / 2**20),
}


def chrome_trace(report: ReportData, timelines: Sequence[Timeline] = ()) -> dict[str, Any]:
    """The report as a Trace Event Format object (``{"traceEvents": [...]}``)."""
    events: list[dict[str, Any]] = [
        _meta("process_name", {"name": "perfmagic"}),
        _meta("thread_name", {"name": "steps"}, _STEPS_TID),
        _meta("thread_name", {"name": "stages"}, _STAGES_TID),
    ]
    table = report["step_table"]
    names = list(table["stages"])
    for i, (start, end) in enumerate(zip(table["start"], table["end"], strict=True)):
        events.append(_span(f"step {i + 1}", start, end - start, _STEPS_TID, {"step": i + 1}))
        t = start
        for name in names:
            s = table["stages"][name][i] or 0.0
            if s > 0:
                events.append(_span(name, t, s, _STAGES_TID, {"step": i + 1, "seconds": s}))
                t += s
    for metric, series in sorted(report["timeseries"]["metrics"].items()):
        label = _counter_label(metric)
        if label is None:
            continue
        title, factor = label
        for t, v in zip(series["t"], series["v"], strict=True):
            if v is not None:
                events.append(
                    {"ph": "C", "name": title, "pid": PID, "ts": t * 1e6, "args": {"value": v * factor}}
                )
    for trace in report["torch_traces"]:
        events += torch_events(trace)
    for k, timeline in enumerate(t for t in timelines if t.span_count):
        events += timeline_events(timeline, PID + 1 + k)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "perfmagic", "schema": report["schema"]},
    }


def write_chrome_trace(
    report: ReportData, path: str | os.PathLike[str], timelines: Sequence[Timeline] = ()
) -> Path:
    """Write the trace as JSON (gzip-compressed when the name ends in ``.gz``)."""
    p = Path(path)
    text = json.dumps(chrome_trace(report, timelines), separators=(",", ":"))
    if p.suffix == ".gz":
        p.write_bytes(gzip.compress(text.encode()))
    else:
        p.write_text(text, encoding="utf-8")
    return p


def torch_events(trace: TorchTrace) -> list[dict[str, Any]]:
    """The events of a torch.profiler trace on the report's clock (empty when the file is gone)."""
    path = Path(trace["path"])
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        events: list[dict[str, Any]] = json.loads(raw)["traceEvents"]
    except (OSError, ValueError, KeyError):
        return []
    marker_us = marker_midpoint_us(events, trace["clock_name"])
    if marker_us is None:
        return []
    shift = marker_us - float(trace["clock_t"]) * 1e6
    for e in events:
        if "ts" in e:
            e["ts"] = float(e["ts"]) - shift
    return events


def timeline_events(timeline: Timeline, pid: int) -> list[dict[str, Any]]:
    """Every stage interval of one process's timeline, as recorded (nested spans on one thread)."""
    spans = timeline.spans
    meta = timeline.meta
    rank = meta["rank"] if "rank" in meta else None
    label = f"perfmagic stages (pid {meta['pid'] if 'pid' in meta else None}" + (
        f", rank {rank})" if rank is not None else ")"
    )
    events = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": 1, "args": {"name": "stages as recorded"}},
    ]
    # Spans are recorded as they close, children before parents. Viewers nest complete events on one
    # thread by order, so: by start, the enclosing (longer) span first. Times go to whole nanoseconds
    # first, the resolution viewers keep, so that a child never ends a rounding error after its parent.
    start_ns = np.round(spans.start * 1e9).astype(np.int64)
    end_ns = np.round(spans.end * 1e9).astype(np.int64)
    for i in np.lexsort((spans.depth, start_ns - end_ns, start_ns)):
        name = spans.name_of(int(i))
        if name.startswith(STEP_BOUNDARY_PREFIX):
            continue
        span = _span(name, 0.0, 0.0, 1, {"depth": int(spans.depth[i])})
        span.update(pid=pid, ts=int(start_ns[i]) / 1e3, dur=int(end_ns[i] - start_ns[i]) / 1e3)
        events.append(span)
    return events


def _counter_label(metric: str) -> tuple[str, float] | None:
    gpu = gpu_metric(metric)
    if gpu is None:
        return _HOST_COUNTERS.get(metric)
    index, quantity = gpu
    if quantity not in _GPU_COUNTERS:
        return None
    title, factor = _GPU_COUNTERS[quantity]
    return f"GPU {index} {title}", factor


def _span(name: str, start: float, dur: float, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "ph": "X",
        "name": name,
        "cat": "perfmagic",
        "pid": PID,
        "tid": tid,
        "ts": start * 1e6,
        "dur": dur * 1e6,
        "args": args,
    }


def _meta(name: str, args: dict[str, Any], tid: int = 0) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": PID, "tid": tid, "args": args}
