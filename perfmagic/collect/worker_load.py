"""DataLoader workers' own account of their time: building batches, apart from waiting for work.

From outside, a worker waiting for its next index and a worker sleeping in ``__getitem__``
look alike: both sleep in the kernel. So each worker times its own fetches. While the source
is open, torch's fetchers are patched; a worker forked from then on (the ``fork`` start
method, Linux's default before Python 3.14) runs the patched fetch and adds, per batch, its
wall, CPU and run-queue seconds to a row of an anonymous shared mapping, which the sampler
reads each tick. Workers started with ``spawn`` or ``forkserver``, or forked before the
window (``persistent_workers``), write nothing: the analysis then has no account of them.
The same workers sample their own stacks while they fetch (``collect.worker_stacks``); when the
window closes, a worker still running puts torch's fetchers back at its next fetch.

Samples, each a rate over the tick (from the first tick a worker has written on):

- ``loader.busy_workers``: workers building a batch, on average (fetch seconds per second);
- ``loader.busy_cpu_cores`` and ``loader.busy_queued_cores``: of that, on a CPU, and runnable
  but waiting for one (Linux run delay, and all the time off a CPU of a fetch that never went to
  sleep: ``threadclock.wait_off_cpu``; NaN where the kernel does not say);
- ``loader.batches_per_s``: batches the workers built.

Each worker also reads its own USS (``/proc/self/smaps_rollup``) as its first fetch begins and at most
every :data:`USS_EVERY_S` after a fetch, with the samples it has read since the first reading: a
forked worker that reads a dataset of Python objects copies the pages whose reference counts it
changes, so its unique memory grows with the samples it reads. ``meta["worker_memory"]`` lists each
worker's first and last reading (:class:`perfmagic.contract.memory.WorkerMemoryMeta`).
"""

from __future__ import annotations

import math
import mmap
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from perfmagic.collect.memory_readers import own_uss
from perfmagic.collect.threadclock import open_schedstat, run_delay, voluntary_switches, wait_off_cpu
from perfmagic.collect.tracebacks import drop_own_frame
from perfmagic.collect.worker_stacks import WorkerSampler, WorkerStacks
from perfmagic.contract.memory import WorkerMemoryMeta
from perfmagic.schema import (
    LOADER_BATCHES,
    LOADER_BUSY,
    LOADER_BUSY_CPU,
    LOADER_BUSY_QUEUED,
    WORKER_MEMORY,
    WORKER_STACKS,
)
from perfmagic.timeline import Timeline

if TYPE_CHECKING:
    import numpy as np

SLOTS = 1024
"""Rows of the mapping; a worker adds to row ``pid % SLOTS`` (rows only grow, so a row a later
worker reuses keeps its sums: two workers share one only if their PIDs are this far apart)."""

BATCHES, WALL, CPU, QUEUED, PID, USS_FIRST, USS_LAST, SAMPLES = range(8)
COLUMNS = 8
METRICS = (LOADER_BATCHES, LOADER_BUSY, LOADER_BUSY_CPU, LOADER_BUSY_QUEUED)
"""The samples, in the order of the row's first columns (the others: the worker's PID and its USS readings)."""

USS_EVERY_S = 0.5
"""How often a worker reads its own USS after a fetch (a ``smaps_rollup`` read: a millisecond or so)..."""
USS_COST = 0.02
"""...or less often: the reading's time grows with the pages the worker maps (its parent's, all of
them), and the readings may take at most this share of the worker's time."""


class WorkerLoadSource:
    """A sampler source that reads what the DataLoader workers forked while it is open counted."""

    name = "loader"

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self._map: mmap.mmap | None = None
        self._rows: np.ndarray | None = None
        self._fetchers: list[tuple[type, Callable[[Any, Any], Any]]] = []  # each class and its own fetch
        self._last: tuple[float, np.ndarray] | None = None
        self._stacks: WorkerStacks | None = None

    def open(self, timeline: Timeline) -> None:
        global _open_source
        self._map = mmap.mmap(-1, SLOTS * COLUMNS * 8)
        self._stacks = WorkerStacks()
        _open_source = self

    def _view(self) -> np.ndarray | None:
        """The mapping's rows, viewed once a worker can be timed (torch, which times them, imports numpy
        anyway; a process that never loads data never imports it)."""
        if self._rows is None and self._map is not None:
            import numpy as np

            self._rows = np.frombuffer(self._map, dtype=np.float64).reshape(SLOTS, COLUMNS)
        return self._rows

    def poll(self, now: float, timeline: Timeline) -> None:
        if not self._fetchers:
            return  # no worker was forked with timed fetchers: none has counted anything
        rows = self._view()
        if rows is None:
            return
        totals = rows[:, : len(METRICS)].sum(axis=0)
        if not totals[BATCHES] and self._last is None:
            return  # no worker has built a batch yet: say nothing rather than zero
        last, self._last = self._last, (now, totals)
        if last is None or now <= last[0]:
            return
        rates = (totals - last[1]) / (now - last[0])
        for metric, rate in zip(METRICS, rates, strict=True):
            timeline.add_sample(metric, now, max(0.0, float(rate)) if math.isfinite(rate) else math.nan)

    def close(self, timeline: Timeline) -> None:
        global _open_source
        if _open_source is self:
            _open_source = None
        if self._fetchers and (rows := self._view()) is not None:  # written to, maybe with no tick since
            timeline.meta[WORKER_MEMORY] = worker_memory(rows)
            del rows  # no view may outlive the mapping
        self._rows = None  # the view goes before the mapping it points into
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._stacks is not None:
            stacks, warnings = self._stacks.close()
            self._stacks = None
            self.warnings += warnings
            if stacks is not None:
                timeline.meta[WORKER_STACKS] = stacks

    def before_fork(self) -> None:
        """In the training process about to fork: torch's fetchers, the first time torch is there (under
        ``perfmagic run`` the window opens before the script imports torch), and the child's slot."""
        if not self._fetchers and (fetch := sys.modules.get("torch.utils.data._utils.fetch")) is not None:
            self._fetchers = [
                (cls, cls.fetch) for cls in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher)
            ]
        if self._stacks is not None:
            self._stacks.before_fork()

    def time_this_child(self) -> None:
        """In a child just forked: its fetchers time each batch into the child's row, and sample its stack.
        The training process itself is never patched: its own loading is the ``data`` stage."""
        rows = self._view() if self._fetchers else None
        if rows is None:
            return
        child = _Child(_WorkerRow(rows[os.getpid() % SLOTS]), self._fetchers)
        for cls, fetch in self._fetchers:  # the originals: a worker's own fork is timed once
            cls.fetch = _timed(fetch, child)  # type: ignore[attr-defined]
        if self._stacks is not None:
            child.stacks = self._stacks.sampler_for_child(frozenset(f.__code__ for _, f in self._fetchers))


