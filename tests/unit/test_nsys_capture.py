"""Nsight Systems captures (``nsys export --type sqlite``) read as traces: real exports' totals, steps
from NVTX ranges, stage shares and Nsight's expert checks on synthetic training captures.

The real captures' totals were computed once with the sqlite3 shell on the decompressed exports; the
SQL is beside each literal.
"""

from __future__ import annotations

import gzip
import os
import sqlite3
import stat
import sys
from pathlib import Path

import numpy as np
import pytest
from nsys_capture import CLOVERLEAF, PID, SAXPY, Loop, write_capture

import perfmagic
from perfmagic.cli import main
from perfmagic.traces import TraceFormatError, nsys_columns
from perfmagic.traces.events import MEMORY
from perfmagic.traces.nsys import read_capture
from perfmagic.traces.nsys_schema import NsysSchema, open_capture

# SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL;
# SELECT copyKind, srcKind, dstKind, count(*), sum(end - start), sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY
#   GROUP BY 1, 2, 3;
# SELECT count(*), sum(end - start), sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMSET;  (no such table: 0)
# SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
#   WHERE s.value LIKE 'cudaLaunchKernel%' AND r.eventClass IN (0, 1);  (0: runtime, 1: driver; not the
#   backtrace copies of the calls, class 67)
REAL = {
    CLOVERLEAF: {
        "schema": "3.13.2",
        "kernels": (1312, 294404540),
        "htod_pageable": (254, 9346285, 225065752),
        "dtoh_pageable": (25, 44638, 51200),
        "memsets": (0, 0),
        "launches": 1312,
    },
    SAXPY: {
        "schema": "2.9.1",
        "kernels": (5, 88573480),
        "htod_pageable": (10, 186001123, 2621440000),
        "dtoh_pageable": (5, 98698477, 1310720000),
        "memsets": (0, 0),
        "launches": 5,
    },
}


def _named(trace: perfmagic.traces.KinetoTrace, prefix: str) -> np.ndarray:
    gpu = trace.gpu
    ids = [i for i, n in enumerate(gpu.names) if n.startswith(prefix)]
    return np.isin(gpu.name_id, ids)


@pytest.mark.parametrize("path", list(REAL), ids=lambda p: p.name)
def test_a_real_capture_reads_its_kernel_copy_and_memset_totals(path: Path) -> None:
    want = REAL[path]
    (trace,) = read_capture(path)
    with open_capture(path) as db:
        assert NsysSchema(db, path).version == want["schema"]
    kernels = trace.gpu.kind != MEMORY
    assert (int(kernels.sum()), trace.gpu.dur[kernels].sum()) == pytest.approx(
        (want["kernels"][0], want["kernels"][1] / 1e3)
    )
    for key, name in (("htod_pageable", "Memcpy HtoD (Pageable -> Device)"),
                      ("dtoh_pageable", "Memcpy DtoH (Device -> Pageable)")):  # fmt: skip
        rows = _named(trace, name)
        count, ns, nbytes = want[key]
        assert (int(rows.sum()), trace.gpu.dur[rows].sum(), trace.gpu.bytes[rows].sum()) == pytest.approx(
            (count, ns / 1e3, nbytes)
        )
    memsets = _named(trace, "Memset")
    assert (int(memsets.sum()), trace.gpu.dur[memsets].sum()) == want["memsets"]
    launch = trace.cpu.names.index("cudaLaunchKernel")  # without nsys's _v7000
    assert int((trace.cpu.name_id == launch).sum()) == want["launches"]
    # every GPU event was launched by a runtime call the capture holds
    assert trace.gpu.launch_row is not None and (trace.gpu.launch_row >= 0).all()


@pytest.mark.parametrize("path", list(REAL), ids=lambda p: p.name)
def test_a_real_capture_reports_its_copies_and_renders(path: Path, tmp_path: Path) -> None:
    want = REAL[path]
    report = perfmagic.load_trace(path)
    gpu = report.to_dict()["gpu"]
    count, ns, nbytes = want["htod_pageable"]
    assert gpu["h2d_copies"]["pageable"] == pytest.approx(
        {"count": count, "bytes": nbytes, "total_s": ns / 1e9}
    )
    assert gpu["h2d_copies"]["pinned"]["count"] == 0
    assert gpu["memcpy_bytes"] == {"HtoD": nbytes, "DtoH": want["dtoh_pageable"][2]}
    assert gpu["kernel_count"] == want["kernels"][0]
    page = report.to_html(tmp_path / "report.html").read_text(encoding="utf-8")
    notebook = report._repr_mimebundle_()["text/html"]
    for html in (page, notebook):
        # the GPU time bar and the top kernels table
        assert "pm-gpu-bar" in html and "pm-kernels" in html


