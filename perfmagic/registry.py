"""Running sessions on this machine, for ``perfmagic exporter``: one small JSON status file each.

A session writes ``<pid>.json`` in the registry directory (``$PERFMAGIC_REGISTRY_DIR``, else
``perfmagic-<uid>/sessions`` in the temporary directory) about once a second from its sampler
thread, by an atomic rename, and removes it when it stops. A process that was killed leaves its
file behind: readers skip files whose process is gone.

Readers mark the directory as read (the ``reader`` file's time) each time they list it, and a
session writes only while it was read in the last :data:`READ_WITHIN_S`: a run that no exporter or
sidebar watches does not add up its stage totals every second, on the thread beside the user's loop.
A reader's first look can therefore miss a session by up to a second.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from perfmagic.schema import THREAD_SAMPLES
from perfmagic.timeline import Timeline

if TYPE_CHECKING:
    from perfmagic.analyze.running import RunningStages

Json = dict[str, Any]

REGISTRY_ENV = "PERFMAGIC_REGISTRY_DIR"
PUBLISH_EVERY_S = 1.0
RATE_WINDOW_S = 10.0
STALE_S = 30.0
"""A file not rewritten for this long is a process gone (its pid may have been reused since)."""
READ_WITHIN_S = 300.0
"""Sessions keep writing this long after the last read: longer than any scrape interval in use."""
READER_FILE = "reader"


def registry_dir() -> Path:
    where = os.environ.get(REGISTRY_ENV)
    if where:
        return Path(where)
    return Path(tempfile.gettempdir()) / f"perfmagic-{os.getuid()}" / "sessions"


class StatusFile:
    """The status file of this process's session: ``publish`` often (it writes at most once a
    :data:`PUBLISH_EVERY_S`), ``remove`` at the end. Failing to write never stops the session."""

    def __init__(self, identity: Json, directory: Path | None = None) -> None:
        self.path = (directory or registry_dir()) / f"{os.getpid()}.json"
        self.identity = identity
        self._written = -PUBLISH_EVERY_S
        self._counts: deque[tuple[float, float, float | None]] = deque()  # (time, steps, samples)
        self._totals: deque[tuple[float, dict[str, float]]] = deque()
        self.failed: str | None = None

    def due(self, now: float) -> bool:
        """Whether a ``publish`` at ``now`` may write: the readings between writes change nothing."""
        return self.failed is None and now - self._written >= PUBLISH_EVERY_S

    def publish(
        self,
        steps: int,
        stage: str | None,
        stage_seconds: Callable[[], dict[str, float]],
        now: float | None = None,
        samples: float | None = None,
    ) -> None:
        """Note the step count (and the samples the loop has taken, where counted); at most once a
        :data:`PUBLISH_EVERY_S`, write the status with the seconds per stage of the steps ended so
        far (``stage_seconds``, asked only then)."""
        now = time.monotonic() if now is None else now
        # Rates start at the loop's first step (a window reaching back into the start-up would read as
        # slow steps), steps and samples over the same readings: the samples per step come out whole.
        if steps:
            self._counts.append((now, steps, samples))
            while len(self._counts) > 2 and now - self._counts[0][0] > RATE_WINDOW_S:
                self._counts.popleft()
        if not self.due(now):
            return
        self._written = now
        if not _read_recently(self.path.parent):
            return
        totals = dict(stage_seconds())
        self._totals.append((now, totals))
        while len(self._totals) > 2 and now - self._totals[0][0] > RATE_WINDOW_S:
            self._totals.popleft()
        earlier = self._totals[0][1]
        recent = {k: v - earlier.get(k, 0.0) for k, v in totals.items()}
        status = {
            **self.identity,
            "updated": time.time(),
            "steps": steps,
            "steps_per_s": _rate([(t, n) for t, n, _ in self._counts]),
            # None for a loop whose samples are not counted (no DataLoader batch seen yet)
            "samples_per_s": _rate([(t, n) for t, _, n in self._counts if n is not None]),
            "stage": stage,
            "stage_seconds": totals,
            # where the last ten seconds' steps spent most of their time
            "bottleneck": max(recent, key=lambda k: recent[k])
            if any(v > 0 for v in recent.values())
            else None,
        }
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # argv is the user's business
            partial = self.path.with_suffix(".tmp")
            partial.write_text(json.dumps(status))
            partial.replace(self.path)  # a reader sees the old file or the new one, never half of one
        except OSError as e:
            self.failed = f"the status file for perfmagic exporter could not be written ({e})"

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()


def _read_recently(directory: Path) -> bool:
    try:
        return time.time() - (directory / READER_FILE).stat().st_mtime < READ_WITHIN_S
    except OSError:
        return False  # never read


def mark_read(directory: Path) -> None:
    """Note that a reader looked at the registry now: sessions write for :data:`READ_WITHIN_S`."""
    with contextlib.suppress(OSError):  # a registry the reader cannot write goes unmarked
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        (directory / READER_FILE).touch()


def _rate(counts: Sequence[tuple[float, float]]) -> float | None:
    """Per second from the first reading to the last; None before two readings apart in time."""
    if len(counts) < 2:
        return None
    (t0, c0), (t1, c1) = counts[0], counts[-1]
    return (c1 - c0) / (t1 - t0) if t1 > t0 else None


def running_sessions(directory: Path | None = None) -> list[Json]:
    """The status of every session whose process still runs, by pid."""
    import psutil

    directory = directory or registry_dir()
    mark_read(directory)
    found = []
    now = time.time()
    for path in sorted(directory.glob("*.json")):
        try:
            status = json.loads(path.read_text())
            pid, updated = int(status["pid"]), float(status["updated"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # gone between the listing and the read, or not a status file
        if now - updated < STALE_S and psutil.pid_exists(pid):
            found.append(status)
    return found


class SessionStatus:
    """A session's status file kept up to date from its sampler's ticks: the steps so far, the stage
    the training thread is in, and the seconds per stage of the steps ended so far."""

    def __init__(self, identity: Json, timeline: Timeline, stages: StageCount | None) -> None:
        self._file = StatusFile(identity)
        self._timeline, self._stages = timeline, stages
        self._totals: RunningStages | None = None  # the analysis is imported once a step has ended

    def tick(self) -> None:
        now = time.monotonic()
        if not self._file.due(now):  # ten ticks a second: the other nine cost one clock reading
            return
        stages = self._stages
        steps, stage = (stages.step_count, stages.current_stage) if stages is not None else (0, None)

        def stage_seconds() -> dict[str, float]:
            if not steps:  # nothing to add up: a process that trains nothing never loads the analysis
                return {}
            if self._totals is None:
                from perfmagic.analyze.running import RunningStages

                self._totals = RunningStages()
            self._totals.add_ended(self._timeline)
            return self._totals.totals

        _, taken = self._timeline.last(THREAD_SAMPLES)
        self._file.publish(steps, stage, stage_seconds, now, float(taken[-1]) if len(taken) else None)

    def remove(self) -> list[str]:
        """Take the file away; a warning if it could never be written."""
        self._file.remove()
        return [self._file.failed] if self._file.failed else []


class StageCount(Protocol):
    """What the status reads of the stage recorder."""

    @property
    def step_count(self) -> int: ...

    @property
    def current_stage(self) -> str | None: ...
