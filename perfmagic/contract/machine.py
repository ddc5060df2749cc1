"""The report's ``devices`` and ``host`` sections: the GPUs and the machine over the window.

Units: bytes, seconds, watts, joules, MHz, °C; utilizations and fractions in [0, 1]. A figure
that was not measured is ``None``.
"""

from __future__ import annotations

from typing import TypedDict

from perfmagic.contract.meta import GpuProcess, MigInstance


class DriverSamples(TypedDict):
    """The driver's own utilization samples of one GPU (NVML's sample buffer) over the window."""

    count: int
    period_s: float | None
    from_s: float  # on the timeline's clock
    to_s: float
    util_mean: float
    util_p95: float
    mem_util_mean: float | None


class Allocator(TypedDict):
    """PyTorch's caching allocator on one GPU over the window."""

    allocated_peak_bytes: int
    reserved_peak_bytes: int
    alloc_retries: int
    ooms: int


class DeviceMigInstance(MigInstance):
    """A MIG instance, with its peak memory over the window."""

    mem_used_peak_bytes: int | None


class Device(TypedDict):
    """One GPU as NVML sampled it (``devices[i]``)."""

    index: int
    name: str | None
    uuid: str | None
    pci_bus_id: str | None
    compute_capability: str | None  # "9.0"
    samples: int
    util_mean: float | None
    util_p95: float | None
    mem_util_mean: float | None
    mem_used_peak_bytes: int | None
    mem_total_bytes: int | None
    mem_used_peak_fraction: float | None
    power_mean_w: float | None
    power_max_w: float | None
    power_limit_w: float | None
    energy_j: float | None
    energy_source: str | None  # "counter" or "power_integral"
    sm_clock_mean_mhz: float | None
    mem_clock_mean_mhz: float | None
    temperature_max_c: float | None
    throttle_reasons: list[str]
    throttle_fraction: dict[str, float]  # per clocks-event reason: the share of samples it was active in
    pcie_tx_mean_bytes_per_s: float | None
    pcie_rx_mean_bytes_per_s: float | None
    nvlink_tx_mean_bytes_per_s: float | None
    nvlink_rx_mean_bytes_per_s: float | None
    sm_active_mean: float | None
    sm_occupancy_mean: float | None
    tensor_active_mean: float | None
    dram_bw_util_mean: float | None
    driver_samples: DriverSamples | None
    lost: bool  # the GPU fell off the bus or stopped answering in the window
    lost_at_s: float | None
    lost_reason: str | None
    processes: list[GpuProcess]
    tree_mem_used_bytes: int | None  # GPU memory of the profiled process tree
    numa_node: int | None
    numa_cpus: list[int] | None
    mig_enabled: bool | None
    mig_instances: list[DeviceMigInstance]
    allocator: Allocator | None


class GpuAffinity(TypedDict):
    """How many of the CPUs the process may use are NUMA-local to one GPU."""

    gpu: int
    numa_node: int | None
    local_cpus: int
    allowed_cpus: int
    allowed_local_cpus: int
    allowed_local_fraction: float | None


class Host(TypedDict):
    """The machine and the profiled process tree over the window (``host``); CPU of the tree in cores."""

    cpu_count: int | None
    physical_cores: int | None
    cpu_util_mean: float | None
    cpu_util_p95: float | None
    per_core_util_mean: list[float | None]
    proc_cpu_util_mean: float | None
    proc_cpu_util_p95: float | None
    rss_peak_bytes: int | None
    uss_peak_bytes: int | None
    pss_peak_bytes: int | None
    mem_available_min_bytes: int | None
    mem_total_bytes: int | None
    read_bytes: int | None
    write_bytes: int | None
    read_ops: int | None
    write_ops: int | None
    avg_read_size_bytes: float | None
    read_mean_bytes_per_s: float | None
    proc_read_bytes: int | None
    proc_write_bytes: int | None
    iowait_mean: float | None
    net_sent_bytes: int | None
    net_recv_bytes: int | None
    affinity: list[int] | None  # the CPUs the process may run on
    numa_nodes: dict[str, list[int]] | None  # CPUs per NUMA node (JSON keys: the node's number)
    gpu_affinity: list[GpuAffinity]
