"""GPU time from a kernel trace: busy, idle and why, in HolisticTraceAnalysis's terms.

The figures follow HolisticTraceAnalysis (HTA) 0.5.0, so a report can be checked
against it:

- *window*: the GPU events launched by a CPU call that started before the last
  ``ProfilerStep#`` began (the last step is usually cut short by the profiler
  stopping); the *span* runs from the first event's start to the last one's end;
- *idle* = span minus the union of all GPU events (kernels, memcpy, memset);
  *compute* = the union of computation kernels; *non-compute* = busy minus compute
  (communication and memory time not hidden under computation);
- *idle breakdown*: each gap before a GPU event is *host wait* when the CPU call
  that launched the event started after the gap began (the host was late),
  else *kernel wait* when the gap is shorter than ``KERNEL_WAIT_US`` (launch
  overhead between back-to-back kernels), else *other* (e.g. waiting on an event);
- *exposed communication*: the union of communication kernels minus its overlap with the
  union of computation kernels (the time the GPU only communicates).

The figures are tallied over the events in start order by
:class:`perfmagic.analyze.gpu_tally.GpuTally`: a trace's arrays in one go, a capture's events
as its reader streams them. Kernel names say whether a kernel ran on tensor cores (:func:`tensor_cores`); the host's
CUDA calls (launches, syncs, copies) are figured in :mod:`perfmagic.analyze.cuda_calls`.

Times are microseconds on the trace's clock in, seconds and fractions out.
"""

from __future__ import annotations

import numpy as np

from perfmagic.analyze.cuda_calls import blocking_copies, h2d_copies, launch_stats, sync_stats
from perfmagic.analyze.gpu_tally import GAP_MIN_US, IDLE_CATEGORIES, ByName, GpuTally
from perfmagic.analyze.tensor_cores import tensor_cores
from perfmagic.contract import GpuSection
from perfmagic.contract.gpu import (
    Comm,
    Gaps,
    GpuSummary,
    IdleBreakdown,
    KernelTable,
    KernelTimes,
    MemoryPeak,
    StreamIdle,
    TopKernel,
)
from perfmagic.traces.events import (
    COMMUNICATION,
    COMPUTATION,
    CUDA_DEVICE,
    KINDS,
    MEMORY,
    GpuChunk,
    GpuEvents,
    KinetoTrace,
    MemoryEvents,
)
from perfmagic.traces.stages import profiler_steps

__all__ = ["gpu_summary", "memory_peaks", "tensor_cores", "trace_gpu"]

TOP_KERNELS = 10
KERNEL_TABLE = 200
"""GPU event names the ``kernels`` table keeps (by total time); the rest are summed in ``kernels_omitted``."""


def gpu_summary(
    events: GpuEvents, launched_before: float | None = None, whole_us: bool = False
) -> GpuSummary | None:
    """The report's ``gpu`` section from one process's GPU events; None when there are none.

    ``launched_before``: keep only events whose launching CPU call started before this time
    (HTA's window: the last ``ProfilerStep#``'s start); None keeps every event.
    ``whole_us``: count in whole microseconds as HTA does for ns-resolution traces (each
    event's start rounded up and end rounded down; pytorch#122425).

    ``idle_breakdown`` is for the whole GPU: the gaps in the union of all events, each
    classified by the event that ends it, as fractions of idle time (so it splits
    ``idle_fraction``). ``idle_breakdown_by_stream`` is HTA's ``get_idle_time_breakdown``
    exactly: per stream, the gaps between consecutive events on that stream, which count
    time that other streams kept the GPU busy.
    """
    tally = GpuTally(events.names, launched_before, whole_us)
    tally.add(_chunk(events, np.full(len(events), -1, np.int32), np.full(len(events), np.nan)), final=True)
    return summary(tally)


def summary(tally: GpuTally) -> GpuSummary | None:
    """The figures of :func:`gpu_summary` from a finished tally; None when it kept no event."""
    if not tally.events:
        return None
    span = tally.span
    busy = tally.busy.length
    kind_time = [union.length for union in tally.kinds]
    compute = kind_time[COMPUTATION]

    def share(t: float) -> float | None:
        return t / span if span > 0 else None

    return {
        "window_s": span / 1e6,
        "busy_fraction": share(busy),
        "idle_fraction": share(span - busy),
        "compute_fraction": share(compute),
        "non_compute_fraction": share(busy - compute),
        "comm_fraction": share(kind_time[COMMUNICATION]),
        "memory_fraction": share(kind_time[MEMORY]),
        "idle_s": (span - busy) / 1e6,
        "idle_breakdown": _breakdown(tally.gap_sum, tally.gap_by_category),
        "idle_breakdown_by_stream": _by_stream(tally),
        "event_count": tally.events,
        "kernel_count": tally.kernels,
        "streams": sorted({s for _, s in tally.streams}),
        **_kernels_by_time(tally.names, tally.kernel_names, span),
        "comm": _comm(tally, span),
        **_kernel_table(tally.names, tally.all),
        "memcpy_bytes": _memcpy_bytes(tally.names, tally.all),
        "gaps": _long_gaps(*tally.long_gaps, span),
    }


