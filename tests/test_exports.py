"""Report exports: offline HTML, Chrome trace, TensorBoard events, JSON round trip, notebook bundle."""

from __future__ import annotations

import gzip
import json
import re
import struct
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import perfmagic
from perfmagic.analyze.timeseries import downsample
from perfmagic.render.chrome import PID


@pytest.fixture(scope="module")
def report() -> perfmagic.Report:
    ds = TensorDataset(torch.randn(96, 8), torch.randn(96, 1))
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with perfmagic.profile(interval=0.02) as session:
        for x, y in DataLoader(ds, batch_size=8):
            time.sleep(0.01)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return session.report


def test_report_carries_compact_timeseries(report: perfmagic.Report) -> None:
    ts = report["timeseries"]
    assert ts["epoch"] > 1e9
    assert {"host.cpu_util", "host.rss_bytes"} <= set(ts["metrics"])
    cpu = ts["metrics"]["host.cpu_util"]
    assert len(cpu["t"]) == len(cpu["v"]) > 3
    assert report["torch_traces"] == []


def test_downsample_keeps_at_most_max_points_and_the_mean() -> None:
    t = np.linspace(0, 100, 100_001)
    v = np.sin(t)
    v[::7] = np.nan
    bt, bv = downsample(t, v, 1000)
    assert len(bt) == len(bv) <= 1000
    assert abs(np.nanmean(bv) - np.nanmean(v)) < 1e-3
    assert np.all(np.diff(bt) > 0)
    small_t, _ = downsample(t[:10], v[:10], 1000)
    assert len(small_t) == 10


def test_html_is_one_file_that_opens_offline(report: perfmagic.Report, tmp_path: Path) -> None:
    path = report.to_html(tmp_path / "report.html")
    text = path.read_text()
    assert text.startswith("<!DOCTYPE html>")
    assert not re.search(r"<script[^>]+src=", text)  # every script inline
    assert not re.search(r"<link[^>]+href=[\"']https?://", text)
    assert "cdn.bokeh.org" not in text
    assert "Bokeh.embed" in text or "embed_items" in text  # the charts
    assert "Stage waterfall" in text and "Share of step time" in text and "Utilization" in text


def test_html_survives_json_round_trip(report: perfmagic.Report, tmp_path: Path) -> None:
    again = perfmagic.Report.from_json(report.to_json())
    assert again.to_dict() == report.to_dict()
    a = report._repr_mimebundle_()
    b = again._repr_mimebundle_()
    assert a["text/plain"] == b["text/plain"] == str(report)
    strip_ids = re.compile(r"(p\d{4,}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")
    assert strip_ids.sub("", a["text/html"]) == strip_ids.sub("", b["text/html"])


def test_advice_cards_render_with_severity_saving_and_copyable_fix() -> None:
    from perfmagic.render.html import SEVERITY_COLORS, cards_html

    card = {
        "id": "input_bound",
        "severity": "high",
        "title": "Input-bound <fast>",
        "evidence": "data takes 62% of each step",
        "fix": "DataLoader(ds, num_workers=4)",
        "saving_s": 0.012,
        "speedup": 1.8,
    }
    out = cards_html([card])
    assert SEVERITY_COLORS["high"] in out and 'data-advice-id="input_bound"' in out
    assert "Input-bound &lt;fast&gt;" in out  # escaped
    assert "saves ~12.0 ms per step" in out and "1.8× faster" in out
    assert "<pre><code>DataLoader(ds, num_workers=4)</code></pre>" in out and "Copy</button>" in out


def test_chrome_trace_is_valid_and_matches_the_step_table(report: perfmagic.Report, tmp_path: Path) -> None:
    path = report.to_chrome_trace(tmp_path / "trace.json")
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    for e in events:
        assert e["ph"] in {"X", "C", "M"}
        assert isinstance(e["pid"], int) and isinstance(e["name"], str)
        if e["ph"] == "X":
            assert e["dur"] >= 0 and isinstance(e["ts"], float) and isinstance(e["tid"], int)
        if e["ph"] == "C":
            assert set(e["args"]) == {"value"}
    names = {(e["name"], e["args"]["name"]) for e in events if e["ph"] == "M"}
    assert {("process_name", "perfmagic"), ("thread_name", "steps"), ("thread_name", "stages")} <= names
    table = report["step_table"]
    steps = [e for e in events if e["ph"] == "X" and e["name"].startswith("step ")]
    assert len(steps) == len(table["start"]) == report.steps["count"]
    for e, start, end in zip(steps, table["start"], table["end"], strict=True):
        assert e["ts"] == pytest.approx(start * 1e6) and e["dur"] == pytest.approx((end - start) * 1e6)
    per_step: dict[int, dict[str, float]] = defaultdict(dict)
    for e in events:
        if e["ph"] == "X" and e["tid"] == 2:
            per_step[e["args"]["step"]][e["name"]] = e["dur"] / 1e6
            assert e["pid"] == PID
    for i in range(len(table["start"])):
        for name, column in table["stages"].items():
            assert per_step[i + 1].get(name, 0.0) == pytest.approx(column[i], abs=1e-9)
        assert sum(per_step[i + 1].values()) == pytest.approx(table["end"][i] - table["start"][i], abs=1e-6)
    assert any(e["ph"] == "C" and e["name"] == "host CPU (%)" for e in events)
    gz = report.to_chrome_trace(tmp_path / "trace.json.gz")
    assert json.loads(gzip.decompress(gz.read_bytes())) == trace


