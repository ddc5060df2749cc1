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
the export, microseconds out. Every table is read through a cursor a chunk of rows at a time
(:mod:`perfmagic.traces.nsys_columns`), the rows turned into integer columns before the next chunk
is read; strings are fetched once per distinct id, and names and threads are kept as int32 ids.
Read whole, every event is a row of columns (32 B a runtime call or NVTX range, 61 B a GPU event
with its link to its call). ``perfmagic report`` reads a capture streamed instead
(:mod:`perfmagic.traces.nsys_stream`): the GPU events go through the ``gpu`` section's figures in
start order and few events are kept, so memory does not grow with the GPU events and runtime calls.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from perfmagic.traces import nsys_columns
from perfmagic.traces.events import (
    CpuEvents,
    GpuEvents,
    GpuFigures,
    GpuFiguresOf,
    KinetoTrace,
    kernel_kind,
    no_memory,
)
from perfmagic.traces.kineto import TraceFormatError, launch_rows
from perfmagic.traces.nsys_columns import (
    Filled,
    Names,
    Threads,
    chunks,
    copy_names,
    memset_names,
    process_of,
    us,
)
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
from perfmagic.traces.nsys_stream import CALLS, Counted, kept_calls, stream_gpu
from perfmagic.traces.stages import profiler_steps

PERFMAGIC_DOMAIN = "perfmagic"
"""The NVTX domain of perfmagic's stage ranges (:mod:`perfmagic.collect.nvtx_ranges`)."""
NVTX_RANGES = (59, 60)
"""``eventType`` of NVTX push/pop and start/end ranges."""
NVTX_DOMAIN_CREATE = 75
_STEP = re.compile(r"ProfilerStep#\d+$")


def read_capture(
    path: str | os.PathLike[str], step_range: str | None = None, figures: GpuFiguresOf | None = None
) -> list[KinetoTrace]:
    """Read a ``.sqlite`` (``.sqlite.gz``, ``.nsys-rep``) capture: one trace per process that ran GPU
    work (in process id order; one for the capture where none did), as Nsight analyses per process.
    With ``figures``, the GPU events are streamed into the figures it makes for each process and only
    what the report reads is kept (:mod:`perfmagic.traces.nsys_stream`); without, every event is.
    Raises :class:`TraceFormatError` on a file that is not a readable export, or when ``step_range``
    matches no NVTX range."""
    p = Path(path)
    pattern = _compiled(step_range)
    with open_capture(p) as db:
        try:
            return _read(db, NsysSchema(db, p), pattern, figures)
        except sqlite3.DatabaseError as e:
            raise TraceFormatError(f"{p}: cannot read the export ({e})") from e


def _compiled(step_range: str | None) -> re.Pattern[str] | None:
    if step_range is None:
        return None
    try:
        return re.compile(step_range)
    except re.error as e:
        raise TraceFormatError(f"--step-range {step_range!r}: not a regular expression ({e})") from e


def _rows(db: sqlite3.Connection, schema: NsysSchema, *tables: str, where: str = "1") -> int:
    """How many rows of ``tables`` ``where`` holds in all (absent tables none): an upper bound on their
    events."""
    return sum(
        int(db.execute(f"SELECT count(*) FROM {t} WHERE {where}").fetchone()[0])
        for t in tables
        if schema.has(t)
    )


_Cols = tuple[np.ndarray, ...]
_CPU = (
    np.int32,
    np.float64,
    np.float64,
    np.int32,
    np.int64,
)  # name, start µs, dur µs, thread (:class:`Threads`), correlation
_GPU = (np.int32, np.float64, np.float64, np.int32, np.int32, np.int64, np.float64, np.bool_, np.int32)
"""name, start µs, dur µs, device, stream, correlation, bytes, memory (a copy or memset), process id."""
_NO_GPU = [np.zeros(0, t) for t in _GPU[:-1]]


_Part = tuple[int | None, Any, dict[str, Any]]  # a process (None: the whole capture), its CPU rows, its facts


