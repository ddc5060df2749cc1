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
file: a reader takes every complete line and ignores a torn last one.
"""

from __future__ import annotations

import json
import os
import threading
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

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
    __slots__ = ("t", "v")

    def __init__(self) -> None:
        self.t = array("d")
        self.v = array("d")


class Timeline:
    """Spans, samples and marks of one process over one window."""

    def __init__(self, meta: dict[str, Any] | None = None) -> None:
        self.meta: dict[str, Any] = dict(meta or {})
        self._names: list[str] = []
        self._name_ids: dict[str, int] = {}
        self._span_name = array("i")
        self._span_start = array("d")
        self._span_end = array("d")
        self._span_depth = array("b")
        self._series: dict[str, _Series] = {}
        self._marks: list[Mark] = []
        self._lock = threading.Lock()

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

    def set_span_times(self, index: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        """Move the spans at ``index`` to new times (a recorder that learns its device times later)."""
        np.frombuffer(self._span_start, dtype=np.float64)[index] = start
        np.frombuffer(self._span_end, dtype=np.float64)[index] = end

    def add_sample(self, metric: str, t: float, value: float) -> None:
        series = self._series.get(metric)
        if series is None:
            with self._lock:
                series = self._series.setdefault(metric, _Series())
        series.t.append(t)
        series.v.append(value)

    def add_mark(self, t: float, name: str, **data: Any) -> None:
        self._marks.append(Mark(t, name, data))

    # -- reading ---------------------------------------------------------

    @property
    def span_count(self) -> int:
        """Spans recorded so far, without copying them (``spans`` copies)."""
        # add_span appends the depth column last: a span another thread is adding has no depth yet
        return len(self._span_depth)

    def span_times(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(starts, ends) of the spans at ``index``, without copying the others."""
        n = self.span_count
        return _snapshot(self._span_start, n, np.float64)[index], _snapshot(self._span_end, n, np.float64)[
            index
        ]

    @property
    def span_names(self) -> list[str]:
        """The names spans use (interned; a name may have no span yet)."""
        return list(self._names)

    @property
    def spans(self) -> Spans:
        n = self.span_count
        return Spans(
            names=list(self._names),
            name_id=_snapshot(self._span_name, n, np.int32),
            start=_snapshot(self._span_start, n, np.float64),
            end=_snapshot(self._span_end, n, np.float64),
            depth=_snapshot(self._span_depth, n, np.int8),
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
        n = min(len(s.t), len(s.v))
        return _snapshot(s.t, n, np.float64), _snapshot(s.v, n, np.float64)

    def last(self, metric: str, n: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """The last ``n`` samples of a metric, without copying its history (live views poll this)."""
        s = self._series.get(metric)
        if s is None:
            empty = np.zeros(0)
            return empty, empty
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
        self._marks = [Mark(m.t + shift, m.name, m.data) for m in self._marks]
        self.meta["epoch"] = float(epoch)
        if self.meta.get("wall_s") is not None:
            self.meta["wall_s"] = float(self.meta["wall_s"]) + shift

    # -- persistence -----------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the whole timeline as JSON lines."""
        with open(path, "w", encoding="utf-8") as f:
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
            name_ids = array("i", [self.name_id(names[i]) for i in record["name"]])
            starts, ends = array("d", record["start"]), array("d", record["end"])
            depths = array("b", record["depth"])
            if not len(name_ids) == len(starts) == len(ends) == len(depths):
                raise ValueError("span columns of different lengths")
            self._span_name.extend(name_ids)
            self._span_start.extend(starts)
            self._span_end.extend(ends)
            self._span_depth.extend(depths)
        elif kind == "samples":
            for metric, (ts, vs) in record["series"].items():
                s = self._series.setdefault(metric, _Series())
                s.t.extend(ts)
                s.v.extend(float("nan") if v is None else v for v in vs)
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
    dies leaves every earlier chunk readable.
    """

    def __init__(self, timeline: Timeline, file: IO[str]) -> None:
        self._tl = timeline
        self._file = file
        self._meta_written: dict[str, Any] = {}
        self._names_sent = 0
        self._spans_sent = 0
        self._samples_sent: dict[str, int] = {}
        self._marks_sent = 0
        self._lock = threading.Lock()

    def flush(self) -> None:
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        tl = self._tl
        out: list[dict[str, Any]] = []
        # list() copies in one step: the profiled thread may add keys while this runs on the sampler's
        meta = {k: v for k, v in list(tl.meta.items()) if self._meta_written.get(k, _MISSING) != v}
        if meta:
            out.append({"type": "meta", "meta": meta})
            self._meta_written.update(meta)

        n = tl.span_count
        if n > self._spans_sent:
            a = self._spans_sent
            names = list(tl._names)
            out.append(
                {
                    "type": "spans",
                    "names": names,
                    "name": tl._span_name[a:n].tolist(),
                    "start": tl._span_start[a:n].tolist(),
                    "end": tl._span_end[a:n].tolist(),
                    "depth": tl._span_depth[a:n].tolist(),
                }
            )
            self._spans_sent = n

        series: dict[str, tuple[list[float], list[float | None]]] = {}
        with tl._lock:
            items = list(tl._series.items())
        for metric, s in items:
            a = self._samples_sent.get(metric, 0)
            b = min(len(s.t), len(s.v))
            if b > a:
                series[metric] = (s.t[a:b].tolist(), [None if v != v else v for v in s.v[a:b]])
                self._samples_sent[metric] = b
        if series:
            out.append({"type": "samples", "series": series})

        m = len(tl._marks)
        if m > self._marks_sent:
            marks = tl._marks[self._marks_sent : m]
            out.append(
                {"type": "marks", "marks": [{"t": k.t, "name": k.name, "data": k.data} for k in marks]}
            )
            self._marks_sent = m

        if out:
            self._file.write("".join(json.dumps(r, default=_jsonable) + "\n" for r in out))
            self._file.flush()


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
