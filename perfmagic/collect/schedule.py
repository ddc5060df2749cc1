"""Which training steps are recorded fully: every step of a short run, then windows of a few steps.

A fully recorded step has every stage hook installed (forward, backward, copies, fetches…); the
others pay only for the hooks that mark the step's end and the rare stages (checkpoints, syncs,
evaluation), a few Python calls. The analysis takes the steps' rhythm from all steps and the
stages' shares from the full ones (``analyze.steps``).

The schedule counts step ends and reads the session's clock (a test's fake one drives it): the
first :data:`FULL_STEPS` steps and :data:`FULL_SECONDS` seconds are recorded fully, so a short
profile is the same as with every hook on; after that, :data:`WINDOW` steps in every :data:`PERIOD`,
or in a longer period where the start's steps were too short for that to cost under
:data:`OVERHEAD_TARGET` of them, by what the hooks cost in place (:func:`period_for`: a 2 ms step
and a 2.5 ms one get the longest, 503, a 3 ms one 179, one of 4.5 ms or more 53). ``every_step``
(``perfmagic.profile(full=True)``, ``--full``) records all of them.

Every period is a prime number of steps. A loop that does something every k steps (logs every 10,
loads a slow shard every 100) would otherwise, with a period sharing a factor with k, meet it at the
same place in every window: always in them, or never. A prime period shares no factor with any k it
does not divide, so the windows move through every place of such a cycle in turn.

The windows measure what they cost: each period's window, and the :data:`SETTLING_STEPS` steps after
it that pay for its hooks' removal, against the steps just before it (:class:`WindowCost`). Where the
hooks measurably add more than the estimate allowed for, the period grows until they cost under the
target again.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence

from perfmagic.clock import Clock
from perfmagic.schema import RECORDING
from perfmagic.timeline import Timeline

FULL_STEPS = 200
"""Steps recorded fully from the start: a profile shorter than this is recorded whole."""

FULL_SECONDS = 30.0
"""Seconds recorded fully from the start, however many steps they hold."""

WINDOW = 5
"""Steps recorded fully in each period once the start is over."""

PERIOD = 53
"""Steps in a period (the last :data:`WINDOW` of them are recorded fully), where that keeps the hooks
under :data:`OVERHEAD_TARGET` of a step; longer for shorter steps, up to :data:`LONGEST_PERIOD`. A prime,
as every period is."""

LONGEST_PERIOD = 503
"""The longest period, a prime: a window every few seconds even for steps of a millisecond or less."""

OVERHEAD_TARGET = 0.008
"""The share of the step the schedule lets the hooks cost, on average over a period, by its estimates: the
goal is 1%, and the step ends' cost, which no run measures of itself, moves with the machine (0.2 to
0.8% of ``overhead.py``'s step in five runs)."""

FULL_CALLS_PER_STEP = 43.0
"""Python calls the full stage hooks add to a plain step (DataLoader, forward, loss, backward, SGD):
``benchmarks/hot_path_calls.py``, the thread clock's periodic reads left out, the trampolines of
``collect.windowed_hooks`` (one a hooked call) in."""

BOUNDARY_CALLS_PER_STEP = 3.0
"""What a plain step pays outside the windows, in calls: its optimizer step's wrapper, which notes the
step's end, and its share of the ends written together (``collect.quick_ends``), 1.5 calls counted,
held at 3."""

STEP_END_COST_S = 20e-6
"""What a step outside the windows pays in place (its end noted, the ends written together, the thread
clock's reads), on ``overhead.py``'s 2 to 3 ms loop: +4.9 to +23.8 µs in five runs there, +10 to +23
in three of ``step_end.py`` (less what its control read over its spin); the middle of the eight 15, this
estimate their upper quartile: where the ends cost more, the windows come less often rather than the
total passing 1%. Its :data:`BOUNDARY_CALLS_PER_STEP` calls at 1.5 µs would say 4.5: the caches the
step's own work emptied make each call dearer in place."""

WINDOW_STEP_COST_S = 140e-6
"""What a step of a window adds in place, its share of the hooks' coming out included: +142 µs on
``overhead.py``'s loop (``window_positions.py``; 98 to 262 in other runs). The estimate until
the run has measured its own windows (:class:`WindowCost`)."""

FULL_STEP_COST_S = 90e-6
"""What a step adds in place where every step is recorded fully (no hooks come and go): +89 ± 6 µs in
``overhead.py``'s ``perfmagic`` mode. The estimate in the report of such a profile."""

SETTLING_STEPS = 3
"""Steps after a window that pay for its hooks' coming out, measured with it: the step they are taken out
in and two more. On ``overhead.py``'s loop (medians by position over about 300 periods) these steps
took +295, +87 and +19 µs while the hooks were class attributes, and still +160 to +210, +30 to +50
and +10 to +80 µs with the functions' code switched instead (``collect.windowed_hooks``), the
window's own five +40 to +200 (``benchmarks/window_positions.py``)."""

