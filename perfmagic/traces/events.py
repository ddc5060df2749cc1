"""A trace's events as columns: what the trace readers produce and the analysis reads.

GPU events are classified as HTA does (:func:`kernel_kind`); times are in microseconds
on the trace's clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

KINDS = ("computation", "communication", "memory")
"""GPU event kinds, as HTA classifies them; ``GpuEvents.kind`` indexes this tuple."""
COMPUTATION, COMMUNICATION, MEMORY = range(3)


@dataclass(frozen=True)
class CpuEvents:
    """CPU-side complete events, columnar."""

    names: list[str]
    name_id: np.ndarray  # (n,) int32
    start: np.ndarray  # (n,) float64 µs
    dur: np.ndarray  # (n,) float64 µs
    threads: list[Any]  # the trace's (pid, tid) pairs
    thread: np.ndarray  # (n,) int32 index into threads
    correlation: np.ndarray  # (n,) int64; -1 where the event launched nothing

    def __len__(self) -> int:
        return len(self.start)

    @property
    def end(self) -> np.ndarray:
        end: np.ndarray = self.start + self.dur
        return end

    def take(self, mask: np.ndarray) -> CpuEvents:
        return CpuEvents(
            self.names,
            self.name_id[mask],
            self.start[mask],
            self.dur[mask],
            self.threads,
            self.thread[mask],
            self.correlation[mask],
        )


@dataclass(frozen=True)
class GpuEvents:
    """GPU activity of one process, columnar: one row per kernel, memcpy or memset."""

    names: list[str]
    name_id: np.ndarray  # (n,) int32 index into names
    kind: np.ndarray  # (n,) int8 index into KINDS
    start: np.ndarray  # (n,) float64 µs
    dur: np.ndarray  # (n,) float64 µs
    device: np.ndarray  # (n,) int64
    stream: np.ndarray  # (n,) int64
    launch: np.ndarray  # (n,) float64 µs: start of the CPU call that launched it; NaN when unknown
    bytes: np.ndarray  # (n,) float64: bytes copied or set; 0 for kernels
    # (n,) int64: the id that links it to the CPU call that launched it (CpuEvents.correlation); -1 when
    # unknown. None for events not read from a trace.
    correlation: np.ndarray | None = None
    # (n,) int64: the row in the trace's CpuEvents of the call that launched it; -1 when unknown.
    # None for events not read from a trace.
    launch_row: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.start)

    def take(self, mask: np.ndarray) -> GpuEvents:
        return GpuEvents(
            self.names,
            self.name_id[mask],
            self.kind[mask],
            self.start[mask],
            self.dur[mask],
            self.device[mask],
            self.stream[mask],
            self.launch[mask],
            self.bytes[mask],
            None if self.correlation is None else self.correlation[mask],
            None if self.launch_row is None else self.launch_row[mask],
        )


_OLDER_NCCL = re.compile(r"(?:void )?nccl[A-Z]\w*Kernel")


def kernel_kind(name: str, memory: bool) -> int:
    """HTA's classification: NCCL kernels communicate, memcpy/memset move memory, the rest compute.

    ``ncclDevKernel`` (NCCL >= 2.19's kernel names) and NCCL 2.4-2.6's ``nccl<Op><Algo>Kernel_...``
    (``ncclAllReduceRingLLKernel_sum_f32``, in PyTorch 1.8-era traces) count as communication too; HTA
    0.5.0 only knows ``ncclKernel``.
    """
    if "ncclKernel" in name or "ncclDevKernel" in name or _OLDER_NCCL.match(name):
        return COMMUNICATION
    if memory or "Memcpy" in name or "Memset" in name:
        return MEMORY
    return COMPUTATION


@dataclass(frozen=True)
class GpuChunk:
    """GPU events as the ``gpu`` section's figures take them (:class:`GpuFigures`), with the call that
    launched each: its start (``launch``), name and duration."""

    name_id: np.ndarray  # (n,) int32 index into the trace's names
    kind: np.ndarray  # (n,) int8 index into KINDS
    start: np.ndarray  # (n,) float64 µs
    dur: np.ndarray  # (n,) float64 µs
    device: np.ndarray  # (n,) int64
    stream: np.ndarray  # (n,) int64
    launch: np.ndarray  # (n,) float64 µs: start of the launching call; NaN when unknown
    bytes: np.ndarray  # (n,) float64
    launch_name: np.ndarray  # (n,) int32: the launching call's name id; -1 when unknown
    launch_dur: np.ndarray  # (n,) float64 µs: the launching call's duration; NaN when unknown

    def __len__(self) -> int:
        return len(self.start)


class GpuFigures(Protocol):
    """What takes GPU events a chunk at a time, in start order: the ``gpu`` section's tally
    (:class:`perfmagic.analyze.gpu_tally.GpuTally`), made by a :data:`GpuFiguresOf`."""

    def add(self, chunk: GpuChunk, final: bool = False) -> None: ...


class GpuFiguresOf(Protocol):
    """Makes the figures of one process's GPU events: over the event names ``names`` (a list the reader
    goes on appending to), the events launched before ``launched_before`` (None: all), counted in whole
    microseconds where ``whole_us`` (see :func:`perfmagic.analyze.gpu.gpu_summary`)."""

    def __call__(self, names: list[str], launched_before: float | None, whole_us: bool) -> GpuFigures: ...


@dataclass(frozen=True)
class Aggregates:
    """What a reader that keeps only some of a trace's events counted over all of them."""

    first_us: float | None  # the earliest start of any event; None without events
    last_us: float | None  # the latest end of any event
    busiest_thread: int  # index into CpuEvents.threads of the thread with most CPU events; -1 without
    ns_resolution: bool  # some event's start carries a fraction of a microsecond


