"""A fake pynvml module, for tests only.

It stands in for nvidia-ml-py at perfmagic's one seam
(``perfmagic.collect.nvml_query._load_pynvml``) and answers like a real driver: errors
are the real ``pynvml.NVMLError_*`` classes, structs that callers fill in are the
real ctypes structs, field values honour ``scopeId`` as NVML does, and every
constant comes from the real module. Counters grow with ``clock`` at the rates a
:class:`FakeGpu` is given, so rates computed from them can be checked exactly.

Scenarios: :func:`two_gpus`, :func:`fields_not_supported`, :func:`older_driver`,
:func:`gpu_lost` (flip ``gpus[i].lost`` mid-run), :func:`no_library`,
:func:`driver_not_loaded`, :func:`foreign_pids`, :func:`training_gpu`, :func:`mig`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml as _real
import pytest

GiB = 1024**3
_ALL_LINKS = 0xFFFFFFFF
_PCIE_COUNTERS = (_real.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, _real.NVML_FI_DEV_PCIE_COUNT_RX_BYTES)


@dataclass
class FakeGpu:
    """One fake GPU; rates are per second, utilizations in percent as NVML gives them."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    pci_bus_id: str = "00000000:18:00.0"
    mem_total: int = 80 * GiB
    mem_used: int = 20 * GiB
    util_gpu: int = 87
    util_mem: int = 41
    power_mw: int = 250_120
    power_limit_mw: int = 700_000
    sm_clock: int = 1980
    mem_clock: int = 2619
    temperature: int = 61
    pstate: int = 0
    throttle: int = 0x4  # sw_power_cap
    pcie_tx_bps: float = 2.0e9
    pcie_rx_bps: float = 8.0e9
    pcie_counter_bits: int = 64  # 32: the driver returns the PCIe byte counters as wrapping uiVal
    nvlink_links: int = 4
    nvlink_tx_bps_per_link: float = 1.0e9
    numa_node: int = 0
    numa_cpus: list[int] = field(default_factory=lambda: [0, 1])
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, used bytes)
    gpm: bool = True
    mig_instances: int = 0
    not_supported: set[str] = field(default_factory=set)  # C symbols, or "field:<id>"
    lost: bool = False
    lost_code: int = _real.NVML_ERROR_GPU_IS_LOST
    field_values_s: float = 0.0  # how long a field-values batch takes (4.3 ms on an H200, driver 580)