def worker_memory(rows: np.ndarray) -> list[WorkerMemoryMeta]:
    """Each worker's first and last USS reading, from the rows it wrote them in."""
    return [
        {
            "pid": int(r[PID]),
            "first_uss_bytes": int(r[USS_FIRST]),
            "last_uss_bytes": int(r[USS_LAST]),
            "samples": int(r[SAMPLES]),
        }
        for r in rows
        if r[PID] and r[USS_FIRST] > 0
    ]


class _Child:
    """A worker's timing: its row, its stack sampler, and torch's fetchers to put back."""

    def __init__(self, row: _WorkerRow, fetchers: list[tuple[type, Callable[[Any, Any], Any]]]) -> None:
        self.row, self.fetchers = row, fetchers
        self.stacks: WorkerSampler | None = None

    def window_closed(self) -> bool:
        """Whether the window has closed (the profile ended): then the fetchers are put back."""
        if self.stacks is None or self.stacks.window_open():
            return False
        self.stacks.stop()
        for cls, fetch in self.fetchers:
            cls.fetch = fetch  # type: ignore[attr-defined]
        return True


def _timed(fetch: Callable[[Any, Any], Any], child: _Child) -> Callable[[Any, Any], Any]:
    row = child.row

    def timed_fetch(fetcher: Any, index: Any) -> Any:
        try:
            if child.window_closed():
                return fetch(fetcher, index)
            row.first_memory()  # before the stack sampler starts: its reading is no part of the fetch
            stacks = child.stacks
            if stacks is not None:
                stacks.begin()
            began, cpu, queued, slept = (
                time.perf_counter(),
                time.thread_time(),
                row.queued(),
                voluntary_switches(),
            )
            try:
                return fetch(fetcher, index)
            finally:  # the fetch's own time, without the sampler's writing it down
                wall, cpu = time.perf_counter() - began, time.thread_time() - cpu
                queued = wait_off_cpu(wall, cpu, row.queued() - queued, slept)
                if stacks is not None:
                    stacks.end()
                row.add(wall, cpu, queued)
                row.read_memory(len(index) if isinstance(index, list) else 1)
        except BaseException as e:
            drop_own_frame(e)
            raise

    return timed_fetch


_open_source: WorkerLoadSource | None = None
"""The source open in this process, if any: a child forked meanwhile times its fetches for it."""


def _before_fork() -> None:
    if _open_source is not None:
        _open_source.before_fork()


def _after_fork_in_child() -> None:
    if _open_source is not None:
        _open_source.time_this_child()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


class _WorkerRow:
    """One worker's row of the mapping, its thread's run delay and its USS readings."""

    def __init__(self, row: np.ndarray) -> None:
        self._row = row
        self._next_uss: float | None = None  # None: the first reading is still to come
        self._samples = 0
        self._schedstat = open_schedstat()

    def queued(self) -> float:
        """Seconds this thread has waited for a CPU so far (NaN where the kernel does not say)."""
        delay = None if self._schedstat is None else run_delay(self._schedstat)
        return math.nan if delay is None else delay

    def add(self, wall: float, cpu: float, queued: float) -> None:
        row = self._row
        row[BATCHES] += 1.0
        row[WALL] += wall
        row[CPU] += cpu
        row[QUEUED] += queued

    def first_memory(self) -> None:
        """The worker's USS as its first fetch begins: what it holds before reading any sample."""
        if self._next_uss is not None:
            return
        uss = self._uss()
        row = self._row
        row[PID] = os.getpid()  # a row another worker used before: its readings start over
        row[USS_FIRST] = row[USS_LAST] = float(uss or 0)
        row[SAMPLES] = 0.0

    def read_memory(self, samples: int) -> None:
        """After a fetch of ``samples``: the USS again, at most every ``USS_EVERY_S``."""
        self._samples += samples
        if self._next_uss is None or time.perf_counter() < self._next_uss or not self._row[USS_FIRST]:
            return
        uss = self._uss()
        if uss is not None:
            self._row[USS_LAST] = float(uss)
            self._row[SAMPLES] = float(self._samples)

    def _uss(self) -> int | None:
        """The worker's USS, the next reading set so that readings take at most ``USS_COST`` of its time."""
        began = time.perf_counter()
        uss = own_uss()
        now = time.perf_counter()
        self._next_uss = now + max(USS_EVERY_S, (now - began) / USS_COST)
        return uss
