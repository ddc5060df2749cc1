"""``Timeline.meta``: the facts about one process's window that the collectors and the session write.

Every key may be absent: a timeline read from a trace has other keys than a live session's, a
spool of a killed process lacks what is written at the end (``wall_s``, ``warnings``), and tests
build timelines with a few. Times are on the timeline's clock (seconds from its origin) unless
the name says otherwise.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from perfmagic.contract.gpu import GpuSection, MemoryPeak
from perfmagic.contract.memory import MemoryMeta, WorkerMemoryMeta
from perfmagic.contract.tuning import KnobResult

Source = Literal["live", "run", "trace"]
"""Where a report or timeline came from: a profiled block, ``perfmagic run``, a trace file."""


class HostMeta(TypedDict, total=False):
    """``meta["host"]``: the machine, as :mod:`perfmagic.collect.host` saw it at the start (it writes
    every key; a timeline from elsewhere may have some)."""

    cpu_count: int
    physical_cores: int | None
    affinity: list[int] | None  # the CPUs the process may run on (None: the OS does not say)
    numa_nodes: dict[int, list[int]]  # CPUs per NUMA node; read back from JSON its keys are str
    mem_total_bytes: int
    root_pid: int


class _NvmlMeta(TypedDict):
    available: bool
    reason: str | None  # why not
    driver_version: str | None
    cuda_driver_version: str | None


class NvmlMeta(_NvmlMeta, total=False):
    """``meta["nvml"]``: whether NVML answered, and its versions (the source writes all but ``gpm`` as it
    opens, before it knows whether NVML answers)."""

    gpm: list[int]  # GPUs whose GPM counters (SM activity, occupancy, …) were started


class MigInstance(TypedDict):
    """A MIG instance of one GPU."""

    gpu_instance_id: int | None
    compute_instance_id: int | None
    uuid: str | None
    mem_total_bytes: int | None


class DeviceInfo(TypedDict, total=False):
    """``meta["devices"][i]``: what NVML says of one GPU at the start (``Nvml.static_info``); a GPU
    known only from its samples has none of it."""

    index: int
    name: str | None
    uuid: str | None
    pci_bus_id: str | None
    mem_total_bytes: int | None
    power_limit_w: float | None
    numa_cpus: list[int] | None
    numa_node: int | None
    compute_capability: str | None
    mig_enabled: bool | None
    mig_instances: list[MigInstance]
    lost: bool


class _NvmlProcess(TypedDict):
    pid: int
    used_memory_bytes: int | None
    type: str  # "compute" or "graphics"


class NvmlProcess(_NvmlProcess, total=False):
    """A process NVML lists on one GPU (``Nvml.processes``)."""

    sm_util: float | None  # its mean SM share over the window (set once the shares are read)


class GpuProcess(NvmlProcess):
    """``meta["gpu_processes"][i]``: a process NVML saw on a GPU in the window."""

    gpu: int
    in_tree: bool  # one of the profiled process tree's


class TorchMeta(TypedDict, total=False):
    """``meta["torch"]``: torch's version and global settings when the hooks went in."""

    torch_version: str
    cuda_version: str | None
    cuda_available: bool
    cuda_device_count: int
    num_threads: int
    cudnn_benchmark: bool
    cudnn_allow_tf32: bool
    matmul_allow_tf32: bool
    float32_matmul_precision: str
    distributed: bool


class AllocatorMeta(TypedDict):
    """``meta[ALLOCATOR][i]``: PyTorch's caching allocator on one GPU over the window."""

    index: int
    allocated_peak_bytes: int
    reserved_peak_bytes: int
    alloc_retries: int
    ooms: int


class CodePlace(TypedDict):
    """A line of code named as its user knows it (``perfmagic.places``), resolved where it ran."""

    function: str  # the code's own name: ``__getitem__``, ``<module>`` (a cell's or script's top level)
    file: str  # ``In [2]`` (a notebook cell, by its execution count), else the file's path: relative to
    # the working directory under it, to its site-packages or standard library under one, else absolute
    line: int  # in that cell or file, as its user sees it
    cell: int | None  # the cell's execution count; None: a file
    where: str  # ``function (In [2], line 29)``, ``function (train.py:12)``


class StackSample(CodePlace):
    """``meta[STACK_SAMPLES][i]``: how often the training thread was sampled at one place in a stage."""

    stage: str
    count: int


class PlaceCount(CodePlace):
    """``meta[WORKER_STACKS]["places"][i]``: how often the DataLoader workers were sampled at one place."""

    count: int


class WorkerStacksMeta(TypedDict):
    """``meta[WORKER_STACKS]``: the stacks of the DataLoader workers forked in the window, sampled while
    they built batches (``collect.worker_stacks``)."""

    workers: int  # workers that sampled themselves
    samples: int  # all their samples, those of places left out of ``places`` included
    places: list[PlaceCount]  # the most sampled, most first


class ThreadStateSample(TypedDict):
    """``meta[THREAD_STATES][i]``: how often the training thread was sampled in one state in a stage."""

    stage: str
    state: str  # /proc's letter: R on a CPU or queued for one, S asleep, D uninterruptible (disk), ...
    count: int


class SamplerMeta(TypedDict):
    """``meta["sampler"]``: the sampler thread's own cost."""

    ticks: int
    busy_s: float


class TimelineMeta(TypedDict, total=False):
    """``Timeline.meta``: every key any module writes; all of them may be absent."""

    epoch: float  # wall-clock time (Unix seconds) of the timeline's origin
    pid: int | None
    hostname: str
    rank: int | None
    local_rank: int | None
    node_rank: int | None  # torchrun's GROUP_RANK
    world_size: int | None
    backend: str | None  # a trace's distributed backend
    argv: list[str]
    python: str
    source: str  # "live", "run" or "trace" (a Source)
    interval: float  # sampling period, seconds
    ready_s: float  # when perfmagic had finished its own start
    price_per_gpu_hour: float  # the user's price of one GPU for an hour (energy.cost_*)
    wall_s: float  # the window's end: written when the profile finishes
    framework: str | None
    trace_file: str
    profiler_steps: list[int]  # a trace's ProfilerStep# numbers
    warnings: list[str]
    host: HostMeta
    nvml: NvmlMeta
    devices: list[DeviceInfo]
    gpu_processes: list[GpuProcess]
    gpu_processes_scope: Literal["tree", "all"]
    gpu: GpuSection  # a trace's GPU figures
    gpu_memory: list[MemoryPeak]  # a trace's allocator peaks per CUDA device
    torch: TorchMeta
    cuda_allocator: list[AllocatorMeta]  # schema.ALLOCATOR
    stack_samples: list[StackSample]  # schema.STACK_SAMPLES
    worker_stacks: WorkerStacksMeta  # schema.WORKER_STACKS
    worker_memory: list[WorkerMemoryMeta]  # schema.WORKER_MEMORY
    thread_states: list[ThreadStateSample]  # schema.THREAD_STATES
    sampler: SamplerMeta
    tuning: list[KnobResult]
    memory: MemoryMeta  # collect.torch_memory: one sampled step's memory
