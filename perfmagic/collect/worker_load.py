"""DataLoader workers' own account of their time: building batches, apart from waiting for work.

From outside, a worker waiting for its next index and a worker sleeping in ``__getitem__``
look alike: both sleep in the kernel. So each worker times its own fetches. While the source
is open, torch's fetchers are patched; a worker forked from then on (the ``fork`` start
method, Linux's default before Python 3.14) runs the patched fetch and adds, per batch, its
wall, CPU and run-queue seconds to a row of an anonymous shared mapping, which the sampler
reads each tick. Workers started with ``spawn`` or ``forkserver``, or forked before the
window (``persistent_workers``), write nothing: the analysis then has no account of them.

Samples, each a rate over the tick (from the first tick a worker has written on):

- ``loader.busy_workers``: workers building a batch, on average (fetch seconds per second);
- ``loader.busy_cpu_cores`` and ``loader.busy_queued_cores``: of that, on a CPU, and runnable
  but waiting for one (Linux run delay; NaN where the kernel does not say);
- ``loader.batches_per_s``: batches the workers built.
"""

from __future__ import annotations

import math
import mmap
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from perfmagic.collect.patching import Patcher
from perfmagic.schema import LOADER_BATCHES, LOADER_BUSY, LOADER_BUSY_CPU, LOADER_BUSY_QUEUED
from perfmagic.timeline import Timeline

SLOTS = 1024
"""Rows of the mapping; a worker adds to row ``pid % SLOTS`` (rows only grow, so a row a later
worker reuses keeps its sums: two workers share one only if their PIDs are this far apart)."""

BATCHES, WALL, CPU, QUEUED = range(4)
METRICS = (LOADER_BATCHES, LOADER_BUSY, LOADER_BUSY_CPU, LOADER_BUSY_QUEUED)
"""The samples, in the order of the row's columns."""


class WorkerLoadSource:
    """A sampler source that patches torch's batch fetchers while it is open, and reads what the
    workers forked meanwhile counted."""

    name = "loader"

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self._patcher = Patcher()
        self._map: mmap.mmap | None = None
        self._rows: np.ndarray | None = None
        self._parent = os.getpid()
        self._last: tuple[float, np.ndarray] | None = None
        self._mine: _WorkerRow | None = None  # in a worker: its row and run-delay file

    def open(self, timeline: Timeline) -> None:
        fetch = sys.modules.get("torch.utils.data._utils.fetch")
        if fetch is None:  # torch was not imported by the hooks: no DataLoader to time
            return
        self._map = mmap.mmap(-1, SLOTS * 4 * 8)
        self._rows = np.frombuffer(self._map, dtype=np.float64).reshape(SLOTS, 4)
        self._parent = os.getpid()
        for cls in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher):
            self._patcher.set(cls, "fetch", self._timed(cls.fetch))

    def poll(self, now: float, timeline: Timeline) -> None:
        rows = self._rows
        if rows is None:
            return
        totals = rows.sum(axis=0)
        if not totals[BATCHES] and self._last is None:
            return  # no worker has built a batch yet: say nothing rather than zero
        last, self._last = self._last, (now, totals)
        if last is None or now <= last[0]:
            return
        rates = (totals - last[1]) / (now - last[0])
        for metric, rate in zip(METRICS, rates, strict=True):
            timeline.add_sample(metric, now, max(0.0, float(rate)) if math.isfinite(rate) else math.nan)

    def close(self, timeline: Timeline) -> None:
        self.warnings.extend(self._patcher.restore())
        self._rows = None  # the view goes before the mapping it points into
        if self._map is not None:
            self._map.close()
            self._map = None

    def _timed(self, fetch: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def timed_fetch(fetcher: Any, index: Any) -> Any:
            row = self._row()
            if row is None:  # the training process's own loading is the ``data`` stage
                return fetch(fetcher, index)
            began, cpu, queued = time.perf_counter(), time.thread_time(), row.queued()
            try:
                return fetch(fetcher, index)
            finally:
                row.add(time.perf_counter() - began, time.thread_time() - cpu, row.queued() - queued)

        return timed_fetch

    def _row(self) -> _WorkerRow | None:
        """This worker's row (claimed on its first fetch); None in the process that patched."""
        pid = os.getpid()
        mine = self._mine
        if mine is not None and mine.pid == pid:
            return mine
        if pid == self._parent or self._rows is None:
            return None
        self._mine = _WorkerRow(pid, self._rows[pid % SLOTS])
        return self._mine


class _WorkerRow:
    """One worker's row of the mapping, and its thread's run delay."""

    def __init__(self, pid: int, row: np.ndarray) -> None:
        self.pid, self._row = pid, row
        try:
            self._schedstat: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._schedstat = None

    def queued(self) -> float:
        """Seconds this thread has waited for a CPU so far (NaN where the kernel does not say)."""
        if self._schedstat is None:
            return math.nan
        try:
            return int(os.pread(self._schedstat, 128, 0).split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return math.nan

    def add(self, wall: float, cpu: float, queued: float) -> None:
        row = self._row
        row[BATCHES] += 1.0
        row[WALL] += wall
        row[CPU] += cpu
        row[QUEUED] += queued
