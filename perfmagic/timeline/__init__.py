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
training loop's hot path) and readers get numpy views. :mod:`perfmagic.timeline.file`
writes and reads it on disk.

Memory stays bounded on long runs: the analysis folds the spans of old steps
into per-step rows (:class:`FoldedSteps`, about 30 bytes a step) once the spool
holds them, and old samples of a long series are averaged in pairs. The thread
that writes spans applies a fold between two of its own appends
(:meth:`Timeline.apply_fold`), so the hot path takes no lock.
"""

from __future__ import annotations

import threading
import warnings
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfmagic.timeline.folds import Fold, FoldedColumns, FoldedSteps

if TYPE_CHECKING:
    import numpy as np

    from perfmagic.contract import TimelineMeta


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
        self._sealed: tuple[np.ndarray, ...] | None = None  # read-only views of the span columns (``seal``)
        self._series: dict[str, _Series] = {}
        self._marks: list[Mark] = []
        self._folded: FoldedColumns | None = None
        self.record: Path | None = None  # a file with every span and sample (the spool), where there is one
        # queued for the writer to apply (``request_fold``); an attribute the writer reads at every step
        self.pending_fold: Fold | None = None
        self._lock = threading.Lock()
        # held by readers of span and sample columns; the writer thread applies a fold only when it can
        # take it at once, so a reader never sees columns cut half-way and the writer never waits
        self._cut_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        """Everything but the locks: a worker process hands its timeline back pickled."""
        return {k: v for k, v in vars(self).items() if k not in ("_lock", "_cut_lock", "_sealed")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self._sealed = None  # a copy reads copies: its columns may grow again
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

    def add_instants(self, name_id: int, times: list[float]) -> None:
        """Step boundaries at ``times``, written together (spans of no length, depth -1, depth last)."""
        self._span_name.extend(array("i", (name_id,)) * len(times))
        self._span_start.extend(times)
        self._span_end.extend(times)
        self._span_depth.extend(array("b", (-1,)) * len(times))

    def seal(self) -> None:
        """No span will be added: from now on ``spans`` hands out read-only views of the columns, not a
        copy per read (a capture's timeline holds millions of spans, and the analysis reads them often).
        Adding or folding spans after this raises ``BufferError``."""
        import numpy as np

        columns = (
            (self._span_name, np.int32),
            (self._span_start, np.float64),
            (self._span_end, np.float64),
            (self._span_depth, np.int8),
        )
        with self._cut_lock:
            self._sealed = tuple(_read_only(np.frombuffer(c, dtype=t)) for c, t in columns)

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
        import numpy as np

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
                self._folded = FoldedColumns(fold.steps.kind)
            self._folded.extend(fold.steps)
        finally:
            self._cut_lock.release()
        return True

    def thin(self, metric: str, count: int) -> None:
        """Average the first ``count`` samples of a series in pairs (called by the thread that samples it)."""
        import numpy as np

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
        import numpy as np

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
        import numpy as np

        if self._sealed is not None:
            return Spans(list(self._names), *self._sealed)
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
        import numpy as np

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
        import numpy as np

        s = self._series.get(metric)
        if s is None:
            empty = np.zeros(0)
            return empty, empty
        with self._cut_lock:
            n = min(len(s.t), len(s.v))
            return _snapshot(s.t, n, np.float64), _snapshot(s.v, n, np.float64)

    def last(self, metric: str, n: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """The last ``n`` samples of a metric, without copying its history (live views poll this)."""
        import numpy as np

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

    def samples_since(self, metric: str, index: int) -> tuple[int, np.ndarray, np.ndarray]:
        """A series' samples from the logical ``index`` on (but those averaged or folded away since) and
        the index after them: a live reader looks at the new ones only."""
        import numpy as np

        s = self._series.get(metric)
        if s is None:
            return index, np.zeros(0), np.zeros(0)
        with self._cut_lock:
            end = min(len(s.t), len(s.v))
            begin = min(max(0, index - s.base), end)
            t, v = np.array(s.t[begin:end], dtype=np.float64), np.array(s.v[begin:end], dtype=np.float64)
            return s.base + end, t, v

    def rebase(self, epoch: float) -> None:
        """Move every time onto the clock whose origin is the wall-clock time ``epoch``.

        Timelines of several processes (``perfmagic run``) start at different
        instants; rebased onto one epoch, their times can be compared directly.
        """
        import numpy as np

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

    # -- what was added, for the spool ------------------------------------

    def added_since(self, cursor: SpoolCursor, settled: int | None = None) -> Additions:
        """What the timeline gained since ``cursor``: spans up to logical index ``settled`` (their times
        final), samples and marks. Copies are taken under the lock, so no fold cuts a column meanwhile."""
        with self._cut_lock:
            base, held = self._span_base, len(self._span_depth)
            n = base + held if settled is None else min(base + held, settled)
            a = max(cursor.spans, base)
            lo, hi = a - base, n - base
            columns = (
                self._span_name[lo:hi],
                self._span_start[lo:hi],
                self._span_end[lo:hi],
                self._span_depth[lo:hi],
            )
            names = list(self._names)
            with self._lock:
                items = list(self._series.items())
            samples: dict[str, tuple[array[float], array[float]]] = {}
            sample_ends: dict[str, int] = {}
            for metric, s in items:
                i = max(cursor.samples.get(metric, 0), s.base) - s.base
                j = min(len(s.t), len(s.v))
                if j > i:
                    samples[metric] = (s.t[i:j], s.v[i:j])
                    sample_ends[metric] = s.base + j
        marks = self._marks[cursor.marks : len(self._marks)]
        after = SpoolCursor(
            max(cursor.spans, n), {**cursor.samples, **sample_ends}, cursor.marks + len(marks)
        )
        return Additions(names, columns, samples, marks, after)

    # -- adding what a file holds ------------------------------------------

    def add_spans(
        self, names: list[str], ids: array[int], starts: array[float], ends: array[float], depths: array[int]
    ) -> None:
        """Append spans whose names are ``names[id]``; every column is checked before any grows."""
        name_ids = array("i", [self.name_id(names[i]) for i in ids])
        if not len(name_ids) == len(starts) == len(ends) == len(depths):
            raise ValueError("span columns of different lengths")
        self._span_name.extend(name_ids)
        self._span_start.extend(starts)
        self._span_end.extend(ends)
        self._span_depth.extend(depths)

    def add_samples(self, metric: str, times: array[float], values: array[float]) -> None:
        if len(times) != len(values):
            raise ValueError(f"{metric}: times and values of different lengths")
        s = self._series.setdefault(metric, _Series())
        s.t.extend(times)
        s.v.extend(values)

    def add_folded(self, rows: FoldedSteps) -> None:
        """Append steps folded before the timeline was saved."""
        if not all(len(c) == len(rows) for c in (rows.duration, rows.cpu_s, *rows.stages.values())):
            raise ValueError("step columns of different lengths")
        if self._folded is None:
            self._folded = FoldedColumns(rows.kind)
        self._folded.extend(rows)

    def add_marks(self, marks: Iterable[Mark]) -> None:
        self._marks.extend(marks)


@dataclass(frozen=True)
class SpoolCursor:
    """How much of a timeline a spool holds: spans and each series' samples (logical indices), marks."""

    spans: int = 0
    samples: dict[str, int] = field(default_factory=dict)
    marks: int = 0


@dataclass(frozen=True)
class Additions:
    """What a timeline gained since a :class:`SpoolCursor`, and the cursor after it."""

    names: list[str]
    span_columns: tuple[array[int], array[float], array[float], array[int]]  # name id, start, end, depth
    samples: dict[str, tuple[array[float], array[float]]]
    marks: list[Mark]
    cursor: SpoolCursor


def _snapshot(column: array[Any], n: int, dtype: type[np.generic]) -> np.ndarray:
    """The first ``n`` values of a column another thread may be appending to, as a new numpy array.

    A slice copies the column while holding the GIL, so no buffer of the live column is ever
    exported: a numpy view of it (``np.frombuffer``) would make the writer's next append raise
    ``BufferError`` in the training thread.
    """
    import numpy as np

    return np.frombuffer(column[:n], dtype=dtype)


def _read_only(values: np.ndarray) -> np.ndarray:
    values.flags.writeable = False
    return values