def _chunk(events: GpuEvents, launch_name: np.ndarray, launch_dur: np.ndarray) -> GpuChunk:
    return GpuChunk(
        events.name_id, events.kind, events.start, events.dur, events.device, events.stream, events.launch,
        events.bytes, launch_name, launch_dur,
    )  # fmt: skip


def trace_tally(trace: KinetoTrace, launched_before: float | None, whole_us: bool) -> GpuTally:
    """The tally of a trace's GPU events, each with the call that launched it."""
    gpu, cpu = trace.gpu, trace.cpu
    rows = gpu.launch_row
    assert rows is not None  # read from a trace
    linked = rows >= 0
    launch_name = np.full(len(gpu), -1, np.int32)
    launch_name[linked] = cpu.name_id[rows[linked]]
    launch_dur = np.full(len(gpu), np.nan)
    launch_dur[linked] = cpu.dur[rows[linked]]
    tally = GpuTally(cpu.names, launched_before, whole_us)
    tally.add(_chunk(gpu, launch_name, launch_dur), final=True)
    return tally


def trace_gpu(trace: KinetoTrace) -> GpuSection | None:
    """The ``gpu`` section of one trace, over HTA's window; None without GPU events.

    The window holds the GPU events launched before the last ``ProfilerStep#`` started
    (``profiler_steps`` lists the steps it covers); with fewer than two steps, HTA
    keeps every event, and so does this. A reader that streamed the GPU events hands over
    their tally (``trace.gpu_figures``), made over the same window.
    """
    numbers, starts, ends = profiler_steps(trace)
    before = float(starts.max()) if len(starts) > 1 else None
    tally = trace.gpu_figures
    if not isinstance(tally, GpuTally):
        tally = trace_tally(trace, before, trace.ns_resolution)
    gpu = summary(tally)
    if gpu is None:
        return None
    steps = starts < before if before is not None else np.ones(len(starts), dtype=bool)
    names = {d.get("id"): d.get("name") for d in trace.device_properties}
    return {
        **gpu,
        "profiler_steps": numbers[steps].tolist(),
        "devices": [{"index": i, "name": names.get(i)} for i in sorted(tally.devices)],
        "launches": launch_stats(tally),
        "syncs": sync_stats(trace, (starts[steps], ends[steps])),
        "blocking_copies": blocking_copies(trace, (starts[steps], ends[steps])),
        "h2d_copies": h2d_copies(tally.names, tally.all),
        "memory": memory_peaks(trace.memory),
    }


def _long_gaps(count: int, total: float, longest: float, span: float) -> Gaps:
    """``gaps``: the stretches between busy intervals of at least ``GAP_MIN_US``."""
    return {
        "min_s": GAP_MIN_US / 1e6,
        "count": count,
        "total_s": total / 1e6,
        "fraction": total / span if span > 0 else None,
        "longest_s": longest / 1e6,
    }


def _breakdown(total: float, by_category: np.ndarray) -> IdleBreakdown:
    if total <= 0:
        return {"host_wait": None, "kernel_wait": None, "other": None}
    host_wait, kernel_wait, other = (float(by_category[i]) / total for i in range(len(IDLE_CATEGORIES)))
    return {"host_wait": host_wait, "kernel_wait": kernel_wait, "other": other}


def _by_stream(tally: GpuTally) -> list[StreamIdle]:
    """``idle_breakdown_by_stream``: per stream, its gaps' time by category."""
    out: list[StreamIdle] = []
    for device, stream, idle, (host_wait, kernel_wait, other) in tally.stream_idle():
        out.append(
            {
                "device": device,
                "stream": stream,
                "idle_s": idle / 1e6,
                "host_wait": host_wait / idle if idle > 0 else None,
                "host_wait_s": host_wait / 1e6,
                "kernel_wait": kernel_wait / idle if idle > 0 else None,
                "kernel_wait_s": kernel_wait / 1e6,
                "other": other / idle if idle > 0 else None,
                "other_s": other / 1e6,
            }
        )
    return out


