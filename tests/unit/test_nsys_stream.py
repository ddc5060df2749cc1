"""A capture's GPU events streamed in start order give the figures that its events read whole give.

``perfmagic report`` streams a capture's GPU events from SQLite into the ``gpu`` section's tally and
keeps few events; :func:`read_capture` without a tally keeps every event, whose figures are computed
from the arrays in one go. Both must say the same, whatever the chunks the stream is cut into.
"""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from nsys_capture import Loop, write_capture

from perfmagic.analyze import spill
from perfmagic.analyze.gpu import summary, trace_gpu
from perfmagic.analyze.gpu_tally import GpuTally
from perfmagic.traces import nsys_columns
from perfmagic.traces.events import GpuChunk
from perfmagic.traces.nsys import read_capture
from perfmagic.traces.nsys_columns import Filled
from perfmagic.traces.stages import trace_timeline

KERNEL, MEMCPY = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"


def _busy_capture(path: Path, ns: bool, processes: int = 1) -> Path:
    """A training loop's capture made harder: kernels on three streams, some moved to overlap the one before
    and some onto a shared start, copies of every direction, memsets, stalls and all-reduces."""
    loop = Loop(steps=10, sync_copies=True, stall_every=3, allreduce_us=80.0, pageable=False)
    write_capture(path, loop, repeat=2, processes=processes)
    with sqlite3.connect(path) as db:
        db.execute(f"UPDATE {KERNEL} SET streamId = 7 + rowid % 3")
        db.execute(f"UPDATE {KERNEL} SET start = start - 12000, end = end - 4000 WHERE rowid % 5 = 0")
        db.execute(f"UPDATE {KERNEL} SET start = start - start % 50000 WHERE rowid % 7 = 0")
        db.execute(f"UPDATE {MEMCPY} SET srcKind = 0 WHERE copyKind = 1 AND rowid % 2 = 0")  # pageable
        db.execute(
            f"UPDATE {MEMCPY} SET copyKind = 8, srcKind = 2, dstKind = 2 WHERE copyKind = 2 AND rowid % 3 = 0"
        )
        if ns:  # fractions of a microsecond: counted in whole microseconds, as HTA does
            db.execute(f"UPDATE {KERNEL} SET start = start + 123, end = end + 456 WHERE rowid % 11 = 0")
    return path


def _same(a: Any, b: Any, where: str = "") -> None:
    """Equal, floats to 1e-9 of each other (sums taken chunk by chunk)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), f"{where}: {a} != {b}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.mark.parametrize("ns", [False, True], ids=["us", "ns"])
@pytest.mark.parametrize("rows", [65536, 7], ids=["one-chunk", "7-row-chunks"])
def test_streamed_figures_equal_the_whole_arrays_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ns: bool, rows: int
) -> None:
    path = _busy_capture(tmp_path / "busy.sqlite", ns)
    (whole,) = read_capture(path)
    assert len(np.unique(whole.gpu.stream)) == 3 and whole.ns_resolution == ns
    names = {whole.gpu.names[i].split(" (")[0] for i in np.unique(whole.gpu.name_id)}
    assert {"Memcpy HtoD", "Memcpy DtoH", "Memcpy DtoD", "Memset"} <= names
    monkeypatch.setattr(nsys_columns, "CHUNK_ROWS", rows)
    monkeypatch.setattr(spill, "SPILL_VALUES", 100)  # the launch delays and calls spilled to a file
    (streamed,) = read_capture(path, None, GpuTally)
    assert streamed.gpu_figures is not None and len(streamed.gpu) < len(whole.gpu) / 10
    want, got = trace_gpu(whole), trace_gpu(streamed)
    assert want is not None and got is not None
    assert want["launches"] is not None and want["launches"]["delay_p90_s"] > 0
    assert want["comm"] is not None and want["gaps"]["count"] > 0
    _same(want, got)
    _same(trace_timeline(whole, 0).meta, trace_timeline(streamed, 0).meta)


def test_each_process_streams_into_its_own_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _busy_capture(tmp_path / "two.sqlite", False, processes=2)
    wholes = read_capture(path)
    monkeypatch.setattr(nsys_columns, "CHUNK_ROWS", 50)
    streams = read_capture(path, None, GpuTally)
    assert [t.rank for t in streams] == [0, 1]
    for whole, streamed in zip(wholes, streams, strict=True):
        _same(trace_gpu(whole), trace_gpu(streamed))
        _same(trace_timeline(whole, 0).meta, trace_timeline(streamed, 0).meta)


def _chunk(start: list[float], end: list[float], launch: list[float], streams: list[int]) -> GpuChunk:
    n = len(start)
    return GpuChunk(
        name_id=np.zeros(n, np.int32), kind=np.zeros(n, np.int8), start=np.array(start, float),
        dur=np.array(end, float) - np.array(start, float), device=np.zeros(n, np.int64),
        stream=np.array(streams, np.int64), launch=np.array(launch, float), bytes=np.zeros(n),
        launch_name=np.full(n, -1, np.int32), launch_dur=np.full(n, np.nan),
    )  # fmt: skip


def test_a_gap_is_classified_by_the_first_event_after_it_though_a_chunk_cuts_between_ties() -> None:
    # the gap 0-100 µs ends with two events at 100 µs: the one that ends first (launched at 0, before the
    # gap: not the host's wait) comes in the second chunk
    whole = GpuTally(["k"], None, False)
    whole.add(_chunk([0.0, 100.0, 100.0], [0.5, 200.0, 110.0], [0.0, 50.0, 0.0], [0, 1, 2]), final=True)
    cut = GpuTally(["k"], None, False)
    cut.add(_chunk([0.0, 100.0], [0.5, 200.0], [0.0, 50.0], [0, 1]))
    cut.add(_chunk([100.0], [110.0], [0.0], [2]), final=True)
    want, got = summary(whole), summary(cut)
    assert want is not None and want["idle_breakdown"] == {"host_wait": 0.0, "kernel_wait": 0.0, "other": 1.0}
    assert got == want


def test_kept_columns_grow_past_their_first_capacity() -> None:
    rows = Filled(2, (np.int32, np.float64))
    for k in range(5):
        rows.add(np.full(k, k, np.int32), np.arange(k, dtype=np.float64))
    ids, values = rows.done()
    assert ids.tolist() == [1, 2, 2, 3, 3, 3, 4, 4, 4, 4]
    assert values.tolist() == [0, 0, 1, 0, 1, 2, 0, 1, 2, 3]
