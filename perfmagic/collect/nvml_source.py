"""The sampler source for GPU telemetry: every GPU NVML sees, read each tick into a timeline.

Each tick makes only cheap calls (:meth:`perfmagic.collect.nvml.Nvml.read`); the slow
queries (the driver's sample buffer, per-process figures) run once, in ``close``.

What :class:`NvmlSource` writes (units: bytes, watts, joules, MHz, degrees C;
utilizations in [0, 1]; a metric that is not available is never written):

- samples ``gpu{i}.util``, ``.mem_util``, ``.mem_used_bytes``, ``.power_w``,
  ``.energy_j`` (joules since the window started, from the total-energy counter),
  ``.sm_clock_mhz``, ``.mem_clock_mhz``, ``.temperature_c``, ``.pstate`` (0 = P0),
  ``.throttle_mask`` (NVML clocks-event-reason bits, see
  :data:`perfmagic.schema.THROTTLE_REASONS`),
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

import os
from typing import Literal

from perfmagic.clock import REAL_CLOCK, Clock
from perfmagic.collect.nvml import Nvml
from perfmagic.collect.nvml_query import NvmlUnavailable
from perfmagic.collect.sampler import SourceUnavailable
from perfmagic.contract.meta import GpuProcess, NvmlMeta
from perfmagic.timeline import Timeline

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