def _read(
    db: sqlite3.Connection,
    schema: NsysSchema,
    step_range: re.Pattern[str] | None,
    figures: GpuFiguresOf | None,
) -> list[KinetoTrace]:
    names, threads = Names(db), Threads()
    kept = "1" if figures is None else kept_calls(db, schema)
    # an NVTX range may also be a step: room for each twice
    cpu_rows = Filled(_rows(db, schema, RUNTIME, where=kept) + 2 * _rows(db, schema, NVTX), _CPU)
    _runtime(db, schema, names, threads, cpu_rows, kept)
    runtime_rows = cpu_rows.n
    _nvtx(db, schema, names, threads, cpu_rows)
    counted = None if figures is None else Counted(db, schema)
    gpu: list[np.ndarray] = []
    if counted is None:
        gpu_rows = Filled(_rows(db, schema, KERNEL, MEMCPY, MEMSET), _GPU)
        _kernels(db, schema, names, gpu_rows)
        _copies(db, schema, names, gpu_rows)
        _memsets(db, schema, names, gpu_rows)
        gpu = gpu_rows.done()
        processes = np.unique(gpu[-1][gpu[-1] > 0]).tolist()
    else:
        processes = counted.processes()
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
    cpu_pid = None if whole else threads.pids()[columns[3]]
    parts: list[_Part] = [(None, slice(None), facts)] if whole else [
        (pid, cpu_pid == pid, {**facts, "distributed": {"rank": k, "world_size": len(processes)}})
        for k, pid in enumerate(processes)
    ]  # fmt: skip
    if counted is not None and figures is not None:
        runtime = np.zeros(len(columns[0]), bool)
        runtime[:runtime_rows] = True
        return _streamed(db, schema, (names, threads), columns, runtime, parts, counted, figures)
    return [
        _trace(schema.path, names.names, threads, [c[mine] for c in columns],
               [c[mine if pid is None else gpu[-1] == pid] for c in gpu[:-1]], facts)
        for pid, mine, facts in parts
    ]  # fmt: skip


def _streamed(db: sqlite3.Connection, schema: NsysSchema, interned: tuple[Names, Threads],
              columns: Sequence[np.ndarray], runtime: np.ndarray, parts: list[_Part], counted: Counted,
              figures: GpuFiguresOf) -> list[KinetoTrace]:  # fmt: skip
    """Each process's trace, its GPU events streamed into ``figures`` (``runtime``: which CPU rows are
    runtime calls, all counted in ``counted`` already)."""
    names, threads = interned
    made = []
    sinks: dict[int | None, GpuFigures] = {}
    for process, mine, facts in parts:
        name_id, start, dur, thread, corr = cpu_columns = [c[mine] for c in columns]
        aggregates, busiest = counted.aggregates(process, threads, cpu_columns, runtime[mine])
        also = threads.of(np.array([busiest], np.int64)).tolist() if busiest >= 0 else []
        pairs, index = threads.listed(thread, also)
        cpu = CpuEvents(names.names, name_id, start, dur, pairs, index, corr)
        at = pairs.index(((busiest >> 24) & 0xFFFFFF, busiest & 0xFFFFFF)) if busiest >= 0 else -1
        _, starts, _ = profiler_steps(KinetoTrace(path=schema.path, cpu=cpu, gpu=_linked(cpu, *_NO_GPU)))
        before = float(starts.max()) if len(starts) > 1 else None
        sinks[process] = figures(names.names, before, aggregates.ns_resolution)
        made.append((process, cpu, dataclasses.replace(aggregates, busiest_thread=at), facts))
    kept = stream_gpu(db, schema, names, sinks)
    return [
        KinetoTrace(path=schema.path, cpu=cpu, gpu=_linked(cpu, *kept[process]), memory=no_memory(),
                    gpu_figures=sinks[process], aggregates=aggregates, **facts)
        for process, cpu, aggregates, facts in made
    ]  # fmt: skip


def _trace(path: Path, names: list[str], threads: Threads, cpu_columns: Sequence[np.ndarray],
           gpu_columns: Sequence[np.ndarray], facts: dict[str, Any]) -> KinetoTrace:  # fmt: skip
    """One process's trace from its CPU (name, start, dur, thread, correlation) and GPU columns."""
    name_id, start, dur, thread, corr = cpu_columns
    pairs, index = threads.listed(thread)
    cpu = CpuEvents(names, name_id, start, dur, pairs, index, corr)
    return KinetoTrace(path=path, cpu=cpu, gpu=_linked(cpu, *gpu_columns), memory=no_memory(), **facts)


