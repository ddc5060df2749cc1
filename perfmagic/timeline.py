"""The timeline: the one data model every stage of the pipeline shares.

A timeline holds what one process recorded during a profiled window:

- *spans*: named intervals (training stages, steps), with their nesting depth;
- *samples*: metric time series (GPU utilization, host CPU, RSS, ...);
- *marks*: instants with a small payload (a step boundary, a checkpoint, a
  DataLoader's configuration).

Times are seconds since the window's origin (``time.perf_counter()`` at
start); ``meta["epoch"]`` is the wall-clock time of that origin, so timelines
of several processes can be put on one clock.

Storage is columnar: appends go to ``array.array`` buffers (cheap enough for the
training loop's hot path) and readers get numpy views. The same JSON-lines
format serves as the crash-safe spool written while profiling and as the saved
file: a reader takes every complete line and ignores a torn last one. Span and
sample columns go into it packed (base64 of their little-endian bytes: exact, and
written tens of times faster than numbers in JSON, which the spool thread would
otherwise take from the training loop); a reader also takes plain lists.

Memory stays bounded on long runs: the analysis folds the spans of old steps
into per-step rows (:class:`FoldedSteps`, about 30 bytes a step) once the spool
holds them, and old samples of a long series are averaged in pairs. The thread
that writes spans applies a fold between two of its own appends
(:meth:`Timeline.apply_fold`), so the hot path takes no lock.
"""

from __future__ import annotations

import base64
import json
import math
import os
import sys
import threading
import warnings
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

import numpy as np

from perfmagic.contract import TimelineMeta

SPOOL_NAME = "timeline.jsonl"


class TimelineFormatError(ValueError):
    """A timeline file that cannot be read."""


@dataclass(frozen=True)
class Spans:
    """A read-only columnar view of spans."""

    names: list[str]
    name_id: np.ndarray
    start: np.ndarray
    end: np.ndarray
    depth: np.ndarray

    def __len__(self) -> int:
        return len(self.start)

    def name_of(self, i: int) -> str:
        return self.names[int(self.name_id[i])]


@dataclass(frozen=True)
class Mark:
    """An instant event with a payload."""

    t: float
    name: str
    data: dict[str, Any] = field(default_factory=dict)


class _Series:
    __slots__ = ("base", "t", "v")

    def __init__(self) -> None:
        self.t = array("d")
        self.v = array("d")
        self.base = 0  # samples replaced by fewer (averaged or folded) since the first: indices are logical


@dataclass(frozen=True)
class FoldedSteps:
    """Steps whose spans were folded away: per step its start, duration and the exclusive seconds of
    each stage, and the profiled thread's CPU, run-queue wait and GC seconds (NaN: unmeasured)."""

    kind: str  # the boundary kind that delimited them (see ``analyze.steps``)
    until: float  # the end of the last one: spans before it are no longer in the timeline
    start: np.ndarray
    duration: np.ndarray
    stages: dict[str, np.ndarray]
    cpu_s: np.ndarray
    wait_s: np.ndarray
    gc_s: np.ndarray

    def __len__(self) -> int:
        return len(self.start)


@dataclass(frozen=True)
class Fold:
    """The first ``spans`` spans (all before ``steps.until``) and samples, replaced by their steps' rows."""

    spans: int
    steps: FoldedSteps
    samples: dict[str, int]  # per series: how many samples from the first may go