MEASURED_PERIODS = 8
"""Periods whose windows are measured before their cost may lengthen the period, and between two looks."""

_KEPT_PERIODS = 64
"""Periods whose measurements the schedule keeps: the cost of the recent hooks, not of the start's."""

_LOOK_AGAIN = WINDOW
"""Steps between two looks at the clock while the first :data:`FULL_SECONDS` last."""


class RecordingSchedule:
    """Says, at a step end, whether the steps that follow are recorded fully and for how many."""

    def __init__(self, clock: Clock, *, every_step: bool = False) -> None:
        self.every_step = every_step
        self._now = clock.now
        self._began = clock.now()
        self._windows_from: int | None = None  # the step count at which the current period length began
        self.period = PERIOD
        self.cost = WindowCost()

    def plan(self, steps: int) -> tuple[bool, float]:
        """``(full, for_steps)`` once ``steps`` steps have ended: whether the next ones are recorded
        fully, and how many steps that holds for (the caller asks again after them)."""
        if self.every_step:
            return True, math.inf
        now = self._now()
        if self._windows_from is None:
            if steps < FULL_STEPS:
                return True, FULL_STEPS - steps
            if now - self._began < FULL_SECONDS:
                return True, _LOOK_AGAIN
            self._windows_from = steps
            self.period = period_for((now - self._began) / steps)
        edge = self._edge((steps - self._windows_from) % self.period)
        if edge is None:  # asked between the edges: the hooks went in out of turn (an evaluation pass)
            self.cost.interrupted()
        else:
            self.cost.edge(edge, steps, now)
            if edge == "out":
                self._lengthen_if_costly(steps)
        period = self.period
        phase = (steps - self._windows_from) % period
        if phase < SETTLING_STEPS:  # the steps the hooks' removal slows: measured apart (``WindowCost``)
            return False, SETTLING_STEPS - phase
        compared_from = period - 2 * WINDOW - SETTLING_STEPS  # the steps the window is compared with
        if phase < compared_from:
            return False, compared_from - phase
        if phase < period - WINDOW:
            return False, period - WINDOW - phase
        return True, period - phase

    def _edge(self, phase: int) -> str | None:
        """The period's edge at ``phase``: ``out`` (its window ended), ``settled`` (the steps the removal
        slows ended), ``before`` (the steps compared with the next window begin), ``in`` (it begins)."""
        window_from = self.period - WINDOW
        edges = {0: "out", SETTLING_STEPS: "settled", window_from - WINDOW - SETTLING_STEPS: "before"}
        return "in" if phase == window_from else edges.get(phase)

    def _lengthen_if_costly(self, steps: int) -> None:
        """At a period's start: lengthen the period where its windows measurably cost the step more than
        :data:`OVERHEAD_TARGET` (the next one starts now), looking every :data:`MEASURED_PERIODS`."""
        cost = self.cost
        if not cost.periods or cost.periods % MEASURED_PERIODS or cost.looked_at == cost.periods:
            return
        cost.looked_at = cost.periods
        added, step_s = cost.lower_bound_s(), cost.outside_step_s()
        if added is None or step_s is None:
            return
        longer = period_for(step_s, added_s=added)
        if longer > self.period:
            self.period, self._windows_from = longer, steps


class WindowCost:
    """What recording a step fully adds to it, measured on the run itself, per period: the seconds of its
    window and of the :data:`SETTLING_STEPS` after it (which pay for taking the hooks out) over those of
    as many steps just before the window, per step of the window. Equal counts on both sides: a busy
    machine's slow steps fall into either as often, and the median over periods leaves them out, where a
    mean of every step outside would take them in while most windows miss them. ``edge`` is told each
    edge of a period (``RecordingSchedule._edge``) with the step count and the clock; a period
    interrupted is not counted."""

    def __init__(self) -> None:
        self._last: tuple[str, int, float] | None = None  # the last edge: kind, steps, time
        self._before_s: float | None = None  # the seconds of the steps compared with this window
        self._window_s: float | None = None  # this window's seconds
        self.added_s: deque[float] = deque(maxlen=_KEPT_PERIODS)  # per period measured, per window step
        self.outside_s: deque[float] = deque(maxlen=_KEPT_PERIODS)  # per period, the mean step outside
        self.periods = 0
        self.looked_at = 0  # ``periods`` when the schedule last looked

    def edge(self, kind: str, steps: int, now: float) -> None:
        last, self._last = self._last, (kind, steps, now)
        if last is None:
            return
        was, n, seconds = last[0], steps - last[1], now - last[2]
        if kind == "in":
            self._before_s = seconds if was == "before" and n == WINDOW + SETTLING_STEPS else None
            self._window_s = None
        elif kind == "out":
            measuring = was == "in" and n == WINDOW and self._before_s is not None
            self._window_s = seconds if measuring else None
        elif kind == "settled" and was == "out" and n == SETTLING_STEPS and self._window_s is not None:
            assert self._before_s is not None
            self.added_s.append((self._window_s + seconds - self._before_s) / WINDOW)
            self.outside_s.append(self._before_s / (WINDOW + SETTLING_STEPS))
            self.periods += 1
            self._before_s = self._window_s = None
        else:  # ``before``, or not as scheduled: start again
            self._before_s = self._window_s = None

    def interrupted(self) -> None:
        self._last = self._before_s = self._window_s = None

    def lower_bound_s(self) -> float | None:
        """The added seconds per fully recorded step, less two standard errors of their median (a noisy
        machine must not read as costly hooks); None under :data:`MEASURED_PERIODS` periods."""
        if len(self.added_s) < MEASURED_PERIODS:
            return None
        median, error = median_and_error(self.added_s)
        return median - 2.0 * error

    def outside_step_s(self) -> float | None:
        return median_and_error(self.outside_s)[0] if self.outside_s else None


