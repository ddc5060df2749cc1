"""An Nsight Systems capture read for a report in bounded memory: its GPU events streamed in start
order into the ``gpu`` section's figures, and only the CPU events the timeline reads kept.

A capture holds tens of millions of kernels, copies and runtime calls, and kept as columns they
cost ~86 B each. So where :func:`perfmagic.traces.nsys.read_capture` is given a maker of figures:

- the GPU events of the three tables are read in one query ordered by start, each joined to the
  runtime call that launched it (the same correlation id; in the same process where the capture
  has several), and handed a chunk at a time to their process's figures
  (:class:`perfmagic.analyze.gpu_tally.GpuTally`); only the copies, memsets and communication kernels
  stay events (the timeline's host-to-device copies, syncs by blocking copies and the collectives'
  skew read them);
- of the runtime calls, only those with a stage (syncs, collectives), the copy and memset calls and
  those that launched a copy or memset are kept; every NVTX range is;
- what is read over every event (the trace's extent, its busiest thread, whether a start has a
  fraction of a microsecond) is counted in SQL, as :class:`Aggregates`.

SQLite sorts the events and builds the join's index in its temporary files, so the read holds a
chunk of rows, the events kept and the figures' running state.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perfmagic.traces import nsys_columns
from perfmagic.traces.events import COMMUNICATION, Aggregates, GpuChunk, GpuFigures, kernel_kind
from perfmagic.traces.nsys_columns import (
    RUNTIME_CLASSES,
    VERSION_SUFFIX,
    Filled,
    Names,
    Threads,
    chunks,
    copy_names,
    memset_names,
    process_of,
    us,
)
from perfmagic.traces.nsys_schema import KERNEL, MEMCPY, MEMSET, RUNTIME, STRINGS, NsysSchema
from perfmagic.traces.stages import stage_of

KEPT_CALL_PREFIXES = ("cudaMemcpy", "cudaMemset", "cuMemcpy", "cuMemset")
"""Runtime and driver calls kept besides those with a stage: copies and memsets, blocking or not."""
CALLS = f"end >= start AND eventClass IN {RUNTIME_CLASSES}"
"""The runtime calls read: calls (not their backtraces' copies) whose times are sound."""
_COMMON = (
    "start, end, deviceId AS device, streamId AS stream, coalesce(correlationId, -1) AS corr, "
    "coalesce(globalPid, -1) AS gpid"
)
_ARMS = {
    KERNEL: f"0 AS t, rowid AS rid, demangledName AS name, {_COMMON}, 0 AS nbytes, 0 AS k1, 0 AS k2, 0 AS k3",
    MEMCPY: f"1, rowid, 0, {_COMMON}, coalesce(bytes, 0), coalesce(copyKind, 0), coalesce(srcKind, -1), "
    "coalesce(dstKind, -1)",
    MEMSET: f"2, rowid, 0, {_COMMON}, coalesce(bytes, 0), coalesce(memKind, -1), 0, 0",
}
_WIDTH = 17  # the columns of _ordered's rows
_KEPT = (np.int32, np.float64, np.float64, np.int64, np.int64, np.int64, np.float64, np.bool_)
"""The columns of the GPU events kept: name, start, dur, device, stream, correlation, bytes, memory."""
STREAM_ROWS = 8192
"""GPU events fetched at a time: as Python tuples a row of 17 numbers costs ~700 B (65536 rows: 45 MB)."""


def kept_calls(db: sqlite3.Connection, schema: NsysSchema) -> str:
    """The SQL condition on a runtime call that keeps it (see the module's doc)."""
    ids = [
        int(i)
        for i, value in db.execute(f"SELECT id, value FROM {STRINGS}")
        if isinstance(value, str) and _kept(VERSION_SUFFIX.sub("", value))
    ]
    launched = [f"SELECT correlationId FROM {t}" for t in (MEMCPY, MEMSET) if schema.has(t)]
    parts = [f"nameId IN ({','.join(map(str, ids))})"] if ids else []
    if launched:
        parts.append(f"correlationId IN ({' UNION '.join(launched)})")
    return f"({' OR '.join(parts)})" if parts else "0"


def _kept(name: str) -> bool:
    return stage_of(name) is not None or name.startswith(KEPT_CALL_PREFIXES)


@dataclass
class _Extent:
    """Events counted: how many, the first start and last end (ns), whether a start has ns in it."""

    count: int = 0
    first: float = np.inf
    last: float = -np.inf
    ns: bool = False

    def merged(self, count: int, first: float, last: float, ns: bool) -> _Extent:
        return _Extent(self.count + count, min(self.first, first), max(self.last, last), self.ns or ns)


class Counted:
    """What the capture's runtime calls (per thread) and GPU events (per ``globalPid``) hold in all."""

    def __init__(self, db: sqlite3.Connection, schema: NsysSchema) -> None:
        self.threads: dict[int, _Extent] = {}
        self.gpu: dict[int, _Extent] = {}
        grouped = "count(*), min(start), max(end), max(start % 1000 != 0)"
        if schema.has(RUNTIME):
            sql = f"SELECT globalTid, {grouped} FROM {RUNTIME} WHERE {CALLS} GROUP BY globalTid"
            for tid, n, first, last, ns in db.execute(sql):
                self.threads[int(tid or 0)] = _Extent(n, first, last, bool(ns))
        for table in (KERNEL, MEMCPY, MEMSET):
            if schema.has(table):
                sql = f"SELECT coalesce(globalPid, -1), {grouped} FROM {table} WHERE end >= start GROUP BY 1"
                for gpid, n, first, last, ns in db.execute(sql):
                    self.gpu[int(gpid)] = self.gpu.get(int(gpid), _Extent()).merged(n, first, last, bool(ns))

    def processes(self) -> list[int]:
        """The processes that ran GPU work, in process id order."""
        pids = process_of(np.array([g for g in self.gpu if g >= 0], dtype=np.int64))
        return sorted({int(p) for p in pids if p > 0})

    def aggregates(
        self, process: int | None, threads: Threads, cpu: Sequence[np.ndarray], runtime: np.ndarray
    ) -> tuple[Aggregates, int]:
        """The :class:`Aggregates` of ``process`` (None: of the whole capture) and the ``globalTid`` of its
        busiest thread (-1 without CPU events); ``cpu``: its kept (name, start, dur, thread, correlation)
        columns, ``runtime``: which of them are runtime calls (counted already)."""
        extent = {
            t: e
            for t, e in self.threads.items()
            if process is None or int(process_of(np.int64(t))) == process
        }
        tids = list(threads.ids)
        for index, got in _per_thread(cpu, runtime, len(tids)):
            extent[tids[index]] = extent.get(tids[index], _Extent()).merged(*got)
        gpu = [
            e
            for g, e in self.gpu.items()
            if process is None or (g >= 0 and int(process_of(np.int64(g))) == process)
        ]
        every = list(extent.values()) + gpu
        busiest = min(extent, key=lambda t: (-extent[t].count, t)) if extent else -1
        first, last = (
            min((e.first for e in every), default=np.inf),
            max((e.last for e in every), default=-np.inf),
        )
        return Aggregates(
            first_us=first / 1e3 if np.isfinite(first) else None,
            last_us=last / 1e3 if np.isfinite(last) else None,
            busiest_thread=-1,  # its index among the trace's threads, set when they are listed
            ns_resolution=any(e.ns for e in every),
        ), busiest


def _per_thread(
    cpu: Sequence[np.ndarray], runtime: np.ndarray, threads: int
) -> list[tuple[int, tuple[int, float, float, bool]]]:
    """Per thread index, what its CPU rows but the runtime calls hold: (count, first start, last end (ns),
    whether a start has a fraction of a µs). A block of rows at a time: a copy of every row's columns
    would cost what the rows do."""
    _, start, dur, thread, _ = cpu
    count = np.zeros(threads, np.int64)
    first, last = np.full(threads, np.inf), np.full(threads, -np.inf)
    ns = np.zeros(threads, bool)
    for at in range(0, len(thread), STREAM_ROWS):
        rows = slice(at, at + STREAM_ROWS)
        mine = ~runtime[rows]
        t, s = thread[rows][mine], start[rows][mine]
        count += np.bincount(t, minlength=threads)
        np.minimum.at(first, t, s)
        np.maximum.at(last, t, s + dur[rows][mine])
        ns[t[s != np.floor(s)]] = True
    return [
        (i, (int(count[i]), float(first[i]) * 1e3, float(last[i]) * 1e3, bool(ns[i])))
        for i in np.flatnonzero(count).tolist()
    ]


def stream_gpu(
    db: sqlite3.Connection, schema: NsysSchema, names: Names, figures: dict[int | None, GpuFigures]
) -> dict[int | None, list[np.ndarray]]:
    """Hand every GPU event, in start order, to its process's ``figures`` (one under None: the whole
    capture's); the copies, memsets and communication kernels kept, per process, as (name, start, dur,
    device, stream, correlation, bytes, memory) columns."""
    whole = None in figures
    kept = {p: Filled(1024, _KEPT) for p in figures}
    kinds = _Kinds(names)
    last = (-1, -1)  # (table, rowid) of the row before: a call found twice launched it once
    for c in chunks(db, _ordered(schema, whole), _WIDTH, min(STREAM_ROWS, nsys_columns.CHUNK_ROWS)):
        again = np.zeros(len(c), bool)
        again[0] = (int(c[0, 0]), int(c[0, 1])) == last
        again[1:] = (c[1:, 0] == c[:-1, 0]) & (c[1:, 1] == c[:-1, 1])
        last = (int(c[-1, 0]), int(c[-1, 1]))
        c = c[~again]
        chunk, process, memory, corr = _chunk(c, names, schema, kinds)
        for p, sink in figures.items():
            mine = slice(None) if p is None else process == p
            sink.add(_taken(chunk, mine))
            keep = (memory | (chunk.kind == COMMUNICATION)) & (True if p is None else process == p)
            if keep.any():
                kept[p].add(chunk.name_id[keep], chunk.start[keep], chunk.dur[keep], chunk.device[keep],
                            chunk.stream[keep], corr[keep], chunk.bytes[keep], memory[keep])  # fmt: skip
    empty = _taken(_chunk(np.zeros((0, _WIDTH), np.int64), names, schema, kinds)[0], slice(None))
    for sink in figures.values():
        sink.add(empty, final=True)
    return {p: [c.copy() for c in rows.done()] for p, rows in kept.items()}


def _ordered(schema: NsysSchema, whole: bool) -> str:
    """The GPU events of every table in start order (then table, then row), each with the first runtime
    call (by row) of its correlation id: (table, rowid, name, start, end, device, stream, correlation,
    globalPid, bytes, the kinds, call start, call end, call name, call rowid or -1)."""
    union = " UNION ALL ".join(
        f"SELECT {columns} FROM {table} WHERE end >= start"
        for table, columns in _ARMS.items()
        if schema.has(table)
    )
    if not schema.has(RUNTIME):
        return f"SELECT g.*, 0, 0, -1, -1 FROM ({union}) g ORDER BY g.start, g.t, g.rid"
    # correlation ids count per process: with several, a call of the same process
    same = "" if whole else " AND ((r.globalTid >> 24) & 16777215) = ((g.gpid >> 24) & 16777215)"
    return (
        f"SELECT g.*, coalesce(r.start, 0), coalesce(r.end, 0), coalesce(r.nameId, -1), coalesce(r.rowid, -1) "
        f"FROM ({union}) g LEFT JOIN {RUNTIME} r ON r.correlationId = g.corr "
        f"AND r.eventClass IN {RUNTIME_CLASSES} AND r.end >= r.start{same} ORDER BY g.start, g.t, g.rid, r.rowid"
    )


class _Kinds:
    """Each name id's kind, as a kernel and as a copy or memset (:func:`kernel_kind`), grown with the names."""

    def __init__(self, names: Names) -> None:
        self.names = names
        self.by_name = np.zeros(0, np.int8)
        self.as_memory = np.zeros(0, np.int8)

    def of(self, name_id: np.ndarray, memory: np.ndarray) -> np.ndarray:
        listed = self.names.names
        if len(self.by_name) < len(listed):
            new = listed[len(self.by_name) :]
            self.by_name = np.concatenate((self.by_name, [kernel_kind(n, False) for n in new])).astype(
                np.int8
            )
            self.as_memory = np.concatenate((self.as_memory, [kernel_kind(n, True) for n in new])).astype(
                np.int8
            )
        out: np.ndarray = np.where(memory, self.as_memory[name_id], self.by_name[name_id]).astype(np.int8)
        return out


def _chunk(
    c: np.ndarray, names: Names, schema: NsysSchema, kinds: _Kinds
) -> tuple[GpuChunk, np.ndarray, np.ndarray, np.ndarray]:
    """The rows ``c`` of :func:`_ordered` as a chunk, with each event's process, whether it is a copy or
    memset, and its correlation id."""
    table = c[:, 0]
    name_id = np.zeros(len(c), np.int32)
    for t, named in ((0, None), (1, copy_names), (2, memset_names)):
        rows = table == t
        if rows.any():
            if named is None:
                name_id[rows] = names.of_strings(c[rows, 2])
            else:
                name_id[rows] = named(names, schema, c[rows, 10:13] if t == 1 else c[rows, 10])
    memory = table > 0
    called = c[:, 16] >= 0
    launch_name = np.full(len(c), -1, np.int32)
    launch_name[called] = names.of_strings(c[called, 15], runtime=True)
    chunk = GpuChunk(
        name_id=name_id,
        kind=kinds.of(name_id, memory),
        start=us(c[:, 3]),
        dur=us(c[:, 4] - c[:, 3]),
        device=c[:, 5],
        stream=c[:, 6],
        launch=np.where(called, us(c[:, 13]), np.nan),
        bytes=c[:, 9].astype(np.float64),
        launch_name=launch_name,
        launch_dur=np.where(called, us(c[:, 14] - c[:, 13]), np.nan),
    )
    process = np.where(c[:, 8] >= 0, process_of(c[:, 8]), -1)
    return chunk, process, memory, c[:, 7]


def _taken(chunk: GpuChunk, rows: np.ndarray | slice) -> GpuChunk:
    return GpuChunk(
        chunk.name_id[rows], chunk.kind[rows], chunk.start[rows], chunk.dur[rows], chunk.device[rows],
        chunk.stream[rows], chunk.launch[rows], chunk.bytes[rows], chunk.launch_name[rows], chunk.launch_dur[rows],
    )  # fmt: skip
