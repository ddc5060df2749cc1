"""The DataLoader workers' own stacks, sampled while they build batches: the code the loading costs.

With workers, the training thread waits in the loop's ``for`` line while the workers run the
dataset's code. So each worker forked while the window is open samples itself: a daemon thread in
the worker reads the worker's stack every ``SAMPLE_S`` while a fetch runs (``collect.worker_load``
brackets each fetch) and counts the innermost line of user code inside the fetch, else the
innermost line (a library's: torch's collate, an image decoder). At the end of a fetch the worker
names its lines (``perfmagic.places``: a fork of a kernel has the kernel's cell numbers) and writes
them as JSON into its slot of an anonymous shared mapping, which the training process reads when
the window closes. The training process samples nothing here and is never patched.

Slots go to forks in the order the training process makes them; a fork past the last slot takes
the first over, counts included (its first owner has long ended). A slot is written under a sequence
number, odd while it is written, so a read never takes half a write. Workers started before the
window (``persistent_workers``), spawned, or forked by a worker write nothing. When the window
closes, a flag in the mapping tells workers still running to stop sampling at their next fetch.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import sys
import threading
import time
from collections import Counter
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

from perfmagic.collect.stacks import Line, is_user_file, line_place

if TYPE_CHECKING:
    from perfmagic.contract import CodePlace, PlaceCount, WorkerStacksMeta

SAMPLE_S = 0.01
"""A worker's sampling period while it fetches (py-spy's 100 Hz): about 20 us of its time per sample."""
IDLE_S = 0.5
"""A worker idle this long stops its timer until its next fetch (its first sample is then a period in)."""
SLOTS = 128
SLOT_BYTES = 16384
"""Each slot: sequence number (8 bytes), length (4), JSON; a slot holds about a hundred lines."""
HEADER = 64
"""The mapping starts with the window's state: ``OPEN`` or ``CLOSED``."""
OPEN, CLOSED = 1, 2
PLACES = 200
"""Lines kept in the timeline: the most sampled."""
_READ_TRIES = 10_000
"""Reads of a slot its worker is writing (a write takes microseconds) before giving up on it."""


class WorkerStacks:
    """The shared slots, on the training process's side: made when the window opens, read when it closes."""

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, HEADER + SLOTS * SLOT_BYTES)
        self._map[0] = OPEN
        self._owner = os.getpid()
        self._forks = 0

    def before_fork(self) -> None:
        """In the process about to fork: the child takes the next slot."""
        if os.getpid() == self._owner:
            self._forks += 1

    def sampler_for_child(self, fetches: frozenset[CodeType]) -> WorkerSampler | None:
        """In a child just forked: its sampler, which counts only frames inside torch's ``fetches``
        (outside them are perfmagic's timing, and the training process's stack as it was at the
        fork). None in a fork of a fork."""
        if os.getppid() != self._owner or not self._forks:
            return None
        return WorkerSampler(self._map, (self._forks - 1) % SLOTS, fetches)

    def close(self) -> tuple[WorkerStacksMeta | None, list[str]]:
        """Tell running workers the window closed; what the slots hold, and warnings."""
        self._map[0] = CLOSED
        workers, samples, unread = 0, 0, 0
        places: Counter[str] = Counter()
        named: dict[str, CodePlace] = {}
        for slot in range(min(self._forks, SLOTS)):
            held = read_slot(self._map, slot)
            if held is None:
                unread += 1
                continue
            workers += int(held.get("workers", 0))
            samples += int(held.get("samples", 0))
            for row in held.get("places", []):
                place = named.setdefault(row["where"], _place(row))
                places[place["where"]] += int(row["count"])
        self._map.close()
        warnings = (
            [f"the stack samples of {unread} DataLoader worker(s) could not be read (ended while writing)"]
            if unread
            else []
        )
        if not workers:
            return None, warnings
        rows: list[PlaceCount] = [{**named[w], "count": n} for w, n in places.most_common(PLACES)]
        return {"workers": workers, "samples": samples, "places": rows}, warnings