class _FoldedColumns:
    """Folded steps as the chunks each fold added (no column is ever copied to grow), float32 where a
    duration is all a column holds; a stage's column where it was not used reads 0."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.until = 0.0
        self.chunks: list[FoldedSteps] = []

    def extend(self, rows: FoldedSteps) -> None:
        def f32(column: np.ndarray) -> np.ndarray:
            return np.asarray(column, dtype=np.float32)

        self.chunks.append(
            FoldedSteps(
                kind=rows.kind,
                until=rows.until,
                start=np.asarray(rows.start, dtype=np.float64),
                duration=f32(rows.duration),
                stages={k: f32(v) for k, v in rows.stages.items()},
                cpu_s=f32(rows.cpu_s),
                wait_s=f32(rows.wait_s),
                gc_s=f32(rows.gc_s),
            )
        )
        self.until = rows.until

    def view(self) -> FoldedSteps:
        chunks = self.chunks

        def joined(name: str) -> np.ndarray:
            return np.concatenate([getattr(c, name) for c in chunks]).astype(np.float64)

        stages = dict.fromkeys(k for c in chunks for k in c.stages)
        return FoldedSteps(
            kind=self.kind,
            until=self.until,
            start=joined("start"),
            duration=joined("duration"),
            stages={
                k: np.concatenate([c.stages.get(k, np.zeros(len(c), np.float32)) for c in chunks]).astype(
                    np.float64
                )
                for k in stages
            },
            cpu_s=joined("cpu_s"),
            wait_s=joined("wait_s"),
            gc_s=joined("gc_s"),
        )


class Timeline:
    """Spans, samples and marks of one process over one window."""

    def __init__(self, meta: TimelineMeta | None = None) -> None:
        self.meta: TimelineMeta = meta.copy() if meta is not None else {}
        self._names: list[str] = []
        self._name_ids: dict[str, int] = {}
        self._span_name = array("i")
        self._span_start = array("d")
        self._span_end = array("d")
        self._span_depth = array("b")
        self._span_base = 0  # spans folded away: span indices are logical, ``base`` + position
        self._series: dict[str, _Series] = {}
        self._marks: list[Mark] = []
        self._folded: _FoldedColumns | None = None
        self.record: Path | None = None  # a file with every span and sample (the spool), where there is one
        # queued for the writer to apply (``request_fold``); an attribute the writer reads at every step
        self.pending_fold: Fold | None = None
        self._lock = threading.Lock()
        # held by readers of span and sample columns; the writer thread applies a fold only when it can
        # take it at once, so a reader never sees columns cut half-way and the writer never waits
        self._cut_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        """Everything but the locks: a worker process hands its timeline back pickled."""
        return {k: v for k, v in vars(self).items() if k not in ("_lock", "_cut_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self._lock = threading.Lock()
        self._cut_lock = threading.Lock()

    # -- writing ---------------------------------------------------------

    def name_id(self, name: str) -> int:
        """The id of a span name, interning it on first use."""
        i = self._name_ids.get(name)
        if i is None:
            i = self._name_ids[name] = len(self._names)
            self._names.append(name)
        return i

    def add_span(self, name_id: int, start: float, end: float, depth: int = 0) -> None:
        self._span_name.append(name_id)
        self._span_start.append(start)
        self._span_end.append(end)
        self._span_depth.append(depth)

    def span_appenders(
        self,
    ) -> tuple[
        Callable[[int], None], Callable[[float], None], Callable[[float], None], Callable[[int], None]
    ]:
        """The span columns' own appends (name id, start, end, depth), for the stage recorder: a call of
        :meth:`add_span` per stage costs a fast loop a microsecond or two. Call them in that order, depth last
        (readers count spans by the depth column); they stay valid, as folds cut the columns in place."""
        return self._span_name.append, self._span_start.append, self._span_end.append, self._span_depth.append

    def set_span_times(self, index: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        """Move the spans at ``index`` to new times (a recorder that learns its device times later).

        Called by the thread that writes spans; spans folded away are left as they were.
        """
        at = np.asarray(index) - self._span_base
        kept = at >= 0
        np.frombuffer(self._span_start, dtype=np.float64)[at[kept]] = np.asarray(start)[kept]
        np.frombuffer(self._span_end, dtype=np.float64)[at[kept]] = np.asarray(end)[kept]

    def add_sample(self, metric: str, t: float, value: float) -> None:
        series = self._series.get(metric)
        if series is None:
            with self._lock:
                series = self._series.setdefault(metric, _Series())
        series.t.append(t)
        series.v.append(value)

    def sample_appenders(self, metric: str) -> tuple[Callable[[float], None], Callable[[float], None]]:
        """A series' appends (time, value) for per-step hooks, in that order; thinning keeps them valid."""
        with self._lock:
            series = self._series.setdefault(metric, _Series())
        return series.t.append, series.v.append

    def add_mark(self, t: float, name: str, **data: Any) -> None:
        self._marks.append(Mark(t, name, data))

    # -- bounding memory -------------------------------------------------

    def request_fold(self, fold: Fold) -> None:
        """Queue a fold for the thread that writes spans to apply (``apply_fold``)."""
        self.pending_fold = fold

    def apply_fold(self) -> bool:
        """Apply the queued fold, unless a reader holds the columns right now (then try again later).

        Only the thread that writes spans and ``thread.*`` samples calls this (or anyone once
        recording has ended): it cuts the heads of columns that thread appends to.
        """
        fold = self.pending_fold
        if fold is None or not self._cut_lock.acquire(blocking=False):
            return False
        try:
            self.pending_fold = None
            k = fold.spans
            for column in (self._span_name, self._span_start, self._span_end, self._span_depth):
                del column[:k]
            self._span_base += k
            for metric, m in fold.samples.items():
                s = self._series.get(metric)
                if s is not None and m > 0:
                    del s.t[:m], s.v[:m]
                    s.base += m
            if self._folded is None:
                self._folded = _FoldedColumns(fold.steps.kind)
            self._folded.extend(fold.steps)
        finally:
            self._cut_lock.release()
        return True

    def thin(self, metric: str, count: int) -> None:
        """Average the first ``count`` samples of a series in pairs (called by the thread that samples it)."""
        s = self._series.get(metric)
        if s is None:
            return
        count -= count % 2
        if count < 2:
            return
        t = np.frombuffer(s.t[:count], dtype=np.float64).reshape(-1, 2)
        v = np.frombuffer(s.v[:count], dtype=np.float64).reshape(-1, 2)
        with warnings.catch_warnings():  # a pair of NaNs (a metric that was unreadable) stays NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            mean_v = np.nanmean(v, axis=1)
        with self._cut_lock:
            s.t[:count] = array("d", t.mean(axis=1).tobytes())
            s.v[:count] = array("d", mean_v.tobytes())
            s.base += count // 2

    @property
    def folded(self) -> FoldedSteps | None:
        """Steps folded out of the spans to bound memory (None until the first fold)."""
        with self._cut_lock:
            return self._folded.view() if self._folded is not None else None

    @property
    def fold_point(self) -> tuple[str, float] | None:
        """(boundary kind, end of the last folded step), without copying the folded rows."""
        folded = self._folded
        return (folded.kind, folded.until) if folded is not None else None

    def unfolded(self) -> Timeline:
        """This timeline with every span it recorded: itself, or, where old steps were folded out of
        memory, the one its record (the spool, which has every span and sample) holds."""
        if self._folded is None or self.record is None:
            return self
        return Timeline.load(self.record)

    @property
    def span_base(self) -> int:
        """The logical index of the first span held (the count of spans folded away)."""
        return self._span_base

    def raw_span_count(self) -> int:
        """Spans still held as spans (not folded)."""
        return len(self._span_depth)

    def sample_count(self, metric: str) -> int:
        """Samples of a series so far, counting those averaged or folded away (a logical index)."""
        s = self._series.get(metric)
        return 0 if s is None else s.base + min(len(s.t), len(s.v))

    def sample_base(self, metric: str) -> int:
        """The logical index of a series' first sample held (samples averaged or folded away before it)."""
        s = self._series.get(metric)
        return 0 if s is None else s.base

    # -- reading ---------------------------------------------------------

    @property
    def span_count(self) -> int:
        """Spans recorded so far, folded ones included: the logical index of the next span."""
        # add_span appends the depth column last: a span another thread is adding has no depth yet
        return self._span_base + len(self._span_depth)

    def span_times(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(starts, ends) of the spans at logical ``index`` (none folded), without copying the others."""
        with self._cut_lock:
            n, at = len(self._span_depth), np.asarray(index) - self._span_base
            return _snapshot(self._span_start, n, np.float64)[at], _snapshot(self._span_end, n, np.float64)[
                at
            ]

    @property
    def span_names(self) -> list[str]:
        """The names spans use (interned; a name may have no span yet)."""
        return list(self._names)

    @property
    def spans(self) -> Spans:
        """The spans held (those of folded steps are in ``folded``)."""
        with self._cut_lock:
            n = len(self._span_depth)
            return Spans(
                names=list(self._names),
                name_id=_snapshot(self._span_name, n, np.int32),
                start=_snapshot(self._span_start, n, np.float64),
                end=_snapshot(self._span_end, n, np.float64),
                depth=_snapshot(self._span_depth, n, np.int8),
            )

    def spans_since(self, index: int) -> tuple[int, Spans]:
        """The spans from logical ``index`` on, copying only those, and the logical index of the first
        (later than ``index`` where spans were folded away since)."""
        with self._cut_lock:
            n = len(self._span_depth)
            lo = min(max(index - self._span_base, 0), n)
            return self._span_base + lo, Spans(
                names=list(self._names),
                name_id=np.frombuffer(self._span_name[lo:n], dtype=np.int32),
                start=np.frombuffer(self._span_start[lo:n], dtype=np.float64),
                end=np.frombuffer(self._span_end[lo:n], dtype=np.float64),
                depth=np.frombuffer(self._span_depth[lo:n], dtype=np.int8),
            )

    @property
    def metrics(self) -> list[str]:
        with self._lock:
            return sorted(self._series)

    def series(self, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """(times, values) of one metric; empty arrays when it was never sampled."""
        s = self._series.get(metric)
        if s is None:
            empty = np.zeros(0)
            return empty, empty
        with self._cut_lock:
            n = min(len(s.t), len(s.v))
            return _snapshot(s.t, n, np.float64), _snapshot(s.v, n, np.float64)

    def last(self, metric: str, n: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """The last ``n`` samples of a metric, without copying its history (live views poll this)."""
        s = self._series.get(metric)
        if s is None:
            empty = np.zeros(0)
            return empty, empty
        with self._cut_lock:
            end = min(len(s.t), len(s.v))
            begin = max(0, end - n)
            return np.array(s.t[begin:end], dtype=np.float64), np.array(s.v[begin:end], dtype=np.float64)

    def marks(self, name: str | None = None) -> list[Mark]:
        return [m for m in list(self._marks) if name is None or m.name == name]

    def rebase(self, epoch: float) -> None:
        """Move every time onto the clock whose origin is the wall-clock time ``epoch``.

        Timelines of several processes (``perfmagic run``) start at different
        instants; rebased onto one epoch, their times can be compared directly.
        """
        own = self.meta.get("epoch")
        if own is None:
            raise ValueError("a timeline without meta['epoch'] cannot be rebased")
        shift = float(own) - float(epoch)
        for column in (self._span_start, self._span_end, *(s.t for s in self._series.values())):
            np.frombuffer(column, dtype=np.float64)[:] += shift  # in place, on the array's own buffer
        folded = self._folded
        if folded is not None:
            folded.chunks = [replace(c, until=c.until + shift, start=c.start + shift) for c in folded.chunks]
            folded.until += shift
        self._marks = [Mark(m.t + shift, m.name, m.data) for m in self._marks]
        self.meta["epoch"] = float(epoch)
        for key in ("wall_s", "ready_s"):  # times on the timeline's clock kept in its meta
            if self.meta.get(key) is not None:
                self.meta[key] = float(self.meta[key]) + shift

    # -- persistence -----------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the whole timeline as JSON lines."""
        with open(path, "w", encoding="utf-8") as f:
            folded = self.folded
            if folded is not None:
                f.write(json.dumps(_steps_record(folded)) + "\n")
            Spooler(self, f).flush()

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Timeline:
        """Read a saved timeline or a spool, tolerating a torn last line and skipping unreadable ones
        (said in the timeline's warnings); a file with no record at all is a :class:`TimelineFormatError`."""
        p = Path(path)
        if p.is_dir():
            p = p / SPOOL_NAME
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise TimelineFormatError(f"cannot read timeline {p}: {e.strerror}") from e
        timeline = cls()
        skipped: list[int] = []
        applied = 0
        for lineno, record in _records(text, p, skipped):
            try:
                timeline._apply(record)
            except (KeyError, TypeError, ValueError, OverflowError):
                skipped.append(lineno)
            else:
                applied += 1
        if not applied:
            raise TimelineFormatError(f"{p}: not a timeline: no readable record")
        if skipped:
            timeline.meta.setdefault("warnings", []).append(
                f"{p.name}: {len(skipped)} unreadable line(s) skipped (line {', '.join(map(str, skipped[:5]))}"
                f"{', ...' if len(skipped) > 5 else ''}): the record around them is kept"
            )
        return timeline

    def _apply(self, record: dict[str, Any]) -> None:
        kind = record["type"]
        if kind == "meta":
            self.meta.update(record["meta"])
        elif kind == "spans":
            # every column checked before any grows: a bad record must not leave them of unequal length
            names = record["names"]
            packed = record.get("packed")
            if packed is not None:
                ids, starts, ends = (
                    _unpacked(packed["name"], "i"),
                    _unpacked(packed["start"], "d"),
                    _unpacked(packed["end"], "d"),
                )
                depths = _unpacked(packed["depth"], "b")
            else:  # plain lists (spools written before columns were packed)
                ids, starts, ends = (
                    array("i", record["name"]),
                    array("d", record["start"]),
                    array("d", record["end"]),
                )
                depths = array("b", record["depth"])
            name_ids = array("i", [self.name_id(names[i]) for i in ids])
            if not len(name_ids) == len(starts) == len(ends) == len(depths):
                raise ValueError("span columns of different lengths")
            self._span_name.extend(name_ids)
            self._span_start.extend(starts)
            self._span_end.extend(ends)
            self._span_depth.extend(depths)
        elif kind == "samples":
            packed = record.get("packed")
            if packed is not None:
                columns = {m: (_unpacked(t, "d"), _unpacked(v, "d")) for m, (t, v) in packed.items()}
            else:  # plain lists, NaN as null
                columns = {
                    m: (array("d", ts), array("d", [math.nan if v is None else v for v in vs]))
                    for m, (ts, vs) in record["series"].items()
                }
            for metric, (ts, vs) in columns.items():
                if len(ts) != len(vs):
                    raise ValueError(f"{metric}: times and values of different lengths")
                s = self._series.setdefault(metric, _Series())
                s.t.extend(ts)
                s.v.extend(vs)
        elif kind == "steps":
            steps = record["steps"]
            rows = FoldedSteps(
                kind=str(steps["kind"]),
                until=float(steps["until"]),
                **{
                    k: np.array(steps[k], dtype=np.float64)
                    for k in ("start", "duration", "cpu_s", "wait_s", "gc_s")
                },
                stages={str(k): np.array(v, dtype=np.float64) for k, v in steps["stages"].items()},
            )
            if not all(len(c) == len(rows) for c in (rows.duration, rows.cpu_s, *rows.stages.values())):
                raise ValueError("step columns of different lengths")
            if self._folded is None:
                self._folded = _FoldedColumns(rows.kind)
            self._folded.extend(rows)
        elif kind == "marks":
            self._marks.extend(Mark(m["t"], m["name"], m.get("data", {})) for m in record["marks"])
        else:
            raise ValueError(f"unknown record type {kind!r}")


def _records(text: str, path: Path, skipped: list[int]) -> Iterator[tuple[int, dict[str, Any]]]:
    """The records of a JSON-lines timeline; line numbers of lines that are none go to ``skipped``."""
    lines = text.split("\n")
    complete = text.endswith("\n")
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            last = lineno == len(lines) or (lineno == len(lines) - 1 and not complete)
            if not last:  # a process killed mid-write leaves one torn last line: no news
                skipped.append(lineno)
            continue
        if not isinstance(record, dict) or "type" not in record:
            skipped.append(lineno)
            continue
        yield lineno, record


class Spooler:
    """Appends what a timeline gained since the last flush to a JSON-lines file.

    Each flush writes whole lines and flushes the OS buffer, so a process that
    dies leaves every earlier chunk readable. Spans go out once they are
    ``settled`` (their times final: no device time pending), in lines of at most
    :data:`SPOOL_CHUNK` so a flush's memory stays small whatever the backlog.
    """

    def __init__(self, timeline: Timeline, file: IO[str], settled: Callable[[], int] | None = None) -> None:
        self._tl = timeline
        self._file = file
        self._settled = settled
        self._meta_written: dict[str, Any] = {}
        self._spans_sent = 0
        self._samples_sent: dict[str, int] = {}
        self._marks_sent = 0
        self._lock = threading.Lock()

    @property
    def spans_sent(self) -> int:
        """Spans (logical index) on disk so far."""
        return self._spans_sent

    def samples_sent(self, metric: str) -> int:
        """Samples of a series (logical index) on disk so far."""
        return self._samples_sent.get(metric, 0)

    def flush(self) -> None:
        with self._lock:
            self._flush()

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, default=_jsonable) + "\n")

    def _flush(self) -> None:
        tl = self._tl
        # list() copies in one step: the profiled thread may add keys while this runs on the sampler's
        meta = {k: v for k, v in list(tl.meta.items()) if self._meta_written.get(k, _MISSING) != v}
        if meta:
            self._write({"type": "meta", "meta": meta})
            self._meta_written.update(meta)

        # copies taken under the lock (no fold cuts the columns meanwhile), written out after it
        with tl._cut_lock:
            base, held = tl._span_base, len(tl._span_depth)
            n = base + held if self._settled is None else min(base + held, self._settled())
            a = max(self._spans_sent, base)
            span_columns = [
                c[a - base : n - base] for c in (tl._span_name, tl._span_start, tl._span_end, tl._span_depth)
            ]
            names = list(tl._names)
            with tl._lock:
                items = list(tl._series.items())
            samples: dict[str, tuple[array[float], array[float]]] = {}
            for metric, s in items:
                i = max(self._samples_sent.get(metric, 0), s.base) - s.base
                j = min(len(s.t), len(s.v))
                if j > i:
                    samples[metric] = (s.t[i:j], s.v[i:j])
                    self._samples_sent[metric] = s.base + j
        self._spans_sent = max(self._spans_sent, n)
        for i in range(0, len(span_columns[0]), SPOOL_CHUNK):
            name, start, end, depth = (_packed(c[i : i + SPOOL_CHUNK]) for c in span_columns)
            self._write(
                {
                    "type": "spans",
                    "names": names,
                    "packed": {"name": name, "start": start, "end": end, "depth": depth},
                }
            )
        for i in range(0, max((len(t) for t, _ in samples.values()), default=0), SPOOL_CHUNK):
            # a line holds each series' next chunk: a per-step series may have a long backlog
            chunk = {
                metric: (_packed(t[i : i + SPOOL_CHUNK]), _packed(v[i : i + SPOOL_CHUNK]))
                for metric, (t, v) in samples.items()
                if len(t) > i
            }
            self._write({"type": "samples", "packed": chunk})

        m = len(tl._marks)
        if m > self._marks_sent:
            marks = tl._marks[self._marks_sent : m]
            self._write(
                {"type": "marks", "marks": [{"t": k.t, "name": k.name, "data": k.data} for k in marks]}
            )
            self._marks_sent = m
        self._file.flush()


