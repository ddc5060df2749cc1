"""A simulated CUDA device, as unkind as a real one where perfmagic's CUDA paths can go wrong.

Installed over the real ``torch.cuda`` (``install``), it gives the torch hooks what a GPU
machine would: kernels queue per stream and run in order for their modelled time,
after what was queued before them; an event is reached when its stream gets there and
``query()`` says so only then; ``synchronize`` waits for the queues; while a graph is
captured, querying or waiting on an event raises as CUDA does; an event freed in a forked child
kills that child, as the real one's destructor aborts it; the caching allocator has
current and peak figures, retries and OOMs. Every kernel's device interval is kept, so a
test can measure the truth a profiler should find.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest


@dataclass
class Stream:
    device: int
    busy_until: float = 0.0  # perf_counter time at which its queued work is done


@dataclass
class Kernel:
    device: int
    name: str
    start: float
    end: float


@dataclass
class Allocator:
    allocated: int = 0
    reserved: int = 0
    allocated_peak: int = 0
    reserved_peak: int = 0
    retries: int = 0
    ooms: int = 0


class CaptureError(RuntimeError):
    """What CUDA raises for an operation not permitted while a stream is captured."""


@dataclass
class SimCuda:
    devices: int = 1
    current: int = 0
    capturing: bool = False
    initialized: bool = True
    kernels: list[Kernel] = field(default_factory=list)
    device_syncs: int = 0
    events_recorded: int = 0
    fail_records: bool = False  # the next event records raise, as after a device-side assert
    total_bytes: int = 80 * 2**30  # each device's memory
    pinned_bytes: int = 0  # page-locked host memory the host allocator holds (pin_memory's buffers)

    def __post_init__(self) -> None:
        self.streams = [Stream(d) for d in range(self.devices)]
        self.allocators = [Allocator() for _ in range(self.devices)]

    # -- what the tests do on the device ----------------------------------

    def launch(self, seconds: float, name: str = "kernel", device: int | None = None) -> Kernel:
        """Queue a kernel on the device's stream: it runs after everything queued before it."""
        stream = self.streams[self.current if device is None else device]
        if self.capturing:  # captured work runs when the graph is replayed, not now
            return Kernel(stream.device, name, float("inf"), float("inf"))
        start = max(time.perf_counter(), stream.busy_until)
        kernel = Kernel(stream.device, name, start, start + seconds)
        stream.busy_until = kernel.end
        self.kernels.append(kernel)
        return kernel

    def alloc(self, nbytes: int, device: int = 0, retry: bool = False) -> None:
        a = self.allocators[device]
        a.allocated += nbytes
        a.reserved = max(a.reserved, a.allocated)
        a.allocated_peak = max(a.allocated_peak, a.allocated)
        a.reserved_peak = max(a.reserved_peak, a.reserved)
        a.retries += int(retry)

    def free(self, nbytes: int, device: int = 0) -> None:
        self.allocators[device].allocated -= nbytes

    @contextmanager
    def capture(self) -> Iterator[None]:
        self.capturing = True
        try:
            yield
        finally:
            self.capturing = False

    def idle_at(self) -> float:
        return max(s.busy_until for s in self.streams)

    # -- torch.cuda's surface ---------------------------------------------

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        return self.devices

    def current_device(self) -> int:
        return self.current

    def current_stream(self, device: int | None = None) -> Stream:
        return self.streams[self.current if device is None else device]

    def is_current_stream_capturing(self) -> bool:
        return self.capturing

    def synchronize(self, device: Any = None) -> None:
        self.device_syncs += 1
        device = getattr(device, "index", device)  # a torch.device, as torch.cuda takes one
        streams = self.streams if device is None else [self.streams[device]]
        _sleep_until(max(s.busy_until for s in streams))

    def Event(self, enable_timing: bool = False) -> Event:
        return Event(self)

    def memory_stats(self, device: int | None = None) -> dict[str, Any]:
        a = self.allocators[self.current if device is None else device]
        return {
            "allocated_bytes.all.current": a.allocated,
            "reserved_bytes.all.current": a.reserved,
            "allocated_bytes.all.peak": a.allocated_peak,
            "reserved_bytes.all.peak": a.reserved_peak,
            "num_alloc_retries": a.retries,
            "num_ooms": a.ooms,
        }

    def reset_peak_memory_stats(self, device: int | None = None) -> None:
        a = self.allocators[self.current if device is None else device]
        a.allocated_peak, a.reserved_peak = a.allocated, a.reserved

    def host_memory_stats(self) -> dict[str, Any]:
        return {"allocated_bytes.current": self.pinned_bytes, "num_host_alloc": int(self.pinned_bytes > 0)}

    def memory_reserved(self, device: int | None = None) -> int:
        return int(self.memory_stats(device)["reserved_bytes.all.current"])

    def mem_get_info(self, device: int | None = None) -> tuple[int, int]:
        """(free, total) bytes of the device: what the allocator has not reserved."""
        a = self.allocators[self.current if device is None else device]
        return self.total_bytes - a.reserved, self.total_bytes


