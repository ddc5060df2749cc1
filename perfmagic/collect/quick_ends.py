"""Step ends the optimizer's wrapper only notes, for the recorder to write together.

Outside the recording windows a plain training step pays perfmagic for one thing: its end. Marked by
:meth:`~perfmagic.collect.recorder.StageRecorder.boundary`, that end runs some two hundred bytecodes
over a dozen objects which the step's own work has pushed out of the caches: 25 to 44 µs of a 2 ms
step in place (``benchmarks/step_end.py``), where appending a time to a list costs nothing measurable.
So where the recorder allows it (outside the windows, without a device clock or a call at each step
end), the wrapper of the one optimizer that ends the steps appends the end's time to :attr:`times`.
The recorder writes them, each at its own time (``StageRecorder.settle_quick_ends``):

- at a step end, when :attr:`limit` are noted or the thread clock is due (:attr:`due`);
- before it writes anything else, and where a step end is dropped or released.

The timeline is then the one ``boundary`` would have written; the last end noted is held, as
``boundary(..., hold=True)`` holds it (a second optimizer stepping next continues that step).
"""

from __future__ import annotations

import math

HELD_AT_MOST = 64
"""Step ends noted at most before they are written: what live views of the steps lag by, at most."""


class QuickEnds:
    """Who may end steps by a note, and the ends noted."""

    __slots__ = ("due", "limit", "owner", "thread_id", "times")

    def __init__(self) -> None:
        self.owner: object | None = None
        """The optimizer whose steps end by a note, on thread :attr:`thread_id` (None: no one's)."""
        self.thread_id = 0
        self.times: list[float] = []
        """Clock times of the ends noted and not written yet (the list is never replaced)."""
        self.limit = 1
        """Write the ends at a step end once this many are noted (the windows' countdown among them)."""
        self.due = -math.inf
        """Write them at a step end from this clock time: the thread clock's next reading (-inf: a
        collection ran, and its step carries its GC seconds)."""
