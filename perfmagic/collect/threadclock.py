"""The profiled thread's CPU time and run-queue wait, read at each step boundary.

CPU time is ``time.thread_time`` (exact: the clock brings the thread's run time up to
date when read). The wait is the second field of Linux's ``/proc/thread-self/schedstat``:
nanoseconds the thread was runnable but waiting for a CPU (the scheduler's run delay),
added each time the thread gets a CPU back. That wait is what other processes, or more
threads than CPUs, cost the training directly; sleeping, I/O and locks are not in it.
Where the file does not exist the wait is NaN. On some VMs the wait outgrows the wall
clock (timed on two CPUs' unsynchronised scheduler clocks): the analysis holds a step's
wait to its wall time less its CPU time. (The file's first field, time on a CPU,
only moves at scheduler ticks: too coarse for a step of a few milliseconds.)

Neither clock sees all the time a thread spends off a CPU while it could run: on a VM the
hypervisor takes the virtual CPU away (steal) and no run delay shows it. What tells that from
blocking is whether the thread went to sleep: a read, a lock or a sleep is a voluntary context
switch (``getrusage``'s per-thread count); time off a CPU in an interval without one was taken by
others (:func:`wait_off_cpu`).

It also adds up the time Python's garbage collector runs on the thread (``gc.callbacks``,
removed again by ``close``): a slow step that is a collection says so.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import resource
import threading
import time
from collections.abc import Callable
from typing import Any

from perfmagic.clock import REAL_CLOCK, Clock


class ThreadClock:
    """Cumulative CPU and run-queue seconds of the thread that creates it; GC seconds on ``clock``
    (whose ``thread_readings``, where set, stand in for the OS's CPU and wait)."""

    def __init__(self, clock: Clock = REAL_CLOCK) -> None:
        self._now, self._replay = clock.now, clock.thread_readings
        self.sleeps = clock.thread_sleeps or voluntary_switches
        self._fd = open_schedstat()
        self._thread = threading.get_ident()
        # seconds Python's garbage collector ran on the thread since the clock was made (an attribute:
        # the recorder compares it at every step end)
        self.gc_s = 0.0
        self._gc_began: float | None = None
        self.after_collection: Callable[[], object] | None = None  # called after each collection counted
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if threading.get_ident() != self._thread:
            return
        if phase == "start":
            self._gc_began = self._now()
        elif self._gc_began is not None:
            self.gc_s += self._now() - self._gc_began
            self._gc_began = None
            if self.after_collection is not None:
                self.after_collection()

    @property
    def measures_wait(self) -> bool:
        return self._fd is not None or self._replay is not None

    def read(self) -> tuple[float, float]:
        """(CPU seconds, run-queue seconds) since the thread started; call it on that thread."""
        if self._replay is not None:
            return self._replay()
        fd = self._fd
        if fd is not None:
            cpu, delay = time.thread_time(), run_delay(fd)
            if delay is not None:
                return cpu, delay
            self._fd = None  # a kernel without the field: CPU time only from now on
            os.close(fd)
        return time.thread_time(), math.nan

    def close(self) -> None:
        """Stop counting: the file is closed and the collector's callback removed."""
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_gc)
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def open_schedstat() -> int | None:
    """The calling thread's schedstat file, open for :func:`run_delay`; None where there is none."""
    try:
        return os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    except OSError:
        return None


def run_delay(fd: int) -> float | None:
    """Seconds the thread of ``fd`` (from :func:`open_schedstat`) has waited for a CPU so far; None
    where the kernel's file does not say."""
    try:
        return int(os.pread(fd, 128, 0).split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def voluntary_switches() -> int | None:
    """How often the calling thread has gone to sleep (I/O, a lock, a sleep); None where the OS does
    not count it per thread."""
    try:
        return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
    except (AttributeError, OSError):  # RUSAGE_THREAD is Linux's
        return None


def wait_off_cpu(
    wall: float,
    cpu: float,
    queued: float,
    switches_before: int | None,
    switches: Callable[[], int | None] = voluntary_switches,
) -> float:
    """Seconds of an interval the thread could run but did not: the run delay, and where it never went
    to sleep (``switches()`` still reads ``switches_before``) all of its time off a CPU, which only
    others can have taken (on a VM the hypervisor's steal, which no run delay shows). Call it on the
    thread as the interval ends. NaN stays NaN: the wait is unknown."""
    if switches_before is None or switches() != switches_before:
        return queued
    return max(queued, wall - cpu)


def cpu_only_reading() -> tuple[float, float]:
    """A reading of the calling thread where no :class:`ThreadClock` measures it: CPU time, wait unknown."""
    return time.thread_time(), math.nan
