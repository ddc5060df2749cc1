"""What the host's CUDA calls in a trace say: kernel launches, synchronizations, host-to-device copies.

Each figure pairs a CPU runtime call with the GPU event it launched (their shared
``correlation`` id) over the ``gpu`` section's window: the GPU events launched before the
last ``ProfilerStep#`` began and the steps before it (:func:`perfmagic.analyze.gpu.trace_gpu`).
Times are microseconds on the trace's clock in, seconds and fractions out.
"""

from __future__ import annotations

import numpy as np

from perfmagic.analyze.gpu_tally import ByName, GpuTally
from perfmagic.contract.gpu import BlockingCopies, Copies, H2dCopies, Launches, Syncs
from perfmagic.traces.events import KinetoTrace
from perfmagic.traces.stages import SYNC_CALLS

BLOCKING_COPY = "cudaMemcpy"
"""The blocking copy call: a synchronization when it copies device to host."""
BLOCKING_MEMCPY = frozenset(
    {"cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemcpyToSymbol", "cudaMemcpyFromSymbol"}
)
BLOCKING_MEMSET = frozenset({"cudaMemset", "cudaMemset2D", "cudaMemset3D"})
"""The synchronous copy and memset calls (their ``Async`` forms are not)."""
H2D_SOURCES = ("Pageable", "Pinned")
"""Host memory a ``Memcpy HtoD (<source> -> Device)`` copies from."""


def launch_stats(tally: GpuTally) -> Launches | None:
    """``launches``: the tallied kernels against the kernel-launch calls that launched them.

    HolisticTraceAnalysis's definitions: a kernel's *launch delay* is its start minus the end of
    the call that launched it (0 when it started earlier); a kernel is *shorter than its launch*
    when it runs for less time than that call took. ``launch_bound_fraction``: what those short
    kernels' calls took beyond their kernels' run time, as a share of the window's span (the GPU
    time a stream of such kernels leaves idle, since the host cannot launch them as fast as
    they run). None without launched kernels.
    """
    count, shorter, beyond = tally.launches
    if not count:
        return None
    span_us = tally.span
    return {
        "count": count,
        "delay_median_s": tally.delays.median() / 1e6,
        "delay_p90_s": tally.delays.percentile(90) / 1e6,
        "call_median_s": tally.calls.median() / 1e6,
        "shorter_than_launch": shorter,
        "shorter_than_launch_fraction": shorter / count,
        "launch_bound_fraction": beyond / span_us if span_us > 0 else None,
    }


def sync_stats(trace: KinetoTrace, steps: tuple[np.ndarray, np.ndarray]) -> Syncs | None:
    """``syncs``: the synchronizing CUDA calls per step, over the step ranges ``(starts, ends)`` (µs).

    The calls: ``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, ``cudaEventSynchronize``, and
    ``cudaMemcpy`` when its copy runs device to host (the host waits for the GPU to finish). A call
    counts in the step its start falls in. None without steps.
    """
    starts, ends = steps
    if not len(starts):
        return None
    cpu, gpu = trace.cpu, trace.gpu
    # by name first, then per event: an object array of every event's name would cost more than the rest
    names = np.array(cpu.names, dtype=object)
    sync = np.isin(names, [n for n in SYNC_CALLS if n != BLOCKING_COPY])[cpu.name_id]
    rows = gpu.launch_row
    assert rows is not None  # read from a trace
    dtoh = np.array([n.startswith("Memcpy DtoH") for n in gpu.names], dtype=bool)[gpu.name_id]
    copies = rows[dtoh & (rows >= 0)]
    sync[copies[names[cpu.name_id[copies]] == BLOCKING_COPY]] = True
    # the syncs only, in row order: a step's index per row of a capture would cost more than its rows
    calls = np.flatnonzero(sync)
    counted = calls[_in_steps(cpu.start[calls], starts, ends)]
    n = len(starts)
    per_name = np.bincount(cpu.name_id[counted], minlength=len(names))
    per_call = {str(names[i]): int(per_name[i]) / n for i in np.flatnonzero(per_name)}
    return {
        "steps": n,
        "per_step": float(len(counted)) / n,
        "calls_per_step": per_call,
        "time_per_step_s": float(cpu.dur[counted].sum()) / n / 1e6,
    }


def _in_steps(t: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per time in ``t``, whether it falls in one of the steps ``[starts, ends)``."""
    order = np.argsort(starts)
    at = np.searchsorted(starts[order], t, side="right") - 1
    inside = at >= 0
    inside[inside] = t[inside] < ends[order][at[inside]]
    return inside


def blocking_copies(trace: KinetoTrace, steps: tuple[np.ndarray, np.ndarray]) -> BlockingCopies | None:
    """``blocking_copies``: the synchronous ``cudaMemcpy`` and ``cudaMemset`` calls per step over the step
    ranges ``(starts, ends)`` (µs), and the host's time in them (Nsight Systems' synchronous memcpy and
    memset checks). A call counts in the step its start falls in. None without steps."""
    starts, ends = steps
    if not len(starts):
        return None
    cpu = trace.cpu
    copy = np.array([n in BLOCKING_MEMCPY for n in cpu.names], dtype=bool)[cpu.name_id]
    memset = np.array([n in BLOCKING_MEMSET for n in cpu.names], dtype=bool)[cpu.name_id]
    calls = np.flatnonzero(copy | memset)
    inside = calls[_in_steps(cpu.start[calls], starts, ends)]
    n = len(starts)
    return {
        "steps": n,
        "memcpy_per_step": float(copy[inside].sum()) / n,
        "memset_per_step": float(memset[inside].sum()) / n,
        "time_per_step_s": float(cpu.dur[inside].sum()) / n / 1e6,
    }


def h2d_copies(names: list[str], events: ByName) -> H2dCopies | None:
    """``h2d_copies``: the host-to-device copies by host memory, pageable or pinned (the kind Kineto writes
    in each copy's name: ``Memcpy HtoD (Pinned -> Device)``), each with its ``count``, ``bytes`` and GPU
    ``total_s``; ``pinned_bytes_fraction`` of all bytes copied. None without such copies."""
    seen = np.flatnonzero(events.count > 0).tolist()
    by_source = [[i for i in seen if names[i].startswith(f"Memcpy HtoD ({host} -> ")] for host in H2D_SOURCES]
    if not any(by_source):
        return None
    # H2D_SOURCES: pageable, then pinned
    pageable, pinned = (_copies(events, ids) for ids in by_source)
    copied = pageable["bytes"] + pinned["bytes"]
    return {
        "pageable": pageable,
        "pinned": pinned,
        "pinned_bytes_fraction": pinned["bytes"] / copied if copied > 0 else None,
    }


def _copies(events: ByName, ids: list[int]) -> Copies:
    return {
        "count": int(events.count[ids].sum()),
        "bytes": float(events.bytes[ids].sum()),
        "total_s": float(events.total[ids].sum()) / 1e6,
    }