def test_step_range_names_a_users_own_iteration_ranges_in_a_real_capture() -> None:
    # saxpy's NVTX ranges: "saxpy" around each of its 5 iterations (SELECT count(*) FROM NVTX_EVENTS
    # WHERE text = 'saxpy': 5)
    assert perfmagic.load_trace(SAXPY, step_range="^saxpy$").to_dict()["steps"]["count"] == 5
    assert perfmagic.load_trace(SAXPY).to_dict()["steps"]["count"] == 0
    with pytest.raises(TraceFormatError, match="no NVTX range matches --step-range 'train'"):
        perfmagic.load_trace(SAXPY, step_range="train")


def test_the_cli_reports_a_capture_and_exits_2_on_a_bad_one(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert main(["report", "--json", str(out), "--step-range", "^saxpy$", str(SAXPY)]) == 0
    assert '"count": 5' in out.read_text()
    bad = tmp_path / "bad.sqlite"
    bad.write_text("not a database")
    assert main(["report", str(bad)]) == 2


def _plain(tmp_path: Path, gz: Path) -> Path:
    path = tmp_path / gz.name.removesuffix(".gz")
    path.write_bytes(gzip.decompress(gz.read_bytes()))
    return path


def test_an_unknown_schema_is_an_error_naming_the_table_and_column(tmp_path: Path) -> None:
    path = _plain(tmp_path, CLOVERLEAF)
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_MEMCPY DROP COLUMN srcKind")
    db.commit()
    db.close()
    with pytest.raises(
        TraceFormatError, match=r"schema 3\.13\.2 .*table CUPTI_ACTIVITY_KIND_MEMCPY has no column srcKind"
    ):
        read_capture(path)
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(TraceFormatError, match="not an Nsight Systems export: no META_DATA_EXPORT"):
        read_capture(other)


def _stand_in_nsys(bin_dir: Path, known: Path) -> None:
    """An ``nsys`` that checks it was asked for an SQLite export and writes ``known`` where asked."""
    bin_dir.mkdir()
    script = bin_dir / "nsys"
    script.write_text(
        f"#!{sys.executable}\n"
        "import shutil, sys\n"
        "a = sys.argv[1:]\n"
        "assert a[:3] == ['export', '--type', 'sqlite'], a\n"
        "assert a[-1].endswith('.nsys-rep') and open(a[-1]).read() == 'report', a\n"
        f"shutil.copy({str(known)!r}, a[a.index('--output') + 1])\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def test_an_nsys_report_is_exported_by_nsys_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rep = tmp_path / "run.nsys-rep"
    rep.write_text("report")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(TraceFormatError, match=r"nsys is not on PATH\. .*nsys export --type sqlite"):
        read_capture(rep)
    _stand_in_nsys(tmp_path / "bin", _plain(tmp_path, SAXPY))
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + os.pathsep + os.environ["PATH"])
    (trace,) = read_capture(rep)
    assert int((trace.gpu.kind != MEMORY).sum()) == REAL[SAXPY]["kernels"][0]


def test_rows_are_read_a_chunk_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    (whole,) = read_capture(CLOVERLEAF)
    monkeypatch.setattr(nsys_columns, "CHUNK_ROWS", 97)
    (chunked,) = read_capture(CLOVERLEAF)
    for a, b in ((whole.gpu, chunked.gpu), (whole.cpu, chunked.cpu)):
        assert np.array_equal(a.start, b.start) and np.array_equal(a.dur, b.dur)
        assert [a.names[i] for i in a.name_id] == [b.names[i] for i in b.name_id]


def test_a_capture_read_in_tiny_chunks_gives_the_same_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # two processes (threads and names first met in different chunks), pageable and blocking copies,
    # memsets, syncs and all-reduces: every table spread over many chunks, runs of rows cut anywhere
    loop = Loop(pageable=True, sync_copies=True, blocking_sync=True, allreduce_us=50.0, steps=6)
    path = write_capture(tmp_path / "job.sqlite", loop, processes=2)
    with sqlite3.connect(path) as db:
        memsets = db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET").fetchone()[0]
    chunk = 5
    assert memsets > 2 * chunk  # the smallest table read in several chunks too
    whole = perfmagic.load_trace(path).to_dict()
    monkeypatch.setattr(nsys_columns, "CHUNK_ROWS", chunk)
    assert perfmagic.load_trace(path).to_dict() == whole
    assert [r["steps"]["count"] for r in whole["ranks"]] == [loop.steps, loop.steps]


# -- synthetic training captures (tests/nsys_capture.py) -------------------------------------------


def _report(tmp_path: Path, loop: Loop, step_range: str | None = None) -> dict:  # type: ignore[type-arg]
    return perfmagic.load_trace(write_capture(tmp_path / "capture.sqlite", loop), step_range).to_dict()


@pytest.mark.parametrize(
    ("loop", "step_range"),
    [
        (Loop(), None),  # perfmagic's own ranges: a step ends with each optimizer range
        (Loop(perfmagic_ranges=False, profiler_steps=True), None),
        (Loop(perfmagic_ranges=False), "^train_iter$"),
    ],
    ids=["perfmagic", "ProfilerStep", "step-range"],
)
def test_steps_come_from_nvtx_ranges(tmp_path: Path, loop: Loop, step_range: str | None) -> None:
    steps = _report(tmp_path, loop, step_range)["steps"]
    assert steps["count"] == loop.steps and steps["boundary"] == "profiler_step"
    host_us = loop.data_us + 15 + sum(loop.kernels) * loop.launch_us  # the host's time per step
    assert steps["median_s"] == pytest.approx(host_us / 1e6)


def test_perfmagic_stage_ranges_give_the_stage_shares(tmp_path: Path) -> None:
    loop = Loop()
    stages = _report(tmp_path, loop)["stages"]
    host_us = loop.data_us + 15 + sum(loop.kernels) * loop.launch_us
    launches = dict(zip(("forward", "backward", "optimizer"), loop.kernels, strict=True))
    assert stages["data"]["fraction"] == pytest.approx(loop.data_us / host_us)
    assert stages["h2d"]["fraction"] == pytest.approx(15 / host_us)
    for stage, n in launches.items():
        assert stages[stage]["fraction"] == pytest.approx(n * loop.launch_us / host_us)


def test_a_directory_of_captures_is_one_rank_each_with_collective_skew(tmp_path: Path) -> None:
    # kernels shorter than their launch calls: each GPU keeps pace with its host, so rank 1's late
    # launches are late all-reduces
    for rank, late in enumerate((0.0, 400.0)):
        write_capture(tmp_path / f"rank{rank}.sqlite", Loop(kernel_us=5.0, allreduce_us=200.0, late_us=late))
    report = perfmagic.load_trace(tmp_path).to_dict()
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    skew = report["collective_skew"]
    assert skew is not None and skew["last_rank"] == 1


def test_a_capture_of_several_processes_is_one_rank_each(tmp_path: Path) -> None:
    loop = Loop()
    path = write_capture(tmp_path / "job.sqlite", loop, processes=2)
    traces = read_capture(path)
    # each process's kernels linked to its own launches, though their correlation ids are the same
    assert [t.rank for t in traces] == [0, 1]
    for k, trace in enumerate(traces):
        assert np.unique(trace.gpu.device).tolist() == [k]
        assert {pid for pid, _ in trace.cpu.threads} == {PID + k}
        assert trace.gpu.launch_row is not None and (trace.gpu.launch_row >= 0).all()
        launched = trace.cpu.start[trace.gpu.launch_row]
        assert (launched <= trace.gpu.start).all()
    report = perfmagic.load_trace(path).to_dict()
    assert [r["steps"]["count"] for r in report["ranks"]] == [loop.steps, loop.steps]


CHECKS = ("pin_memory", "sync_copies", "sync_logging", "gpu_gaps", "low_gpu_util")
"""Nsight's expert checks as cards: pageable async copies, synchronous copies and memsets, blocking
synchronization, GPU starvation gaps, low utilization."""


@pytest.mark.parametrize(
    ("loop", "fires"),
    [
        (Loop(), set()),
        (Loop(pageable=True), {"pin_memory"}),
        (Loop(sync_copies=True), {"sync_copies", "sync_logging"}),
        (Loop(blocking_sync=True), {"sync_logging"}),
        (Loop(kernel_us=9.5, stall_every=3), {"gpu_gaps"}),
        (Loop(data_us=20000.0), {"low_gpu_util"}),
    ],
    ids=["healthy", "pageable", "sync-copies", "blocking-sync", "gaps", "starved"],
)
def test_each_expert_check_fires_on_a_capture_that_shows_it(
    tmp_path: Path, loop: Loop, fires: set[str]
) -> None:
    report = _report(tmp_path, loop)
    cards = {c["id"] for c in report["advice"] + report["advice_minor"]}
    assert cards & set(CHECKS) == fires
