"""The memory in use on one device, read cheaply enough to read every millisecond of one step.

A CUDA device's is the caching allocator's (host-side counters, no device call); the CPU's is the
process's USS: one USS reading (``/proc/<pid>/smaps``, slow) anchors the RSS change read from
``/proc/self/statm`` (fast) since then.
"""

from __future__ import annotations

import os
from typing import Any, Protocol


class DeviceReader(Protocol):
    def read(self) -> tuple[int, int | None]:
        """(bytes in use, bytes reserved by an allocator or None)."""

    def total(self) -> int | None:
        """The device's memory."""

    def failures(self) -> tuple[int | None, int | None]:
        """Allocator retries and out-of-memory errors since the reader was made."""


def readers_for(devices: list[str], torch: Any) -> dict[str, DeviceReader]:
    """A reader for each device of ``devices`` that can be read ("cpu", "cuda:N")."""
    out: dict[str, DeviceReader] = {}
    for device in devices:
        if device == "cpu":
            out[device] = ProcessReader()
        elif device.startswith("cuda"):
            index = int(device.partition(":")[2] or 0)
            out[device] = CudaReader(torch.cuda, index)
    return out


class CudaReader:
    """The caching allocator of one CUDA device."""

    def __init__(self, cuda: Any, index: int) -> None:
        self._cuda, self._index = cuda, index
        stats = cuda.memory_stats(index)
        self._retries0, self._ooms0 = _count(stats, "num_alloc_retries"), _count(stats, "num_ooms")

    def read(self) -> tuple[int, int | None]:
        stats = self._cuda.memory_stats(self._index)
        return _count(stats, "allocated_bytes.all.current"), _count(stats, "reserved_bytes.all.current")

    def total(self) -> int | None:
        try:
            return int(self._cuda.mem_get_info(self._index)[1])
        except Exception:  # a device that cannot say: the report takes NVML's figure
            return None

    def failures(self) -> tuple[int | None, int | None]:
        stats = self._cuda.memory_stats(self._index)
        return (
            _count(stats, "num_alloc_retries") - self._retries0,
            _count(stats, "num_ooms") - self._ooms0,
        )


class ProcessReader:
    """This process's USS, followed by its RSS between two USS readings."""

    def __init__(self) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._rss0 = self._rss()
        uss = own_uss()
        self._uss0 = uss if uss is not None else self._rss0  # no smaps: RSS stands in

    def _rss(self) -> int:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * self._page

    def read(self) -> tuple[int, int | None]:
        return self._uss0 + self._rss() - self._rss0, None

    def total(self) -> int | None:
        try:
            return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        except (ValueError, OSError):
            return None

    def failures(self) -> tuple[int | None, int | None]:
        return None, None


def own_uss() -> int | None:
    """This process's USS: its private pages, from ``smaps_rollup`` (one read), else psutil."""
    try:
        with open("/proc/self/smaps_rollup", "rb") as f:
            private = 0
            for line in f.read().splitlines():  # a loop, not a generator: no call per line on the step
                if line.startswith((b"Private_Clean:", b"Private_Dirty:")):
                    private += int(line.split()[1])
        return private * 1024 if private else None
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.Process().memory_full_info().uss)
    except Exception:  # psutil absent, or no access to smaps
        return None


def _count(stats: dict[str, Any], key: str) -> int:
    return int(stats.get(key) or 0)
