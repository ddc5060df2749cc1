"""``perfmagic.load_trace``: a trace's report, rendered as a live one is, its GPU figures as the raw events say.

Expected values come from the trace's JSON with pandas (``trace_data``), not from perfmagic's reader.
"""

from __future__ import annotations

import re
from pathlib import Path

from trace_data import DATA, assert_top_kernels, gpu_window, length, real, union

import perfmagic

A100 = "a100_rank3_control.json.gz"


def test_load_trace_renders_the_waterfall_gpu_time_and_top_kernels(tmp_path: Path) -> None:
    path = real(A100)
    report = perfmagic.load_trace(path)
    assert report["source"] == "trace" and report.steps["count"] == 6
    exported = report.to_html(tmp_path / "report.html").read_text(encoding="utf-8")
    notebook = report._repr_mimebundle_()["text/html"]
    for page in (exported, notebook):
        assert "Stage waterfall" in page  # from the ProfilerStep ranges
        assert_top_kernels(page, path)
    # The GPU time bar: busy and idle over the window, from the union of the GPU events.
    window = gpu_window(path)[0]
    span = (window["ts"] + window["dur"]).max() - window["ts"].min()
    busy = length(union(window)) / span
    compute = length(union(window[(window["cat"] == "kernel") & ~window["name"].str.contains("nccl")])) / span
    shown = dict(re.findall(r'data-part="([^"]+)"><i [^>]*></i>[^<]*<b>(\d+)%</b>', exported))
    assert list(shown) == ["compute", "non-compute", "idle: host wait", "idle: kernel wait", "idle: other"]
    assert int(shown["compute"]) == round(100 * compute)
    assert int(shown["non-compute"]) == round(100 * (busy - compute))
    idle = sum(int(shown[k]) for k in shown if k.startswith("idle"))
    assert abs(idle - 100 * (1 - busy)) <= 1.5  # three parts, each rounded


def test_load_trace_of_a_directory_reads_every_rank(tmp_path: Path) -> None:
    for name in ("sampled_rank-0.json.gz", "sampled_rank-1.json.gz"):
        (tmp_path / name).symlink_to(DATA / name)
    report = perfmagic.load_trace(tmp_path)
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert "pm-kernels" in report._repr_mimebundle_()["text/html"]
