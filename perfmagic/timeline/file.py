"""A timeline on disk: one JSON-lines format for the spool written while profiling and the saved file.

The spool is crash-safe: each flush writes whole lines, and a reader takes every complete line and
ignores a torn last one. Span and sample columns go in packed (base64 of their little-endian bytes:
exact, and written tens of times faster than numbers in JSON, which the spool thread would otherwise
take from the training loop); a reader also takes plain lists.
"""

from __future__ import annotations

import base64
import json
import math
import os
import sys
import threading
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from perfmagic.schema import RECORDING
from perfmagic.timeline import Mark, SpoolCursor, Timeline
from perfmagic.timeline.folds import FoldedSteps

SPOOL_NAME = "timeline.jsonl"

SPOOL_CHUNK = 32768
"""Most spans in one line of a spool."""

_BIG_ENDIAN = sys.byteorder == "big"
_RECORDING_MARK = "recording"


class TimelineFormatError(ValueError):
    """A timeline file that cannot be read."""


def write_timeline(timeline: Timeline, path: str | os.PathLike[str]) -> None:
    """Write the whole timeline as JSON lines."""
    with open(path, "w", encoding="utf-8") as f:
        folded = timeline.folded
        if folded is not None:
            f.write(json.dumps(_steps_record(folded)) + "\n")
        Spooler(timeline, f).flush()


def read_timeline(path: str | os.PathLike[str]) -> Timeline:
    """Read a saved timeline or a spool (a directory means its spool), tolerating a torn last line and
    skipping unreadable ones (said in the timeline's warnings); a file with no record at all is a
    :class:`TimelineFormatError`."""
    p = Path(path)
    if p.is_dir():
        p = p / SPOOL_NAME
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise TimelineFormatError(f"cannot read timeline {p}: {e.strerror}") from e
    timeline = Timeline()
    skipped: list[int] = []
    applied = 0
    for lineno, record in _records(text, skipped):
        try:
            _apply(timeline, record)
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


def unfolded(timeline: Timeline) -> Timeline:
    """The timeline with every span it recorded: itself, or, where old steps were folded out of memory,
    the one its record (the spool, which has every span and sample) holds."""
    if timeline.fold_point is None or timeline.record is None:
        return timeline
    return read_timeline(timeline.record)


def _apply(timeline: Timeline, record: dict[str, Any]) -> None:
    import numpy as np

    kind = record["type"]
    if kind == "meta":
        timeline.meta.update(record["meta"])
    elif kind == "spans":
        packed = record.get("packed")
        if packed is not None:
            timeline.add_spans(
                record["names"],
                _unpacked(packed["name"], "i"),
                _unpacked(packed["start"], "d"),
                _unpacked(packed["end"], "d"),
                _unpacked(packed["depth"], "b"),
            )
        else:  # plain lists (spools written before columns were packed)
            timeline.add_spans(
                record["names"],
                array("i", record["name"]),
                array("d", record["start"]),
                array("d", record["end"]),
                array("b", record["depth"]),
            )
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
            timeline.add_samples(metric, ts, vs)
    elif kind == "steps":
        steps = record["steps"]
        timeline.add_folded(
            FoldedSteps(
                kind=str(steps["kind"]),
                until=float(steps["until"]),
                **{
                    k: np.array(steps[k], dtype=np.float64)
                    for k in ("start", "duration", "cpu_s", "wait_s", "gc_s")
                },
                stages={str(k): np.array(v, dtype=np.float64) for k, v in steps["stages"].items()},
            )
        )
    elif kind == "marks":
        marks = [Mark(m["t"], m["name"], m.get("data", {})) for m in record["marks"]]
        # records written before the changes of recording were a series held them as marks
        changes = [m for m in marks if m.name == _RECORDING_MARK]
        for m in changes:
            timeline.add_sample(RECORDING, m.t, 1.0 if m.data.get("full") else 0.0)
        timeline.add_marks(m for m in marks if m.name != _RECORDING_MARK)
    else:
        raise ValueError(f"unknown record type {kind!r}")


def _records(text: str, skipped: list[int]) -> Iterator[tuple[int, dict[str, Any]]]:
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
        self._cursor = SpoolCursor()
        self._lock = threading.Lock()

    @property
    def spans_sent(self) -> int:
        """Spans (logical index) on disk so far."""
        return self._cursor.spans

    def samples_sent(self, metric: str) -> int:
        """Samples of a series (logical index) on disk so far."""
        return self._cursor.samples.get(metric, 0)

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
        added = tl.added_since(self._cursor, None if self._settled is None else self._settled())
        self._cursor = added.cursor
        columns = added.span_columns
        for i in range(0, len(columns[0]), SPOOL_CHUNK):
            name, start, end, depth = (_packed(c[i : i + SPOOL_CHUNK]) for c in columns)
            self._write(
                {
                    "type": "spans",
                    "names": added.names,
                    "packed": {"name": name, "start": start, "end": end, "depth": depth},
                }
            )
        samples = added.samples
        for i in range(0, max((len(t) for t, _ in samples.values()), default=0), SPOOL_CHUNK):
            # a line holds each series' next chunk: a per-step series may have a long backlog
            chunk = {
                metric: (_packed(t[i : i + SPOOL_CHUNK]), _packed(v[i : i + SPOOL_CHUNK]))
                for metric, (t, v) in samples.items()
                if len(t) > i
            }
            self._write({"type": "samples", "packed": chunk})
        if added.marks:
            marks = [{"t": k.t, "name": k.name, "data": k.data} for k in added.marks]
            self._write({"type": "marks", "marks": marks})
        self._file.flush()


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
    np = sys.modules.get("numpy")  # no value is numpy's where numpy was never imported
    if np is not None and isinstance(value, np.generic):
        return value.item()
    if np is not None and isinstance(value, np.ndarray):
        return value.tolist()
    return repr(value)