def test_chrome_trace_merges_a_profiler_trace_onto_our_clock(
    report: perfmagic.Report, tmp_path: Path
) -> None:
    profiler = {
        "traceEvents": [
            {"ph": "X", "name": "perfmagic.clock", "pid": 77, "tid": 77, "ts": 5_000_000.0, "dur": 1.0},
            {"ph": "X", "name": "ProfilerStep#2", "pid": 77, "tid": 77, "ts": 5_250_000.0, "dur": 10.0},
        ]
    }
    (tmp_path / "torch.json").write_text(json.dumps(profiler))
    data = report.to_dict()
    data["torch_traces"] = [
        {"path": str(tmp_path / "torch.json"), "clock_name": "perfmagic.clock", "clock_t": 1.5}
    ]
    merged = perfmagic.Report(data).to_chrome_trace(tmp_path / "merged.json")
    by_name = {e["name"]: e for e in json.loads(merged.read_text())["traceEvents"]}
    assert by_name["perfmagic.clock"]["ts"] == pytest.approx(1.5e6)
    assert by_name["ProfilerStep#2"]["ts"] == pytest.approx(1.75e6)


def read_events(logdir: Path) -> Iterator[Any]:
    """Events of every TFRecord file in ``logdir`` (length, CRC, payload, CRC), with tensorboardX's proto."""
    from tensorboardX.proto import event_pb2

    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data, i = path.read_bytes(), 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i : i + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[i + 12 : i + 12 + n])
            i += 12 + n + 4
            yield event


def test_tensorboard_scalars_read_back(report: perfmagic.Report, tmp_path: Path) -> None:
    logdir = report.to_tensorboard(tmp_path / "tb")
    scalars: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    texts = []
    for event in read_events(logdir):
        for value in event.summary.value:
            if value.HasField("simple_value"):
                scalars[value.tag].append((event.step, value.simple_value, event.wall_time))
            else:
                texts.append(value.tag)
    table = report["step_table"]
    step_times = scalars["perfmagic/step_time_s"]
    assert [s for s, _, _ in step_times] == list(range(1, len(table["start"]) + 1))
    expected = [e - s for s, e in zip(table["start"], table["end"], strict=True)]
    assert [v for _, v, _ in step_times] == pytest.approx(expected, rel=1e-5)
    epoch = report["timeseries"]["epoch"]
    assert step_times[0][2] == pytest.approx(epoch + table["end"][0], abs=1e-3)
    for name, column in table["stages"].items():
        assert [v for _, v, _ in scalars[f"perfmagic/stage/{name}_s"]] == pytest.approx(
            column, rel=1e-5, abs=1e-9
        )
    cpu = report["timeseries"]["metrics"]["host.cpu_util"]
    assert len(scalars["perfmagic/host.cpu_util"]) == sum(v is not None for v in cpu["v"])
    assert "perfmagic/report/text_summary" in texts or any("perfmagic/report" in t for t in texts)


def test_repr_mimebundle_has_plain_text_fallback(report: perfmagic.Report) -> None:
    bundle = report._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert bundle["text/plain"].startswith("perfmagic report")
    assert "pm-report" in bundle["text/html"] and "Bottleneck" in bundle["text/html"]


def test_report_without_steps_still_renders(tmp_path: Path) -> None:
    with perfmagic.profile(interval=0.02) as session:
        time.sleep(0.05)
    report = session.report
    assert report.steps["count"] == 0
    bundle = report._repr_mimebundle_()
    assert "no training steps were seen" in bundle["text/html"]
    report.to_html(tmp_path / "empty.html")
    trace = json.loads(report.to_chrome_trace(tmp_path / "empty.json").read_text())
    assert not [e for e in trace["traceEvents"] if e["ph"] == "X"]
    report.to_tensorboard(tmp_path / "tb")


def test_chrome_trace_of_a_live_report_has_every_stage_interval_nested(tmp_path: Path) -> None:
    class Noisy(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            print("inside forward")  # logging nested in forward
            return x * 2

    model = Noisy()
    with perfmagic.profile(sample=False) as session:
        for _ in range(3):
            model(torch.ones(2))
            perfmagic.step()
    trace = json.loads(session.report.to_chrome_trace(tmp_path / "t.json").read_text())
    recorded = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == PID + 1]
    forwards = [e for e in recorded if e["name"] == "forward"]
    logs = [e for e in recorded if e["name"] == "logging"]
    assert len(forwards) == 3 and len(logs) == 3
    for f, g in zip(forwards, logs, strict=True):
        assert f["ts"] <= g["ts"] and g["ts"] + g["dur"] <= f["ts"] + f["dur"]  # nested, as it ran
        assert (f["args"]["depth"], g["args"]["depth"]) == (0, 1)
    # A report read back from JSON has no timelines: the per-step view is still there.
    reloaded = perfmagic.Report.from_json(session.report.to_json())
    back = json.loads(reloaded.to_chrome_trace(tmp_path / "r.json").read_text())
    assert not any(e.get("pid") == PID + 1 for e in back["traceEvents"])
