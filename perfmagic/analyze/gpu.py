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

Kernel names say whether a kernel ran on tensor cores (:func:`tensor_cores`); the host's
CUDA calls (launches, syncs, copies) are figured in :mod:`perfmagic.analyze.cuda_calls`.

Times are microseconds on the trace's clock in, seconds and fractions out.
"""

from __future__ import annotations

import numpy as np

from perfmagic.analyze.cuda_calls import blocking_copies, h2d_copies, launch_stats, sync_stats
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
from perfmagic.intervals import merge_intervals, union_length
from perfmagic.traces.events import (
    COMMUNICATION,
    COMPUTATION,
    CUDA_DEVICE,
    KINDS,
    MEMORY,
    GpuEvents,
    KinetoTrace,
    MemoryEvents,
)
from perfmagic.traces.stages import profiler_steps

KERNEL_WAIT_US = 30.0
"""HTA's ``consecutive_kernel_delay`` default: shorter gaps are launch overhead."""

GAP_MIN_US = 1000.0
"""An idle stretch of the GPU this long (1 ms) is a starvation gap: longer than any launch overhead,
short enough to catch a host stall within a step of tens of milliseconds (Nsight's own check looks for
500 ms, across whole applications)."""

IDLE_CATEGORIES = ("host_wait", "kernel_wait", "other")
"""Idle-gap categories, in the order ``_classify`` numbers them."""

TOP_KERNELS = 10
KERNEL_TABLE = 200
"""GPU event names the ``kernels`` table keeps (by total time); the rest are summed in ``kernels_omitted``."""


