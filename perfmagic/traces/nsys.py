"""Read an Nsight Systems capture (its SQLite export) into the columns a Kineto trace gives.

So a capture becomes the same timeline, ``gpu`` section and advice as a torch.profiler trace:

- GPU events: ``CUPTI_ACTIVITY_KIND_KERNEL`` (named by their demangled name, NCCL's kernels
  communication as in Kineto), ``_MEMCPY`` named as Kineto names copies (``Memcpy HtoD
  (Pageable -> Device)``: direction and host memory from ``copyKind``, ``srcKind``,
  ``dstKind``) and ``_MEMSET`` (``Memset (Device)``); each linked to its launching runtime call
  by ``correlationId``;
- CPU events: the CUDA runtime calls (``CUPTI_ACTIVITY_KIND_RUNTIME``, their names without
  nsys's ``_v3020`` version suffix, so ``cudaStreamSynchronize`` counts as a sync) and the
  NVTX push/pop and start/end ranges. perfmagic's own ranges (NVTX domain ``perfmagic``, one
  per stage it records) become ``## stage ##`` annotations, which :mod:`perfmagic.traces.stages`
  reads as stages;
- steps: ``ProfilerStep#N`` ranges (``torch.autograd.profiler.emit_nvtx``); else, with
  ``step_range``, the NVTX ranges whose text the regular expression matches (a user's own
  iteration ranges, as DLProf's ``--iter_start``); else perfmagic's ``optimizer`` ranges, a
  step ending with each. Steps found either way are added as ``ProfilerStep#N`` events.

A capture of several processes gives one trace per process that ran GPU work (correlation ids
count per process), ranked in process id order. Times are nanoseconds from the session's start in
the export, microseconds out. Every table is
read through a cursor a chunk of rows at a time, the rows turned into integer columns before
the next chunk is read; strings are fetched once per distinct id, and names and threads are kept as
int32 ids. Every event is still a row of columns (32 B a runtime call or NVTX range, 61 B a GPU event
with its link to its call), so memory grows with the events read, not with the tables left unread.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from perfmagic.traces.events import CpuEvents, GpuEvents, KinetoTrace, kernel_kind, no_memory
from perfmagic.traces.kineto import TraceFormatError, launch_rows
from perfmagic.traces.nsys_schema import (
    GPUS,
    KERNEL,
    MEMCPY,
    MEMSET,
    NVTX,
    RUNTIME,
    SESSION_START,
    STRINGS,
    NsysSchema,
    open_capture,
)

CHUNK_ROWS = 65536
"""Rows fetched from a cursor at a time: what a read holds besides the columns it fills."""
PERFMAGIC_DOMAIN = "perfmagic"
"""The NVTX domain of perfmagic's stage ranges (:mod:`perfmagic.collect.nvtx_ranges`)."""
NVTX_RANGES = (59, 60)
"""``eventType`` of NVTX push/pop and start/end ranges."""
NVTX_DOMAIN_CREATE = 75
RUNTIME_CLASSES = (0, 1)
"""``eventClass`` of CUDA runtime and driver calls; the table also holds a copy of each call made for
its backtrace (67, ``TRACE_PROCESS_EVENT_CUDABACKTRACE``), which would count every call twice."""
_VERSION_SUFFIX = re.compile(r"_v\d+$")
_STEP = re.compile(r"ProfilerStep#\d+$")


def read_capture(path: str | os.PathLike[str], step_range: str | None = None) -> list[KinetoTrace]:
    """Read a ``.sqlite`` (``.sqlite.gz``, ``.nsys-rep``) capture: one trace per process that ran GPU
    work (in process id order; one for the capture where none did), as Nsight analyses per process.
    Raises :class:`TraceFormatError` on a file that is not a readable export, or when ``step_range``
    matches no NVTX range."""
    p = Path(path)
    pattern = _compiled(step_range)
    with open_capture(p) as db:
        try:
            return _read(db, NsysSchema(db, p), pattern)
        except sqlite3.DatabaseError as e:
            raise TraceFormatError(f"{p}: cannot read the export ({e})") from e


def _compiled(step_range: str | None) -> re.Pattern[str] | None:
    if step_range is None:
        return None
    try:
        return re.compile(step_range)
    except re.error as e:
        raise TraceFormatError(f"--step-range {step_range!r}: not a regular expression ({e})") from e


