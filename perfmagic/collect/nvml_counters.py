"""NVML's counters read as rates: PCIe and NVLink bytes, energy, and the GPM metrics.

The counters (energy, PCIe, NVLink) come in one batched ``nvmlDeviceGetFieldValues``
call, and rates are computed from the counters' own timestamps, so a late tick does not
skew them. Where that batch is slow, it is read once a second (:data:`FIELDS_PERIOD_S`).
GPM metrics (Hopper and newer) are likewise NVML's figures between two samples.
"""

from __future__ import annotations

import contextlib
from typing import Any

from perfmagic.collect.nvml_query import VALUE_MEMBERS, NvmlQuery

_ALL_LINKS = 0xFFFFFFFF  # NVLink field scope that sums every link (nvml.h)

SLOW_FIELDS_S = 0.001
FIELDS_PERIOD_S = 1.0
"""How often the counters below are read where one batch takes SLOW_FIELDS_S or more: a batch can take
several milliseconds on a large GPU, a sizeable share of a core at 10 Hz, and a counter read once a
second gives the same mean rate."""

# Counters read in one nvmlDeviceGetFieldValues batch: (key, field id, scope, scale to SI).
_FIELDS: tuple[tuple[str, str, int, float], ...] = (
    ("energy_j", "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 0, 1e-3),  # mJ
    ("pcie_tx_bytes_per_s", "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 0, 1.0),
    ("pcie_rx_bytes_per_s", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 0, 1.0),
    ("nvlink_tx_bytes_per_s", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", _ALL_LINKS, 1024.0),  # KiB
    ("nvlink_rx_bytes_per_s", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", _ALL_LINKS, 1024.0),
)
_RATE_KEYS = frozenset(k for k, *_ in _FIELDS if k.endswith("_per_s"))
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


class Counters:
    """Each GPU's counters and GPM samples, between one tick's read and the next."""

    def __init__(self, q: NvmlQuery) -> None:
        self._q = q
        self._fields: dict[int, list[tuple[str, int, int, float]]] = {}
        # GPU -> (when, what its counters gave): kept only for a GPU whose batch is slow
        self._fields_read: dict[int, tuple[float, dict[str, Any]]] = {}
        self._slow_field_reads: dict[int, int] = {}  # slow batches in a row, by GPU
        self._counters: dict[tuple[int, str], tuple[float, int]] = {}
        self._rates: dict[tuple[int, str], float] = {}
        self._gpm: dict[int, list[Any]] = {}
        self._gpm_t: dict[int, float] = {}

    def read_fields(self, index: int, out: dict[str, Any]) -> None:
        """Counters in one batched call; rates from the counters' own timestamps. Where the call is slow
        (:data:`SLOW_FIELDS_S`, twice in a row), at most every :data:`FIELDS_PERIOD_S`, its figures
        repeated between."""
        now = self._q.now
        begin = now()
        last = self._fields_read.get(index)
        if last is not None and begin - last[0] < FIELDS_PERIOD_S:
            out.update(last[1])
            return
        read: dict[str, Any] = {}
        self._read_fields_now(index, read)
        # slow twice in a row: one read a busy machine held up says nothing of the driver
        streak = self._slow_field_reads.get(index, 0) + 1 if now() - begin >= SLOW_FIELDS_S else 0
        self._slow_field_reads[index] = streak
        if streak >= 2:
            self._fields_read[index] = (begin, read)
        else:
            self._fields_read.pop(index, None)
        out.update(read)

    def _field_ids(self, index: int) -> list[tuple[str, int, int, float]]:
        """The fields this nvidia-ml-py knows, looked up once per GPU."""
        fields = self._fields.get(index)
        if fields is None:
            fields = self._fields[index] = []
            for key, const, scope, scale in _FIELDS:
                fid = getattr(self._q.nv, const, None)
                if fid is None:
                    self._q.unavailable(index, key, "field not in this nvidia-ml-py")
                else:
                    fields.append((key, int(fid), scope, scale))
        return fields

    def _read_fields_now(self, index: int, out: dict[str, Any]) -> None:
        q = self._q
        fields = self._field_ids(index)
        if not fields:
            return
        h = q.handles[index]
        ids = [(fid, scope) for _, fid, scope, _ in fields]
        values = q.query(index, "field_values", lambda n: n.nvmlDeviceGetFieldValues(h, ids))
        if values is None:
            return
        dropped = False
        for (key, _, _, scale), v in zip(fields, values, strict=False):
            if v.nvmlReturn != 0:
                q.failed(index, key, q.nv.NVMLError(v.nvmlReturn))
                dropped = dropped or q.is_off(index, key)
                continue
            value = float(getattr(v.value, VALUE_MEMBERS[v.valueType])) * scale
            if key in _RATE_KEYS:
                wrap = _WRAP.get(int(v.valueType))
                out[key] = self._rate(
                    index, key, value, int(v.timestamp), None if wrap is None else wrap * scale
                )
            else:
                out[key] = value
        if dropped:  # stop asking for what this GPU does not have
            self._fields[index] = [f for f in fields if not q.is_off(index, f[0])]

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
        q = self._q
        h = q.handles[index]
        support = q.query(index, "gpm", lambda n: n.nvmlGpmQueryDeviceSupport(h))
        if support is None:
            return False
        if not support.isSupportedDevice:
            q.unavailable(index, "gpm", "GPM needs a Hopper or newer GPU")
            return False
        samples = [q.query(index, "gpm", lambda n: n.nvmlGpmSampleAlloc()) for _ in range(2)]
        if None in samples or q.query(index, "gpm", lambda n: n.nvmlGpmSampleGet(h, samples[0])) is None:
            return False
        self._gpm[index] = samples
        self._gpm_t[index] = q.now()
        return True

    def read_gpm(self, index: int, out: dict[str, Any]) -> None:
        """The GPM metrics since the last read into ``out``, where GPM is on and NVML's spacing allows."""
        if index not in self._gpm:
            return
        q = self._q
        now = q.now()
        if now - self._gpm_t[index] < _GPM_MIN_INTERVAL_S:
            return
        prev, cur = self._gpm[index]
        h = q.handles[index]
        if q.query(index, "gpm", lambda n: n.nvmlGpmSampleGet(h, cur)) is None:
            return
        self._gpm_t[index] = now
        self._gpm[index] = [cur, prev]
        nv = q.nv
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(_GPM)
        request.sample1 = prev
        request.sample2 = cur
        for k, (_, const) in enumerate(_GPM):
            request.metrics[k].metricId = getattr(nv, const)
        result = q.query(index, "gpm", lambda n: n.nvmlGpmMetricsGet(request))
        if result is None:
            return
        for k, (key, _) in enumerate(_GPM):
            metric = result.metrics[k]
            if metric.nvmlReturn == 0:
                out[key] = metric.value / 100.0
            else:
                q.failed(index, key, nv.NVMLError(metric.nvmlReturn))

    def close(self) -> None:
        """Free the GPM samples (before NVML shuts down)."""
        nv = self._q.nv
        for samples in self._gpm.values():
            for sample in samples:
                with contextlib.suppress(nv.NVMLError):
                    nv.nvmlGpmSampleFree(sample)
        self._gpm.clear()
