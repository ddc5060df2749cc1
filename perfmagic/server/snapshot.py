"""Build the sidebar's snapshot: one JSON-able dict of GPUs, GPU processes, host and NVML status.

Units match the report: bytes, watts, joules, seconds; utilizations in [0, 1].
Everything here runs on the sampler thread, never on the server's IO loop.

The TypedDicts below (:class:`Snapshot` and its parts) are the snapshot's schema: the sidebar's
TypeScript types (``labextension/src/snapshot.ts``) are generated from them by
:mod:`perfmagic.server.snapshot_ts`, and ``tests/unit/test_snapshot_schema.py`` checks both that
the committed file is up to date and that real snapshots (fake NVML) have exactly these fields.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, TypedDict

import psutil

from perfmagic.analyze import node_name
from perfmagic.collect.host import busy_fractions, cpu_times_of
from perfmagic.contract import DeviceInfo, NvmlProcess
from perfmagic.contract.meta import MigInstance

SCHEMA = "perfmagic.snapshot/1"

Json = dict[str, Any]


# ---- the schema ---------------------------------------------------------------------------------
# Every field listed is in every snapshot unless its class is ``total=False``; ``None`` where
# the source could not read it. Change a field here, then regenerate the TypeScript:
# ``python -m perfmagic.server.snapshot_ts``.


class NvmlStatus(TypedDict):
    """``snapshot["nvml"]``: whether GPUs can be read, and if not, why."""

    available: bool
    reason: str | None
    driver_version: str | None
    cuda_driver_version: str | None
    device_count: int
    warnings: list[str]


class _Gpu(TypedDict):
    # what NVML says of the GPU at the start (Nvml.static_info)
    index: int
    name: str | None
    uuid: str | None
    pci_bus_id: str | None
    power_limit_w: float | None
    numa_cpus: list[int] | None
    numa_node: int | None
    compute_capability: str | None
    mig_enabled: bool | None
    mig_instances: list[MigInstance]
    # one read (Nvml.read, READ_KEYS), which replaces mem_total_bytes
    util_gpu: float | None
    util_mem: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    power_w: float | None
    energy_j: float | None
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    temperature_c: int | None
    pstate: int | None
    throttle_mask: int | None
    throttle_reasons: list[str] | None
    pcie_tx_bytes_per_s: float | None
    pcie_rx_bytes_per_s: float | None
    nvlink_tx_bytes_per_s: float | None
    nvlink_rx_bytes_per_s: float | None
    mig_mem_used_bytes: list[int | None] | None
    sm_active: float | None
    sm_occupancy: float | None
    tensor_active: float | None
    dram_bw_util: float | None
    lost: bool


class Gpu(_Gpu, total=False):
    """``snapshot["gpus"][i]``: one GPU's facts and latest metrics (a lost GPU's are ``None``)."""

    lost_reason: str | None  # only on a lost GPU


class KernelRef(TypedDict):
    """The kernel (and notebook) a GPU process belongs to (``kernels.kernel_info``)."""

    id: str
    name: str | None
    execution_state: str | None
    session_id: str | None
    session_type: str | None
    path: str | None
    notebook: str | None


class _GpuProcess(TypedDict):
    gpu_index: int
    gpu_uuid: str | None
    pid: int
    used_memory_bytes: int | None
    type: str  # "compute" or "graphics"
    name: str | None
    username: str | None
    visible: bool  # False: a PID of another PID namespace (containers)
    kernel: KernelRef | None
    # where a perfmagic session profiles the process: its distributed rank and node
    rank: int | None
    local_rank: int | None
    node: str | None


class GpuProcess(_GpuProcess, total=False):
    """``snapshot["processes"][i]``: a process on a GPU, and who it is."""

    sm_util: float | None  # its SM share, where the driver reports it


class Host(TypedDict, total=False):
    """``snapshot["host"]``: CPU and memory; empty in the snapshot served before the first sample."""

    cpu_count: int
    cpu_util: float | None
    load_avg_1m: float | None
    mem_total_bytes: int
    mem_used_bytes: int
    mem_available_bytes: int
    mem_util: float | None


class _Snapshot(TypedDict):
    schema: Literal["perfmagic.snapshot/1"]
    seq: int
    time: float
    interval_s: float
    nvml: NvmlStatus
    gpus: list[Gpu]
    processes: list[GpuProcess]
    host: Host


class Snapshot(_Snapshot, total=False):
    """One sample of everything the sidebar shows."""

    age_s: float | None  # added when served (handlers): how old the sample is


class NvmlLike(Protocol):
    """The part of :class:`perfmagic.collect.nvml.Nvml` the monitor uses."""

    driver_version: str | None
    cuda_driver_version: str | None
    warnings: list[str]

    def device_count(self) -> int: ...

    def lost_reason(self, i: int) -> str | None: ...

    def static_info(self, i: int) -> DeviceInfo: ...

    def read(self, i: int) -> Json: ...

    def processes(self, i: int) -> list[NvmlProcess]: ...

    def close(self) -> None: ...


def nvml_status(
    nv: NvmlLike | None, reason: str | None, device_count: int = 0, warnings: list[str] | None = None
) -> Json:
    """The ``nvml`` section: whether GPUs can be read, and if not, why."""
    return {
        "available": nv is not None,
        "reason": reason,
        "driver_version": None if nv is None else nv.driver_version,
        "cuda_driver_version": None if nv is None else nv.cuda_driver_version,
        "device_count": device_count,
        "warnings": list(warnings or []),
    }


class HostReader:
    """Host CPU and memory. CPU utilization comes from our own ``cpu_times`` deltas (counted as the
    report's ``host.cpu_util`` is), because ``psutil.cpu_percent(None)`` keeps one process-wide
    baseline that any other caller would reset."""

    def __init__(self) -> None:
        self._prev = cpu_times_of(psutil.cpu_times())
        self.cpu_count = psutil.cpu_count() or os.cpu_count() or 1

    def read(self) -> Json:
        now = cpu_times_of(psutil.cpu_times())
        fractions = busy_fractions(now, self._prev)
        util = None if fractions is None else fractions[0]
        self._prev = now
        vm = psutil.virtual_memory()
        used = vm.total - vm.available  # what applications hold; excludes reclaimable cache
        return {
            "cpu_count": self.cpu_count,
            "cpu_util": util,
            "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "mem_total_bytes": vm.total,
            "mem_used_bytes": used,
            "mem_available_bytes": vm.available,
            "mem_util": used / vm.total if vm.total else None,
        }


_READ_FIELDS = tuple(k for k in _Gpu.__annotations__ if k not in DeviceInfo.__annotations__)


def read_gpus(nv: NvmlLike, static: list[DeviceInfo]) -> list[Json]:
    """Per-GPU metrics: static facts plus one read; a GPU that fails is reported lost, not dropped."""
    gpus: list[Json] = []
    for info in static:
        i = int(info["index"])
        gpu: Json = dict(info)
        try:
            gpu.update(nv.read(i))
        except Exception as e:  # one bad device must not hide the others
            # the fields of a read, unread, so that the snapshot keeps its shape (Gpu)
            gpu.update(
                dict.fromkeys(_READ_FIELDS), lost=True, lost_reason=f"read failed: {type(e).__name__}: {e}"
            )
        gpu["index"] = i
        gpu["lost"] = bool(gpu.get("lost"))
        if gpu["lost"] and not gpu.get("lost_reason"):
            gpu["lost_reason"] = nv.lost_reason(i)
        gpus.append(gpu)
    return gpus


def read_processes(nv: NvmlLike, gpus: list[Json]) -> list[Json]:
    """The processes of every GPU still on the bus, tagged with their GPU."""
    procs: list[Json] = []
    for gpu in gpus:
        if gpu["lost"]:
            continue
        i = gpu["index"]
        try:
            found = nv.processes(i)
        except Exception:  # the NVML layer already warns; a missing list is not fatal
            continue
        procs.extend({"gpu_index": i, "gpu_uuid": gpu.get("uuid"), **p} for p in found)
    return procs


class ProcessCache:
    """Reuse the last process list for ``max_age_s``: per-process NVML queries are the slow ones."""

    def __init__(self, max_age_s: float) -> None:
        self.max_age_s = max_age_s
        self._value: list[Json] = []
        self._at = -math.inf

    def get(self, compute: Callable[[], list[Json]]) -> list[Json]:
        now = time.monotonic()
        if now - self._at >= self.max_age_s:
            self._value = compute()
            self._at = now
        return self._value


def describe_processes(
    procs: list[Json], kernel_for: Callable[[int], Json | None], sessions: Sequence[Json] = ()
) -> list[Json]:
    """Add each GPU process's name, user and owning kernel (with its notebook path), and where
    a perfmagic session profiles it (``sessions``: their status files), its ``rank``,
    ``local_rank`` and ``node``.

    NVML may report PIDs of another PID namespace (containers): those get ``visible: false``.
    """
    by_pid = {int(s["pid"]): s for s in sessions}
    out: list[Json] = []
    for p in procs:
        pid = int(p["pid"])
        entry: Json = {**p, "name": None, "username": None, "visible": False, "kernel": None}
        session = by_pid.get(pid, {})
        entry |= {
            "rank": session.get("rank"),
            "local_rank": session.get("local_rank"),
            "node": node_name(session) if session else None,
        }
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                entry["name"] = proc.name()
                entry["username"] = _username(proc)
            entry["visible"] = True
            entry["kernel"] = kernel_for(pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
        out.append(entry)
    return out


def _username(proc: psutil.Process) -> str | None:
    try:
        return str(proc.username())
    except (psutil.AccessDenied, KeyError):  # KeyError: uid without a passwd entry (containers)
        return None


def build(
    seq: int,
    interval_s: float,
    nvml: Json,
    gpus: list[Json],
    processes: list[Json],
    host: Json,
) -> Json:
    """Assemble one snapshot; non-finite floats become None so the JSON stays valid."""
    snap: Json = {
        "schema": SCHEMA,
        "seq": seq,
        "time": time.time(),
        "interval_s": interval_s,
        "nvml": nvml,
        "gpus": gpus,
        "processes": processes,
        "host": host,
    }
    cleaned: Json = _finite(snap)
    return cleaned


def _finite(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x