SPOOL_CHUNK = 32768
"""Most spans in one line of a spool."""

_BIG_ENDIAN = sys.byteorder == "big"


def _packed(column: array[Any]) -> str:
    """A column as base64 of its little-endian bytes."""
    if _BIG_ENDIAN:
        column = array(column.typecode, column)
        column.byteswap()
    return base64.b64encode(column.tobytes()).decode("ascii")


def _unpacked(text: str, typecode: str) -> array[Any]:
    """The column :func:`_packed` wrote (ValueError where the text is no such column)."""
    raw = base64.b64decode(text, validate=True)
    column = array(typecode)
    if len(raw) % column.itemsize:
        raise ValueError(f"{len(raw)} bytes are no whole number of {typecode!r} values")
    column.frombytes(raw)
    if _BIG_ENDIAN:
        column.byteswap()
    return column


def _steps_record(rows: FoldedSteps) -> dict[str, Any]:
    return {
        "type": "steps",
        "steps": {
            "kind": rows.kind,
            "until": rows.until,
            **{k: getattr(rows, k).tolist() for k in ("start", "duration", "cpu_s", "wait_s", "gc_s")},
            "stages": {k: v.tolist() for k, v in rows.stages.items()},
        },
    }


_MISSING = object()


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return repr(value)


def _snapshot(column: array[Any], n: int, dtype: type[np.generic]) -> np.ndarray:
    """The first ``n`` values of a column another thread may be appending to, as a new numpy array.

    A slice copies the column while holding the GIL, so no buffer of the live column is ever
    exported: a numpy view of it (``np.frombuffer``) would make the writer's next append raise
    ``BufferError`` in the training thread.
    """
    return np.frombuffer(column[:n], dtype=dtype)
