"""The timeline: columnar spans, samples and marks; the JSON-lines spool and save/load."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from perfmagic.timeline import Timeline
from perfmagic.timeline.file import SPOOL_NAME, Spooler, TimelineFormatError, read_timeline, write_timeline


def filled() -> Timeline:
    tl = Timeline({"pid": 42, "torch": {"version": "2.13"}})
    fwd, bwd = tl.name_id("forward"), tl.name_id("backward")
    tl.add_span(fwd, 0.0, 1.0, 0)
    tl.add_span(tl.name_id("logging"), 0.5, 0.75, 1)
    tl.add_span(bwd, 1.0, 2.5, 0)
    tl.add_sample("host.cpu_util", 0.1, 0.5)
    tl.add_sample("host.cpu_util", 0.2, 0.75)
    tl.add_sample("gpu0.util", 0.1, float("nan"))
    tl.add_mark(0.3, "checkpoint", fn="torch.save", bytes=1024, seconds=np.float64(0.01))
    return tl


def assert_same(a: Timeline, b: Timeline) -> None:
    sa, sb = a.spans, b.spans
    assert [sa.name_of(i) for i in range(len(sa))] == [sb.name_of(i) for i in range(len(sb))]
    for col in ("start", "end", "depth"):
        assert getattr(sa, col).tolist() == getattr(sb, col).tolist()
    assert a.metrics == b.metrics
    for m in a.metrics:
        (ta, va), (tb, vb) = a.series(m), b.series(m)
        assert ta.tolist() == tb.tolist()
        np.testing.assert_array_equal(va, vb)  # NaN == NaN here
    assert [(k.t, k.name, k.data) for k in a.marks()] == [(k.t, k.name, k.data) for k in b.marks()]


def test_interned_names_and_columnar_views() -> None:
    tl = filled()
    assert tl.name_id("forward") == 0 and tl.name_id("forward") == 0
    s = tl.spans
    assert len(s) == 3 and s.depth.dtype == np.int8 and s.start.dtype == np.float64
    assert s.name_of(1) == "logging"
    t, v = tl.series("host.cpu_util")
    assert t.tolist() == [0.1, 0.2] and v.tolist() == [0.5, 0.75]
    assert [len(x) for x in tl.series("never.sampled")] == [0, 0]
    assert [m.name for m in tl.marks("checkpoint")] == ["checkpoint"] and tl.marks("nothing") == []


def test_a_sealed_timeline_hands_out_its_spans_uncopied_and_takes_no_more() -> None:
    """A capture's timeline holds millions of spans, read by every step of the analysis."""
    tl = filled()
    copied = tl.spans
    tl.seal()
    first, second = tl.spans, tl.spans
    assert np.shares_memory(first.start, second.start) and not first.start.flags.writeable
    assert first.start.tolist() == copied.start.tolist() and first.names == copied.names
    with pytest.raises(BufferError):
        tl.add_span(0, 1.0, 2.0)
    with pytest.raises(ValueError):
        first.end[0] = 0.0


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    tl = filled()
    write_timeline(tl, tmp_path / "t.jsonl")
    back = read_timeline(tmp_path / "t.jsonl")
    assert_same(tl, back)
    assert back.meta == {"pid": 42, "torch": {"version": "2.13"}}
    assert math.isnan(back.series("gpu0.util")[1][0])
    assert back.marks()[0].data["seconds"] == 0.01  # numpy scalars saved as numbers


def test_spool_appends_only_what_is_new(tmp_path: Path) -> None:
    tl = Timeline({"pid": 1})
    path = tmp_path / SPOOL_NAME
    with open(path, "w", encoding="utf-8") as f:
        spool = Spooler(tl, f)
        spool.flush()
        tl.add_span(tl.name_id("data"), 0.0, 1.0, 0)
        tl.add_sample("host.rss_bytes", 0.5, 1e6)
        spool.flush()
        spool.flush()  # nothing new: no line
        lines = path.read_text().count("\n")
        tl.add_span(tl.name_id("forward"), 1.0, 2.0, 0)
        tl.add_sample("host.rss_bytes", 1.5, 2e6)
        tl.add_mark(1.5, "sync", op="item")
        tl.meta["wall_s"] = 2.0
        spool.flush()
    assert lines == 3  # meta; spans + samples
    assert_same(tl, read_timeline(tmp_path))  # a directory means its spool
    assert read_timeline(path).meta == {"pid": 1, "wall_s": 2.0}


def test_spool_skips_a_span_another_thread_is_still_adding(tmp_path: Path) -> None:
    tl = Timeline()
    path = tmp_path / SPOOL_NAME
    with open(path, "w", encoding="utf-8") as f:
        spool = Spooler(tl, f)
        tl.add_span(tl.name_id("data"), 0.0, 1.0, 0)
        # add_span is half-way through the next span: every column but depth appended
        tl._span_name.append(tl.name_id("forward"))
        tl._span_start.append(1.0)
        tl._span_end.append(2.0)
        assert len(tl.spans) == 1
        spool.flush()
        assert len(read_timeline(path).spans) == 1
        tl._span_depth.append(0)
        spool.flush()
    assert_same(tl, read_timeline(path))


