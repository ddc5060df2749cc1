"""What each GPU reports through NVML, for the sampler and the sidebar server alike.

:class:`Nvml` reads a GPU's static facts, one tick of its metrics, the driver's own
utilization samples and its processes. Every NVML call goes through
:class:`~perfmagic.collect.nvml_query.NvmlQuery`, so nothing NVML does raises out of
it after :meth:`Nvml.open`; the counters come as rates from
:mod:`perfmagic.collect.nvml_counters`.
"""

from __future__ import annotations

import os
from typing import Any

from perfmagic.clock import REAL_CLOCK, Clock
from perfmagic.collect.nvml_counters import Counters
from perfmagic.collect.nvml_query import VALUE_MEMBERS, NvmlQuery, text
from perfmagic.contract.meta import DeviceInfo, MigInstance, NvmlProcess
from perfmagic.schema import THROTTLE_REASONS

#: Keys of :meth:`Nvml.read`; each is ``None`` when not available.
READ_KEYS = (
    "util_gpu",
    "util_mem",
    "mem_used_bytes",
    "mem_total_bytes",
    "power_w",
    "energy_j",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "temperature_c",
    "pstate",
    "throttle_mask",
    "throttle_reasons",
    "pcie_tx_bytes_per_s",
    "pcie_rx_bytes_per_s",
    "nvlink_tx_bytes_per_s",
    "nvlink_rx_bytes_per_s",
    "mig_mem_used_bytes",
    "sm_active",
    "sm_occupancy",
    "tensor_active",
    "dram_bw_util",
)

_SAMPLE_TYPES = {"gpu_util": "NVML_GPU_UTILIZATION_SAMPLES", "mem_util": "NVML_MEMORY_UTILIZATION_SAMPLES"}


def _cpus_from_mask(words: Any) -> list[int]:
    """CPU ids from NVML's affinity bitmask (an array of 64-bit words)."""
    return [64 * w + b for w, word in enumerate(words) for b in range(64) if int(word) >> b & 1]


def decode_throttle(mask: int) -> list[str]:
    """Names of the clocks-event reasons set in an NVML bitmask."""
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


