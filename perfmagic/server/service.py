"""One sampler per server: a thread that reads NVML and the host, shared by every client.

NVML calls happen only on the sampler thread, so a slow or hung driver never blocks the IO loop.
The thread starts on the first client, runs at the fastest rate any client asks for, and stops
after ``idle_timeout_s`` without clients (and on server shutdown). Handlers only read ``latest``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from perfmagic.contract import DeviceInfo
from perfmagic.registry import running_sessions
from perfmagic.server import snapshot
from perfmagic.server.kernels import KernelIndex

Json = dict[str, Any]

MIN_HZ = 0.25
MAX_HZ = 10.0
DEFAULT_HZ = 1.0
KERNEL_REFRESH_S = 2.0  # kernels start and stop rarely; the session DB needn't be hit every tick
# Per-process queries (process utilization in particular) cost far more than the counters;
# a process list a second old is fresh enough to see who holds the memory.
PROCESS_REFRESH_S = 1.0

log = logging.getLogger(__name__)


def clamp_rate(hz: object, default: float = DEFAULT_HZ) -> float:
    """A client's rate request, clamped to what the sampler serves."""
    if isinstance(hz, bool) or not isinstance(hz, (int, float)):
        return default
    if hz != hz:  # NaN
        return default
    return min(MAX_HZ, max(MIN_HZ, float(hz)))


def open_nvml() -> tuple[snapshot.NvmlLike | None, str | None]:
    """Open NVML; without it return (None, why). Imported here so the server loads without it."""
    try:
        from perfmagic.collect.nvml import Nvml
        from perfmagic.collect.nvml_query import NvmlUnavailable
    except ImportError as e:
        return None, f"perfmagic NVML layer not importable: {e}"
    try:
        nv: snapshot.NvmlLike = Nvml.open()
    except NvmlUnavailable as e:
        return None, str(e) or "NVML unavailable"
    except Exception as e:  # a broken driver must not take the monitor down
        return None, f"NVML failed to open: {type(e).__name__}: {e}"
    return nv, None