def test_a_torn_last_line_is_ignored(tmp_path: Path) -> None:
    tl = filled()
    path = tmp_path / "t.jsonl"
    write_timeline(tl, path)
    text = path.read_text()
    whole = read_timeline(path)
    for cut in (len(text) - 2, len(text) - len(text.splitlines()[-1]) // 2):
        path.write_text(text[:cut])
        back = read_timeline(path)  # the last record (marks) is lost, the rest is there
        assert len(back.spans) == len(whole.spans) and back.metrics == whole.metrics
        assert back.marks() == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('["a list"]\n', "no readable record"),
        ('{"type": "teleport"}\n', "no readable record"),
        ('{"type": "spans", "names": ["a"]}\n', "no readable record"),
    ],
)
def test_corrupt_files_raise_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    with pytest.raises(TimelineFormatError, match=message):
        read_timeline(path)


def test_missing_file_raises_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TimelineFormatError, match="cannot read timeline"):
        read_timeline(tmp_path / "nothing.jsonl")


def test_rebase_puts_another_process_on_this_clock() -> None:
    tl = Timeline({"epoch": 100.0, "wall_s": 3.0})
    tl.add_span(tl.name_id("forward"), 1.0, 2.0)
    tl.add_sample("host.cpu_util", 1.5, 0.5)
    tl.add_mark(1.0, "checkpoint")
    tl.rebase(99.5)  # this process started 0.5 s after the other one
    assert (tl.spans.start[0], tl.spans.end[0]) == (1.5, 2.5)
    assert tl.series("host.cpu_util")[0].tolist() == [2.0]
    assert tl.marks()[0].t == 1.5
    assert (tl.meta["epoch"], tl.meta["wall_s"]) == (99.5, 3.5)


def test_last_reads_the_newest_samples() -> None:
    tl = Timeline()
    for i in range(5):
        tl.add_sample("host.cpu_util", float(i), i / 10)
    t, v = tl.last("host.cpu_util", 2)
    assert t.tolist() == [3.0, 4.0] and v.tolist() == [0.3, 0.4]
    assert tl.last("host.cpu_util", 9)[0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert len(tl.last("no.such.metric")[0]) == 0


def test_reading_while_another_thread_records_never_breaks_the_recording_thread() -> None:
    """The live panel reads spans and samples while the training thread adds them: the writer's append
    used to raise BufferError when a reader held a numpy view of the column."""
    import threading

    tl = Timeline()
    sid = tl.name_id("forward")
    stop = threading.Event()
    errors: list[BaseException] = []

    def read() -> None:
        while not stop.is_set():
            try:
                tl.spans, tl.series("thread.cpu_s"), tl.span_times(np.arange(min(tl.span_count, 10)))
            except BaseException as e:  # pragma: no cover - what the test looks for
                errors.append(e)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(20_000):
            tl.add_span(sid, float(i), float(i) + 0.5, 0)
            tl.add_sample("thread.cpu_s", float(i), float(i))
    finally:
        stop.set()
        reader.join()
    assert not errors and tl.span_count == 20_000


def test_a_garbage_line_in_the_middle_costs_that_line_only(tmp_path: Path) -> None:
    tl = filled()
    path = tmp_path / "t.jsonl"
    write_timeline(tl, path)
    lines = path.read_text().splitlines()
    garbage = [
        lines[0],
        '{"type": "spa',
        '["a list"]',
        '{"type": "spans", "names": ["a"], "name": [0]}',
        # packed columns that are not base64, or not whole values
        '{"type": "spans", "names": ["a"], "packed": {"name": "!!", "start": "", "end": "", "depth": ""}}',
        '{"type": "samples", "packed": {"m": ["AAAA", "AAAA"]}}',
        *lines[1:],
    ]
    path.write_text("\n".join(garbage) + "\n")
    back = read_timeline(path)
    assert len(back.spans) == len(tl.spans) and back.metrics == tl.metrics and back.marks() == tl.marks()
    (warning,) = back.meta["warnings"]
    assert warning.startswith("t.jsonl: 5 unreadable line(s) skipped (line 2, 3, 4, 5, 6)")


def test_a_spool_with_plain_number_lists_still_loads(tmp_path: Path) -> None:
    """Spools written before columns were packed: numbers in lists, NaN as null."""
    path = tmp_path / "old.jsonl"
    path.write_text(
        '{"type": "spans", "names": ["forward", "data"], "name": [1, 0], "start": [0.0, 0.25], '
        '"end": [0.25, 1.0], "depth": [0, 0]}\n'
        '{"type": "samples", "series": {"gpu0.util": [[0.1, 0.2], [null, 50.0]]}}\n'
    )
    back = read_timeline(path)
    s = back.spans
    assert [s.name_of(i) for i in range(len(s))] == ["data", "forward"]
    assert s.start.tolist() == [0.0, 0.25] and s.end.tolist() == [0.25, 1.0]
    t, v = back.series("gpu0.util")
    assert t.tolist() == [0.1, 0.2] and math.isnan(v[0]) and v[1] == 50.0


def test_spooled_columns_are_packed_and_exact(tmp_path: Path) -> None:
    tl = Timeline()
    rng = np.random.default_rng(0)
    starts = np.cumsum(rng.random(1000))  # times no short decimal writes exactly
    for a in starts:
        tl.add_span(tl.name_id("forward"), float(a), float(a) + 1 / 3, 0)
        tl.add_sample("host.cpu_util", float(a), float("nan") if a < 5 else float(a) / 7)
    write_timeline(tl, tmp_path / "t.jsonl")
    text = (tmp_path / "t.jsonl").read_text()
    assert '"packed"' in text and str(float(starts[-1])) not in text
    assert_same(tl, read_timeline(tmp_path / "t.jsonl"))