def _runtime(
    db: sqlite3.Connection, schema: NsysSchema, names: Names, threads: Threads, rows: Filled, kept: str
) -> None:
    """The CUDA runtime calls ``kept`` holds: (name id, start, duration, thread, correlation)."""
    if not schema.has(RUNTIME):
        return
    sql = (
        f"SELECT nameId, start, end, globalTid, coalesce(correlationId, -1) FROM {RUNTIME} "
        f"WHERE {CALLS} AND {kept}"
    )
    for c in chunks(db, sql, 5):
        rows.add(
            names.of_strings(c[:, 0], runtime=True),
            us(c[:, 1]),
            us(c[:, 2] - c[:, 1]),
            threads.of(c[:, 3]),
            c[:, 4],
        )


def _nvtx(db: sqlite3.Connection, schema: NsysSchema, names: Names, threads: Threads, rows: Filled) -> None:
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
    while chunk := cursor.fetchmany(nsys_columns.CHUNK_ROWS):
        ids = [names.of(f"## {text} ##" if domain in domains else str(text)) for text, domain, *_ in chunk]
        c = np.array([r[2:] for r in chunk], dtype=np.int64).reshape(-1, 3)
        rows.add(
            np.array(ids, np.int32),
            us(c[:, 0]),
            us(c[:, 1] - c[:, 0]),
            threads.of(c[:, 2]),
            np.full(len(ids), -1),
        )


_GPU_SELECT = "start, end, deviceId, streamId, coalesce(correlationId, -1), coalesce(globalPid, -1)"


def _add_gpu(
    rows: Filled, name_id: np.ndarray, c: np.ndarray, nbytes: np.ndarray | int, memory: bool
) -> None:
    """GPU rows from ``c``'s columns (start, end, device, stream, correlation, globalPid)."""
    n = len(c)
    rows.add(name_id, us(c[:, 0]), us(c[:, 1] - c[:, 0]), c[:, 2], c[:, 3], c[:, 4],
             np.broadcast_to(nbytes, n), np.full(n, memory), np.where(c[:, 5] >= 0, process_of(c[:, 5]), -1))  # fmt: skip


def _kernels(db: sqlite3.Connection, schema: NsysSchema, names: Names, rows: Filled) -> None:
    """The kernels, by their demangled names."""
    if not schema.has(KERNEL):
        return
    sql = f"SELECT demangledName, {_GPU_SELECT} FROM {KERNEL} WHERE end >= start"
    for c in chunks(db, sql, 7):
        _add_gpu(rows, names.of_strings(c[:, 0]), c[:, 1:7], 0, False)


def _copies(db: sqlite3.Connection, schema: NsysSchema, names: Names, rows: Filled) -> None:
    """The copies, named as Kineto names them: ``Memcpy HtoD (Pageable -> Device)``."""
    if not schema.has(MEMCPY):
        return
    sql = (
        "SELECT coalesce(copyKind, 0), coalesce(srcKind, -1), coalesce(dstKind, -1), "
        f"{_GPU_SELECT}, coalesce(bytes, 0) FROM {MEMCPY} WHERE end >= start"
    )
    for c in chunks(db, sql, 10):
        _add_gpu(rows, copy_names(names, schema, c[:, :3]), c[:, 3:9], c[:, 9], True)


def _memsets(db: sqlite3.Connection, schema: NsysSchema, names: Names, rows: Filled) -> None:
    """The memsets, named as Kineto names them: ``Memset (Device)``."""
    if not schema.has(MEMSET):
        return
    sql = f"SELECT coalesce(memKind, -1), {_GPU_SELECT}, coalesce(bytes, 0) FROM {MEMSET} WHERE end >= start"
    for c in chunks(db, sql, 8):
        _add_gpu(rows, memset_names(names, schema, c[:, 0]), c[:, 1:7], c[:, 7], True)


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


def _steps(names: Names, name_id: np.ndarray, start: np.ndarray, end: np.ndarray, tid: np.ndarray,
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
    step_ids = names.numbered("ProfilerStep#", len(s))
    return step_ids, s, e, tid[rows]


def _outermost(rows: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Of ``rows``, in time order, those no earlier one holds."""
    rows = rows[np.lexsort((-end[rows], start[rows]))]
    ends = np.maximum.accumulate(end[rows])
    keep = np.ones(len(rows), dtype=bool)
    keep[1:] = start[rows[1:]] >= ends[:-1]
    out: np.ndarray = rows[keep]
    return out