class _Names:
    """Event names, interned: one id per distinct name, strings fetched once per StringIds id."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.ids: dict[str, int] = {}
        self._by_string: dict[tuple[int, bool], int] = {}

    def of(self, name: str) -> int:
        return self.ids.setdefault(name, len(self.ids))

    def of_strings(self, string_ids: np.ndarray, runtime: bool = False) -> np.ndarray:
        """Name ids of StringIds ids (a runtime call's without its version suffix)."""
        uniq, inverse = np.unique(string_ids, return_inverse=True)
        missing = [int(u) for u in uniq if (int(u), runtime) not in self._by_string]
        for at in range(0, len(missing), 500):
            part = missing[at : at + 500]
            found = dict(
                self.db.execute(
                    f"SELECT id, value FROM {STRINGS} WHERE id IN ({','.join('?' * len(part))})", part
                )
            )
            for sid in part:
                name = str(found.get(sid, f"<string {sid}>"))
                self._by_string[(sid, runtime)] = self.of(_VERSION_SUFFIX.sub("", name) if runtime else name)
        table = np.array([self._by_string[(int(u), runtime)] for u in uniq], dtype=np.int32)
        out: np.ndarray = table[inverse.reshape(-1)] if len(uniq) else np.zeros(0, np.int32)
        return out

    @property
    def names(self) -> list[str]:
        return list(self.ids)


class _Threads:
    """Threads, interned: an index per distinct ``globalTid`` (in the order first read), so each row holds
    4 bytes for its thread and the few threads are sorted, not the rows."""

    def __init__(self) -> None:
        self.ids: dict[int, int] = {}

    def of(self, global_tids: np.ndarray) -> np.ndarray:
        uniq, inverse = np.unique(global_tids, return_inverse=True)
        table = np.array([self.ids.setdefault(t, len(self.ids)) for t in uniq.tolist()], np.int32)
        out: np.ndarray = table[inverse.reshape(-1)] if len(uniq) else np.zeros(0, np.int32)
        return out

    def pids(self) -> np.ndarray:
        """The process id of each thread, by index."""
        return _pid(np.array(list(self.ids), dtype=np.int64))

    def listed(self, thread: np.ndarray) -> tuple[list[tuple[int, int]], np.ndarray]:
        """The (pid, tid) pairs of the threads ``thread`` holds, in ``globalTid`` order, and each row's
        index into them."""
        tids = np.array(list(self.ids), dtype=np.int64)
        used = np.flatnonzero(np.bincount(thread, minlength=len(tids)))
        used = used[np.argsort(tids[used])]
        remap = np.full(len(tids), -1, np.int32)
        remap[used] = np.arange(len(used), dtype=np.int32)
        return [(int(t >> 24) & 0xFFFFFF, int(t) & 0xFFFFFF) for t in tids[used]], remap[thread]


def _chunks(db: sqlite3.Connection, sql: str, width: int) -> Iterator[np.ndarray]:
    """The rows of an all-integer query, ``CHUNK_ROWS`` at a time, as (n, width) int64 arrays."""
    cursor = db.execute(sql)
    while rows := cursor.fetchmany(CHUNK_ROWS):
        yield np.array(rows, dtype=np.int64).reshape(-1, width)


class _Filled:
    """Columns allocated once for at most ``capacity`` rows and filled a chunk at a time, so the
    events are never held twice (as a list of chunks and their concatenation)."""

    def __init__(self, capacity: int, dtypes: Sequence[type]) -> None:
        self.columns: list[np.ndarray] = [np.empty(capacity, dtype) for dtype in dtypes]
        self.n = 0

    def add(self, *columns: np.ndarray) -> None:
        k = len(columns[0])
        for column, values in zip(self.columns, columns, strict=True):
            column[self.n : self.n + k] = values
        self.n += k

    def done(self) -> list[np.ndarray]:
        return [c[: self.n] for c in self.columns]


def _rows(db: sqlite3.Connection, schema: NsysSchema, *tables: str) -> int:
    """How many rows ``tables`` hold in all (those absent none): an upper bound on their events."""
    return sum(int(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in tables if schema.has(t))


_Cols = tuple[np.ndarray, ...]
_CPU = (
    np.int32,
    np.float64,
    np.float64,
    np.int32,
    np.int64,
)  # name, start µs, dur µs, thread (:class:`_Threads`), correlation
_GPU = (np.int32, np.float64, np.float64, np.int32, np.int32, np.int64, np.float64, np.bool_, np.int32)
"""name, start µs, dur µs, device, stream, correlation, bytes, memory (a copy or memset), process id."""


def _pid(global_id: np.ndarray) -> np.ndarray:
    """The process id in an nsys ``globalTid`` or ``globalPid``."""
    out: np.ndarray = (global_id >> 24) & 0xFFFFFF
    return out


def _read(
    db: sqlite3.Connection, schema: NsysSchema, step_range: re.Pattern[str] | None
) -> list[KinetoTrace]:
    names, threads = _Names(db), _Threads()
    # an NVTX range may also be a step: room for each twice
    cpu_rows = _Filled(_rows(db, schema, RUNTIME) + 2 * _rows(db, schema, NVTX), _CPU)
    _runtime(db, schema, names, threads, cpu_rows)
    _nvtx(db, schema, names, threads, cpu_rows)
    gpu_rows = _Filled(_rows(db, schema, KERNEL, MEMCPY, MEMSET), _GPU)
    _kernels(db, schema, names, gpu_rows)
    _copies(db, schema, names, gpu_rows)
    _memsets(db, schema, names, gpu_rows)
    gpu = gpu_rows.done()
    processes = np.unique(gpu[-1][gpu[-1] > 0]).tolist()
    whole = len(processes) < 2  # one process: no masks, no copies of the columns
    name_id, start, dur, thread, corr = cpu_rows.done()
    cpu_pid = None if whole else threads.pids()[thread]
    found = False
    for pid in [None] if whole else processes:
        mine = slice(None) if cpu_pid is None else np.flatnonzero(cpu_pid == pid)
        steps = _steps(
            names, name_id[mine], start[mine], start[mine] + dur[mine], thread[mine], corr[mine], step_range
        )
        found = found or steps is not None
        if steps is not None:
            step_ids, s, e, step_thread = steps
            cpu_rows.add(step_ids, s, e - s, step_thread, np.full(len(s), -1))
    if step_range is not None and not found:
        raise TraceFormatError(f"{schema.path}: no NVTX range matches --step-range {step_range.pattern!r}")
    columns = cpu_rows.done()
    facts = {"device_properties": _devices(db, schema), "base_time_ns": _session_start(db, schema)}
    if whole:
        return [_trace(schema.path, names.names, threads, columns, gpu[:-1], facts)]
    cpu_pid = threads.pids()[columns[3]]
    return [
        _trace(schema.path, names.names, threads, [c[cpu_pid == pid] for c in columns],
               [c[gpu[-1] == pid] for c in gpu[:-1]],
               {**facts, "distributed": {"rank": k, "world_size": len(processes)}})
        for k, pid in enumerate(processes)
    ]  # fmt: skip


def _trace(path: Path, names: list[str], threads: _Threads, cpu_columns: Sequence[np.ndarray],
           gpu_columns: Sequence[np.ndarray], facts: dict[str, Any]) -> KinetoTrace:  # fmt: skip
    """One process's trace from its CPU (name, start, dur, thread, correlation) and GPU columns."""
    name_id, start, dur, thread, corr = cpu_columns
    pairs, index = threads.listed(thread)
    cpu = CpuEvents(names, name_id, start, dur, pairs, index, corr)
    return KinetoTrace(path=path, cpu=cpu, gpu=_linked(cpu, *gpu_columns), memory=no_memory(), **facts)


def _us(ns: np.ndarray) -> np.ndarray:
    out: np.ndarray = ns / 1e3
    return out


def _runtime(
    db: sqlite3.Connection, schema: NsysSchema, names: _Names, threads: _Threads, rows: _Filled
) -> None:
    """The CUDA runtime calls: (name id, start, duration, thread, correlation)."""
    if not schema.has(RUNTIME):
        return
    sql = (
        f"SELECT nameId, start, end, globalTid, coalesce(correlationId, -1) FROM {RUNTIME} "
        f"WHERE end >= start AND eventClass IN {RUNTIME_CLASSES}"
    )
    for c in _chunks(db, sql, 5):
        rows.add(
            names.of_strings(c[:, 0], runtime=True),
            _us(c[:, 1]),
            _us(c[:, 2] - c[:, 1]),
            threads.of(c[:, 3]),
            c[:, 4],
        )


def _nvtx(
    db: sqlite3.Connection, schema: NsysSchema, names: _Names, threads: _Threads, rows: _Filled
) -> None:
    """The NVTX ranges (correlation -1); perfmagic's stages as ``## stage ##``."""
    if not schema.has(NVTX):
        return
    domains = {
        int(d)
        for (d,) in db.execute(
            f"SELECT domainId FROM {NVTX} WHERE eventType = ? AND text = ?",
            (NVTX_DOMAIN_CREATE, PERFMAGIC_DOMAIN),
        )
        if d is not None
    }
    sql = (
        f"SELECT coalesce(n.text, s.value, ''), coalesce(n.domainId, 0), n.start, n.end, coalesce(n.globalTid, 0) "
        f"FROM {NVTX} n LEFT JOIN {STRINGS} s ON s.id = n.textId "
        f"WHERE n.eventType IN ({','.join(map(str, NVTX_RANGES))}) AND n.end IS NOT NULL AND n.end >= n.start"
    )
    cursor = db.execute(sql)
    while chunk := cursor.fetchmany(CHUNK_ROWS):
        ids = [names.of(f"## {text} ##" if domain in domains else str(text)) for text, domain, *_ in chunk]
        c = np.array([r[2:] for r in chunk], dtype=np.int64).reshape(-1, 3)
        rows.add(
            np.array(ids, np.int32),
            _us(c[:, 0]),
            _us(c[:, 1] - c[:, 0]),
            threads.of(c[:, 2]),
            np.full(len(ids), -1),
        )


_GPU_SELECT = "start, end, deviceId, streamId, coalesce(correlationId, -1), coalesce(globalPid, -1)"


def _add_gpu(
    rows: _Filled, name_id: np.ndarray, c: np.ndarray, nbytes: np.ndarray | int, memory: bool
) -> None:
    """GPU rows from ``c``'s columns (start, end, device, stream, correlation, globalPid)."""
    n = len(c)
    rows.add(name_id, _us(c[:, 0]), _us(c[:, 1] - c[:, 0]), c[:, 2], c[:, 3], c[:, 4],
             np.broadcast_to(nbytes, n), np.full(n, memory), np.where(c[:, 5] >= 0, _pid(c[:, 5]), -1))  # fmt: skip


def _kernels(db: sqlite3.Connection, schema: NsysSchema, names: _Names, rows: _Filled) -> None:
    """The kernels, by their demangled names."""
    if not schema.has(KERNEL):
        return
    sql = f"SELECT demangledName, {_GPU_SELECT} FROM {KERNEL} WHERE end >= start"
    for c in _chunks(db, sql, 7):
        _add_gpu(rows, names.of_strings(c[:, 0]), c[:, 1:7], 0, False)


def _copies(db: sqlite3.Connection, schema: NsysSchema, names: _Names, rows: _Filled) -> None:
    """The copies, named as Kineto names them: ``Memcpy HtoD (Pageable -> Device)``."""
    if not schema.has(MEMCPY):
        return
    sql = (
        "SELECT coalesce(copyKind, 0), coalesce(srcKind, -1), coalesce(dstKind, -1), "
        f"{_GPU_SELECT}, coalesce(bytes, 0) FROM {MEMCPY} WHERE end >= start"
    )
    kinds, memory = schema.copy_kinds, schema.memory_kinds
    for c in _chunks(db, sql, 10):
        triples, inverse = np.unique(c[:, :3], axis=0, return_inverse=True)
        ids = np.array(
            [
                names.of(
                    f"Memcpy {kinds.get(k, 'Unknown')} ({memory.get(s, 'Unknown')} -> {memory.get(d, 'Unknown')})"
                )
                for k, s, d in triples.tolist()
            ],
            np.int32,
        )
        _add_gpu(rows, ids[inverse.reshape(-1)], c[:, 3:9], c[:, 9], True)


def _memsets(db: sqlite3.Connection, schema: NsysSchema, names: _Names, rows: _Filled) -> None:
    """The memsets, named as Kineto names them: ``Memset (Device)``."""
    if not schema.has(MEMSET):
        return
    sql = f"SELECT coalesce(memKind, -1), {_GPU_SELECT}, coalesce(bytes, 0) FROM {MEMSET} WHERE end >= start"
    memory = schema.memory_kinds
    for c in _chunks(db, sql, 8):
        kinds, inverse = np.unique(c[:, 0], return_inverse=True)
        ids = np.array([names.of(f"Memset ({memory.get(k, 'Unknown')})") for k in kinds.tolist()], np.int32)
        _add_gpu(rows, ids[inverse.reshape(-1)], c[:, 1:7], c[:, 7], True)


def _linked(cpu: CpuEvents, name_id: np.ndarray, start: np.ndarray, dur: np.ndarray, device: np.ndarray,
            stream: np.ndarray, corr: np.ndarray, nbytes: np.ndarray, memory: np.ndarray) -> GpuEvents:  # fmt: skip
    """The GPU events, each linked to the runtime call that launched it (same correlation id)."""
    by_name = np.array([kernel_kind(n, False) for n in cpu.names], dtype=np.int8)
    as_memory = np.array([kernel_kind(n, True) for n in cpu.names], dtype=np.int8)
    kinds = np.where(memory, as_memory[name_id], by_name[name_id]).astype(np.int8)
    rows = launch_rows(cpu, corr)
    launch = np.full(len(rows), np.nan)
    launch[rows >= 0] = cpu.start[rows[rows >= 0]]
    return GpuEvents(
        names=cpu.names,
        name_id=name_id,
        kind=kinds,
        start=start,
        dur=dur,
        device=device,
        stream=stream,
        launch=launch,
        bytes=nbytes,
        correlation=corr,
        launch_row=rows,
    )


def _devices(db: sqlite3.Connection, schema: NsysSchema) -> list[dict[str, object]]:
    """The GPUs as Kineto's ``deviceProperties``: ``id`` and ``name``."""
    if not schema.has(GPUS):
        return []
    return [
        {"id": int(i), "name": str(n)} for i, n in db.execute(f"SELECT id, name FROM {GPUS}") if i is not None
    ]


def _session_start(db: sqlite3.Connection, schema: NsysSchema) -> int:
    """Nanoseconds since the epoch of the capture's time 0 (its session's start); 0 when unknown."""
    if not schema.has(SESSION_START):
        return 0
    row = db.execute(f"SELECT utcEpochNs FROM {SESSION_START}").fetchone()
    return int(row[0]) if row and isinstance(row[0], int) else 0


def _steps(names: _Names, name_id: np.ndarray, start: np.ndarray, end: np.ndarray, tid: np.ndarray,
           corr: np.ndarray, step_range: re.Pattern[str] | None) -> _Cols | None:  # fmt: skip
    """(name ids, starts, ends, threads) of ``ProfilerStep#N`` events to add for one process: the
    ranges ``step_range`` matches, or one per perfmagic ``optimizer`` range; None where ``step_range``
    matches nothing, or the process has ``ProfilerStep#`` ranges, or neither."""
    listed = names.names
    if step_range is not None:
        ids = [i for i, n in enumerate(listed) if step_range.search(n)]
        rows = np.flatnonzero(np.isin(name_id, ids) & (corr < 0))
        if not len(rows):
            return None
        rows = _outermost(rows, start, end)
        s, e = start[rows], end[rows]
    elif np.isin(name_id, [i for i, n in enumerate(listed) if _STEP.match(n)]).any():
        return None
    else:
        optimizer = names.ids.get("## optimizer ##")
        rows = np.flatnonzero(name_id == optimizer) if optimizer is not None else np.zeros(0, np.int64)
        if not len(rows):
            return None
        rows = _outermost(rows, start, end)
        ours = np.isin(name_id, [i for i, n in enumerate(listed) if n.startswith("## ")]) & (
            tid == tid[rows[0]]
        )
        e = end[rows]
        s = np.concatenate(([start[ours].min()], e[:-1]))
    step_ids = np.array([names.of(f"ProfilerStep#{k}") for k in range(len(s))], np.int32)
    return step_ids, s, e, tid[rows]


def _outermost(rows: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Of ``rows``, in time order, those no earlier one holds."""
    rows = rows[np.lexsort((-end[rows], start[rows]))]
    ends = np.maximum.accumulate(end[rows])
    keep = np.ones(len(rows), dtype=bool)
    keep[1:] = start[rows[1:]] >= ends[:-1]
    out: np.ndarray = rows[keep]
    return out
