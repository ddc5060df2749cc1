"""Which training steps are recorded fully: every step of a short run, then windows of a few steps.

A fully recorded step has every stage hook installed (forward, backward, copies, fetches…); the
others pay only for the hooks that mark the step's end and the rare stages (checkpoints, syncs,
evaluation), a few Python calls. The analysis takes the steps' rhythm from all steps and the
stages' shares from the full ones (``analyze.steps``).

The schedule counts step ends and reads the session's clock (a test's fake one drives it): the
first :data:`FULL_STEPS` steps and :data:`FULL_SECONDS` seconds are recorded fully, so a short
profile is the same as with every hook on; after that, :data:`WINDOW` steps in every
:data:`PERIOD`. ``every_step`` (``perfmagic.profile(full=True)``, ``--full``) records all of them.
"""

from __future__ import annotations

import math

from perfmagic.clock import Clock

FULL_STEPS = 200
"""Steps recorded fully from the start: a profile shorter than this is recorded whole."""

FULL_SECONDS = 30.0
"""Seconds recorded fully from the start, however many steps they hold."""

WINDOW = 5
"""Steps recorded fully in each period once the start is over."""

PERIOD = 50
"""Steps in a period: the last :data:`WINDOW` of them are recorded fully."""

_LOOK_AGAIN = WINDOW
"""Steps between two looks at the clock while the first :data:`FULL_SECONDS` last."""


class RecordingSchedule:
    """Says, at a step end, whether the steps that follow are recorded fully and for how many."""

    def __init__(self, clock: Clock, *, every_step: bool = False) -> None:
        self.every_step = every_step
        self._now = clock.now
        self._began = clock.now()
        self._windows_from: int | None = None  # the step count at which windows began

    def plan(self, steps: int) -> tuple[bool, float]:
        """``(full, for_steps)`` once ``steps`` steps have ended: whether the next ones are recorded
        fully, and how many steps that holds for (the caller asks again after them)."""
        if self.every_step:
            return True, math.inf
        if self._windows_from is None:
            if steps < FULL_STEPS:
                return True, FULL_STEPS - steps
            if self._now() - self._began < FULL_SECONDS:
                return True, _LOOK_AGAIN
            self._windows_from = steps
        phase = (steps - self._windows_from) % PERIOD
        if phase < PERIOD - WINDOW:
            return False, PERIOD - WINDOW - phase
        return True, PERIOD - phase
