"""Stage recording: the hot path that framework hooks and ``perfmagic.stage`` call.

A recorder keeps a stack of open stages for the profiled thread and writes each one to the timeline
as a span with its nesting depth when it closes. The analysis later gives each instant of a step to
the innermost open stage.

Rules that keep the picture right without the user's help:

- a stage is recorded only where :func:`perfmagic.schema.nests_inside` allows it: not inside itself,
  and nothing built in inside ``data``, ``checkpoint`` or ``comm``. ``enter`` runs for every stage of
  every step, so it applies that rule with stage ids and an open-opaque-stage counter instead of names
  (``tests/unit/test_nesting.py`` checks that the two agree);
- only the thread that started profiling is recorded (DataLoader's pin-memory thread and a live
  panel's thread are not training stages);
- once closed, a recorder records nothing: a wrapper that outlives the session (a ``torch.save`` a
  library bound while profiling, a ``sys.stdout`` proxy a ``redirect_stdout`` put back after the
  block) just calls through.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from perfmagic.clock import REAL_CLOCK, Clock
from perfmagic.collect.device_times import DeviceClock, DeviceSpans
from perfmagic.collect.forked_child import keep_until_exit
from perfmagic.collect.nvtx_ranges import NVTX as _NVTX
from perfmagic.collect.nvtx_ranges import nvtx_pop as _nvtx_pop
from perfmagic.collect.nvtx_ranges import nvtx_push as _nvtx_push
from perfmagic.collect.quick_ends import HELD_AT_MOST, WRITTEN_WITHIN_S, QuickEnds
from perfmagic.collect.schedule import HookWindows, RecordingSchedule
from perfmagic.collect.stage_wrapper import recorded_as_stage
from perfmagic.collect.thread_series import UNREAD, Reading, ThreadClockSeries
from perfmagic.collect.threadclock import ThreadClock
from perfmagic.schema import OPAQUE_STAGES, STAGES, STEP_BOUNDARY_PREFIX
from perfmagic.step_policy import ENDS_BATCH_STEPS, ENDS_RHYTHM, EVIDENCE, STEP_ENDS, delimiting_kind
from perfmagic.timeline import Timeline

MAX_DEPTH = 127
"""Open stages beyond this depth are not recorded (a span's depth is one signed byte)."""

_get_ident = threading.get_ident

_CLOSED = -1
"""The thread id of a closed recorder: no thread has it, so ``enter`` and ``boundary`` do nothing."""

_BACKLOG_CHECK_EVERY = 1024
"""Step boundaries between two looks at the spans held (``on_backlog``)."""


class StageRecorder:
    """Records stage spans of one thread into a timeline."""

    def __init__(
        self, timeline: Timeline, origin: float, thread_id: int | None = None, *, clock: Clock = REAL_CLOCK
    ) -> None:
        # ``clock.now`` read once: the real one is time.perf_counter itself, no Python call per read
        self.timeline, self.clock, self._now, self.origin = timeline, clock, clock.now, origin
        # a span per stage, several a step: the columns' appends, not a method call (see Timeline.span_appenders)
        self._add_name, self._add_start, self._add_end, self._add_depth = timeline.span_appenders()
        self.thread_id = threading.get_ident() if thread_id is None else thread_id
        self.quick = QuickEnds()  # step ends the optimizer's wrapper only notes (``collect.quick_ends``)
        self._quick_times = self.quick.times
        # per-step CPU and run-queue wait of the recorded thread: only readable on that thread
        self.thread_clock = ThreadClock(clock) if thread_id is None else None
        self._thread_series = ThreadClockSeries(self.thread_clock, timeline) if self.thread_clock else None
        if self.thread_clock is not None:  # a collection's step must carry its GC seconds
            self.thread_clock.after_collection = self._collected
        self.read_thread_clock_now()  # the first reading, which the first step's CPU is counted from
        self._device_clock: DeviceClock | None = None
        self._annotate: Callable[[str], Callable[[], object]] | None = None
        # a device clock, trace annotations or NVTX ranges: enter and exit do more than time the stage
        self._extras = _NVTX
        self.ids = {name: timeline.name_id(name) for name in STAGES}
        self._opaque_ids = frozenset(self.ids[n] for n in OPAQUE_STAGES)
        self._builtin_ids = frozenset(self.ids.values())
        # by stage id: its name (NVTX ranges need it on the hot path), how often it is open
        self._names = timeline.span_names
        self._active: list[int] = [0] * len(self._names)
        # open stages: (id, start, device event token, what ends its trace annotation)
        self._stack: list[tuple[int, float, object, Callable[[], object] | None]] = []
        # called on the recorded thread after each boundary that ends a training step (``--trace`` for
        # TensorFlow and JAX starts and stops their profiler there)
        self.on_step: Callable[[], object] | None = None
        # called on the recorded thread at a boundary where more than ``backlog_spans`` spans are held:
        # whoever spools and folds them (the session's sampler thread) has fallen behind
        self.on_backlog: Callable[[], object] | None = None
        self.backlog_spans, self._backlog_countdown, self._opaque_depth = 0, _BACKLOG_CHECK_EVERY, 0
        self._warnings: list[str] = []
        self._device_spans = DeviceSpans(timeline, self._now() - origin, self._warnings)
        self._boundaries: dict[str, int] = {}
        self._steps_end_elsewhere = False  # an optimizer or user boundary was written: batches end no step
        self.rhythm_wanted = True  # no stronger boundary yet: each backward pass ends a step (step_policy)
        self._written_kinds: dict[str, tuple[int, bool]] = {}  # per kind: boundary name id, in STEP_ENDS
        # a boundary held back (kind, time, device event token, thread clock reading): see ``boundary``
        self._held: tuple[str, float, object | None, Reading | None] | None = None
        # which steps are recorded fully (None: all), the hooks it switches at step ends (``record_in_windows``)
        self.schedule: RecordingSchedule | None = None
        self._windows: HookWindows | None = None
        self._step_ends = 0  # optimizer and user step ends marked: what the schedule counts
        self._window_left = math.inf  # step ends until the schedule is asked again

    def stage_id(self, name: str) -> int:
        sid = self.timeline.name_id(name)
        if sid >= len(self._active):
            self._names = self.timeline.span_names
            self._active.extend([0] * (len(self._names) - len(self._active)))
        return sid

    @property
    def device_clock(self) -> DeviceClock | None:
        """Where stage boundaries also take device event tokens (None: host times only)."""
        return self._device_clock

    @device_clock.setter
    def device_clock(self, clock: DeviceClock | None) -> None:
        self._device_clock = clock
        self.quick.owner = None  # step ends take device event tokens
        self._extras = _NVTX or clock is not None or self._annotate is not None

    @property
    def annotate(self) -> Callable[[str], Callable[[], object]] | None:
        """While torch.profiler records: opens a ``## stage ##`` range in its trace, returns what closes it."""
        return self._annotate

    @annotate.setter
    def annotate(self, annotate: Callable[[str], Callable[[], object]] | None) -> None:
        self._annotate = annotate
        self._extras = _NVTX or self._device_clock is not None or annotate is not None

    def enter(self, sid: int) -> bool:
        """Open a stage; False when it is not recorded (then don't call ``exit``). Runs several times a step:
        the plain case (no device clock, annotation or NVTX) is kept to a few bytecodes, because each costs
        a fast loop several times what a microbenchmark says."""
        stack = self._stack
        if (
            _get_ident() != self.thread_id
            or self._active[sid]
            or (self._opaque_depth and sid in self._builtin_ids)
            or len(stack) >= MAX_DEPTH
        ):
            return False
        self._active[sid] += 1
        if sid in self._opaque_ids:
            self._opaque_depth += 1
        if self._extras:
            self._enter_extras(sid)
        else:
            stack.append((sid, self._now(), None, None))
        return True

    def _enter_extras(self, sid: int) -> None:
        annotate = self._annotate
        token = self.device_event_token() if self._device_clock is not None else None
        note = annotate(self._names[sid]) if annotate is not None else None
        self._stack.append((sid, self._now(), token, note))
        if _NVTX:
            _nvtx_push(self._names[sid], domain="perfmagic")

    def exit(self) -> None:
        end = self._now()
        stack = self._stack
        if not stack:  # the session was stopped inside this stage: close() has ended it
            return
        sid, start, token, note = stack.pop()
        self._active[sid] -= 1
        if sid in self._opaque_ids:
            self._opaque_depth -= 1
        if self._extras:
            self._exit_extras(token, note)
        if self._quick_times:  # written first, as they happened
            self.settle_quick_ends()
        origin = self.origin
        self._add_name(sid)
        self._add_start(start - origin)
        self._add_end(end - origin)
        self._add_depth(len(stack))

    def _exit_extras(self, token: object, note: Callable[[], object] | None) -> None:
        if _NVTX:
            _nvtx_pop(domain="perfmagic")
        if note is not None:
            note()
        if token is not None and self._device_clock is not None:
            end_token = self.device_event_token()
            if end_token is not None:
                self._device_spans.pending.append((self.timeline.span_count, token, end_token))

    def record_within(
        self, sid: int, start: float, end: float, tokens: tuple[object | None, object | None] = (None, None)
    ) -> None:
        """A stage measured elsewhere (``clock.now`` times, e.g. by a thread that finished autograd's
        graph) recorded inside the innermost open stage, under the same nesting rules as ``enter``;
        ``tokens``: :meth:`device_event_token` results at its start and end, which give it device time."""
        timed_on_device = tokens[0] is not None and tokens[1] is not None
        if (
            threading.get_ident() != self.thread_id
            or self._active[sid]
            or (self._opaque_depth and sid in self._builtin_ids)
            or end < start
            or (end == start and not timed_on_device)
        ):
            return
        if self._quick_times:  # no call: DDP's buckets in the windows, where none are noted
            self.settle_quick_ends()
        if timed_on_device and self._device_clock is not None:
            self._device_spans.pending.append((self.timeline.span_count, tokens[0], tokens[1]))
        self.timeline.add_span(sid, start - self.origin, end - self.origin, len(self._stack))

    def boundary(self, kind: str, *, hold: bool = False) -> None:
        """Mark a step boundary (``kind``: one of ``step_policy.EVIDENCE`` or ``NOT_STEP_ENDS``). ``hold=True``
        keeps it back, with its time: the next boundary of any kind or :meth:`release_held` writes it,
        :meth:`drop_held` forgets it (two optimizers stepping in one iteration: only the last one's step
        ends the training step)."""
        if _get_ident() != self.thread_id:
            return
        if self._quick_times:
            self.settle_quick_ends()
        held = self._held
        if held is not None:  # release_held, without the call: this runs twice a step
            self._held = None
            self._write_boundary(*held)
        now = self._now()
        t = now - self.origin
        if kind in ENDS_BATCH_STEPS:  # a step end the windows count (the countdown: no call a step)
            self._step_ends += 1
            self._window_left -= 1
            if self._window_left <= 0 and (windows := self._windows) is not None:
                self._window_left = windows.next(self._step_ends, t)
                self.quick.owner = None  # the windows may begin: the optimizer's wrapper opens it again
        token = self.device_event_token() if self._device_clock is not None else None
        # once per step: at optimizer (or user) step ends, at batches only where nothing else ends steps
        series = self._thread_series
        clock_reading: Reading | None = None
        if series is not None and (kind != "batch" or not self._steps_end_elsewhere):
            clock_reading = series.at_step_end(now) if now >= series.due_at else UNREAD
        if hold:  # an optimizer step: the backward rhythm is not wanted (nor able to release it early)
            self._held = (kind, t, token, clock_reading)
            self.rhythm_wanted = self.rhythm_wanted and kind not in ENDS_RHYTHM
        else:
            self._write_boundary(kind, t, token, clock_reading)

    def record_in_windows(self, switch: Callable[[bool], list[str]]) -> None:
        """Let the schedule install (``switch(True)``) and remove (``switch(False)``) the stage hooks recorded
        in windows, at step ends; ``switch`` returns warnings. Without a schedule every step stays full."""
        if self.schedule is None or self.schedule.every_step:
            return
        self._windows = HookWindows(self.schedule, switch, self.timeline, self._warnings)
        self._window_left = 0  # asked at the next step end

    def record_fully_now(self) -> None:
        """Install the windowed hooks now, until the next step end (a DataLoader pass begins: an evaluation
        pass is seen whole)."""
        windows = self._windows
        if windows is None or _get_ident() != self.thread_id:
            return
        self.settle_quick_ends()
        self.quick.owner = None
        if windows.record_fully(self._now() - self.origin):
            self._window_left = 1

    @property
    def full(self) -> bool:
        """Whether the windowed stage hooks are in place (always, without windows)."""
        return self._windows is None or self._windows.full

    def boundary_at(self, kind: str, t: float) -> None:
        """A boundary at an earlier time ``t`` that no step ends at (an evaluation pass's start, known once
        the pass is over): no device event token, no thread clock reading."""
        if threading.get_ident() != self.thread_id:
            return
        self.release_held()
        self._boundaries[kind] = self._boundaries.get(kind, 0) + 1
        self.timeline.add_span(self.timeline.name_id(STEP_BOUNDARY_PREFIX + kind), t, t, -1)

    def release_held(self) -> None:
        """Write the boundary held back by ``boundary(..., hold=True)``, at the time it was marked."""
        self.settle_quick_ends()
        held, self._held = self._held, None
        if held is not None:
            self._write_boundary(*held)

    def drop_held(self) -> None:
        """Forget the boundary held back: the step it would have ended goes on."""
        if self._quick_times:  # no call: a full step drops one
            self.settle_quick_ends()
        self._held = None

    def settle_quick_ends(self, *, at_step_end: bool = False) -> None:
        """Write the step ends noted (``collect.quick_ends``) as ``boundary("optimizer", hold=True)`` would have,
        the last held; ``at_step_end``: it was noted just now, and carries a thread clock reading if due."""
        times, series = self._quick_times, self._thread_series
        if not times or series is None:  # noted only where the series is (``allow_quick_ends``)
            return
        *ends, last = [t - self.origin for t in times]
        now, n = times[-1], len(times)
        times.clear()
        if (held := self._held) is not None:  # released by the first one
            self._held = None
            self._write_boundary(*held)
        # readings taken at the last end written and the held one go with them, the others to the series alone:
        # none carries a collection's seconds, whose step end writes the ends at once (``_collected``)
        on_last = {len(ends) - 1: UNREAD, len(ends): UNREAD}
        for i, taken in self.quick.readings:
            if i in on_last:
                on_last[i] = taken
            else:
                series.write(ends[i], taken)
        self.quick.readings.clear()
        if ends:  # all but the last at once (the kind is written: by ``held`` at the latest)
            if more := ends[:-1]:
                self.timeline.add_instants(self._written_kinds["optimizer"][0], more)
                self._boundaries["optimizer"] += len(more)
                self._backlog_countdown -= len(more)
            self._write_boundary("optimizer", ends[-1], None, on_last[len(ends) - 1])  # the fold, the backlog
        self._step_ends += n  # the windows' countdown, as ``boundary`` counts them
        self._window_left -= n
        if self._window_left <= 0 and (windows := self._windows) is not None:
            self._window_left = windows.next(self._step_ends, last)
        reading = on_last[len(ends)]
        if at_step_end and reading is UNREAD:
            reading = series.at_step_end(now)
        self._held = ("optimizer", last, None, reading)
        self.allow_quick_ends(self.quick.owner)

    def allow_quick_ends(self, owner: object | None) -> None:
        """Let ``owner`` (an optimizer, None: none) end steps by a note (``collect.quick_ends``) where
        recording allows it: outside the windows, without a device clock or a call at each step end."""
        quick, windows, series = self.quick, self._windows, self._thread_series
        if windows is None or windows.full or series is None or self._device_clock is not None:
            owner = None
        quick.owner = owner if self.on_step is None and _get_ident() == self.thread_id else None
        quick.thread_id, quick.limit = self.thread_id, int(min(self._window_left, HELD_AT_MOST))
        quick.series, quick.write_at = series, self._now() + WRITTEN_WITHIN_S
        quick.due = min(series.due_at, quick.write_at) if series is not None else math.inf

    def _collected(self) -> None:
        if self._thread_series is not None:  # the step it ran in carries its GC seconds
            self.quick.due = self._thread_series.due_at = -math.inf

    def _write_boundary(
        self, kind: str, t: float, token: object | None, clock_reading: Reading | None
    ) -> None:
        written = self._written_kinds.get(kind)
        if written is None:  # once per kind (this runs every step): the step policy's flags only turn one way
            if kind in ENDS_RHYTHM:
                self.rhythm_wanted = False
                self._steps_end_elsewhere = self._steps_end_elsewhere or kind in ENDS_BATCH_STEPS
            self._boundaries.setdefault(kind, 0)  # ``boundary_at`` may have counted some
            sid = self.timeline.name_id(STEP_BOUNDARY_PREFIX + kind)
            written = self._written_kinds[kind] = (sid, kind in STEP_ENDS)
        sid, ends_step = written
        self._boundaries[kind] += 1
        if token is not None:
            self._device_spans.pending.append((self.timeline.span_count, token, token))
        self._add_name(sid)
        self._add_start(t)
        self._add_end(t)
        self._add_depth(-1)
        series = self._thread_series
        if clock_reading is UNREAD and series is not None:  # no call: most step ends
            series.last_t = t
        elif clock_reading is not None and series is not None:
            series.write(t, clock_reading)
        clock = self._device_clock
        if clock is not None:
            self._device_spans.drain_if_due(clock, t)
        self._backlog_countdown -= 1
        if self._backlog_countdown <= 0:
            self._backlog_countdown = _BACKLOG_CHECK_EVERY
            self._check_backlog()
        if self.timeline.pending_fold is not None:  # old steps folded into rows: cut here, between appends
            self.timeline.apply_fold()
        on_step = self.on_step
        if on_step is not None and (ends_step or (kind == "batch" and not self._steps_end_elsewhere)):
            on_step()

    def _check_backlog(self) -> None:
        on_backlog = self.on_backlog
        if on_backlog is None or self.timeline.raw_span_count() <= self.backlog_spans:
            return
        try:
            on_backlog()
        except Exception as e:  # memory grows, but the training goes on
            self.on_backlog = None
            self._warnings.append(f"held spans could not be spooled and folded ({e!r})")

    def device_event_token(self) -> object | None:
        """A device event token now, from any thread (for :meth:`record_within`); None without a device
        clock, or where it gives none (a CUDA graph capturing) or fails. A clock that fails is turned off
        with a warning: a CUDA error in a hook must not surface in the user's code, nor mask the user's own."""
        clock = self.device_clock
        if clock is None:
            return None
        try:
            return clock.event_token()
        except Exception as e:
            self.device_clock = None
            self._warnings.append(f"the device clock failed ({e!r}): stages timed on the host from then on")
            return None

    def read_thread_clock_now(self) -> None:
        """A full thread clock reading now (on the recorded thread): the steps since the last one get
        their CPU and wait from it. Called where recording ends."""
        if self._thread_series is None or threading.get_ident() != self.thread_id:
            return
        self.settle_quick_ends()
        now = self._now()
        self._thread_series.read_now(now, now - self.origin)

    @property
    def pending_device_spans(self) -> int:
        """Spans whose device times are not resolved yet."""
        return len(self._device_spans.pending)

    @property
    def settled_spans(self) -> int:
        """Spans before this logical index have their final times: none of them awaits device times."""
        # the count read first: a span counted here is listed as pending already
        return self._device_spans.settled(self.timeline.span_count)

    def on_recorded_thread(self) -> bool:
        """Whether the caller is the thread this recorder records (never, once closed)."""
        return threading.get_ident() == self.thread_id

    @property
    def active(self) -> list[int]:
        """How often each stage id is open on the recorded thread, by id: the list itself, for hooks
        that must skip a nested call at the cost of one read (read it, never write it)."""
        return self._active

    def is_open(self, sid: int) -> bool:
        """Whether stage ``sid`` is open (on the recorded thread)."""
        return bool(self._active[sid])

    @property
    def current_stage(self) -> str | None:
        """The innermost open stage (read by live views from another thread)."""
        try:
            return self._names[self._stack[-1][0]]
        except IndexError:
            return None

    @property
    def step_count(self) -> int:
        """Steps ended so far, by the boundaries that delimit them (``step_policy``)."""
        kind = delimiting_kind([k for k in EVIDENCE if self._boundaries.get(k)])
        return self._boundaries[kind] if kind is not None else 0

    @property
    def boundary_counts(self) -> dict[str, int]:
        """Step boundaries marked so far, per kind."""
        return dict(self._boundaries)

    def wrap(self, fn: Callable[..., Any], stage: str) -> Callable[..., Any]:
        """``fn`` recorded as ``stage`` whenever the recorder takes it."""
        return recorded_as_stage(fn, self.enter, self.exit, self.stage_id(stage))

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        recorded = self.enter(self.stage_id(name))
        try:
            yield
        finally:
            if recorded:
                self.exit()

    def stop_recording(self) -> None:
        """Record nothing more from now on (a forked child's copy of the recorder). The child keeps the
        parent's device event tokens and clock referenced until it exits: freeing a CUDA event in a forked
        child calls into a CUDA context it cannot use, and the C++ destructor that fails there aborts the
        process (a DataLoader worker "exited unexpectedly")."""
        self.thread_id = _CLOSED
        self.quick.forget()  # the device clock's setter closes the quick path
        keep_until_exit((self._stack, self._held, self._device_spans.pending, self.device_clock))
        self._stack, self._held, self._device_spans.pending, self.device_clock = [], None, [], None
        if self.thread_clock is not None:
            self.thread_clock.close()

    def close(self) -> list[str]:
        """Close stages left open (an interrupted block), stop recording, apply device times; returns warnings."""
        while self._stack:
            self.exit()
        self.release_held()
        self.read_thread_clock_now()
        self.thread_id = _CLOSED
        self.quick.owner = None
        if self.thread_clock is not None:
            self.thread_clock.close()
        clock = self.device_clock
        self._device_spans.close(clock)  # its warnings are the recorder's
        if clock is not None:
            clock.close()  # now: a child forked before the collector finds this recorder's cycles frees them
        warnings = self._warnings[:]
        self._warnings.clear()  # the list itself stays: the device spans write to it
        return warnings