class Nvml:
    """An open NVML session: static facts, one-tick reads, per-process figures.

    Every method returns ``None`` (or an empty list) for what NVML cannot say
    and records why in :attr:`warnings`, each reason once.
    """

    def __init__(self, q: NvmlQuery) -> None:
        """Use :meth:`open`."""
        self._q = q
        self._counters = Counters(q)
        self.warnings = q.warnings
        self._mig: dict[int, list[Any]] = {}
        self.driver_version: str | None = q.query(
            None, "driver_version", lambda n: text(n.nvmlSystemGetDriverVersion())
        )
        cuda = q.query(None, "cuda_driver_version", lambda n: n.nvmlSystemGetCudaDriverVersion())
        self.cuda_driver_version: str | None = None if cuda is None else f"{cuda // 1000}.{cuda % 1000 // 10}"

    @classmethod
    def open(cls, clock: Clock = REAL_CLOCK) -> Nvml:
        """Initialize NVML (slow reads timed on ``clock``); raises
        :class:`~perfmagic.collect.nvml_query.NvmlUnavailable` with the reason."""
        return cls(NvmlQuery.open(clock))

    def device_count(self) -> int:
        return len(self._q.handles)

    def is_lost(self, index: int) -> bool:
        return self._q.is_lost(index)

    def lost_reason(self, index: int) -> str | None:
        return self._q.lost_reason(index)

    def static_info(self, index: int) -> DeviceInfo:
        """Facts that do not change during a run."""
        q, h = self._q, self._q.handles[index]
        name = q.query(index, "name", lambda n: text(n.nvmlDeviceGetName(h)))
        if name is not None:
            q.names[index] = name
        mem = self._memory(index)
        limit = q.query(index, "power_limit_w", lambda n: n.nvmlDeviceGetEnforcedPowerLimit(h))
        ncpu = os.cpu_count() or 1
        mask = q.query(index, "numa_cpus", lambda n: n.nvmlDeviceGetCpuAffinity(h, (ncpu + 63) // 64))
        cc = q.query(index, "compute_capability", lambda n: n.nvmlDeviceGetCudaComputeCapability(h))
        mig_mode = q.query(index, "mig_mode", lambda n: n.nvmlDeviceGetMigMode(h))
        mig_enabled = bool(mig_mode is not None and mig_mode[0] == q.nv.NVML_DEVICE_MIG_ENABLE)
        return {
            "index": index,
            "name": name,
            "uuid": q.query(index, "uuid", lambda n: text(n.nvmlDeviceGetUUID(h))),
            "pci_bus_id": q.query(index, "pci_bus_id", lambda n: text(n.nvmlDeviceGetPciInfo(h).busId)),
            "mem_total_bytes": None if mem is None else int(mem.total),
            "power_limit_w": None if limit is None else limit / 1000.0,
            "numa_cpus": None if mask is None else _cpus_from_mask(mask),
            "numa_node": q.query(index, "numa_node", lambda n: n.nvmlDeviceGetNumaNodeId(h)),
            "compute_capability": None if cc is None else f"{cc[0]}.{cc[1]}",
            "mig_enabled": mig_enabled,
            "mig_instances": self._mig_instances(index) if mig_enabled else [],
            "lost": self.is_lost(index),
        }

    def _memory(self, index: int) -> Any:
        h = self._q.handles[index]
        # v2 excludes driver-reserved memory from "used", as nvidia-smi does since R510.
        return self._q.query(
            index,
            "memory",
            lambda n: n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2),
            lambda n: n.nvmlDeviceGetMemoryInfo(h),
        )

    def _mig_instances(self, index: int) -> list[MigInstance]:
        q, h = self._q, self._q.handles[index]
        slots = q.query(index, "mig_instances", lambda n: n.nvmlDeviceGetMaxMigDeviceCount(h)) or 0
        handles: list[Any] = []
        out: list[MigInstance] = []
        for k in range(int(slots)):
            mh = q.query(index, f"mig_slot{k}", lambda n, k=k: n.nvmlDeviceGetMigDeviceHandleByIndex(h, k))
            if mh is None:  # an empty slot answers NotFound
                continue
            key = f"mig{len(handles)}"
            mem = q.query(index, key, lambda n, mh=mh: n.nvmlDeviceGetMemoryInfo(mh))
            out.append(
                {
                    "gpu_instance_id": q.query(
                        index, key + ".gi", lambda n, mh=mh: n.nvmlDeviceGetGpuInstanceId(mh)
                    ),
                    "compute_instance_id": q.query(
                        index, key + ".ci", lambda n, mh=mh: n.nvmlDeviceGetComputeInstanceId(mh)
                    ),
                    "uuid": q.query(index, key + ".uuid", lambda n, mh=mh: text(n.nvmlDeviceGetUUID(mh))),
                    "mem_total_bytes": None if mem is None else int(mem.total),
                }
            )
            handles.append(mh)
        self._mig[index] = handles
        return out

    def read(self, index: int) -> dict[str, Any]:
        """One tick of dynamic metrics; only cheap, non-blocking NVML calls."""
        out: dict[str, Any] = dict.fromkeys(READ_KEYS)
        if not self._q.is_lost(index):
            self._read_into(index, out)
        out["lost"] = self._q.is_lost(index)
        return out

    def _read_into(self, index: int, out: dict[str, Any]) -> None:
        q, h = self._q, self._q.handles[index]
        util = q.query(index, "util", lambda n: n.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            out["util_gpu"] = util.gpu / 100.0
            out["util_mem"] = util.memory / 100.0
        mem = self._memory(index)
        if mem is not None:
            out["mem_used_bytes"] = int(mem.used)
            out["mem_total_bytes"] = int(mem.total)
        power = q.query(index, "power_w", lambda n: n.nvmlDeviceGetPowerUsage(h))
        out["power_w"] = None if power is None else power / 1000.0
        out["sm_clock_mhz"] = q.query(
            index, "sm_clock_mhz", lambda n: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)
        )
        out["mem_clock_mhz"] = q.query(
            index, "mem_clock_mhz", lambda n: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)
        )
        out["temperature_c"] = q.query(
            index, "temperature_c", lambda n: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)
        )
        pstate = q.query(index, "pstate", lambda n: n.nvmlDeviceGetPerformanceState(h))
        out["pstate"] = None if pstate is None or pstate == q.nv.NVML_PSTATE_UNKNOWN else int(pstate)
        mask = q.query(
            index,
            "throttle_reasons",
            lambda n: n.nvmlDeviceGetCurrentClocksEventReasons(h),
            lambda n: n.nvmlDeviceGetCurrentClocksThrottleReasons(h),  # drivers before R535
        )
        if mask is not None:
            out["throttle_mask"] = int(mask)
            out["throttle_reasons"] = decode_throttle(int(mask))
        self._counters.read_fields(index, out)
        if self._mig.get(index):
            used: list[int | None] = []
            for k, mh in enumerate(self._mig[index]):
                m = q.query(index, f"mig{k}", lambda n, mh=mh: n.nvmlDeviceGetMemoryInfo(mh))
                used.append(None if m is None else int(m.used))
            out["mig_mem_used_bytes"] = used
        self._counters.read_gpm(index, out)

    def start_gpm(self, index: int) -> bool:
        """Turn on GPM metrics (Hopper and newer) for one GPU; ``False`` if unsupported."""
        return self._counters.start_gpm(index)

    def samples(self, index: int, kind: str, since: float) -> list[tuple[float, float]]:
        """The driver's own samples of ``kind`` (``"gpu_util"``, ``"mem_util"``) after ``since``.

        Times are wall-clock seconds, values fractions. The driver keeps a
        bounded history, so a long window gets its most recent part.
        """
        h = self._q.handles[index]
        result = self._q.query(
            index,
            f"{kind}_samples",
            lambda n: n.nvmlDeviceGetSamples(h, getattr(n, _SAMPLE_TYPES[kind]), int(since * 1e6)),
        )
        if result is None:
            return []
        value_type, samples = result
        member = VALUE_MEMBERS[int(value_type)]
        return [(s.timeStamp / 1e6, float(getattr(s.sampleValue, member)) / 100.0) for s in samples]

    def processes(self, index: int, since: float | None = None) -> list[NvmlProcess]:
        """Processes on one GPU: memory, and SM share averaged since ``since`` (wall clock; default 2 s)."""
        q, h = self._q, self._q.handles[index]
        found: dict[int, NvmlProcess] = {}
        for kind in ("compute", "graphics"):
            name = f"nvmlDeviceGet{kind.capitalize()}RunningProcesses"
            procs = q.query(
                index,
                f"{kind}_processes",
                lambda n, name=name: getattr(n, name)(h),
                lambda n, name=name: getattr(n, name + "_v2")(h),  # drivers without the _v3 symbol
            )
            for p in procs or []:
                mem = p.usedGpuMemory
                found.setdefault(
                    int(p.pid),
                    {"pid": int(p.pid), "used_memory_bytes": None if mem is None else int(mem), "type": kind},
                )
        start = q.wall() - 2.0 if since is None else since
        util = q.query(
            index, "process_util", lambda n: n.nvmlDeviceGetProcessUtilization(h, int(start * 1e6))
        )
        shares: dict[int, list[float]] = {}
        for s in util or []:
            if s.timeStamp / 1e6 >= start:
                shares.setdefault(int(s.pid), []).append(s.smUtil / 100.0)
        for pid, entry in found.items():
            values = shares.get(pid)
            entry["sm_util"] = sum(values) / len(values) if values else None
        return list(found.values())

    def close(self) -> None:
        self._counters.close()
        self._q.close()
