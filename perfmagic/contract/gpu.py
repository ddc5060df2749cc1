"""The report's ``gpu`` section: what a torch.profiler trace says the GPU did over HTA's window.

Times in seconds, sizes in bytes; fractions are of the window's span unless the name says
otherwise, and ``None`` where their whole is zero.
"""

from __future__ import annotations

from typing import TypedDict


class IdleBreakdown(TypedDict):
    """Idle time by the event that ends each gap, as fractions of idle time (``None``: no idle time)."""

    host_wait: float | None  # the next event was launched after the gap began: the host was late
    kernel_wait: float | None  # short gaps between kernels that were launched in time
    other: float | None


class _StreamIdle(TypedDict):
    device: int
    stream: int
    idle_s: float
    host_wait_s: float
    kernel_wait_s: float
    other_s: float


class StreamIdle(IdleBreakdown, _StreamIdle):
    """HTA's ``get_idle_time_breakdown`` for one stream: the gaps between its consecutive events."""


class TopKernel(TypedDict):
    """One of the GPU event names with most time."""

    name: str
    kind: str  # "computation", "communication" or "memory" (traces.events.KINDS)
    count: int
    total_s: float
    mean_s: float
    fraction: float | None
    tensor_cores: bool | None  # from the kernel's name; None where the name does not say


class KernelRow(TypedDict):
    """A row of the kernel table: one GPU event name (kernel, memcpy, memset)."""

    name: str
    kind: str  # "computation", "communication" or "memory" (traces.events.KINDS)
    count: int
    total_s: float


class KernelsOmitted(TypedDict):
    """The names the kernel table leaves out, summed."""

    names: int
    count: int
    total_s: float


class Comm(TypedDict):
    """Communication kernels, and how much of them compute overlapped."""

    total_s: float
    overlapped_s: float
    exposed_s: float  # with no computation beside it
    exposed_fraction: float | None
    overlap_fraction: float | None  # of communication time


class GpuDevice(TypedDict):
    index: int
    name: str | None


class Launches(TypedDict):
    """Kernels against the calls that launched them (HTA's definitions)."""

    count: int
    delay_median_s: float  # a kernel's start less its launch call's end (0 when it started earlier)
    delay_p90_s: float
    call_median_s: float
    shorter_than_launch: int  # kernels that ran for less time than their launch call took
    shorter_than_launch_fraction: float
    launch_bound_fraction: float | None  # those calls' time beyond their kernels', as a share of the window


class Syncs(TypedDict):
    """Calls that block the host until the GPU catches up, within the profiler steps."""

    steps: int
    per_step: float
    calls_per_step: dict[str, float]  # by CUDA call name
    time_per_step_s: float


class BlockingCopies(TypedDict):
    """Synchronous copies and memsets (``cudaMemcpy``, ``cudaMemset``) within the profiler steps: each
    returns only when the GPU has run it, after all the work queued before it."""

    steps: int
    memcpy_per_step: float
    memset_per_step: float
    time_per_step_s: float  # the host's time in those calls


class Gaps(TypedDict):
    """Long stretches of the window in which the GPU ran nothing (Nsight's GPU starvation gaps)."""

    min_s: float  # a gap counts from this long
    count: int
    total_s: float
    fraction: float | None  # of the window
    longest_s: float  # 0 without such a gap


class Copies(TypedDict):
    count: int
    bytes: float
    total_s: float  # GPU time


class H2dCopies(TypedDict):
    """Host-to-device copies by the host memory they came from."""

    pageable: Copies
    pinned: Copies
    pinned_bytes_fraction: float | None  # of all bytes copied


class MemoryPeak(TypedDict):
    """The allocator's peaks on one GPU, from the trace's memory events."""

    device: int
    allocated_peak_bytes: float
    reserved_peak_bytes: float | None


class KernelTimes(TypedDict):
    top_kernels: list[TopKernel]
    tensor_core_fraction: float | None  # of matrix-kernel time, the kernels that use tensor cores
    tensor_cores_unknown: int  # computation kernel names whose name does not say (tensor_cores None)


class KernelTable(TypedDict):
    kernels: list[KernelRow]
    kernels_omitted: KernelsOmitted | None


class GpuSummary(KernelTimes, KernelTable):
    """The figures of one process's GPU events (``analyze.gpu.gpu_summary``)."""

    window_s: float
    busy_fraction: float | None
    idle_fraction: float | None
    compute_fraction: float | None
    non_compute_fraction: float | None
    comm_fraction: float | None
    memory_fraction: float | None
    idle_s: float
    idle_breakdown: IdleBreakdown
    idle_breakdown_by_stream: list[StreamIdle]
    event_count: int
    kernel_count: int
    streams: list[int]
    comm: Comm | None
    memcpy_bytes: dict[str, float]  # by direction: "HtoD", "DtoH", "DtoD", …
    gaps: Gaps


class GpuSection(GpuSummary):
    """The ``gpu`` section (and ``ranks[i]["gpu"]``) of a trace's or a ``--trace`` window's report."""

    profiler_steps: list[int]  # the ProfilerStep# numbers the window covers
    devices: list[GpuDevice]
    launches: Launches | None
    syncs: Syncs | None
    blocking_copies: BlockingCopies | None
    h2d_copies: H2dCopies | None
    memory: list[MemoryPeak] | None
