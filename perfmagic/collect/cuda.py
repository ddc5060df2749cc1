"""CUDA seen from the host without slowing it: device timestamps from events, the allocator's figures.

Nothing here initializes CUDA: the clock starts once the profiled code has, and the
allocator source reads nothing until then. Every device the training uses is
covered (a model split over ``cuda:0`` and ``cuda:1``), not only the current one.
"""

from __future__ import annotations

import sys
from typing import Any

from perfmagic.clock import REAL_CLOCK, Clock
from perfmagic.contract import AllocatorMeta
from perfmagic.schema import ALLOCATOR, PINNED_BYTES
from perfmagic.timeline import Timeline

DEVICES_EVERY_S = 1.0
"""How often the clock looks again for devices the training has started to use."""


class CudaEventClock:
    """Device timestamps from CUDA events, mapped onto the timeline's clock.

    An event token records one event on the current stream of each device in use (those whose
    caching allocator holds memory); the device work queued before it is done when all
    of them are, and its time is the latest. Each device gets a reference event the first
    time it is used: waiting for it waits for that device's current stream once, never for
    the whole device (``torch.cuda.synchronize`` is patched while profiling, and would
    be a bogus logging span too).
    """

    def __init__(self, torch_mod: Any, origin: float, clock: Clock = REAL_CLOCK) -> None:
        self._cuda = torch_mod.cuda
        self._origin, self._now = origin, clock.now
        self._refs: dict[int, tuple[Any, float]] = {}  # device: (reference event, its time on the timeline)
        self._devices: tuple[int, ...] = ()
        self._looked_at = 0.0
        self._look_for_devices()

    @property
    def devices(self) -> tuple[int, ...]:
        """The devices an event token records on."""
        return self._devices

    def _look_for_devices(self) -> None:
        cuda = self._cuda
        used = [d for d in range(cuda.device_count()) if cuda.memory_reserved(d) > 0]
        for d in used or [cuda.current_device()]:
            if d not in self._refs:
                ref = cuda.Event(enable_timing=True)
                ref.record(cuda.current_stream(d))
                ref.synchronize()
                self._refs[d] = (ref, self._now() - self._origin)
        self._devices = tuple(used or [cuda.current_device()])
        self._looked_at = self._now()

    def event_token(self) -> object | None:
        cuda = self._cuda
        if cuda.is_current_stream_capturing():  # an event recorded into a graph being captured would replay
            return None
        events = []
        for d in self._devices:
            event = cuda.Event(enable_timing=True)
            event.record(cuda.current_stream(d))
            events.append((d, event))
        return events

    def done(self, token: object) -> bool:
        cuda = self._cuda
        if cuda.is_current_stream_capturing():  # querying an event is illegal while a graph is captured
            return False
        if self._now() - self._looked_at >= DEVICES_EVERY_S:  # drains call this about once a second
            self._look_for_devices()
        return all(event.query() for _, event in token)  # type: ignore[attr-defined]

    def resolve(self, tokens: list[object]) -> list[float | None]:
        out: list[float | None] = []
        for token in tokens:
            times: list[float] = []
            for d, event in token:  # type: ignore[attr-defined]
                ref, ref_t = self._refs[d]
                try:
                    event.synchronize()  # only this event: free once it has run
                    times.append(ref_t + ref.elapsed_time(event) / 1000.0)
                except RuntimeError:  # an event the context could not time (a lost device, a reset)
                    continue
            out.append(max(times) if times else None)
        return out

    def close(self) -> None:
        """Free the reference events now, in the process that made them (the recorder has closed).

        A finished session lives on in reference cycles until the collector finds them; a child forked
        before then (a DataLoader worker of the next loop) would find them itself and free the events
        there, which aborts it. ``devices`` still answers.
        """
        self._refs.clear()


class AllocatorSource:
    """The PyTorch caching allocator of each device in use: memory allocated and reserved over time,
    and over the window its peaks, the cudaMalloc retries (it freed its cache to find memory: slow)
    and the out-of-memory errors.

    Metrics ``gpu{i}.torch_allocated_bytes`` and ``gpu{i}.torch_reserved_bytes``, and ``host.pinned_bytes``:
    the page-locked host memory its host allocator holds (``pin_memory``'s buffers; torch >= 2.6); the window's
    figures go to ``meta[ALLOCATOR]``. It reads host-side counters only (no device call), and
    only once the profiled code has initialized CUDA; the peaks are the allocator's own where they
    were reached inside the window (its peak counters are never reset: they are the user's).
    """

    name = "torch allocator"

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self._first: dict[int, dict[str, int]] = {}
        self._last: dict[int, dict[str, int]] = {}
        self._sampled_peak: dict[int, tuple[int, int]] = {}
        self._pinned_ok = True

    def open(self, timeline: Timeline) -> None:
        return None

    def _cuda(self) -> Any:
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        return cuda if cuda is not None and cuda.is_available() and cuda.is_initialized() else None

    def poll(self, now: float, timeline: Timeline) -> None:
        cuda = self._cuda()
        if cuda is None:
            return
        for d in range(cuda.device_count()):
            stats = _figures(cuda.memory_stats(d))
            if not stats["reserved"] and d not in self._first:
                continue
            self._first.setdefault(d, stats)
            self._last[d] = stats
            allocated, reserved = self._sampled_peak.get(d, (0, 0))
            self._sampled_peak[d] = (max(allocated, stats["allocated"]), max(reserved, stats["reserved"]))
            timeline.add_sample(f"gpu{d}.torch_allocated_bytes", now, float(stats["allocated"]))
            timeline.add_sample(f"gpu{d}.torch_reserved_bytes", now, float(stats["reserved"]))
        if self._pinned_ok and hasattr(cuda, "host_memory_stats"):
            try:
                pinned = float(cuda.host_memory_stats().get("allocated_bytes.current") or 0)
            except Exception:  # a host allocator that cannot say: not asked again
                self._pinned_ok = False
            else:
                timeline.add_sample(PINNED_BYTES, now, pinned)

    def close(self, timeline: Timeline) -> None:
        cuda = self._cuda()
        if cuda is not None:
            for d in self._first:
                self._last[d] = _figures(cuda.memory_stats(d))
        devices: list[AllocatorMeta] = []
        for d, first in sorted(self._first.items()):
            last = self._last[d]
            sampled_allocated, sampled_reserved = self._sampled_peak[d]
            devices.append(
                {
                    "index": d,
                    # a peak counter that grew in the window was reached in it: exact; else the samples'
                    "allocated_peak_bytes": last["allocated_peak"]
                    if last["allocated_peak"] > first["allocated_peak"]
                    else max(sampled_allocated, last["allocated"]),
                    "reserved_peak_bytes": last["reserved_peak"]
                    if last["reserved_peak"] > first["reserved_peak"]
                    else max(sampled_reserved, last["reserved"]),
                    "alloc_retries": last["retries"] - first["retries"],
                    "ooms": last["ooms"] - first["ooms"],
                }
            )
        if devices:
            timeline.meta[ALLOCATOR] = devices


def _figures(stats: dict[str, Any]) -> dict[str, int]:
    def get(key: str) -> int:
        return int(stats.get(key) or 0)

    return {
        "allocated": get("allocated_bytes.all.current"),
        "reserved": get("reserved_bytes.all.current"),
        "allocated_peak": get("allocated_bytes.all.peak"),
        "reserved_peak": get("reserved_bytes.all.peak"),
        "retries": get("num_alloc_retries"),
        "ooms": get("num_ooms"),
    }