def _window(
    events: GpuEvents, launched_before: float | None, whole_us: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(events kept, and the kept ones' start, end and launch times): HTA's window and its whole-µs
    counting. The times of the kept events only, so the events dropped are never copied."""
    launch = np.ceil(events.launch) if whole_us else events.launch
    if whole_us and launched_before is not None:
        launched_before = float(np.ceil(launched_before))
    keep = np.ones(len(events), dtype=bool) if launched_before is None else launch < launched_before
    start = events.start[keep]
    end = start + events.dur[keep]
    if whole_us:
        start, end = np.ceil(start), np.floor(end)
    return keep, start, end, launch[keep]


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
    keep, start, end, launch = _window(events, launched_before, whole_us)
    if not keep.any():
        return None
    # the window's events are not copied whole (a capture holds millions): its times and kinds are, the
    # figures by name read the events through masks, and each stream's its own columns
    kind = events.kind[keep]
    busy_start, busy_end = merge_intervals(start, end)
    span = float(busy_end[-1] - busy_start[0])
    busy = float((busy_end - busy_start).sum())
    kind_time = [union_length(start[kind == k], end[kind == k]) for k in range(len(KINDS))]
    compute = kind_time[COMPUTATION]

    def share(t: float) -> float | None:
        return t / span if span > 0 else None

    gaps = _gaps(start, end, launch, busy_start, busy_end)
    kernels = keep & (events.kind != MEMORY)
    return {
        "window_s": span / 1e6,
        "busy_fraction": share(busy),
        "idle_fraction": share(span - busy),
        "compute_fraction": share(compute),
        "non_compute_fraction": share(busy - compute),
        "comm_fraction": share(kind_time[COMMUNICATION]),
        "memory_fraction": share(kind_time[MEMORY]),
        "idle_s": (span - busy) / 1e6,
        "idle_breakdown": _breakdown(*gaps),
        "idle_breakdown_by_stream": _by_stream(events.device[keep], events.stream[keep], start, end, launch),
        "event_count": len(start),
        "kernel_count": int(kernels.sum()),
        "streams": np.unique(events.stream[keep]).tolist(),
        **_kernels_by_time(events, kernels, span),
        "comm": _comm(kind, start, end, span),
        **_kernel_table(events, keep),
        "memcpy_bytes": _memcpy_bytes(events, keep),
        "gaps": _long_gaps(busy_start, busy_end, span),
    }


def trace_gpu(trace: KinetoTrace) -> GpuSection | None:
    """The ``gpu`` section of one trace, over HTA's window; None without GPU events.

    The window holds the GPU events launched before the last ``ProfilerStep#`` started
    (``profiler_steps`` lists the steps it covers); with fewer than two steps, HTA
    keeps every event, and so does this.
    """
    numbers, starts, ends = profiler_steps(trace)
    before = float(starts.max()) if len(starts) > 1 else None
    whole_us = trace.ns_resolution  # a look at every timestamp: once
    gpu = gpu_summary(trace.gpu, launched_before=before, whole_us=whole_us)
    if gpu is None:
        return None
    steps = starts < before if before is not None else np.ones(len(starts), dtype=bool)
    names = {d.get("id"): d.get("name") for d in trace.device_properties}
    launched = _window(trace.gpu, before, whole_us)[0]
    return {
        **gpu,
        "profiler_steps": numbers[steps].tolist(),
        "devices": [{"index": int(i), "name": names.get(int(i))} for i in np.unique(trace.gpu.device)],
        "launches": launch_stats(trace, launched, gpu["window_s"] * 1e6),
        "syncs": sync_stats(trace, (starts[steps], ends[steps])),
        "blocking_copies": blocking_copies(trace, (starts[steps], ends[steps])),
        "h2d_copies": h2d_copies(trace, launched),
        "memory": memory_peaks(trace.memory),
    }


def _long_gaps(busy_start: np.ndarray, busy_end: np.ndarray, span: float) -> Gaps:
    """``gaps``: the stretches between busy intervals of at least ``GAP_MIN_US``."""
    gap = busy_start[1:] - busy_end[:-1]
    long = gap[gap >= GAP_MIN_US]
    total = float(long.sum())
    return {
        "min_s": GAP_MIN_US / 1e6,
        "count": len(long),
        "total_s": total / 1e6,
        "fraction": total / span if span > 0 else None,
        "longest_s": float(long.max()) / 1e6 if len(long) else 0.0,
    }


def _classify(gap_start: np.ndarray, gap: np.ndarray, next_launch: np.ndarray) -> np.ndarray:
    """Index into ``IDLE_CATEGORIES`` of each gap (HTA's rule; a NaN launch is not host wait)."""
    host = next_launch > gap_start
    # int8: one byte per gap, of which a capture has millions
    out: np.ndarray = np.where(host, np.int8(0), np.where(gap < KERNEL_WAIT_US, np.int8(1), np.int8(2)))
    return out


def _gaps(
    start: np.ndarray, end: np.ndarray, launch: np.ndarray, busy_start: np.ndarray, busy_end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Whole-GPU gaps (µs) and their category, each ended by the first event after it."""
    gap = busy_start[1:] - busy_end[:-1]
    order = np.lexsort((end, start))
    # the event that ends a gap is the first one starting at the next busy interval's start
    first = order[np.searchsorted(start[order], busy_start[1:])]
    return gap, _classify(busy_end[:-1], gap, launch[first])


def _breakdown(gap: np.ndarray, category: np.ndarray) -> IdleBreakdown:
    total = float(gap.sum())
    if total <= 0:
        return {"host_wait": None, "kernel_wait": None, "other": None}
    host_wait, kernel_wait, other = (
        float(gap[category == i].sum()) / total for i in range(len(IDLE_CATEGORIES))
    )
    return {"host_wait": host_wait, "kernel_wait": kernel_wait, "other": other}


def _by_stream(
    device_of: np.ndarray, stream_of: np.ndarray, start: np.ndarray, end: np.ndarray, launch: np.ndarray
) -> list[StreamIdle]:
    """``idle_breakdown_by_stream`` of the events whose device, stream and times the arrays give."""
    out: list[StreamIdle] = []
    # (device, stream) in sorted order, each device's own streams found apart: a unique over stacked
    # columns would copy and sort every event twice
    devices = np.unique(device_of)
    keys = [(d, s) for d in devices for s in np.unique(stream_of[device_of == d])]
    for device, stream in keys:
        on = np.flatnonzero((device_of == device) & (stream_of == stream))
        on = on[np.argsort(start[on], kind="stable")]
        # HTA: the gap before each event is its start minus the previous event's end
        gap = start[on][1:] - end[on][:-1]
        category = _classify(end[on][:-1], gap, launch[on][1:])
        idle = float(gap.sum())
        host_wait, kernel_wait, other = (float(gap[category == i].sum()) for i in range(len(IDLE_CATEGORIES)))
        out.append(
            {
                "device": int(device),
                "stream": int(stream),
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


def _by_name(ev: GpuEvents, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per name of the events in ``mask``: (total µs, count, kind, name ids by total time, longest first).

    The events' own durations, not HTA's whole microseconds: those would count a kernel shorter than
    a microsecond (thousands of them in a launch-bound job) as 0 or less."""
    ids = ev.name_id[mask]
    n = len(ev.names)
    total = np.bincount(ids, weights=ev.dur[mask], minlength=n)
    count = np.bincount(ids, minlength=n)
    kind = np.zeros(n, dtype=np.int8)
    kind[ids] = ev.kind[mask]
    order = np.argsort(-total, kind="stable")
    return total, count, kind, order[count[order] > 0]


def _kernels_by_time(ev: GpuEvents, is_kernel: np.ndarray, span: float) -> KernelTimes:
    """``top_kernels``: the ``TOP_KERNELS`` kernel names with most time; ``tensor_core_fraction``: of the
    matrix kernels' time (those whose name tells), the share on tensor cores (None without any);
    ``tensor_cores_unknown``: the computation kernel names that do not tell."""
    total, count, kind, order = _by_name(ev, is_kernel)
    on_tensor_cores = [tensor_cores(ev.names[i]) for i in order]
    top: list[TopKernel] = [
        {
            "name": ev.names[i],
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


def _comm(kind: np.ndarray, start: np.ndarray, end: np.ndarray, span: float) -> Comm | None:
    """Communication kernels' time (their union), the part overlapped by computation kernels and the
    exposed rest, in seconds and as a share of the span (``kind``: each event's); None without
    communication kernels."""
    comm, compute = kind == COMMUNICATION, kind == COMPUTATION
    if not comm.any():
        return None
    total = union_length(start[comm], end[comm])
    either = union_length(start[comm | compute], end[comm | compute])
    exposed = either - union_length(start[compute], end[compute])
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


def _kernel_table(ev: GpuEvents, mask: np.ndarray) -> KernelTable:
    """``kernels``: every GPU event name (kernels, memcpy, memset) of the events in ``mask`` with its count
    and total time, the ``KERNEL_TABLE`` longest; ``kernels_omitted``: the rest summed (None when nothing
    was left out)."""
    total, count, kind, order = _by_name(ev, mask)
    rest = order[KERNEL_TABLE:]
    return {
        "kernels": [
            {
                "name": ev.names[i],
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


def _memcpy_bytes(ev: GpuEvents, mask: np.ndarray) -> dict[str, float]:
    """Bytes copied per direction (``HtoD``, ``DtoH``, ``DtoD``, ...) by the events in ``mask``, from
    ``Memcpy XtoY (...)`` names."""
    copies = np.flatnonzero(mask & (ev.kind == MEMORY) & (ev.bytes > 0))
    out: dict[str, float] = {}
    for i in np.unique(ev.name_id[copies]):
        words = ev.names[i].split()
        if len(words) > 1 and words[0] == "Memcpy":
            out[words[1]] = out.get(words[1], 0.0) + float(ev.bytes[copies][ev.name_id[copies] == i].sum())
    return out
