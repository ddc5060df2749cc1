"""Where the training thread is, sampled at each sampler tick: what fills ``other`` and ``data``.

The stage breakdown says how long the step spends outside any known stage
(``other``) or getting batches in the training process (``data``); a sample of the
training thread's stack, taken with the stage it is in (as pyinstrument and
Scalene sample), says which code that is. Each tick reads the thread's frame
(``sys._current_frames``) and counts the innermost frame of the user's own code,
not the libraries' (site-packages, the standard library, perfmagic): that is the
line the user can change or wrap in ``perfmagic.stage``.

Each tick also reads the thread's scheduler state (``/proc``, Linux: ``R`` on a CPU or queued
for one, ``S`` asleep, ``D`` in uninterruptible sleep, mostly disk I/O), counted by stage
(``meta[THREAD_STATES]``); inside ``data``, the sample ``loader.thread_disk`` is 1 where it was
in ``D``, else 0, so its mean over any window is the share of the loading that waited on storage.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
from collections import Counter
from collections.abc import Callable
from types import FrameType

from perfmagic.schema import LOADER_THREAD_DISK, STACK_SAMPLES, THREAD_STATES
from perfmagic.timeline import Timeline

_LIBRARY_DIRS = tuple(
    {
        os.path.normcase(resolve(p)) + os.sep
        for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
        | {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}  # perfmagic itself
        for resolve in (os.path.abspath, os.path.realpath)
    }
)
"""Where library code lives, as code objects name it and with links resolved (a venv's links)."""


class StackSource:
    """A sampler source that counts where the training thread is, by stage."""

    name = "stacks"

    def __init__(self, thread_id: int, current_stage: Callable[[], str | None]) -> None:
        self.warnings: list[str] = []
        self._thread_id = thread_id
        self._current_stage = current_stage
        self._counts: Counter[tuple[str, str]] = Counter()
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
        stage = self._current_stage() or "other"
        self._counts[(stage, self._where(frame))] += 1
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
        timeline.meta[STACK_SAMPLES] = [
            {"stage": stage, "where": where, "count": n}
            for (stage, where), n in self._counts.most_common(200)
        ]

    def _where(self, frame: FrameType) -> str:
        """The innermost frame of user code (else the innermost frame), as ``function (file:line)``."""
        return _describe(user_frame(frame) or frame)


_USER_FILE: dict[str, bool] = {}


def is_user_file(filename: str) -> bool:
    """Whether code in ``filename`` is the user's: not the standard library's, a package's or perfmagic's."""
    known = _USER_FILE.get(filename)
    if known is None:
        path = os.path.normcase(filename)
        known = _USER_FILE[filename] = not (path.startswith(_LIBRARY_DIRS) or filename.startswith("<frozen"))
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


def call_site(frame: FrameType | None) -> dict[str, str | int] | None:
    """The user's line at or above ``frame``: ``{"file", "line", "function"}`` (None: only library code)."""
    f = user_frame(frame)
    return {"file": f.f_code.co_filename, "line": f.f_lineno, "function": f.f_code.co_name} if f else None


def _describe(frame: FrameType) -> str:
    code = frame.f_code
    name = os.path.basename(code.co_filename) if not code.co_filename.startswith("<") else code.co_filename
    return f"{code.co_name} ({name}:{frame.f_lineno})"