@dataclass(frozen=True)
class MemoryEvents:
    """The allocator's ``[memory]`` events: the memory allocated on a device after each (de)allocation."""

    start: np.ndarray  # (n,) float64 µs
    allocated: np.ndarray  # (n,) float64 bytes: "Total Allocated"
    reserved: np.ndarray  # (n,) float64 bytes: "Total Reserved" (NaN when absent)
    device_type: np.ndarray  # (n,) int64: "Device Type", CUDA_DEVICE for a CUDA GPU (0 is the CPU)
    device: np.ndarray  # (n,) int64: "Device Id"

    def __len__(self) -> int:
        return len(self.start)


CUDA_DEVICE = 1
"""``Device Type`` of a CUDA GPU in ``[memory]`` events (c10's DeviceType::CUDA)."""


def no_memory() -> MemoryEvents:
    """No allocator events: a trace recorded without ``profile_memory``."""
    f, i = np.zeros(0), np.zeros(0, dtype=np.int64)
    return MemoryEvents(f, f, f, i, i)


def running_allocated(
    start: np.ndarray, allocated: np.ndarray, device_type: np.ndarray, device: np.ndarray, delta: np.ndarray
) -> np.ndarray:
    """The memory allocated after each ``[memory]`` event: its ``Total Allocated``, or where an older
    trace (PyTorch 1.9) writes only the ``Bytes`` (de)allocated, their running sum per device from the
    first event (the memory held before the trace began is not in it)."""
    older = np.isnan(allocated) & np.isfinite(delta)
    if not older.any():
        return allocated
    out: np.ndarray = allocated.copy()
    rows = np.flatnonzero(older)
    for dtype, dev in set(zip(device_type[rows].tolist(), device[rows].tolist(), strict=True)):
        on = rows[(device_type[rows] == dtype) & (device[rows] == dev)]
        on = on[np.argsort(start[on], kind="stable")]
        out[on] = np.cumsum(delta[on])
    return out


@dataclass(frozen=True)
class KinetoTrace:
    """One rank's trace."""

    path: Path
    cpu: CpuEvents
    gpu: GpuEvents
    distributed: dict[str, Any] = field(default_factory=dict)  # distributedInfo: rank, world_size, backend
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    base_time_ns: int = 0  # baseTimeNanoseconds: add to ts for wall-clock time, when the trace has it
    dropped: dict[str, int] = field(default_factory=dict)  # events left out, by reason
    memory: MemoryEvents = field(default_factory=no_memory)
    # names of CPU events that carry a ``step_num`` argument: the steps a JAX ``StepTraceAnnotation`` or a
    # TensorFlow ``tf.profiler.experimental.Trace(..., step_num=...)`` marks (``ProfilerStep#N`` for torch)
    step_names: frozenset[str] = frozenset()
    # figures a reader tallied over GPU events it streamed rather than kept: ``gpu`` then holds only the
    # copies, memsets and communication kernels, and ``aggregates`` what was counted over every event
    gpu_figures: GpuFigures | None = None
    aggregates: Aggregates | None = None

    @property
    def ns_resolution(self) -> bool:
        """Timestamps carry fractions of a microsecond (newer PyTorch writes ns resolution)."""
        if self.aggregates is not None:
            return self.aggregates.ns_resolution
        return any(bool(np.any(t != np.floor(t))) for t in (self.cpu.start, self.gpu.start))

    @property
    def rank(self) -> int | None:
        rank = self.distributed.get("rank")
        return int(rank) if isinstance(rank, (int, float)) and finite_number(rank) and rank >= 0 else None


def finite_number(value: Any) -> bool:
    """A JSON number that is a real int or float, and finite."""
    return type(value) in (int, float) and bool(np.isfinite(value))