def _kernels_by_time(names: list[str], kernels: ByName, span: float) -> KernelTimes:
    """``top_kernels``: the ``TOP_KERNELS`` kernel names with most time; ``tensor_core_fraction``: of the
    matrix kernels' time (those whose name tells), the share on tensor cores (None without any);
    ``tensor_cores_unknown``: the computation kernel names that do not tell.

    The events' own durations, not HTA's whole microseconds: those would count a kernel shorter than
    a microsecond (thousands of them in a launch-bound job) as 0 or less."""
    total, count, kind, order = kernels.total, kernels.count, kernels.kind, kernels.ranked()
    on_tensor_cores = [tensor_cores(names[i]) for i in order]
    top: list[TopKernel] = [
        {
            "name": names[i],
            "kind": KINDS[kind[i]],
            "count": int(count[i]),
            "total_s": float(total[i]) / 1e6,
            "mean_s": float(total[i]) / count[i] / 1e6,
            "fraction": float(total[i]) / span if span > 0 else None,
            "tensor_cores": tc,
        }
        for i, tc in zip(order[:TOP_KERNELS], on_tensor_cores, strict=False)
    ]
    says = [(tc, float(total[i])) for i, tc in zip(order, on_tensor_cores, strict=True)]
    matrix = sum(t for tc, t in says if tc is not None)
    tensor = sum(t for tc, t in says if tc)
    unknown = sum(
        1 for i, tc in zip(order, on_tensor_cores, strict=True) if tc is None and kind[i] == COMPUTATION
    )
    return {
        "top_kernels": top,
        "tensor_core_fraction": tensor / matrix if matrix > 0 else None,
        "tensor_cores_unknown": unknown,
    }


def _comm(tally: GpuTally, span: float) -> Comm | None:
    """Communication kernels' time (their union), the part overlapped by computation kernels and the
    exposed rest, in seconds and as a share of the span; None without communication kernels."""
    if tally.kinds[COMMUNICATION].open is None:
        return None
    total = tally.kinds[COMMUNICATION].length
    exposed = tally.comm_or_compute.length - tally.kinds[COMPUTATION].length
    return {
        "total_s": total / 1e6,
        "overlapped_s": (total - exposed) / 1e6,
        "exposed_s": exposed / 1e6,
        "exposed_fraction": exposed / span if span > 0 else None,
        "overlap_fraction": (total - exposed) / total if total > 0 else None,
    }


def memory_peaks(memory: MemoryEvents) -> list[MemoryPeak] | None:
    """Per CUDA device, the peak of the memory allocated (and reserved) in the allocator's ``[memory]``
    events over the whole trace; None when the trace has none (recorded without ``profile_memory``)."""
    cuda = memory.device_type == CUDA_DEVICE
    if not cuda.any():
        return None
    out: list[MemoryPeak] = []
    for device in np.unique(memory.device[cuda]):
        on = cuda & (memory.device == device)
        reserved = memory.reserved[on]
        out.append(
            {
                "device": int(device),
                "allocated_peak_bytes": float(memory.allocated[on].max()),
                "reserved_peak_bytes": float(np.nanmax(reserved)) if np.isfinite(reserved).any() else None,
            }
        )
    return out


def _kernel_table(names: list[str], events: ByName) -> KernelTable:
    """``kernels``: every GPU event name (kernels, memcpy, memset) with its count and total time, the
    ``KERNEL_TABLE`` longest; ``kernels_omitted``: the rest summed (None when nothing was left out)."""
    total, count, kind, order = events.total, events.count, events.kind, events.ranked()
    rest = order[KERNEL_TABLE:]
    return {
        "kernels": [
            {
                "name": names[i],
                "kind": KINDS[kind[i]],
                "count": int(count[i]),
                "total_s": float(total[i]) / 1e6,
            }
            for i in order[:KERNEL_TABLE]
        ],
        "kernels_omitted": {
            "names": len(rest),
            "count": int(count[rest].sum()),
            "total_s": float(total[rest].sum()) / 1e6,
        }
        if len(rest)
        else None,
    }


def _memcpy_bytes(names: list[str], events: ByName) -> dict[str, float]:
    """Bytes copied per direction (``HtoD``, ``DtoH``, ``DtoD``, ...), from ``Memcpy XtoY (...)`` names."""
    out: dict[str, float] = {}
    copied = events.copied
    for i in np.flatnonzero(copied > 0):
        words = names[i].split()
        if len(words) > 1 and words[0] == "Memcpy":
            out[words[1]] = out.get(words[1], 0.0) + float(copied[i])
    return out