class MonitorService:
    """Owns the sampler thread, the latest snapshot, and the subscribed stream clients."""

    def __init__(
        self,
        kernels: KernelIndex | None = None,
        idle_timeout_s: float = 30.0,
        nvml_opener: Callable[[], tuple[snapshot.NvmlLike | None, str | None]] = open_nvml,
    ) -> None:
        self.kernels = kernels or KernelIndex()
        self.idle_timeout_s = idle_timeout_s
        self.nvml_opener = nvml_opener  # tests swap in a fake NVML here
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._retired: threading.Thread | None = None  # an idle thread still closing NVML
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._rates: dict[object, float] = {}  # subscriber -> Hz; only the loop touches it
        self._interval_s = 1.0 / DEFAULT_HZ  # derived from _rates; a float the thread can read
        self._last_used = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Event | None = None
        self._listeners: set[Callable[[Json], None]] = set()
        self._kernels_refreshed = 0.0
        self._kernels_task: asyncio.Task[None] | None = None
        self.latest: Json | None = None
        self.samples = 0

    # ---- loop side -------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        t = self._thread
        return t is not None and t.is_alive()

    @property
    def interval_s(self) -> float:
        return self._interval_s

    def touch(self) -> None:
        """Note a client's interest and make sure the sampler runs. Call on the IO loop."""
        self._last_used = time.monotonic()
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.running:
                return
            self._loop = loop
            self._ready = asyncio.Event()
            self.latest = None  # left by a sampler that went idle: too old to serve
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, args=(self._retired,), name="perfmagic-monitor", daemon=True
            )
            self._retired = None
            self._thread.start()
        self._refresh_kernels()

    async def get_snapshot(self, timeout: float = 5.0) -> Json:
        """The latest snapshot, waiting (without blocking the loop) for the first one."""
        self.touch()
        if self.latest is None and self._ready is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._ready.wait(), timeout)
        return self.latest or starting_snapshot(self.interval_s)

    def subscribe(self, listener: Callable[[Json], None], rate_hz: float) -> None:
        """Call ``listener(snapshot)`` on the IO loop after each sample (it throttles itself)."""
        self._listeners.add(listener)
        self.set_rate(listener, rate_hz)

    def unsubscribe(self, listener: Callable[[Json], None]) -> None:
        self._listeners.discard(listener)
        self.set_rate(listener, None)
        self._last_used = time.monotonic()

    def set_rate(self, subscriber: object, rate_hz: float | None) -> None:
        """Set (or with None, drop: a paused client) a subscriber's demand."""
        if rate_hz is None:
            self._rates.pop(subscriber, None)
        else:
            self._rates[subscriber] = clamp_rate(rate_hz)
            self.touch()
        self._interval_s = 1.0 / max(self._rates.values(), default=DEFAULT_HZ)
        self._wake.set()  # a faster rate takes effect now, not after the old interval

    async def stop(self) -> None:
        """Stop the sampler thread (server shutdown); waits off the loop for it to finish."""
        self._stop.set()
        self._wake.set()
        t = self._thread
        if t is not None:
            await asyncio.get_running_loop().run_in_executor(None, t.join, 5.0)
        if self._kernels_task is not None:
            self._kernels_task.cancel()

    def _published(self, snap: Json) -> None:
        self.latest = snap
        if self._ready is not None:
            self._ready.set()
        for listener in list(self._listeners):
            try:
                listener(snap)
            except Exception:
                log.warning("perfmagic: stream listener failed", exc_info=True)
        self._refresh_kernels()

    def _refresh_kernels(self) -> None:
        now = time.monotonic()
        busy = self._kernels_task is not None and not self._kernels_task.done()
        if busy or now - self._kernels_refreshed < KERNEL_REFRESH_S:
            return
        self._kernels_refreshed = now
        self._kernels_task = asyncio.ensure_future(self.kernels.refresh())

    # ---- sampler thread --------------------------------------------------------------------

    def _idle(self) -> bool:
        return not self._rates and time.monotonic() - self._last_used > self.idle_timeout_s

    def _run(self, retired: threading.Thread | None) -> None:
        if retired is not None:  # NVML init/shutdown must not interleave with the previous thread's
            retired.join()
        host = snapshot.HostReader()
        nv, reason = self.nvml_opener()
        static: list[DeviceInfo] = []
        if nv is not None:
            try:
                static = [nv.static_info(i) for i in range(nv.device_count())]
            except Exception as e:
                reason = f"NVML device query failed: {type(e).__name__}: {e}"
                self._close(nv)
                nv = None
        # CPU utilization needs a time delta; 0.1 s is the shortest that cpu_times() resolves well
        self._stop.wait(0.1)
        seq = 0
        procs = snapshot.ProcessCache(PROCESS_REFRESH_S)
        try:
            while not self._stop.is_set():
                t0 = time.monotonic()
                seq += 1
                snap = self._sample(seq, nv, reason, static, host, procs)
                self.samples += 1
                if not self._post(snap):
                    break
                with self._lock:
                    if self._idle():
                        self._retired, self._thread = self._thread, None
                        break
                self._wake.clear()
                self._wake.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))
        finally:
            self._close(nv)

    def _sample(
        self,
        seq: int,
        nv: snapshot.NvmlLike | None,
        reason: str | None,
        static: list[DeviceInfo],
        host: snapshot.HostReader,
        process_cache: snapshot.ProcessCache,
    ) -> Json:
        gpus: list[Json] = []
        procs: list[Json] = []
        warnings: list[str] = []
        if nv is not None:
            gpus = snapshot.read_gpus(nv, static)
            procs = process_cache.get(
                lambda: snapshot.describe_processes(
                    snapshot.read_processes(nv, gpus), self.kernels.kernel_for, running_sessions()
                )
            )
            warnings = list(nv.warnings)
        status = snapshot.nvml_status(nv, reason, len(static), warnings)
        return snapshot.build(seq, self.interval_s, status, gpus, procs, host.read())

    def _post(self, snap: Json) -> bool:
        """Hand a snapshot to the IO loop; False once the loop is gone."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return False
        try:
            loop.call_soon_threadsafe(self._published, snap)
        except RuntimeError:  # loop closed between the check and the call
            return False
        return True

    @staticmethod
    def _close(nv: snapshot.NvmlLike | None) -> None:
        if nv is None:
            return
        try:
            nv.close()
        except Exception:
            log.debug("perfmagic: NVML close failed", exc_info=True)


def starting_snapshot(interval_s: float) -> Json:
    """What a client gets if the sampler has not produced its first snapshot in time."""
    status = snapshot.nvml_status(None, "the GPU monitor is starting")
    return snapshot.build(0, interval_s, status, [], [], {})
