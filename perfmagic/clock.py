"""The clock every collector reads, one object passed down from the session.

What comes from it: ``now``, seconds on a monotonic clock (stage spans, step
boundaries, sample times, the sampler's schedule); ``wall``, seconds since the
epoch (the record's start, what a GPU driver stamps its samples with); ``event``, the event the sampler
waits on between ticks (``wait(timeout)`` returns early once it is set); and
``thread_readings`` and ``thread_sleeps``, where the recorded thread's CPU and run-queue
seconds and its count of sleeps come from (None: the OS, see ``collect.threadclock``).
A test passes a clock of its own (``tests/fakeclock.py``) and drives the whole cadence
without real time.

The real clock costs the hot path nothing: its ``now`` *is* :func:`time.perf_counter`,
a builtin, which the recorder binds once (no Python frame per read).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Clock:
    """Real time: ``now`` is :func:`time.perf_counter` itself, ``wall`` :func:`time.time`; ``event`` a plain
    :class:`threading.Event`."""

    now: Callable[[], float]
    """Seconds on a monotonic clock (an attribute, not a method: read it once, call it often)."""

    wall: Callable[[], float]
    """Seconds since the epoch: only to meet other programs' timestamps, never to time an interval."""

    thread_readings: Callable[[], tuple[float, float]] | None = None
    """The calling thread's (CPU, run-queue wait) seconds in place of the OS's figures (a test's replay)."""

    thread_sleeps: Callable[[], int | None] | None = None
    """How often the calling thread has gone to sleep, in place of the OS's count (a test's replay)."""

    def __init__(self) -> None:
        self.now, self.wall = time.perf_counter, time.time

    def event(self) -> threading.Event:
        """An event whose ``wait(timeout)`` waits on this clock: the sampler's stop signal."""
        return threading.Event()


REAL_CLOCK = Clock()
"""The clock a collector reads where none is given."""
