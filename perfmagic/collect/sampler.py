"""One background thread that polls every metric source at a fixed interval."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Protocol

from perfmagic.clock import REAL_CLOCK, Clock
from perfmagic.timeline import Timeline

START_TIMEOUT_S = 2.0
"""How long ``start`` waits for the sources to open and give a first tick."""
STOP_TIMEOUT_S = 2.0
"""How long ``stop`` waits for the last tick and the sources' closing."""
FORK_WAIT_S = 0.5
"""How long a ``fork`` waits for the tick in progress (a hung source must not hang the user's fork)."""
MAX_FAILURES = 3
"""Failed ticks in a row after which a source is turned off (one bad read is not a broken source)."""


class SourceUnavailable(Exception):
    """A source cannot run here; the message says why, for the report's warnings."""


class Source(Protocol):
    """A metric source polled by the sampler thread.

    ``open`` may raise :class:`SourceUnavailable`; it records static facts in
    ``timeline.meta``. ``poll`` appends one tick of samples and must not block.
    ``close`` runs once after the window (reads that are too slow for a tick).
    Every warning a source wants in the report goes to ``warnings``.
    """

    name: str
    warnings: list[str]

    def open(self, timeline: Timeline) -> None: ...

    def poll(self, now: float, timeline: Timeline) -> None: ...

    def close(self, timeline: Timeline) -> None: ...