def median_and_error(values: Sequence[float]) -> tuple[float, float]:
    """The median of ``values`` and its standard error from their median absolute deviation (robust
    to the odd period a checkpoint or a stall fell in)."""
    ranked = sorted(values)
    n = len(ranked)
    median = 0.5 * (ranked[(n - 1) // 2] + ranked[n // 2])
    deviations = sorted(abs(v - median) for v in ranked)
    mad = 0.5 * (deviations[(n - 1) // 2] + deviations[n // 2])
    return median, 1.2533 * 1.4826 * mad / math.sqrt(n)


def estimated_cost_s(window_share: float, window_step_s: float = WINDOW_STEP_COST_S) -> float:
    """What the hooks add to a step on average, by the estimates, where ``window_share`` of the steps are
    a window's: :data:`STEP_END_COST_S` on every step, ``window_step_s`` more on a window's (measured, or
    :data:`WINDOW_STEP_COST_S`)."""
    return STEP_END_COST_S + window_share * max(window_step_s, 0.0)


def period_for(step_s: float, added_s: float = WINDOW_STEP_COST_S) -> int:
    """The shortest prime period from :data:`PERIOD` whose windows keep the hooks' estimated cost
    (:func:`estimated_cost_s`) under :data:`OVERHEAD_TARGET` of a ``step_s`` step; :data:`LONGEST_PERIOD`
    where none up to it does (the steps' ends alone cost more). ``added_s``: what a step of a window adds
    to it (measured, or the estimate)."""
    room_s = OVERHEAD_TARGET * step_s - estimated_cost_s(0.0)  # what the windows may add a step
    if room_s <= 0:
        return LONGEST_PERIOD
    shortest = max(PERIOD, math.ceil(WINDOW * max(added_s, 0.0) / room_s))
    return next((n for n in range(shortest, LONGEST_PERIOD) if _is_prime(n)), LONGEST_PERIOD)


def period_after_start(step_s: float) -> int:
    """The period a long run of ``step_s`` steps gets: its first :data:`FULL_SECONDS`, recorded fully,
    measure its steps with what full recording adds to them (:data:`FULL_STEP_COST_S`)."""
    return period_for(step_s + FULL_STEP_COST_S)


def _is_prime(n: int) -> bool:
    return n > 1 and all(n % k for k in range(2, math.isqrt(n) + 1))


class HookWindows:
    """A schedule applied: ``switch`` installs (True) or removes (False) the stage hooks recorded in
    windows, at step ends, with a ``recording`` mark at each change. A switch that fails ends the
    windows with a warning: where removing failed, every step is recorded fully from then on."""

    def __init__(
        self,
        schedule: RecordingSchedule,
        switch: Callable[[bool], list[str]],
        timeline: Timeline,
        warnings: list[str],
    ) -> None:
        self.schedule, self.timeline, self.warnings = schedule, timeline, warnings
        self._switch: Callable[[bool], list[str]] | None = switch
        self.full = True  # the windowed hooks are in place

    def next(self, steps: int, t: float) -> float:
        """At the step end ``steps`` (timeline time ``t``): install or remove the hooks as the schedule
        says; the step ends until it is asked again."""
        if self._switch is None:
            return math.inf
        full, left = self.schedule.plan(steps)
        if full != self.full:
            self._set_full(full, t)
        return left if self._switch is not None else math.inf

    def record_fully(self, t: float) -> bool:
        """Install the hooks now, if they are out; whether they were."""
        if self.full or self._switch is None:
            return False
        self._set_full(True, t)
        return True

    def _set_full(self, full: bool, t: float) -> None:
        switch = self._switch
        assert switch is not None
        try:
            self.warnings += switch(full)
        except Exception as e:  # recording every step costs more, but the training goes on
            self._switch = None
            self.warnings.append(f"the stage hooks could not be {'installed' if full else 'removed'} ({e!r})")
            if full:
                return
            full = True
        self.full = full
        self.timeline.add_sample(RECORDING, t, 1.0 if full else 0.0)
