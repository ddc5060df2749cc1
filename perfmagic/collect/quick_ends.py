"""Step ends the optimizer's wrapper only notes, for the recorder to write together.

Outside the recording windows a plain training step pays perfmagic for one thing: its end. Marked by
:meth:`~perfmagic.collect.recorder.StageRecorder.boundary`, that end runs some two hundred bytecodes
over a dozen objects which the step's own work has pushed out of the caches: 23 to 44 µs of a 2 ms
step in place (``benchmarks/step_end.py``), where appending a time to a list costs nothing measurable.
So where the recorder allows it (outside the windows, without a device clock or a call at each step
end), the wrapper of the one optimizer that ends the steps appends the end's time to :attr:`times`.
The recorder writes them, each at its own time (``StageRecorder.settle_quick_ends``):

- at a step end, when :attr:`limit` are noted, :data:`WRITTEN_WITHIN_S` has passed, or a collection
  ran (its step carries its GC seconds);
- before it writes anything else, and where a step end is dropped or released.

Where the thread clock's reading is due (every 10 ms, ``collect.thread_series``), the wrapper's step
end only takes it (:meth:`QuickEnds.only_read`) into :attr:`readings`, to be written with the ends:
in place, on a 1.7 ms step, the note costs about 6 µs, a reading 20 and a write of the ends 24
(``benchmarks/step_end.py``). The timeline is then the one ``boundary`` would have written; the last
end noted is held, as ``boundary(..., hold=True)`` holds it (a second optimizer stepping next
continues that step).
"""

from __future__ import annotations

import math

from perfmagic.collect.thread_series import Reading, ThreadClockSeries

HELD_AT_MOST = 64
"""Step ends noted at most before they are written."""

WRITTEN_WITHIN_S = 0.1
"""Seconds a step end noted waits at most to be written (with :data:`HELD_AT_MOST`: what live views of
the steps lag by, at most)."""


class QuickEnds:
    """Who may end steps by a note, and the ends noted."""

    __slots__ = ("due", "limit", "owner", "readings", "series", "thread_id", "times", "write_at")

    def __init__(self) -> None:
        self.owner: object | None = None
        """The optimizer whose steps end by a note, on thread :attr:`thread_id` (None: no one's)."""
        self.thread_id = 0
        self.times: list[float] = []
        """Clock times of the ends noted and not written yet (the list is never replaced)."""
        self.limit = 1
        """Write the ends at a step end once this many are noted (the windows' countdown among them)."""
        self.series: ThreadClockSeries | None = None
        """The recorded thread's clock series, whose readings are due at :attr:`due`."""
        self.readings: list[tuple[int, Reading]] = []
        """Thread clock readings taken at ends noted: (index in :attr:`times`, reading)."""
        self.write_at = -math.inf
        """Clock time from which a step end writes them."""
        self.due = -math.inf
        """Clock time from which a step end calls the recorder: the thread clock's next reading or
        :attr:`write_at` (-inf: a collection ran, and its step carries its GC seconds)."""

    def forget(self) -> None:
        """Drop the ends noted and their readings (a forked child's copy: they are its parent's)."""
        self.times.clear()
        self.readings.clear()

    def only_read(self, now: float) -> bool:
        """At a step end noted at clock time ``now`` that found :attr:`due` passed or :attr:`limit` reached:
        take the thread clock's reading due, to be written with the ends, and say True; False where the
        ends must be written now (their limit or time, a collection's seconds: the caller writes them)."""
        times, series = self.times, self.series
        if series is None or series.due_at == -math.inf or now >= self.write_at or len(times) >= self.limit:
            return False
        self.readings.append((len(times) - 1, series.at_step_end(now)))
        self.due = min(series.due_at, self.write_at)
        return True
