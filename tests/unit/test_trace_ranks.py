"""Many ranks' traces (``perfmagic report DIR/``) and two traces compared (``--compare A B``).

Built from the two real ranks of one job in ``tests/data`` (``sampled_rank-0/1``);
the expected figures are computed here from the raw events with pandas.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from trace_data import gpu_window, raw, real

from perfmagic.report import Report
from perfmagic.trace_report import pool_size, report_from_traces, trace_paths, worker_peak_bytes
from perfmagic.traces import TraceFormatError

RANKS = 64
SHIFT_US = 100.0  # rank r's copy runs r * SHIFT_US later


@pytest.fixture(scope="module")
def rank_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 ranks: rank r is real rank r % 2's trace, its rank set to r and its clock r * 100 µs late."""
    sources = [raw(real(f"sampled_rank-{k}.json.gz")) for k in (0, 1)]
    out = tmp_path_factory.mktemp("ranks")
    for r in range(RANKS):
        doc = dict(sources[r % 2])
        doc["distributedInfo"] = {**doc["distributedInfo"], "rank": r}
        doc["traceEvents"] = [
            {**e, "ts": e["ts"] + r * SHIFT_US} if isinstance(e.get("ts"), (int, float)) else e
            for e in sources[r % 2]["traceEvents"]
        ]
        with gzip.open(out / f"host{r // 8}_rank{r}.pt.trace.json.gz", "wt", compresslevel=1) as f:
            json.dump(doc, f)
    (out / "notes.txt").write_text("not a trace")
    return out


