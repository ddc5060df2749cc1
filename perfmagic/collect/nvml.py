"""GPU telemetry from NVML that says what it could not measure.

Two layers:

- :class:`Nvml` wraps the nvidia-ml-py module (``pynvml``) for one-off reads; the
  sampler and the sidebar server share it. Every query goes through one helper that
  turns "not supported", "no permission", a symbol missing from an older driver or
  an older nvidia-ml-py into ``None`` plus one warning, and a lost GPU into
  ``lost=True`` plus one warning. Nothing NVML does raises out of it after
  :meth:`Nvml.open`.
- :class:`NvmlSource` is the sampler source. Each tick makes only cheap calls: the
  counters (energy, PCIe, NVLink) come in one batched ``nvmlDeviceGetFieldValues``
  and rates are computed from the counters' own timestamps. The slow queries (the
  driver's sample buffer, per-process figures) run once, in ``close``.

pynvml is reached only through :func:`_load_pynvml`, the seam tests replace with a
fake.

What :class:`NvmlSource` writes into a timeline (units: bytes, watts, joules, MHz,
degrees C; utilizations in [0, 1]; a metric that is not available is never written):

- samples ``gpu{i}.util``, ``.mem_util``, ``.mem_used_bytes``, ``.power_w``,
  ``.energy_j`` (joules since the window started, from the total-energy counter),
  ``.sm_clock_mhz``, ``.mem_clock_mhz``, ``.temperature_c``, ``.pstate`` (0 = P0),
  ``.throttle_mask`` (NVML clocks-event-reason bits, see :data:`THROTTLE_REASONS`),
  ``.pcie_tx_bytes_per_s``, ``.pcie_rx_bytes_per_s``, ``.nvlink_tx_bytes_per_s``,
  ``.nvlink_rx_bytes_per_s``, ``.mig{k}.mem_used_bytes`` (MIG instance k); with
  ``gpm=True`` also ``.sm_active``, ``.sm_occupancy``, ``.tensor_active``,
  ``.dram_bw_util``;
- after the window, the driver's own utilization samples at its native rate as
  ``gpu{i}.util_driver`` and ``gpu{i}.mem_util_driver``;
- ``meta["nvml"]``: ``available``, ``reason``, ``driver_version``,
  ``cuda_driver_version``, ``gpm`` (indices with GPM on);
  ``meta["devices"]``: one :meth:`Nvml.static_info` dict per GPU;
  ``meta["gpu_processes"]``: per-process GPU memory and SM share over the window
  (``gpu``, ``pid``, ``used_memory_bytes``, ``sm_util``, ``type``, ``in_tree``);
  ``meta["gpu_processes_scope"]``: ``"tree"`` or ``"all"`` (see ``close``);
- mark ``gpu_lost`` (``index``, ``reason``) when a GPU falls off the bus.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any, Literal

from perfmagic.clock import REAL_CLOCK, Clock
from perfmagic.collect.sampler import SourceUnavailable
from perfmagic.contract.meta import DeviceInfo, GpuProcess, MigInstance, NvmlMeta, NvmlProcess
from perfmagic.schema import THROTTLE_REASONS
from perfmagic.timeline import Timeline

# NVML return codes (nvml.h; stable ABI, so plain ints keep this module import-free).
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_NOT_FOUND = 6
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_RESET_REQUIRED = 16
_LIB_RM_VERSION_MISMATCH = 18
_NO_DATA = 21
_GPU_NOT_FOUND = 28
_UNKNOWN = 999
_UNAVAILABLE_CODES = frozenset(
    {_NOT_SUPPORTED, _NO_PERMISSION, 2, 25, 26}
)  # + invalid arg, version, deprecated
_NO_DATA_CODES = frozenset({_NOT_FOUND, _NO_DATA})
_LOST_CODES = frozenset({_GPU_IS_LOST, _RESET_REQUIRED, _GPU_NOT_FOUND, _UNKNOWN})

_ALL_LINKS = 0xFFFFFFFF  # NVLink field scope that sums every link (nvml.h)

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

SLOW_FIELDS_S = 0.001
FIELDS_PERIOD_S = 1.0
"""How often the counters below are read where one batch takes SLOW_FIELDS_S or more: it took 4.3 ms on
an H200 (driver 580, measured by make gpu-check), 4% of a core at 10 Hz, and a counter read once a second
gives the same mean rate."""

# Counters read in one nvmlDeviceGetFieldValues batch: (key, field id, scope, scale to SI).
_FIELDS: tuple[tuple[str, str, int, float], ...] = (
    ("energy_j", "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 0, 1e-3),  # mJ
    ("pcie_tx_bytes_per_s", "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 0, 1.0),
    ("pcie_rx_bytes_per_s", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 0, 1.0),
    ("nvlink_tx_bytes_per_s", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", _ALL_LINKS, 1024.0),  # KiB
    ("nvlink_rx_bytes_per_s", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", _ALL_LINKS, 1024.0),
)
_RATE_KEYS = frozenset(k for k, *_ in _FIELDS if k.endswith("_per_s"))
# c_nvmlValue_t member for each NVML_VALUE_TYPE_* (0..6).
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
# Where a counter of each value type wraps: nvml.h says the PCIe byte counters "can be wrapped",
# and some drivers return them as 32-bit ``uiVal`` (4 GiB: under 0.1 s at PCIe 5 speed).
_WRAP = {1: 2.0**32, 6: 2.0**16}  # UNSIGNED_INT, UNSIGNED_SHORT

# GPM metrics (percent in NVML) and the minimum spacing NVML wants between two samples.
_GPM: tuple[tuple[str, str], ...] = (
    ("sm_active", "NVML_GPM_METRIC_SM_UTIL"),
    ("sm_occupancy", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("tensor_active", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    ("dram_bw_util", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
)
_GPM_MIN_INTERVAL_S = 0.1

_SAMPLE_TYPES = {"gpu_util": "NVML_GPU_UTILIZATION_SAMPLES", "mem_util": "NVML_MEMORY_UTILIZATION_SAMPLES"}

# A query: called with the pynvml module; alternatives are tried newest first.
_Query = Callable[..., Any]


def _load_pynvml() -> Any:
    """The pynvml module; the one seam tests replace with a fake NVML."""
    import pynvml

    return pynvml


class NvmlUnavailable(Exception):
    """NVML cannot be used here; ``str(e)`` is the reason, for people."""


def _init_reason(error: Exception) -> str:
    code = getattr(error, "value", None)
    if code == _LIBRARY_NOT_FOUND:
        return "NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver on this machine"
    if code == _DRIVER_NOT_LOADED:
        return "the NVIDIA driver is not loaded"
    if code == _LIB_RM_VERSION_MISMATCH:
        return (
            "NVML and the NVIDIA kernel driver versions differ (reboot or reload the driver after an upgrade)"
        )
    if code == _NO_PERMISSION:
        return "no permission to talk to the NVIDIA driver"
    return f"NVML failed to start ({_describe(error)})"


def _describe(error: Exception) -> str:
    try:
        return str(error)
    except Exception:  # pynvml's __str__ calls into the library, which may be gone
        return f"NVML error {getattr(error, 'value', '?')}"


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


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

    def __init__(self, nv: Any, handles: list[Any], clock: Clock = REAL_CLOCK) -> None:
        """Use :meth:`open`."""
        self._nv, self._handles, self._now, self._wall = nv, handles, clock.now, clock.wall
        self.warnings: list[str] = []
        self._names: dict[int, str] = {}
        self._off: set[tuple[int | None, str]] = set()  # (index, key) not available, said once
        self._said: set[tuple[int | None, str]] = set()
        self._pick: dict[tuple[int | None, str], int] = {}  # which alternative of a query works
        self._lost: dict[int, str] = {}
        self._fields: dict[int, list[tuple[str, int, int, float]]] = {}
        # GPU -> (when, what its counters gave): kept only for a GPU whose batch is slow
        self._fields_read: dict[int, tuple[float, dict[str, Any]]] = {}
        self._slow_field_reads: dict[int, int] = {}  # slow batches in a row, by GPU
        self._counters: dict[tuple[int, str], tuple[float, int]] = {}
        self._rates: dict[tuple[int, str], float] = {}
        self._mig: dict[int, list[Any]] = {}
        self._gpm: dict[int, list[Any]] = {}
        self._gpm_t: dict[int, float] = {}
        self.driver_version: str | None = self._opt(
            None, "driver_version", lambda n: _text(n.nvmlSystemGetDriverVersion())
        )
        cuda = self._opt(None, "cuda_driver_version", lambda n: n.nvmlSystemGetCudaDriverVersion())
        self.cuda_driver_version: str | None = None if cuda is None else f"{cuda // 1000}.{cuda % 1000 // 10}"

    @classmethod
    def open(cls, clock: Clock = REAL_CLOCK) -> Nvml:
        """Initialize NVML (slow reads timed on ``clock``); raises :class:`NvmlUnavailable` with the reason."""
        try:
            nv = _load_pynvml()
        except ImportError as e:
            raise NvmlUnavailable(f"nvidia-ml-py is not installed ({e})") from e
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            raise NvmlUnavailable(_init_reason(e)) from e
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as e:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlShutdown()
            raise NvmlUnavailable(f"NVML cannot count the GPUs ({_describe(e)})") from e
        handles: list[Any] = []
        failures: list[tuple[int, Exception]] = []
        for i in range(count):
            try:
                handles.append(nv.nvmlDeviceGetHandleByIndex(i))
            except nv.NVMLError as e:  # one bad GPU must not hide the others
                handles.append(None)
                failures.append((i, e))
        self = cls(nv, handles, clock)
        for i, error in failures:
            self._mark_lost(i, f"cannot be opened ({_describe(error)})")
        return self

    # -- the careful query helper -----------------------------------------

    def _opt(self, index: int | None, key: str, *queries: _Query) -> Any:
        """Run the first query that exists here; ``None`` when not available.

        A query that hits a symbol missing from the driver (``FunctionNotFound``)
        or from an older nvidia-ml-py (a missing name or parameter) falls through
        to the next alternative; once one works it is used directly from then on.
        """
        slot = (index, key)
        if slot in self._off or (index is not None and index in self._lost):
            return None
        first = self._pick.get(slot, 0)
        nv = self._nv
        for k in range(first, len(queries)):
            try:
                value = queries[k](nv)
            except (AttributeError, TypeError):
                continue
            except nv.NVMLError as e:
                code = getattr(e, "value", None)
                if code == _FUNCTION_NOT_FOUND:
                    continue
                self._pick[slot] = k
                self._failed(index, key, e)
                return None
            self._pick[slot] = k
            return value
        self._unavailable(index, key, "not in this driver or nvidia-ml-py")
        return None

    def _failed(self, index: int | None, key: str, error: Exception) -> None:
        code = getattr(error, "value", None)
        if code in _LOST_CODES and index is not None:
            self._mark_lost(index, _describe(error))
        elif code in _UNAVAILABLE_CODES:
            self._unavailable(index, key, _describe(error))
        elif code not in _NO_DATA_CODES:
            self._say(
                (index, key), f"{self._who(index)}: reading {key} failed ({_describe(error)}), retrying"
            )

    def _unavailable(self, index: int | None, key: str, why: str) -> None:
        self._off.add((index, key))
        self._say((index, key), f"{self._who(index)}: {key} not available ({why})")

    def _mark_lost(self, index: int, why: str) -> None:
        if index not in self._lost:
            self._lost[index] = why
            self.warnings.append(f"{self._who(index)} was lost ({why}); its metrics stop, the rest go on")

    def _say(self, slot: tuple[int | None, str], message: str) -> None:
        if slot not in self._said:
            self._said.add(slot)
            self.warnings.append(message)

    def _who(self, index: int | None) -> str:
        if index is None:
            return "NVML"
        name = self._names.get(index)
        return f"GPU {index}" + (f" ({name})" if name else "")

    # -- public API ------------------------------------------------------

    def device_count(self) -> int:
        return len(self._handles)

    def is_lost(self, index: int) -> bool:
        return index in self._lost

    def lost_reason(self, index: int) -> str | None:
        return self._lost.get(index)

    def static_info(self, index: int) -> DeviceInfo:
        """Facts that do not change during a run."""
        h = self._handles[index]
        name = self._opt(index, "name", lambda n: _text(n.nvmlDeviceGetName(h)))
        if name is not None:
            self._names[index] = name
        mem = self._memory(index)
        limit = self._opt(index, "power_limit_w", lambda n: n.nvmlDeviceGetEnforcedPowerLimit(h))
        ncpu = os.cpu_count() or 1
        mask = self._opt(index, "numa_cpus", lambda n: n.nvmlDeviceGetCpuAffinity(h, (ncpu + 63) // 64))
        cc = self._opt(index, "compute_capability", lambda n: n.nvmlDeviceGetCudaComputeCapability(h))
        mig_mode = self._opt(index, "mig_mode", lambda n: n.nvmlDeviceGetMigMode(h))
        mig_enabled = bool(mig_mode is not None and mig_mode[0] == self._nv.NVML_DEVICE_MIG_ENABLE)
        return {
            "index": index,
            "name": name,
            "uuid": self._opt(index, "uuid", lambda n: _text(n.nvmlDeviceGetUUID(h))),
            "pci_bus_id": self._opt(index, "pci_bus_id", lambda n: _text(n.nvmlDeviceGetPciInfo(h).busId)),
            "mem_total_bytes": None if mem is None else int(mem.total),
            "power_limit_w": None if limit is None else limit / 1000.0,
            "numa_cpus": None if mask is None else _cpus_from_mask(mask),
            "numa_node": self._opt(index, "numa_node", lambda n: n.nvmlDeviceGetNumaNodeId(h)),
            "compute_capability": None if cc is None else f"{cc[0]}.{cc[1]}",
            "mig_enabled": mig_enabled,
            "mig_instances": self._mig_instances(index) if mig_enabled else [],
            "lost": self.is_lost(index),
        }

    def _memory(self, index: int) -> Any:
        h = self._handles[index]
        # v2 excludes driver-reserved memory from "used", as nvidia-smi does since R510.
        return self._opt(
            index,
            "memory",
            lambda n: n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2),
            lambda n: n.nvmlDeviceGetMemoryInfo(h),
        )

    def _mig_instances(self, index: int) -> list[MigInstance]:
        h = self._handles[index]
        slots = self._opt(index, "mig_instances", lambda n: n.nvmlDeviceGetMaxMigDeviceCount(h)) or 0
        handles: list[Any] = []
        out: list[MigInstance] = []
        for k in range(int(slots)):
            mh = self._opt(index, f"mig_slot{k}", lambda n, k=k: n.nvmlDeviceGetMigDeviceHandleByIndex(h, k))
            if mh is None:  # an empty slot answers NotFound
                continue
            key = f"mig{len(handles)}"
            mem = self._opt(index, key, lambda n, mh=mh: n.nvmlDeviceGetMemoryInfo(mh))
            out.append(
                {
                    "gpu_instance_id": self._opt(
                        index, key + ".gi", lambda n, mh=mh: n.nvmlDeviceGetGpuInstanceId(mh)
                    ),
                    "compute_instance_id": self._opt(
                        index, key + ".ci", lambda n, mh=mh: n.nvmlDeviceGetComputeInstanceId(mh)
                    ),
                    "uuid": self._opt(index, key + ".uuid", lambda n, mh=mh: _text(n.nvmlDeviceGetUUID(mh))),
                    "mem_total_bytes": None if mem is None else int(mem.total),
                }
            )
            handles.append(mh)
        self._mig[index] = handles
        return out

    def read(self, index: int) -> dict[str, Any]:
        """One tick of dynamic metrics; only cheap, non-blocking NVML calls."""
        out: dict[str, Any] = dict.fromkeys(READ_KEYS)
        if index not in self._lost:
            self._read_into(index, out)
        out["lost"] = index in self._lost
        return out

    def _read_into(self, index: int, out: dict[str, Any]) -> None:
        h = self._handles[index]
        util = self._opt(index, "util", lambda n: n.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            out["util_gpu"] = util.gpu / 100.0
            out["util_mem"] = util.memory / 100.0
        mem = self._memory(index)
        if mem is not None:
            out["mem_used_bytes"] = int(mem.used)
            out["mem_total_bytes"] = int(mem.total)
        power = self._opt(index, "power_w", lambda n: n.nvmlDeviceGetPowerUsage(h))
        out["power_w"] = None if power is None else power / 1000.0
        out["sm_clock_mhz"] = self._opt(
            index, "sm_clock_mhz", lambda n: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)
        )
        out["mem_clock_mhz"] = self._opt(
            index, "mem_clock_mhz", lambda n: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)
        )
        out["temperature_c"] = self._opt(
            index, "temperature_c", lambda n: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)
        )
        pstate = self._opt(index, "pstate", lambda n: n.nvmlDeviceGetPerformanceState(h))
        out["pstate"] = None if pstate is None or pstate == self._nv.NVML_PSTATE_UNKNOWN else int(pstate)
        mask = self._opt(
            index,
            "throttle_reasons",
            lambda n: n.nvmlDeviceGetCurrentClocksEventReasons(h),
            lambda n: n.nvmlDeviceGetCurrentClocksThrottleReasons(h),  # drivers before R535
        )
        if mask is not None:
            out["throttle_mask"] = int(mask)
            out["throttle_reasons"] = decode_throttle(int(mask))
        self._read_fields(index, out)
        if self._mig.get(index):
            used: list[int | None] = []
            for k, mh in enumerate(self._mig[index]):
                m = self._opt(index, f"mig{k}", lambda n, mh=mh: n.nvmlDeviceGetMemoryInfo(mh))
                used.append(None if m is None else int(m.used))
            out["mig_mem_used_bytes"] = used
        if index in self._gpm:
            self._read_gpm(index, out)

    def _read_fields(self, index: int, out: dict[str, Any]) -> None:
        """Counters in one batched call; rates from the counters' own timestamps. Where the call is slow
        (:data:`SLOW_FIELDS_S`, twice in a row), at most every :data:`FIELDS_PERIOD_S`, its figures
        repeated between."""
        begin = self._now()
        last = self._fields_read.get(index)
        if last is not None and begin - last[0] < FIELDS_PERIOD_S:
            out.update(last[1])
            return
        read: dict[str, Any] = {}
        self._read_fields_now(index, read)
        # slow twice in a row: one read a busy machine held up says nothing of the driver
        streak = self._slow_field_reads.get(index, 0) + 1 if self._now() - begin >= SLOW_FIELDS_S else 0
        self._slow_field_reads[index] = streak
        if streak >= 2:
            self._fields_read[index] = (begin, read)
        else:
            self._fields_read.pop(index, None)
        out.update(read)

    def _read_fields_now(self, index: int, out: dict[str, Any]) -> None:
        nv = self._nv
        fields = self._fields.get(index)
        if fields is None:
            fields = self._fields[index] = []
            for key, const, scope, scale in _FIELDS:
                fid = getattr(nv, const, None)
                if fid is None:
                    self._unavailable(index, key, "field not in this nvidia-ml-py")
                else:
                    fields.append((key, int(fid), scope, scale))
        if not fields:
            return
        h = self._handles[index]
        ids = [(fid, scope) for _, fid, scope, _ in fields]
        values = self._opt(index, "field_values", lambda n: n.nvmlDeviceGetFieldValues(h, ids))
        if values is None:
            return
        dropped = False
        for (key, _, _, scale), v in zip(fields, values, strict=False):
            if v.nvmlReturn != 0:
                self._failed(index, key, nv.NVMLError(v.nvmlReturn))
                dropped = dropped or (index, key) in self._off
                continue
            value = float(getattr(v.value, _VALUE_MEMBERS[v.valueType])) * scale
            if key in _RATE_KEYS:
                wrap = _WRAP.get(int(v.valueType))
                out[key] = self._rate(
                    index, key, value, int(v.timestamp), None if wrap is None else wrap * scale
                )
            else:
                out[key] = value
        if dropped:  # stop asking for what this GPU does not have
            self._fields[index] = [f for f in fields if (index, f[0]) not in self._off]

    def _rate(self, index: int, key: str, value: float, ts_us: int, wrap: float | None) -> float | None:
        """Rate of a counter from its own timestamps (µs); ``wrap``: where a narrow counter rolls over."""
        slot = (index, key)
        prev = self._counters.get(slot)
        if prev is not None and ts_us <= prev[1]:
            return self._rates.get(slot)  # the driver has not refreshed the counter yet
        self._counters[slot] = (value, ts_us)
        if prev is None:
            return None
        delta = value - prev[0]
        if delta < 0:
            if wrap is None:  # a 64-bit counter going back was reset (driver reload): no rate
                self._rates.pop(slot, None)
                return None
            delta += wrap  # a 32-bit counter rolled over (once: at 10 Hz, twice needs > 40 GB/s)
        rate = delta / ((ts_us - prev[1]) / 1e6)
        self._rates[slot] = rate
        return rate

    def start_gpm(self, index: int) -> bool:
        """Turn on GPM metrics (Hopper and newer) for one GPU; ``False`` if unsupported."""
        h = self._handles[index]
        support = self._opt(index, "gpm", lambda n: n.nvmlGpmQueryDeviceSupport(h))
        if support is None:
            return False
        if not support.isSupportedDevice:
            self._unavailable(index, "gpm", "GPM needs a Hopper or newer GPU")
            return False
        samples = [self._opt(index, "gpm", lambda n: n.nvmlGpmSampleAlloc()) for _ in range(2)]
        if None in samples or self._opt(index, "gpm", lambda n: n.nvmlGpmSampleGet(h, samples[0])) is None:
            return False
        self._gpm[index] = samples
        self._gpm_t[index] = self._now()
        return True

    def _read_gpm(self, index: int, out: dict[str, Any]) -> None:
        now = self._now()
        if now - self._gpm_t[index] < _GPM_MIN_INTERVAL_S:
            return
        prev, cur = self._gpm[index]
        h = self._handles[index]
        if self._opt(index, "gpm", lambda n: n.nvmlGpmSampleGet(h, cur)) is None:
            return
        self._gpm_t[index] = now
        self._gpm[index] = [cur, prev]
        nv = self._nv
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(_GPM)
        request.sample1 = prev
        request.sample2 = cur
        for k, (_, const) in enumerate(_GPM):
            request.metrics[k].metricId = getattr(nv, const)
        result = self._opt(index, "gpm", lambda n: n.nvmlGpmMetricsGet(request))
        if result is None:
            return
        for k, (key, _) in enumerate(_GPM):
            metric = result.metrics[k]
            if metric.nvmlReturn == 0:
                out[key] = metric.value / 100.0
            else:
                self._failed(index, key, nv.NVMLError(metric.nvmlReturn))

    def samples(self, index: int, kind: str, since: float) -> list[tuple[float, float]]:
        """The driver's own samples of ``kind`` (``"gpu_util"``, ``"mem_util"``) after ``since``.

        Times are wall-clock seconds, values fractions. The driver keeps a
        bounded history, so a long window gets its most recent part.
        """
        h = self._handles[index]
        result = self._opt(
            index,
            f"{kind}_samples",
            lambda n: n.nvmlDeviceGetSamples(h, getattr(n, _SAMPLE_TYPES[kind]), int(since * 1e6)),
        )
        if result is None:
            return []
        value_type, samples = result
        member = _VALUE_MEMBERS[int(value_type)]
        return [(s.timeStamp / 1e6, float(getattr(s.sampleValue, member)) / 100.0) for s in samples]

    def processes(self, index: int, since: float | None = None) -> list[NvmlProcess]:
        """Processes on one GPU: memory, and SM share averaged since ``since`` (wall clock; default 2 s)."""
        h = self._handles[index]
        found: dict[int, NvmlProcess] = {}
        for kind in ("compute", "graphics"):
            name = f"nvmlDeviceGet{kind.capitalize()}RunningProcesses"
            procs = self._opt(
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
        start = self._wall() - 2.0 if since is None else since
        util = self._opt(
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
        nv = self._nv
        for samples in self._gpm.values():
            for sample in samples:
                with contextlib.suppress(nv.NVMLError):
                    nv.nvmlGpmSampleFree(sample)
        self._gpm.clear()
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()


# Timeline metric suffix for each scalar key of Nvml.read().
_SERIES = (
    ("util_gpu", "util"),
    ("util_mem", "mem_util"),
    ("mem_used_bytes", "mem_used_bytes"),
    ("power_w", "power_w"),
    ("sm_clock_mhz", "sm_clock_mhz"),
    ("mem_clock_mhz", "mem_clock_mhz"),
    ("temperature_c", "temperature_c"),
    ("pstate", "pstate"),
    ("throttle_mask", "throttle_mask"),
    ("pcie_tx_bytes_per_s", "pcie_tx_bytes_per_s"),
    ("pcie_rx_bytes_per_s", "pcie_rx_bytes_per_s"),
    ("nvlink_tx_bytes_per_s", "nvlink_tx_bytes_per_s"),
    ("nvlink_rx_bytes_per_s", "nvlink_rx_bytes_per_s"),
    ("sm_active", "sm_active"),
    ("sm_occupancy", "sm_occupancy"),
    ("tensor_active", "tensor_active"),
    ("dram_bw_util", "dram_bw_util"),
)


class NvmlSource:
    """Samples every GPU NVML sees; see the module docstring for what it writes.

    ``gpm=True`` turns on GPM metrics on Hopper and newer. It is opt-in because
    GPM shares hardware counters with DCGM, which a cluster may already run.
    ``root_pid`` is the profiled process tree, for per-process GPU figures.
    """

    name = "nvml"

    def __init__(self, gpm: bool = False, root_pid: int | None = None, clock: Clock = REAL_CLOCK) -> None:
        self.warnings: list[str] = []
        self._want_gpm, self._clock = gpm, clock
        self._root_pid = os.getpid() if root_pid is None else root_pid
        self._nvml: Nvml | None = None
        self._metrics: list[list[tuple[str, str]]] = []
        self._energy0: dict[int, float] = {}
        self._done: set[int] = set()
        self._wall_offset: float | None = None  # wall clock minus timeline clock
        self._first: float | None = None
        self._last: float | None = None

    def open(self, timeline: Timeline) -> None:
        meta: NvmlMeta = {
            "available": False,
            "reason": None,
            "driver_version": None,
            "cuda_driver_version": None,
        }
        timeline.meta["nvml"] = meta
        try:
            nvml = Nvml.open(self._clock)
        except NvmlUnavailable as e:
            meta["reason"] = str(e)
            raise SourceUnavailable(f"no GPU metrics: {e}") from e
        if nvml.device_count() == 0:
            nvml.close()
            meta["reason"] = "NVML sees no GPU"
            raise SourceUnavailable("no GPU metrics: NVML sees no GPU")
        self._nvml = nvml
        self.warnings = nvml.warnings  # one list: NVML's own findings go straight to the report
        n = nvml.device_count()
        timeline.meta["devices"] = [nvml.static_info(i) for i in range(n)]
        gpm = [i for i in range(n) if self._want_gpm and nvml.start_gpm(i)]
        meta["available"], meta["gpm"] = True, gpm
        meta["driver_version"], meta["cuda_driver_version"] = nvml.driver_version, nvml.cuda_driver_version
        self._metrics = [[(key, f"gpu{i}.{suffix}") for key, suffix in _SERIES] for i in range(n)]

    def poll(self, now: float, timeline: Timeline) -> None:
        nvml = self._nvml
        if nvml is None:
            return
        if self._wall_offset is None:
            self._wall_offset = self._clock.wall() - now
            self._first = now
        self._last = now
        add = timeline.add_sample
        for i, metrics in enumerate(self._metrics):
            if i in self._done:
                continue
            r = nvml.read(i)
            if r["lost"]:
                self._done.add(i)
                timeline.add_mark(now, "gpu_lost", index=i, reason=nvml.lost_reason(i))
                continue
            for key, metric in metrics:
                value = r[key]
                if value is not None:
                    add(metric, now, float(value))
            energy = r["energy_j"]
            if energy is not None:
                add(f"gpu{i}.energy_j", now, energy - self._energy0.setdefault(i, energy))
            for k, used in enumerate(r["mig_mem_used_bytes"] or ()):
                if used is not None:
                    add(f"gpu{i}.mig{k}.mem_used_bytes", now, float(used))

    def close(self, timeline: Timeline) -> None:
        """Read what is too slow for a tick: driver samples and per-process figures."""
        nvml = self._nvml
        if nvml is None:
            return
        try:
            if self._wall_offset is not None and self._first is not None and self._last is not None:
                self._window_reads(nvml, timeline, self._wall_offset, self._first, self._last)
        finally:
            nvml.close()
            self._nvml = None

    def _window_reads(self, nvml: Nvml, timeline: Timeline, offset: float, first: float, last: float) -> None:
        live = [i for i in range(nvml.device_count()) if not nvml.is_lost(i)]
        for i in live:
            for kind, suffix in (("gpu_util", "util_driver"), ("mem_util", "mem_util_driver")):
                for wall, value in nvml.samples(i, kind, since=first + offset):
                    t = wall - offset
                    if first <= t <= last:
                        timeline.add_sample(f"gpu{i}.{suffix}", t, value)
        tree = _process_tree(self._root_pid)
        rows: list[GpuProcess] = [
            {**p, "gpu": i, "in_tree": p["pid"] in tree}
            for i in live
            for p in nvml.processes(i, since=first + offset)
        ]
        scope: Literal["tree", "all"] = "tree"
        if rows and not any(r["in_tree"] for r in rows):
            scope = "all"
            self.warnings.append(
                f"none of the {len(rows)} GPU processes NVML lists belong to the profiled process tree: "
                "either it did not use the GPU, or NVML reports PIDs of another PID namespace (containers); "
                "per-process GPU figures cover every process on the GPU"
            )
        timeline.meta["gpu_processes"] = rows
        timeline.meta["gpu_processes_scope"] = scope


def _process_tree(root_pid: int) -> set[int]:
    import psutil

    try:
        root = psutil.Process(root_pid)
        return {root_pid, *(c.pid for c in root.children(recursive=True))}
    except psutil.Error:
        return {root_pid}
