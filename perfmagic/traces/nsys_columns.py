"""The columns an Nsight Systems capture's rows become: names and threads interned, rows read a chunk
at a time (:mod:`perfmagic.traces.nsys`)."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator, Sequence

import numpy as np

from perfmagic.traces.nsys_schema import STRINGS, NsysSchema

CHUNK_ROWS = 65536
"""Rows fetched from a cursor at a time: what a read holds besides the columns it fills."""
VERSION_SUFFIX = re.compile(r"_v\d+$")
RUNTIME_CLASSES = (0, 1)
"""``eventClass`` of CUDA runtime and driver calls; the table also holds a copy of each call made for
its backtrace (67, ``TRACE_PROCESS_EVENT_CUDABACKTRACE``), which would count every call twice."""


class Names:
    """Event names, interned: one id per distinct name, strings fetched once per StringIds id."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.ids: dict[str, int] = {}
        self.listed: list[str] = []  # the names by id, appended to as they are met
        self._numbered: dict[str, list[int]] = {}
        self._by_string: dict[tuple[int, bool], int] = {}

    def of(self, name: str) -> int:
        got = self.ids.get(name)
        if got is None:
            got = self.ids[name] = len(self.listed)
            self.listed.append(name)
        return got

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
                self._by_string[(sid, runtime)] = self.of(VERSION_SUFFIX.sub("", name) if runtime else name)
        table = np.array([self._by_string[(int(u), runtime)] for u in uniq], dtype=np.int32)
        out: np.ndarray = table[inverse.reshape(-1)] if len(uniq) else np.zeros(0, np.int32)
        return out

    def numbered(self, prefix: str, n: int) -> np.ndarray:
        """Ids of ``prefix`` + 0 .. n - 1 (``ProfilerStep#N``): listed, not looked up by name, as a
        capture has hundreds of thousands of steps and an entry each in the lookup cost as much again."""
        while len(self._numbered.setdefault(prefix, [])) < n:
            self._numbered[prefix].append(len(self.listed))
            self.listed.append(f"{prefix}{len(self._numbered[prefix]) - 1}")
        return np.array(self._numbered[prefix][:n], np.int32)

    @property
    def names(self) -> list[str]:
        return self.listed


class Threads:
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
        return process_of(np.array(list(self.ids), dtype=np.int64))

    def listed(
        self, thread: np.ndarray, also: Sequence[int] = ()
    ) -> tuple[list[tuple[int, int]], np.ndarray]:
        """The (pid, tid) pairs of the threads ``thread`` holds and the indices ``also``, in ``globalTid``
        order, and each row's index into them."""
        tids = np.array(list(self.ids), dtype=np.int64)
        held = np.bincount(thread, minlength=len(tids))
        held[list(also)] += 1
        used = np.flatnonzero(held)
        used = used[np.argsort(tids[used])]
        remap = np.full(len(tids), -1, np.int32)
        remap[used] = np.arange(len(used), dtype=np.int32)
        return [(int(t >> 24) & 0xFFFFFF, int(t) & 0xFFFFFF) for t in tids[used]], remap[thread]


def chunks(
    db: sqlite3.Connection, sql: str, width: int, at_a_time: int | None = None
) -> Iterator[np.ndarray]:
    """The rows of an all-integer query, ``at_a_time`` (else ``CHUNK_ROWS``) at a time, as (n, width)
    int64 arrays."""
    cursor = db.execute(sql)
    while rows := cursor.fetchmany(at_a_time or CHUNK_ROWS):
        yield np.array(rows, dtype=np.int64).reshape(-1, width)


class Filled:
    """Columns allocated for ``capacity`` rows (doubled when more come) and filled a chunk at a time, so
    the events are never held twice (as a list of chunks and their concatenation), nor a small array
    per chunk kept (each would pin the memory of the chunk's freed rows around it)."""

    def __init__(self, capacity: int, dtypes: Sequence[type]) -> None:
        self.columns: list[np.ndarray] = [np.empty(capacity, dtype) for dtype in dtypes]
        self.n = 0

    def add(self, *columns: np.ndarray) -> None:
        k = len(columns[0])
        if self.n + k > len(self.columns[0]):
            size = max(2 * len(self.columns[0]), self.n + k)
            self.columns = [
                np.concatenate((c[: self.n], np.empty(size - self.n, c.dtype))) for c in self.columns
            ]
        for column, values in zip(self.columns, columns, strict=True):
            column[self.n : self.n + k] = values
        self.n += k

    def done(self) -> list[np.ndarray]:
        return [c[: self.n] for c in self.columns]


def process_of(global_id: np.ndarray) -> np.ndarray:
    """The process id in an nsys ``globalTid`` or ``globalPid``."""
    out: np.ndarray = (global_id >> 24) & 0xFFFFFF
    return out


def us(ns: np.ndarray) -> np.ndarray:
    out: np.ndarray = ns / 1e3
    return out


def copy_names(names: Names, schema: NsysSchema, kinds: np.ndarray) -> np.ndarray:
    """Name ids of copies from their (copyKind, srcKind, dstKind) rows, named as Kineto names them:
    ``Memcpy HtoD (Pageable -> Device)``."""
    copy, memory = schema.copy_kinds, schema.memory_kinds
    triples, inverse = np.unique(kinds, axis=0, return_inverse=True)
    ids = [
        names.of(
            f"Memcpy {copy.get(k, 'Unknown')} ({memory.get(s, 'Unknown')} -> {memory.get(d, 'Unknown')})"
        )
        for k, s, d in triples.tolist()
    ]
    out: np.ndarray = np.array(ids, np.int32)[inverse.reshape(-1)]
    return out


def memset_names(names: Names, schema: NsysSchema, kinds: np.ndarray) -> np.ndarray:
    """Name ids of memsets from their memKind, named as Kineto names them: ``Memset (Device)``."""
    uniq, inverse = np.unique(kinds, return_inverse=True)
    ids = [names.of(f"Memset ({schema.memory_kinds.get(k, 'Unknown')})") for k in uniq.tolist()]
    out: np.ndarray = np.array(ids, np.int32)[inverse.reshape(-1)]
    return out