def nccl_starts(doc: dict[str, Any]) -> pd.DataFrame:
    """Each NCCL kernel's start, numbered per kernel name in time order."""
    ev = pd.DataFrame([e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"])
    ev = ev[ev["name"].str.contains("ncclKernel|ncclDevKernel")].sort_values("ts", kind="stable")
    ev["k"] = ev.groupby("name").cumcount()
    return ev[["name", "k", "ts"]]


def test_a_directory_is_every_rank_read_in_parallel_with_the_collectives_skew(rank_dir: Path) -> None:
    files = trace_paths([rank_dir])
    assert len(files) == RANKS  # notes.txt is not a trace
    assert pool_size(files) > 1  # workers, as many as the CPUs and memory allow
    report = report_from_traces([rank_dir]).to_dict()
    assert [r["rank"] for r in report["ranks"]] == list(range(RANKS))
    assert all(r["gpu"]["busy_fraction"] > 0 for r in report["ranks"])  # per-rank GPU figures
    idle = {r["rank"]: r["gpu"]["idle_fraction"] for r in report["ranks"][:2]}
    assert idle == {0: pytest.approx(0.5356, abs=6e-5), 1: pytest.approx(0.5472, abs=6e-5)}  # HTA's

    # expected: rank r starts the k-th launch of each kernel at its source's time + r * SHIFT_US
    starts = [nccl_starts(raw(real(f"sampled_rank-{k}.json.gz"))) for k in (0, 1)]
    matched = starts[0].merge(starts[1], on=["name", "k"], suffixes=("_0", "_1"))
    at = np.stack([matched[f"ts_{r % 2}"].to_numpy() + r * SHIFT_US for r in range(RANKS)])
    late = (at - at.min(axis=0)) / 1e6
    skew = report["collective_skew"]
    assert skew["instances"] == len(matched) == 10
    assert skew["last_rank"] == int(np.bincount(late.argmax(axis=0)).argmax())
    assert skew["skew_mean_s"] == pytest.approx(late.max(axis=0).mean())
    for r, row in enumerate(skew["ranks"]):
        assert row["rank"] == r
        assert row["late_mean_s"] == pytest.approx(late[r].mean())
        assert row["late_p90_s"] == pytest.approx(np.percentile(late[r], 90))


# The parent's peak is VmHWM, not ru_maxrss: Linux carries a process's ru_maxrss over fork and exec, so a
# subprocess of a big pytest process would report pytest's size (1.1 GB in a CI run)
PEAK_RSS = """
import re, resource, sys
from perfmagic.trace_report import report_from_traces
report_from_traces([sys.argv[1]])
with open("/proc/self/status") as f:
    parent_kib = int(re.search(r"VmHWM:\\s+(\\d+)", f.read()).group(1))
print(parent_kib * 1024, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
"""


def test_64_ranks_are_read_within_the_memory_budget(rank_dir: Path) -> None:
    """Every worker process that reads ranks peaks within the budget the reader gives one worker (the pool's
    size keeps their sum within half the available memory); the parent, which analyzes the 64 timelines,
    is measured too and stays within a few workers' budgets."""
    files = trace_paths([rank_dir])
    result = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, str(rank_dir)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    parent, worker = map(int, result.stdout.split())
    budget = worker_peak_bytes(files)
    assert worker > 0  # read in worker processes
    assert worker <= budget, (worker, budget)
    assert parent <= 4 * budget, (parent, budget)


def test_the_cli_reads_a_directory(rank_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "ranks.json"
    result = subprocess.run(
        [sys.executable, "-m", "perfmagic.cli", "report", "--json", str(out), str(rank_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "collectives: 10 matched across ranks" in result.stdout
    assert len(json.loads(out.read_text())["ranks"]) == RANKS


def test_a_bad_rank_in_a_directory_read_by_workers_is_a_clear_error(rank_dir: Path, tmp_path: Path) -> None:
    for f in trace_paths([rank_dir]):
        (tmp_path / f.name).symlink_to(f)
    bad = tmp_path / "host9_rank99.pt.trace.json.gz"
    bad.write_bytes(gzip.compress(b'{"traceEvents": []}' * 50)[:40])
    assert pool_size(trace_paths([tmp_path])) > 1
    with pytest.raises(TraceFormatError, match="truncated gzip") as info:
        report_from_traces([tmp_path])
    assert str(bad) in str(info.value)


def test_a_directory_without_traces_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(TraceFormatError, match="no trace files"):
        report_from_traces([tmp_path])


def test_an_xplane_without_tensorflow_says_what_reads_it(tmp_path: Path) -> None:
    """The main venv has no TensorFlow: an XSpace file is a clear error that names the JSON beside it."""
    xplane = tmp_path / "host.xplane.pb"
    xplane.write_bytes(b"\x0a\x00")
    with pytest.raises(TraceFormatError, match="needs TensorFlow's converter") as info:
        report_from_traces([xplane])
    assert "trace.json.gz" in str(info.value)


def test_a_jax_run_directory_is_read_once_though_it_holds_two_files_of_one_trace(tmp_path: Path) -> None:
    (tmp_path / "host.trace.json.gz").write_bytes(b"")
    (tmp_path / "host.xplane.pb").write_bytes(b"\x0a\x00")
    (tmp_path / "other.xplane.pb").write_bytes(b"\x0a\x00")
    assert trace_paths([tmp_path]) == [tmp_path / "host.trace.json.gz", tmp_path / "other.xplane.pb"]


def test_one_rank_has_no_collective_skew() -> None:
    assert report_from_traces([real("a100_rank3_control.json.gz")]).to_dict()["collective_skew"] is None


def kernel_totals(path: Path) -> pd.DataFrame:
    """Count and total seconds per GPU event name over HTA's window: launched before the last step."""
    window = gpu_window(path)[0]
    return window.groupby("name").agg(count=("dur", "size"), total_s=("dur", lambda d: d.sum() / 1e6))


def test_compare_two_traces_kernel_by_kernel(tmp_path: Path) -> None:
    a, b = real("sampled_rank-0.json.gz"), real("sampled_rank-1.json.gz")
    before, after = report_from_traces([a]), report_from_traces([b])
    comparison = before.compare(after).to_dict()
    expected = kernel_totals(a).merge(
        kernel_totals(b), left_index=True, right_index=True, how="outer", suffixes=("_a", "_b")
    )
    expected = expected.fillna(0)
    kernels = {k["name"]: k for k in comparison["kernels"]}
    assert set(kernels) == set(expected.index)
    for name, row in expected.iterrows():
        k = kernels[name]
        assert (k["count_before"], k["count_after"]) == (row["count_a"], row["count_b"])
        assert k["before_s"] == pytest.approx(row["total_s_a"], abs=1e-6)
        assert k["after_s"] == pytest.approx(row["total_s_b"], abs=1e-6)
    deltas = [abs(k["delta_s"]) for k in comparison["kernels"]]
    assert deltas == sorted(deltas, reverse=True)
    busy = comparison["gpu"]["busy_fraction"]
    assert busy["before"] == pytest.approx(1 - 0.5356, abs=6e-5) and busy["after"] == pytest.approx(
        1 - 0.5472, abs=6e-5
    )
    # the same from reports read back from JSON
    again = Report.from_json(before.to_json()).compare(Report.from_json(after.to_json())).to_dict()
    assert again["kernels"] == comparison["kernels"]


def test_a_trace_compared_with_itself_changes_nothing() -> None:
    report = report_from_traces([real("v100_ns_resolution.json.gz")])
    comparison = report.compare(report)
    assert comparison.speedup == pytest.approx(1.0)
    assert all(k.delta_s == 0 for k in comparison.kernels) and comparison.kernels


def test_cli_compare(tmp_path: Path) -> None:
    out = tmp_path / "cmp.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "perfmagic.cli",
            "report",
            "--compare",
            str(real("sampled_rank-0.json.gz")),
            str(real("a100_rank3_control.json.gz")),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "GPU (trace): busy 46% → 84%" in result.stdout
    assert "kernel (largest changes in total time)" in result.stdout
    doc = json.loads(out.read_text())
    assert doc["step"]["speedup"] > 1 and doc["kernels"][0]["delta_s"] is not None
    usage = subprocess.run(
        [sys.executable, "-m", "perfmagic.cli", "report", "--compare", "a", "b", "c"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert usage.returncode == 2 and "give traces, or --compare A B" in usage.stderr
