"""Where the training thread is, sampled at each sampler tick: what fills ``other`` and ``data``.

The stage breakdown says how long the step spends outside any known stage
(``other``) or getting batches in the training process (``data``); a sample of the
training thread's stack, taken with the stage it is in (as pyinstrument and
Scalene sample), says which code that is. Each tick reads the thread's frame
(``sys._current_frames``) and counts the innermost frame of the user's own code,
not the libraries' (site-packages, the standard library, perfmagic): that is the
line the user can change or wrap in ``perfmagic.stage``. The lines are named when the
source closes, in this process (``perfmagic.places``: a notebook cell as ``In [2], line 29``).

Each tick also reads the thread's scheduler state (``/proc``, Linux: ``R`` on a CPU or queued
for one, ``S`` asleep, ``D`` in uninterruptible sleep, mostly disk I/O), counted by stage
(``meta[THREAD_STATES]``); inside ``data``, the sample ``loader.thread_disk`` is 1 where it was
in ``D``, else 0, so its mean over any window is the share of the loading that waited on storage.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import Counter
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Protocol

from perfmagic.contract.marks import CallSite
from perfmagic.places import LIBRARY_DIRS, STAND_IN_FILES, code_place
from perfmagic.schema import BEFORE_FIRST_STEP, LOADER_THREAD_DISK, STACK_SAMPLES, THREAD_STATES
from perfmagic.timeline import Timeline

if TYPE_CHECKING:
    from perfmagic.contract import CodePlace, StackSample

Line = tuple[CodeType, int]
"""A line of code as sampled: its code object and line number, named only when the samples are read."""


class StageCursor(Protocol):
    """Where the training thread is: the recorder's view of it."""

    thread_id: int

    @property
    def current_stage(self) -> str | None: ...

    @property
    def boundary_counts(self) -> dict[str, int]: ...


class StackSource:
    """A sampler source that counts where the training thread is, by stage."""

    name = "stacks"

    def __init__(self, recorder: StageCursor) -> None:
        self.warnings: list[str] = []
        self._thread_id = recorder.thread_id
        self._recorder = recorder
        self._counts: Counter[tuple[str, Line]] = Counter()
        self._stat: int | None = None  # the thread's /proc stat file
        self._states: Counter[tuple[str, str]] = Counter()

    def open(self, timeline: Timeline) -> None:
        native = next((t.native_id for t in threading.enumerate() if t.ident == self._thread_id), None)
        try:
            self._stat = os.open(f"/proc/self/task/{native}/stat", os.O_RDONLY) if native else None
        except OSError:
            self._stat = None

    def poll(self, now: float, timeline: Timeline) -> None:
        frame = sys._current_frames().get(self._thread_id)
        if frame is None:
            return
        recorder = self._recorder
        stage = recorder.current_stage or ("other" if recorder.boundary_counts else BEFORE_FIRST_STEP)
        self._counts[(stage, sampled_line(frame))] += 1
        if self._stat is None:
            return
        try:
            data = os.pread(self._stat, 512, 0)
        except OSError:  # the thread is gone
            return
        state = data[data.rindex(b")") + 2 :][:1].decode()
        self._states[(stage, state)] += 1
        if stage == "data":
            timeline.add_sample(LOADER_THREAD_DISK, now, float(state == "D"))

    def close(self, timeline: Timeline) -> None:
        if self._stat is not None:
            os.close(self._stat)
            self._stat = None
        if self._states:
            timeline.meta[THREAD_STATES] = [
                {"stage": stage, "state": state, "count": n} for (stage, state), n in self._states.items()
            ]
        named: Counter[tuple[str, str]] = Counter()
        places: dict[str, CodePlace] = {}
        for (stage, line), n in self._counts.items():  # two code objects may be one line of one cell
            place = line_place(line)
            place = places.setdefault(place["where"], place)
            named[(stage, place["where"])] += n
        rows: list[StackSample] = [
            {"stage": stage, "count": n, **places[where]} for (stage, where), n in named.most_common(200)
        ]
        timeline.meta[STACK_SAMPLES] = rows


def sampled_line(frame: FrameType) -> Line:
    """The innermost line of user code at or above ``frame`` (else ``frame``'s own line)."""
    f = user_frame(frame) or frame
    return f.f_code, f.f_lineno


def line_place(line: Line) -> CodePlace:
    """A sampled line, named as its user knows it (in the process where it ran)."""
    code, lineno = line
    return code_place(code.co_filename, lineno, code.co_name)


_USER_FILE: dict[str, bool] = {}


def is_user_file(filename: str) -> bool:
    """Whether code in ``filename`` is the user's: not the standard library's, a package's or perfmagic's
    (but for the demo's, which stands for the user's: ``places.STAND_IN_FILES``)."""
    known = _USER_FILE.get(filename)
    if known is None:
        path = os.path.normcase(filename)
        library = path.startswith(LIBRARY_DIRS) or filename.startswith("<frozen")
        known = _USER_FILE[filename] = not library or path in STAND_IN_FILES
    return known


def user_frame(frame: FrameType | None) -> FrameType | None:
    """The innermost frame of the user's code at or above ``frame`` (None: there is none)."""
    while frame is not None:
        filename = frame.f_code.co_filename
        known = _USER_FILE.get(filename)  # inline: the torch hooks call this once per model
        if known if known is not None else is_user_file(filename):
            return frame
        frame = frame.f_back
    return None


def call_site(frame: FrameType | None) -> CallSite | None:
    """The user's line at or above ``frame``: ``{"file", "line", "function"}`` as compiled (to read its
    source), and ``place``, as its user knows it (None: only library code)."""
    f = user_frame(frame)
    if f is None:
        return None
    code = f.f_code
    return {
        "file": code.co_filename,
        "line": f.f_lineno,
        "function": code.co_name,
        "place": code_place(code.co_filename, f.f_lineno, code.co_name),
    }