class WorkerSampler:
    """In one worker: samples its stack while it fetches, and writes the counts into its slot."""

    def __init__(self, mapping: mmap.mmap, slot: int, fetches: frozenset[CodeType]) -> None:
        self._map, self._offset, self._fetches = mapping, HEADER + slot * SLOT_BYTES, fetches
        self._slot = slot
        self._counts: dict[Line, int] = {}
        self._samples = self._written = 0
        self._names: dict[Line, CodePlace] = {}
        self._before: dict[str, Any] | None = None  # what the slot held before: an earlier fork's
        self._fetching = threading.Event()
        self._stopped = False
        self._ident: int | None = None
        self._thread: threading.Thread | None = None

    def window_open(self) -> bool:
        """Whether the profile still runs (a worker's own copy of the mapping outlives the training
        process's; in one process, the closed mapping says it)."""
        try:
            return self._map[0] == OPEN
        except ValueError:  # the mapping was closed
            return False

    def begin(self) -> None:
        """A fetch starts (on the worker's thread that fetches)."""
        if self._thread is None:
            self._ident = threading.get_ident()
            self._thread = threading.Thread(target=self._run, name="perfmagic-worker-stacks", daemon=True)
            try:
                self._thread.start()
            except RuntimeError:  # no thread to be had: the worker loads on, unsampled
                self._stopped = True
        self._fetching.set()

    def end(self) -> None:
        """The fetch ended: what was sampled so far goes into the slot."""
        self._fetching.clear()
        if self._samples != self._written and not self._stopped:
            try:
                self._write()
            except (OSError, ValueError, TypeError):  # the loading must go on: sample no more
                self.stop()

    def stop(self) -> None:
        """The window closed: the sampling thread ends."""
        self._stopped = True
        self._fetching.set()

    def _run(self) -> None:
        idle = 0.0
        while not self._stopped:
            if idle >= IDLE_S:
                self._fetching.wait()
                idle = 0.0
            time.sleep(SAMPLE_S)  # a free-running timer: its ticks fall anywhere in the fetches
            if self._fetching.is_set() and not self._stopped:
                idle = 0.0
                self.count(sys._current_frames().get(self._ident or 0))
            else:
                idle += SAMPLE_S

    def count(self, frame: FrameType | None) -> None:
        """One sample of the worker's stack, ``frame`` its innermost frame."""
        line = self._line(frame)
        if line is not None:
            self._counts[line] = self._counts.get(line, 0) + 1
            self._samples += 1

    def _line(self, frame: FrameType | None) -> Line | None:
        """The innermost line of user code inside the fetch, else the innermost line; None when the
        fetch is no longer on the stack (it ended between the check and the read)."""
        innermost, user = frame, None
        while frame is not None:
            code = frame.f_code
            if code in self._fetches:
                found = user or innermost
                return (found.f_code, found.f_lineno) if found is not None else None
            if user is None and is_user_file(code.co_filename):
                user = frame
            frame = frame.f_back
        return None

    def _write(self) -> None:
        counts, samples = self._counts.copy(), self._samples  # the sampling thread adds meanwhile
        if self._before is None:  # the first write: the slot's former owner's counts are kept
            self._before = read_slot(self._map, self._slot) or {}
        before = self._before
        places: Counter[str] = Counter()
        named: dict[str, CodePlace] = {}
        for row in before.get("places", []):
            named.setdefault(row["where"], _place(row))
            places[row["where"]] += int(row["count"])
        for line, n in counts.items():
            place = self._names.get(line) or self._names.setdefault(line, line_place(line))
            named.setdefault(place["where"], place)
            places[place["where"]] += n
        rows: list[dict[str, Any]] = [{**named[w], "count": n} for w, n in places.most_common()]
        total = {
            "workers": int(before.get("workers", 0)) + 1,
            "samples": int(before.get("samples", 0)) + samples,
        }
        data = json.dumps({**total, "places": rows}, separators=(",", ":")).encode()
        while len(data) > SLOT_BYTES - 12 and rows:  # the least sampled lines go; the total stays
            rows = rows[: len(rows) * 3 // 4]
            data = json.dumps({**total, "places": rows}, separators=(",", ":")).encode()
        write_slot(self._map, self._offset, data)
        self._written = samples


def write_slot(mapping: mmap.mmap, offset: int, data: bytes) -> None:
    """Write ``data`` at ``offset`` under its sequence number: odd while it is written."""
    (seq,) = struct.unpack_from("<Q", mapping, offset)
    struct.pack_into("<Q", mapping, offset, seq + 1)
    struct.pack_into("<I", mapping, offset + 8, len(data))
    mapping[offset + 12 : offset + 12 + len(data)] = data
    struct.pack_into("<Q", mapping, offset, seq + 2)


def read_slot(mapping: mmap.mmap, slot: int) -> dict[str, Any] | None:
    """What slot ``slot`` holds ({} if it was never written); None: it stayed mid-write, or is garbled."""
    offset = HEADER + slot * SLOT_BYTES
    for _ in range(_READ_TRIES):
        (seq,) = struct.unpack_from("<Q", mapping, offset)
        if not seq:
            return {}
        if seq % 2:
            continue
        (length,) = struct.unpack_from("<I", mapping, offset + 8)
        data = mapping[offset + 12 : offset + 12 + min(length, SLOT_BYTES - 12)]
        if struct.unpack_from("<Q", mapping, offset)[0] == seq:
            try:
                held = json.loads(data)
            except ValueError:
                return None
            return held if isinstance(held, dict) else None
    return None


def _place(row: dict[str, Any]) -> CodePlace:
    """A slot's row as a place (its count left out)."""
    return {
        "function": str(row["function"]),
        "file": str(row["file"]),
        "line": int(row["line"]),
        "cell": int(row["cell"]) if row.get("cell") is not None else None,
        "where": str(row["where"]),
    }