class Event:
    """A CUDA event: reached once its stream has run everything queued before it was recorded."""

    def __init__(self, sim: SimCuda) -> None:
        self.sim = sim
        self.device: int | None = None
        self.at: float | None = None
        self.pid = os.getpid()

    def __del__(self) -> None:
        # A real event freed in a forked child calls into a CUDA context the child cannot use: the C++
        # destructor's error terminates the process (SIGABRT), whatever Python was doing
        if os.getpid() != self.pid:
            os._exit(134)

    def record(self, stream: Stream | None = None) -> None:
        sim = self.sim
        if sim.fail_records:
            raise RuntimeError("CUDA error: device-side assert triggered")
        stream = stream or sim.current_stream()
        sim.events_recorded += 1
        self.device = stream.device
        # captured into a graph: reached only when the graph is replayed, never in this run
        self.at = float("inf") if sim.capturing else max(time.perf_counter(), stream.busy_until)

    def query(self) -> bool:
        if self.sim.capturing:
            raise CaptureError("operation not permitted when stream is capturing")
        return self.at is None or time.perf_counter() >= self.at

    def synchronize(self) -> None:
        if self.sim.capturing:
            raise CaptureError("operation not permitted when stream is capturing")
        if self.at is not None:
            _sleep_until(self.at)

    def elapsed_time(self, end: Event) -> float:
        if self.at is None or end.at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        if self.device != end.device:
            raise RuntimeError("Both events must be recorded on the same device.")
        return (end.at - self.at) * 1000.0


def _sleep_until(t: float) -> None:
    if t == float("inf"):
        raise RuntimeError("waiting for work that only a graph replay would run")
    while (left := t - time.perf_counter()) > 0:
        time.sleep(min(left, 0.01))


SURFACE = (
    "is_available",
    "is_initialized",
    "device_count",
    "current_device",
    "current_stream",
    "is_current_stream_capturing",
    "synchronize",
    "Event",
    "memory_stats",
    "reset_peak_memory_stats",
    "memory_reserved",
    "mem_get_info",
    "host_memory_stats",
)
"""What the simulated device answers for, where this torch has it (``host_memory_stats`` since 2.3):
a function an older torch lacks stays absent, as it is for the hooks on a real device."""


def _surface(torch: Any) -> list[str]:
    return [name for name in SURFACE if hasattr(torch.cuda, name)]


@contextmanager
def installed(sim: SimCuda) -> Iterator[SimCuda]:
    """The simulated device behind ``torch.cuda`` for a block (benchmarks; tests use ``install``)."""
    import torch

    real = {name: getattr(torch.cuda, name) for name in _surface(torch)}
    try:
        for name in real:
            setattr(torch.cuda, name, getattr(sim, name))
        yield sim
    finally:
        for name, value in real.items():
            setattr(torch.cuda, name, value)


def install(monkeypatch: pytest.MonkeyPatch, sim: SimCuda) -> SimCuda:
    """Put the simulated device behind ``torch.cuda`` for one test (monkeypatch puts the real one back)."""
    import torch

    for name in _surface(torch):
        monkeypatch.setattr(torch.cuda, name, getattr(sim, name))
    return sim