class Sampler:
    """Polls sources on one daemon thread; a source that raises is turned off.

    ``clock`` returns seconds on the timeline's clock. ``on_tick`` runs after
    each tick on the sampler thread (the spooler and live panels hang there).
    ``timer`` schedules the ticks and times the polls (``busy_s``): a fake one
    drives the cadence without real time. The start and stop timeouts are real.
    """

    def __init__(
        self,
        timeline: Timeline,
        sources: Sequence[Source],
        interval: float,
        clock: Callable[[], float],
        on_tick: Callable[[], None] | None = None,
        *,
        timer: Clock = REAL_CLOCK,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"sampling interval must be positive, got {interval!r}")
        self.timeline = timeline
        self.interval = interval
        self.warnings: list[str] = []
        self.ticks = 0
        self.busy_s = 0.0  # time spent in polls: the sampler's own cost
        self._clock = clock
        self._timer = timer
        self._on_tick = on_tick
        self._sources: list[Source] = []
        self._candidates = list(sources)
        self._stop = threading.Event()  # the timer's own is made in start (a thread waits on that one)
        self._opened = threading.Event()
        self._thread: threading.Thread | None = None
        self._busy_with: str | None = None  # the source being opened, polled or closed (names a hang)
        self._failures: dict[str, int] = {}  # failed ticks in a row, by source
        self._abandoned = False  # stop() gave up waiting: the thread must not close sources late
        # held for each tick: a fork waits for it, so a child never inherits a lock or a file buffer
        # that this thread was half-way through (a child that then touches it waits forever)
        self._tick_lock = threading.Lock()
        self._held_for_fork = False

    @property
    def sources(self) -> list[Source]:
        return list(self._sources)

    def start(self) -> None:
        """Open the sources and take the first tick on the sampler thread, waiting for that at most
        ``START_TIMEOUT_S``: a source that hangs (a stuck GPU driver) must not hold up the training.
        A start that raises has stopped the thread again."""
        self._stop = self._timer.event()
        self._thread = threading.Thread(target=self._run, name="perfmagic-sampler", daemon=True)
        _RUNNING.add(self)
        self._thread.start()
        try:
            opened = self._opened.wait(START_TIMEOUT_S)
        except BaseException:  # interrupted (Ctrl-C) while the sources open: no thread is left behind
            self.stop()
            raise
        if not opened:
            self.warnings.append(
                f"{self._busy_with or 'a source'}: took longer than {START_TIMEOUT_S:g} s to start; "
                "profiling began without waiting for it"
            )

    def stop(self) -> None:
        """Stop sampling: the last tick and the sources' closing run on the sampler thread, waited for
        at most ``STOP_TIMEOUT_S``; a source that hangs then loses its last samples, not the training."""
        self._stop.set()
        _RUNNING.discard(self)
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(STOP_TIMEOUT_S)
            if thread.is_alive():
                self._abandoned = True
                self.warnings.append(
                    f"{self._busy_with or 'a source'}: did not answer within {STOP_TIMEOUT_S:g} s at the end "
                    "(a hung driver?): its last samples are missing"
                )
                return
        for source in self._sources:
            self.warnings.extend(source.warnings)
        self._sources = []

    def finish(self) -> list[str]:
        """Stop sampling and record the sampler's own cost (``meta["sampler"]``); the warnings of its run."""
        self.stop()
        self.timeline.meta["sampler"] = {"ticks": self.ticks, "busy_s": self.busy_s}
        return self.warnings

    def _hold_for_fork(self) -> None:
        """Before ``fork``: wait for the tick in progress and keep the next one from starting."""
        self._held_for_fork = self._tick_lock.acquire(timeout=FORK_WAIT_S)

    def _release_after_fork(self) -> None:
        """After ``fork``, in the parent and in the child: ticks may run again."""
        if self._held_for_fork:
            self._held_for_fork = False
            self._tick_lock.release()

    def poll_once(self) -> None:
        begin = self._timer.now()
        now = self._clock()
        for source in list(self._sources):
            self._busy_with = source.name
            try:
                source.poll(now, self.timeline)
            except Exception as e:
                failures = self._failures[source.name] = self._failures.get(source.name, 0) + 1
                if failures >= MAX_FAILURES:
                    self._sources.remove(source)
                    self.warnings.append(
                        f"{source.name}: disabled mid-run after {failures} failed ticks in a row ({e!r})"
                    )
            else:
                self._failures[source.name] = 0
        self._busy_with = None
        self.ticks += 1
        self.busy_s += self._timer.now() - begin

    def _open(self) -> None:
        for source in self._candidates:
            self._busy_with = source.name
            try:
                source.open(self.timeline)
            except SourceUnavailable as e:
                self.warnings.append(f"{source.name}: {e}")
            except Exception as e:  # a broken source must never stop the training
                self.warnings.append(f"{source.name}: disabled, failed to start ({e!r})")
            else:
                self._sources.append(source)
        self._busy_with = None
        self.poll_once()

    def _close(self) -> None:
        self.poll_once()
        for source in self._sources:
            self._busy_with = source.name
            try:
                source.close(self.timeline)
            except Exception as e:
                self.warnings.append(f"{source.name}: failed to finish ({e!r})")
        self._busy_with = None

    def _run(self) -> None:
        try:
            with self._tick_lock:
                self._open()
        finally:
            self._opened.set()
        now = self._timer.now
        next_tick = now() + self.interval
        while not self._stop.wait(max(0.0, next_tick - now())):
            with self._tick_lock:
                self._tick()
            next_tick += self.interval
            late = now() - next_tick
            if late > self.interval:  # skip missed ticks instead of bursting
                next_tick += self.interval * (late // self.interval + 1)
        if not self._abandoned:
            with self._tick_lock:
                self._close()

    def _tick(self) -> None:
        self.poll_once()
        if self._on_tick is not None:
            try:
                self._on_tick()
            except Exception as e:
                self.warnings.append(f"sampler tick callback failed ({e!r}); callback removed")
                self._on_tick = None


_RUNNING: weakref.WeakSet[Sampler] = weakref.WeakSet()


def _before_fork() -> None:
    for sampler in list(_RUNNING):
        sampler._hold_for_fork()


def _after_fork() -> None:
    for sampler in list(_RUNNING):
        sampler._release_after_fork()


# A child forked while a sampler ticks (a DataLoader worker, os.fork) must not inherit a lock or a
# file buffer the sampler thread was half-way through: the fork waits for the tick to end.
os.register_at_fork(before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork)