class FakeNvml:
    """Looks like the ``pynvml`` module to the code under test."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        init_error: int | None = None,
        driver_lacks: set[str] | None = None,
        module_lacks: set[str] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.driver_lacks = driver_lacks or set()
        self.module_lacks = module_lacks or set()
        self.clock, self.sleep = clock, sleep
        self.calls: dict[str, int] = {}
        self.per_gpu: dict[str, list[int]] = {}  # calls per symbol, by GPU index
        self.initialized = False
        self._t0 = clock()
        self._gpm_t: dict[int, float] = {}

    def __getattribute__(self, name: str) -> Any:
        # an older nvidia-ml-py: the name does not exist at all
        if not name.startswith("_") and name in object.__getattribute__(self, "module_lacks"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    def __getattr__(self, name: str) -> Any:
        if name in self.module_lacks:
            raise AttributeError(name)
        value = getattr(_real, name)  # constants, error classes, ctypes structs
        if callable(value) and name.startswith("nvml") and not isinstance(value, type):
            return self._not_in_driver  # a real function this fake driver does not implement
        return value

    @staticmethod
    def _not_in_driver(*args: Any, **kwargs: Any) -> Any:
        raise _real.NVMLError(_real.NVML_ERROR_FUNCTION_NOT_FOUND)

    def _enter(self, symbol: str, gpu: FakeGpu | None = None) -> None:
        self.calls[symbol] = self.calls.get(symbol, 0) + 1
        if gpu is not None and gpu in self.gpus:
            self.per_gpu.setdefault(symbol, [0] * len(self.gpus))[self.gpus.index(gpu)] += 1
        if not self.initialized:
            raise _real.NVMLError(_real.NVML_ERROR_UNINITIALIZED)
        if symbol in self.driver_lacks:
            raise _real.NVMLError(_real.NVML_ERROR_FUNCTION_NOT_FOUND)
        if gpu is not None and gpu.lost:
            raise _real.NVMLError(gpu.lost_code)
        if gpu is not None and symbol in gpu.not_supported:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)

    # -- library -----------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise _real.NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount_v2")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._enter("nvmlDeviceGetHandleByIndex_v2")
        if not 0 <= index < len(self.gpus):
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    # -- static facts --------------------------------------------------------

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        self._enter("nvmlDeviceGetName", h)
        return h.name

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        self._enter("nvmlDeviceGetUUID", h)
        return h.uuid

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> Any:
        self._enter("nvmlDeviceGetPciInfo_v3", h)
        return SimpleNamespace(busId=h.pci_bus_id)

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeGpu) -> int:
        self._enter("nvmlDeviceGetEnforcedPowerLimit", h)
        return h.power_limit_mw

    def nvmlDeviceGetCpuAffinity(self, h: FakeGpu, size: int) -> list[int]:
        self._enter("nvmlDeviceGetCpuAffinity", h)
        words = [0] * size
        for cpu in h.numa_cpus:
            if cpu // 64 < size:
                words[cpu // 64] |= 1 << (cpu % 64)
        return words

    def nvmlDeviceGetNumaNodeId(self, h: FakeGpu) -> int:
        self._enter("nvmlDeviceGetNumaNodeId", h)
        return h.numa_node

    def nvmlDeviceGetCudaComputeCapability(self, h: FakeGpu) -> tuple[int, int]:
        self._enter("nvmlDeviceGetCudaComputeCapability", h)
        return (9, 0) if h.gpm else (8, 0)

    def nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", _parent(h))
        on = _real.NVML_DEVICE_MIG_ENABLE if h.mig_instances else 0
        return [on, on]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeGpu) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", h)
        return 7 if h.mig_instances else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeGpu, k: int) -> Any:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", h)
        if k >= h.mig_instances:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)
        return SimpleNamespace(parent=h, k=k)

    def nvmlDeviceGetGpuInstanceId(self, mh: Any) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId", mh.parent)
        return int(mh.k) + 1

    def nvmlDeviceGetComputeInstanceId(self, mh: Any) -> int:
        self._enter("nvmlDeviceGetComputeInstanceId", mh.parent)
        return 0

    # -- one tick ------------------------------------------------------------

    def nvmlDeviceGetMemoryInfo(self, h: Any, version: int | None = None) -> Any:
        symbol = "nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo"
        self._enter(symbol, _parent(h))
        if isinstance(h, FakeGpu):
            return SimpleNamespace(total=h.mem_total, used=h.mem_used, free=h.mem_total - h.mem_used)
        share = h.parent.mem_total // 7
        return SimpleNamespace(total=share, used=share // (h.k + 2), free=share - share // (h.k + 2))

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates", h)
        if h.mig_instances:  # NVML does not report utilization of a MIG-enabled GPU
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=h.util_gpu, memory=h.util_mem)

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        self._enter("nvmlDeviceGetPowerUsage", h)
        return h.power_mw

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, kind: int) -> int:
        self._enter("nvmlDeviceGetClockInfo", h)
        return h.sm_clock if kind == _real.NVML_CLOCK_SM else h.mem_clock

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", h)
        return h.temperature

    def nvmlDeviceGetPerformanceState(self, h: FakeGpu) -> int:
        self._enter("nvmlDeviceGetPerformanceState", h)
        return h.pstate

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", h)
        return h.throttle

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeGpu) -> int:
        self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        return h.throttle

    def nvmlDeviceGetFieldValues(self, h: FakeGpu, ids: list[Any]) -> Any:
        self._enter("nvmlDeviceGetFieldValues", h)
        self.sleep(h.field_values_s)
        values = (_real.c_nvmlFieldValue_t * len(ids))()
        now = self.clock()
        elapsed = now - self._t0
        for v, request in zip(values, ids, strict=True):
            fid, scope = request if isinstance(request, tuple) else (request, 0)
            v.fieldId, v.scopeId = fid, scope
            v.timestamp = int(now * 1e6)
            v.valueType = _real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            counter = self._counter(h, fid, scope, elapsed)
            if f"field:{fid}" in h.not_supported or counter is None:
                v.nvmlReturn = _real.NVML_ERROR_NOT_SUPPORTED
            elif h.pcie_counter_bits == 32 and fid in _PCIE_COUNTERS:
                v.nvmlReturn = _real.NVML_SUCCESS
                v.valueType = _real.NVML_VALUE_TYPE_UNSIGNED_INT
                v.value.uiVal = int(counter) % 2**32
            else:
                v.nvmlReturn = _real.NVML_SUCCESS
                v.value.ullVal = int(counter)
        return values

    @staticmethod
    def _counter(h: FakeGpu, fid: int, scope: int, elapsed: float) -> float | None:
        if fid == _real.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
            return 1_000_000 + h.power_mw * elapsed  # mJ since the driver loaded
        if fid == _real.NVML_FI_DEV_PCIE_COUNT_TX_BYTES:
            return h.pcie_tx_bps * elapsed
        if fid == _real.NVML_FI_DEV_PCIE_COUNT_RX_BYTES:
            return h.pcie_rx_bps * elapsed
        if fid in (_real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
            if not h.nvlink_links:
                return None
            links = h.nvlink_links if scope == _ALL_LINKS else 1 if scope < h.nvlink_links else 0
            return links * h.nvlink_tx_bps_per_link * elapsed / 1024  # KiB
        return None

    # -- after the window ----------------------------------------------------

    def nvmlDeviceGetSamples(self, h: FakeGpu, kind: int, since_us: int) -> tuple[int, list[Any]]:
        self._enter("nvmlDeviceGetSamples", h)
        now_us = int(self.clock() * 1e6)
        value = h.util_gpu if kind == _real.NVML_GPU_UTILIZATION_SAMPLES else h.util_mem
        # the driver's buffer: one sample per 1/6 s over the last 10 s
        stamps = [now_us - k * 166_667 for k in range(60, -1, -1)]
        samples = []
        for ts in stamps:
            if ts > since_us:
                s = _real.c_nvmlSample_t()
                s.timeStamp = ts
                s.sampleValue.uiVal = value
                samples.append(s)
        return _real.NVML_VALUE_TYPE_UNSIGNED_INT, samples

    def _processes(self, symbol: str, h: FakeGpu) -> list[Any]:
        self._enter(symbol, h)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in h.processes]

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[Any]:
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v3", h)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h: FakeGpu) -> list[Any]:
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v2", h)

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: FakeGpu) -> list[Any]:
        self._enter("nvmlDeviceGetGraphicsRunningProcesses_v3", h)
        return []

    def nvmlDeviceGetProcessUtilization(self, h: FakeGpu, since_us: int) -> list[Any]:
        self._enter("nvmlDeviceGetProcessUtilization", h)
        if not h.processes:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)
        now_us = int(self.clock() * 1e6)
        share = h.util_gpu // len(h.processes)
        return [
            SimpleNamespace(pid=pid, timeStamp=now_us - k * 100_000, smUtil=share, memUtil=0)
            for pid, _ in h.processes
            for k in range(3)
        ]

    # -- GPM -----------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, h: FakeGpu) -> Any:
        self._enter("nvmlGpmQueryDeviceSupport", h)
        return SimpleNamespace(isSupportedDevice=int(h.gpm))

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        return _real.c_nvmlGpmSample_t()

    def nvmlGpmSampleGet(self, h: FakeGpu, sample: Any) -> Any:
        self._enter("nvmlGpmSampleGet", h)
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        values = {
            _real.NVML_GPM_METRIC_SM_UTIL: 62.5,
            _real.NVML_GPM_METRIC_SM_OCCUPANCY: 31.0,
            _real.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 12.0,
            _real.NVML_GPM_METRIC_DRAM_BW_UTIL: 48.0,
        }
        for k in range(request.numMetrics):
            metric = request.metrics[k]
            metric.nvmlReturn = _real.NVML_SUCCESS
            metric.value = values[metric.metricId]
        return request

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._enter("nvmlGpmSampleFree")


def _parent(h: Any) -> FakeGpu:
    return h if isinstance(h, FakeGpu) else h.parent


# -- scenarios -------------------------------------------------------------------


def two_gpus(**kwargs: Any) -> FakeNvml:
    """An H100 running this process (and a foreign one) and an idle A100 without GPM or NVLink."""
    return FakeNvml(
        [
            FakeGpu(processes=[(os.getpid(), 18 * GiB), (4_000_001, 2 * GiB)]),
            FakeGpu(
                name="NVIDIA A100-SXM4-40GB",
                uuid="GPU-11111111-1111-1111-1111-111111111111",
                pci_bus_id="00000000:3B:00.0",
                mem_total=40 * GiB,
                mem_used=4 * 1024**2,
                util_gpu=0,
                util_mem=0,
                power_mw=62_400,
                power_limit_mw=400_000,
                pstate=0,
                throttle=0x1,
                pcie_tx_bps=0.0,
                pcie_rx_bps=0.0,
                nvlink_links=0,
                numa_node=1,
                numa_cpus=[1],
                gpm=False,
            ),
        ],
        **kwargs,
    )


def fields_not_supported() -> FakeNvml:
    """A consumer GPU: no power, energy, temperature, throttle reasons or PCIe/NVLink counters."""
    gpu = FakeGpu(
        name="NVIDIA GeForce GTX 1080",
        gpm=False,
        nvlink_links=0,
        not_supported={
            "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetTemperature",
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetProcessUtilization",
            f"field:{_real.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION}",
            f"field:{_real.NVML_FI_DEV_PCIE_COUNT_TX_BYTES}",
            f"field:{_real.NVML_FI_DEV_PCIE_COUNT_RX_BYTES}",
        },
    )
    return FakeNvml([gpu])


def older_driver() -> FakeNvml:
    """An R470-era driver and an old nvidia-ml-py: newer symbols and constants are missing."""
    return FakeNvml(
        [FakeGpu(name="Tesla V100-SXM2-16GB", gpm=False, processes=[(os.getpid(), GiB)])],
        driver_lacks={
            "nvmlDeviceGetMemoryInfo_v2",
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetGraphicsRunningProcesses_v3",
            "nvmlDeviceGetNumaNodeId",
        },
        module_lacks={
            "NVML_FI_DEV_PCIE_COUNT_TX_BYTES",
            "NVML_FI_DEV_PCIE_COUNT_RX_BYTES",
            "nvmlGpmQueryDeviceSupport",
        },
    )


def gpu_lost(code: int = _real.NVML_ERROR_GPU_IS_LOST) -> FakeNvml:
    """Two GPUs; set ``gpus[1].lost = True`` to make GPU 1 fall off the bus."""
    fake = two_gpus()
    fake.gpus[1].lost_code = code
    return fake


def no_library() -> FakeNvml:
    return FakeNvml([], init_error=_real.NVML_ERROR_LIBRARY_NOT_FOUND)


def driver_not_loaded() -> FakeNvml:
    return FakeNvml([], init_error=_real.NVML_ERROR_DRIVER_NOT_LOADED)


def foreign_pids() -> FakeNvml:
    """A container: NVML reports host PIDs, none of which is in this process tree."""
    return FakeNvml([FakeGpu(processes=[(4_000_001, 18 * GiB), (4_000_002, GiB)])])


def training_gpu() -> FakeNvml:
    """One H100 at 250.12 W running the processes whose pids ``$FAKE_NVML_PIDS`` lists (comma-separated):
    another process's training, for an exporter started after it."""
    pids = [int(p) for p in os.environ.get("FAKE_NVML_PIDS", "").split(",") if p]
    return FakeNvml([FakeGpu(processes=[(pid, 2 * GiB) for pid in pids])])


def mig() -> FakeNvml:
    """An H100 split into two MIG instances."""
    return FakeNvml([FakeGpu(mig_instances=2, gpm=False)])


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., FakeNvml]]:
    """``fake_nvml(scenario())`` installs a fake NVML at perfmagic's pynvml seam; ``fake_nvml(scenario(),
    clock)`` runs its driver on a test's fake clock (``wall`` stamps, ``advance`` for slow calls)."""
    from perfmagic.collect import nvml_query

    def install(fake: FakeNvml, clock: Any = None) -> FakeNvml:
        if clock is not None:
            fake.clock, fake.sleep, fake._t0 = clock.wall, clock.advance, clock.wall()
        monkeypatch.setattr(nvml_query, "_load_pynvml", lambda: fake)
        return fake

    yield install
