"""A clock that tests move by hand, for every collector at once (``perfmagic.clock``).

Time stands still until the test moves it: ``advance(seconds)`` or ``set(t)``.
Threads that wait on the clock's events (the sampler between ticks) are run in
step with it: ``advance`` wakes each waiter whose deadline falls inside the
move, at that deadline and in deadline order, and returns only once every such
thread has done its work and waits again. A tick then happens at exactly the
times the schedule says, whatever the machine's load, and the test's next line
sees all it did. The thread that made the clock drives it; on any other thread
``advance`` is work that takes time inside a tick (a slow driver call): time
moves on, nothing is woken (the driver's ``advance`` wakes whoever is due).

Like pyinstrument's test ``FakeClock``, but for a threaded sampler.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

from perfmagic.clock import Clock

_RESOLUTION_S = 1e-9
"""A deadline this close past the end of a move is due in it: sums of an interval drift by ulps."""

EPOCH = 1_750_000_000.0
"""The fake clock's ``wall`` at its start (June 2025): fixed, so what a driver stamps is exact too."""

_STUCK_S = 30.0
"""How long ``advance`` waits for a woken thread to wait again before it says the test is stuck."""


class FakeEvent(threading.Event):
    """An event whose ``wait(timeout)`` waits on its :class:`FakeClock`, not on real time."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self._clock = clock
        self.deadline: float | None = None  # while its thread waits: when the wait ends
        self.owner: threading.Thread | None = None  # the thread that waits on it

    def set(self) -> None:
        with self._clock._cond:
            super().set()
            self._clock._cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        clock = self._clock
        with clock._cond:
            self.owner = threading.current_thread()
            deadline = math.inf if timeout is None else clock.t + timeout
            if self.is_set() or deadline <= clock.t:
                return self.is_set()
            self.deadline = deadline
            clock._cond.notify_all()  # parked: an advance in progress may go on
            while not self.is_set() and self.deadline is not None:
                clock._cond.wait()
            self.deadline = None
            return self.is_set()


class FakeClock(Clock):
    """Time that moves only when told (``now`` from ``start``, ``wall`` from :data:`EPOCH`); the threads
    that wait on its ``event``s run in step with it.

    ``cpu_share`` and ``wait_share`` make the recorded thread's CPU and run-queue readings
    (``thread_readings``): that share of the time since the clock was made. The rest it is asleep:
    its count of sleeps (``thread_sleeps``) grows with time where the rest is more than nothing.
    """

    def __init__(self, start: float = 1000.0, cpu_share: float = 0.75, wait_share: float = 0.0) -> None:
        self.t = self.start = start
        self.now: Callable[[], float] = lambda: self.t
        self.wall: Callable[[], float] = lambda: EPOCH + (self.t - self.start)
        self.cpu_share, self.wait_share = cpu_share, wait_share
        self.thread_readings = self._thread_readings
        self.thread_sleeps = self._thread_sleeps
        self._cond = threading.Condition()
        self._events: list[FakeEvent] = []
        self._driver = threading.current_thread()

    def event(self) -> FakeEvent:
        event = FakeEvent(self)
        with self._cond:
            self._events.append(event)
        return event

    def _thread_readings(self) -> tuple[float, float]:
        elapsed = self.t - self.start
        return self.cpu_share * elapsed, self.wait_share * elapsed

    def _thread_sleeps(self) -> int:
        asleep = self.cpu_share + self.wait_share < 1.0
        return round((self.t - self.start) * 1e6) if asleep else 0

    def set(self, t: float) -> None:
        """Move to ``t`` (never back)."""
        self.advance(t - self.t)

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass, running every waiter due in them to its next wait."""
        if seconds < 0:
            raise ValueError(f"time does not go back ({seconds!r} s)")
        me = threading.current_thread()
        with self._cond:
            if me is not self._driver:  # a waiter's thread at work: its tick takes this long
                self.t += seconds
                return
            end = self.t + seconds
            while True:
                self._settle(me)
                due = [
                    e for e in self._live(me) if e.deadline is not None and e.deadline <= end + _RESOLUTION_S
                ]
                if not due:
                    break
                first = min(due, key=lambda e: e.deadline or 0.0)
                self.t = max(self.t, first.deadline or 0.0)
                first.deadline = None  # running: _settle waits until it waits again
                self._cond.notify_all()
            self.t = max(self.t, end)

    def _live(self, me: threading.Thread) -> list[FakeEvent]:
        """Events some other thread waits on, or is about to (not set, its thread not over)."""
        self._events = [e for e in self._events if not e.is_set() and (e.owner is None or e.owner.is_alive())]
        return [e for e in self._events if e.owner is not me]

    def _settle(self, me: threading.Thread) -> None:
        """Wait until every other thread of the clock's events waits (or is done)."""
        if not self._cond.wait_for(
            lambda: all(e.deadline is not None for e in self._live(me)), timeout=_STUCK_S
        ):
            raise AssertionError(
                "a thread on the fake clock neither waited again nor ended: is the sampler stuck?"
            )
