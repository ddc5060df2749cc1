"""The recorded thread's CPU, run-queue wait and GC seconds as series, read at step ends.

The analysis gives each step the difference of the series at its two ends. A full reading is two
system calls that cost a fast loop more in place than they seem to (cache and TLB refills), so steps
shorter than :data:`THREAD_CLOCK_EVERY_S` share one by time; the GC seconds, a counter in Python, are
written wherever a collection ran, at the step's start and end, so that a slow step that was a
collection says so.
"""

from __future__ import annotations

import math

from perfmagic.collect.threadclock import ThreadClock
from perfmagic.schema import THREAD_CPU, THREAD_GC, THREAD_WAIT
from perfmagic.timeline import Timeline

THREAD_CLOCK_EVERY_S = 0.01
"""Shortest time between two full readings: steps at least this long get them at both ends, shorter
ones share them by time between readings."""

Reading = tuple[float | None, float | None, float]
"""What a step end carries: CPU and run-queue wait seconds (None where not read), GC seconds."""

UNREAD: Reading = (None, None, 0.0)
"""A step end where nothing was due: no sample, yet a collection in the next step begins there."""


class ThreadClockSeries:
    """Writes ``clock``'s readings at step ends into ``timeline``'s ``thread.*`` series."""

    def __init__(self, clock: ThreadClock, timeline: Timeline) -> None:
        self.clock = clock
        self.due_at = -math.inf
        """Clock time from which a step end carries a reading: the next full one, or -inf while the
        seconds of a collection are not written (whoever sees one run sets it so)."""
        self.last_t = 0.0
        """Timeline time of the last step end written."""
        self._next_read = -math.inf  # clock time of the next full reading
        self._gc_written = 0.0
        # appended to at step ends: the columns' appends, not a method call
        self._add = {m: timeline.sample_appenders(m) for m in (THREAD_GC, THREAD_CPU, THREAD_WAIT)}

    def at_step_end(self, now: float) -> Reading:
        """What a step end at clock time ``now`` carries: a full reading where one is due, the GC
        seconds where a collection ran since the last ones written, else :data:`UNREAD`."""
        clock = self.clock
        reading = UNREAD
        if now >= self._next_read:
            self._next_read = now + THREAD_CLOCK_EVERY_S
            reading = (*clock.read(), clock.gc_s)
        elif clock.gc_s != self._gc_written:
            reading = (None, None, clock.gc_s)
        self._set_due()
        return reading

    def write(self, t: float, reading: Reading) -> None:
        """Write a step end's ``reading`` at timeline time ``t``."""
        on_cpu, waiting, gc_s = reading
        if reading is UNREAD:
            self.last_t = t
            return
        add_t, add_v = self._add[THREAD_GC]
        if gc_s != self._gc_written:
            # the collection ran within the step ending now: its seconds begin at the step's start, which
            # a reading between the two would otherwise spread them back past
            add_t(self.last_t)
            add_v(self._gc_written)
            add_t(t)
            add_v(gc_s)
            self._gc_written = gc_s
            self._set_due()
        elif on_cpu is not None:
            add_t(t)
            add_v(gc_s)
        if on_cpu is not None and waiting is not None:
            for metric, value in ((THREAD_CPU, on_cpu), (THREAD_WAIT, waiting)):
                add_t, add_v = self._add[metric]
                add_t(t)
                add_v(value)
        self.last_t = t

    def read_now(self, now: float, t: float) -> None:
        """A full reading now (clock time ``now``, timeline time ``t``), on the thread."""
        self._next_read = now + THREAD_CLOCK_EVERY_S
        self._set_due()
        self.write(t, (*self.clock.read(), self.clock.gc_s))

    def _set_due(self) -> None:
        self.due_at = self._next_read if self.clock.gc_s == self._gc_written else -math.inf
