"""Report exports: offline HTML, Chrome trace, TensorBoard events, JSON round trip, notebook bundle."""

from __future__ import annotations

import base64
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
from analysis_builder import whole_report
from torch.utils.data import DataLoader, TensorDataset

import perfmagic
from perfmagic.analyze.timeseries import downsample
from perfmagic.render.chrome import PID
from perfmagic.report import report_from_timelines


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
    strip_ids = re.compile(
        r"(p\d{4,}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|pm-[0-9a-f]{32})"
    )
    assert strip_ids.sub("", a["text/html"]) == strip_ids.sub("", b["text/html"])


def test_advice_cards_render_with_severity_saving_and_copyable_fix() -> None:
    from perfmagic.advise.card import make_card
    from perfmagic.render.colors import SEVERITY_COLORS
    from perfmagic.render.html import cards_html

    card = make_card(
        "input_bound",
        "Input-bound <fast>",
        "data takes 62% of each step",
        "DataLoader(ds, num_workers=4)",
        {},
        saving_s=0.012,
        step_s=0.027,  # 1.8× faster without the 12 ms
        model=None,
        severity="high",
    )
    out = cards_html([card.to_dict()])
    assert SEVERITY_COLORS["high"] in out and 'data-advice-id="input_bound"' in out
    assert "Input-bound &lt;fast&gt;" in out  # escaped
    assert "saves ~12.0 ms per step" in out and "1.8× faster" in out
    assert "<pre><code>DataLoader(ds, num_workers=4)</code></pre>" in out
    # the Copy button is the script's to make: where no script runs, there is none that does nothing
    assert "<button" not in out and "<script>" in out and "'pm-copy'" in out


@pytest.mark.browser
def test_fix_is_text_everywhere_and_copy_only_where_scripts_run(tmp_path: Path) -> None:
    from browser import chromium

    from perfmagic.advise.card import make_card
    from perfmagic.render.html import CSS, cards_html, document

    fix = "loader = DataLoader(ds,\n    num_workers=4)"
    card = make_card("dataloader_workers", "t", "e", fix, {}, saving_s=0.5, step_s=1.0, model=None).to_dict()
    path = tmp_path / "fixes.html"
    path.write_text(
        document("fixes", f'<style>{CSS}</style><div class="pm-report">{cards_html([card])}</div>')
    )
    with chromium() as page:
        # no script: an untrusted notebook, an export that strips them
        still = page.context.browser.new_context(java_script_enabled=False).new_page()
        still.goto(path.as_uri())
        assert still.locator(".pm-fix pre code").inner_text() == fix
        assert still.locator("button").count() == 0
        page.goto(path.as_uri())
        page.context.grant_permissions(["clipboard-read", "clipboard-write"])
        page.locator(".pm-fix .pm-copy").click()
        page.wait_for_function(
            "() => document.querySelector('.pm-copy').textContent === 'Copied'", timeout=5000
        )
        assert page.locator(".pm-copy").count() == 1
        assert page.evaluate("() => navigator.clipboard.readText()") == fix


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
        # the table holds microseconds: the stages' sum within half of one each of the step's length
        assert sum(per_step[i + 1].values()) == pytest.approx(table["end"][i] - table["start"][i], abs=5e-6)
    assert any(e["ph"] == "C" and e["name"] == "host CPU (%)" for e in events)
    gz = report.to_chrome_trace(tmp_path / "trace.json.gz")
    assert json.loads(gzip.decompress(gz.read_bytes())) == trace


def test_chrome_trace_merges_a_profiler_trace_onto_our_clock(
    report: perfmagic.Report, tmp_path: Path
) -> None:
    profiler = {
        "traceEvents": [
            {"ph": "X", "name": "perfmagic.clock", "pid": 77, "tid": 77, "ts": 5_000_000.0, "dur": 200.0},
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
    # the annotation's midpoint is at ``clock_t``: our two readings bracketed it
    assert by_name["perfmagic.clock"]["ts"] == pytest.approx(1.5e6 - 100)
    assert by_name["ProfilerStep#2"]["ts"] == pytest.approx(1.75e6 - 100)


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


def test_repr_mimebundle_has_plain_text_and_png_fallbacks(report: perfmagic.Report) -> None:
    bundle = report._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html", "image/png"}
    assert base64.b64decode(bundle["image/png"]).startswith(b"\x89PNG")
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


def test_stage_intervals_are_ordered_for_viewers_parents_first_children_inside(tmp_path: Path) -> None:
    from perfmagic.render.chrome import timeline_events
    from perfmagic.timeline import Timeline

    tl = Timeline({"pid": 1})
    outer, inner = tl.name_id("forward"), tl.name_id("logging")
    # As the recorder writes them: the child closes (and is appended) first; times that round badly.
    tl.add_span(inner, 0.1000000004, 0.3000000006, depth=1)
    tl.add_span(outer, 0.1000000004, 0.3000000006, depth=0)
    tl.add_span(outer, 0.0000000001, 0.05, depth=0)
    events = [e for e in timeline_events(tl, PID + 1) if e["ph"] == "X"]
    assert [(e["name"], e["args"]["depth"]) for e in events] == [
        ("forward", 0),
        ("forward", 0),
        ("logging", 1),
    ]
    parent, child = events[1], events[2]
    assert parent["ts"] <= child["ts"] and child["ts"] + child["dur"] <= parent["ts"] + parent["dur"]
    assert all(e["ts"] * 1000 == round(e["ts"] * 1000) for e in events)  # whole nanoseconds


def test_profiler_trace_stays_aligned_when_the_timeline_is_rebased(tmp_path: Path) -> None:
    """``perfmagic run`` moves each process onto the sampler's clock; the torch trace must move with it."""
    from perfmagic.render.chrome import chrome_trace

    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with perfmagic.profile(sample=False, trace=2, outdir=tmp_path) as session:
        for _ in range(5):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
    timeline = session.timeline

    def clock_and_steps() -> tuple[float, list[float]]:
        report = report_from_timelines([timeline]).to_dict()
        events = chrome_trace(report)["traceEvents"]
        (trace,) = report["torch_traces"]
        clock = next(e["ts"] for e in events if e.get("name") == trace["clock_name"])
        return clock, [e["ts"] for e in events if e.get("pid") == PID and e["name"].startswith("step ")]

    clock, steps = clock_and_steps()
    assert steps[0] < clock < steps[-1] + 1e5  # the clock label fires inside the profiled window
    timeline.rebase(timeline.meta["epoch"] - 2.0)  # this process started 2 s after the run's clock
    moved, moved_steps = clock_and_steps()
    assert moved_steps == pytest.approx([t + 2e6 for t in steps])
    assert moved == pytest.approx(clock + 2e6)


def test_report_without_steps_explains_and_shows_what_was_measured() -> None:
    from perfmagic.render.notebook import finished_bundle

    with perfmagic.profile(interval=0.02) as session:
        time.sleep(0.1)
    data = session.report.to_dict()
    page = session.report._repr_mimebundle_()["text/html"]
    assert "No training steps were seen." in page and "perfmagic.step()" in page
    assert "Bottleneck:" not in page and "n/a" not in page.split("pm-bottleneck")[0]  # no empty KPIs
    assert "process memory peak (PSS)" in page and "Stage waterfall" not in page
    line = finished_bundle(data)["text/plain"]
    assert "median step" not in line and "no training steps were seen" in line


def test_memory_chart_reads_in_round_mib_or_gib_from_zero() -> None:
    from bokeh.models import DataRange1d, NumeralTickFormatter

    from perfmagic.render.waterfall import utilization_figures

    def memory(peak: float) -> Any:
        ts = {"metrics": {"host.rss_bytes": {"t": [0.0, 1.0, 2.0], "v": [peak * 0.97, None, peak]}}}
        (fig,) = utilization_figures(ts)
        return fig

    small, big = memory(0.342 * 1024**3), memory(40 * 1024**3)
    assert small.yaxis[0].axis_label == "MiB" and big.yaxis[0].axis_label == "GiB"
    assert max(small.renderers[0].data_source.data["v"]) == pytest.approx(0.342 * 1024)
    for fig in (small, big):
        assert isinstance(fig.y_range, DataRange1d) and fig.y_range.start == 0
        assert isinstance(fig.yaxis[0].formatter, NumeralTickFormatter)
    one_point = {"metrics": {"host.cpu_util": {"t": [0.0], "v": [0.5]}}}
    assert utilization_figures(one_point) == []  # nothing to draw: no empty chart


def test_thousands_of_steps_stay_small_and_fast() -> None:
    from bokeh.models import ColumnDataSource, Quad

    from perfmagic.render.html import report_fragment
    from perfmagic.render.png import charts_png
    from perfmagic.render.waterfall import MAX_BARS, report_layout

    n = 5000
    rng = np.random.default_rng(0)
    stages = {name: (rng.random(n) * 0.01).tolist() for name in ("data", "forward", "backward", "optimizer")}
    total = np.sum(list(stages.values()), axis=0)
    start = np.concatenate([[0.0], np.cumsum(total)[:-1]])
    whole = whole_report()
    report = whole_report(
        wall_s=float(total.sum()),
        steps={**whole["steps"], "count": n, "median_s": 0.02, "p90_s": 0.03, "first_s": 0.02, "per_s": 50.0},
        stages={
            k: {"total_s": sum(v), "fraction": 0.25, "median_s": 0.005, "mean_s": sum(v) / n}
            for k, v in stages.items()
        },
        bottleneck="data",
        step_table={
            "boundary": None,
            "steps_per_row": 1,
            "start": start.tolist(),
            "end": (start + total).tolist(),
            "stages": stages,
        },
        advice=[],
        warnings=[],
        gpu=None,
        devices=[],
    )
    begin = time.perf_counter()
    page = report_fragment(report, png=charts_png(report))
    assert time.perf_counter() - begin < 5
    layout = report_layout(report)
    quads = [
        r for r in layout.references() if getattr(r, "glyph", None) is not None and isinstance(r.glyph, Quad)
    ]
    rows = sum(len(r.data_source.data["left"]) for r in quads if isinstance(r.data_source, ColumnDataSource))
    assert rows <= MAX_BARS * len(stages)  # binned, not one bar per stage per step
    assert len(page) < 300_000  # the charts' data and their PNG: a notebook keeps no BokehJS


def test_gpu_metrics_are_labelled_by_index_in_charts_and_trace() -> None:
    from perfmagic.render.chrome import chrome_trace
    from perfmagic.render.waterfall import utilization_figures
    from perfmagic.schema import gpu_metric

    assert gpu_metric("gpu12.mem_used_bytes") == (12, "mem_used_bytes")
    assert gpu_metric("host.cpu_util") is None
    series = {"t": [0.0, 1.0], "v": [0.5, 0.25]}
    names = ("gpu0.util", "gpu12.util", "gpu12.mem_used_bytes", "gpu0.power_w", "host.cpu_util")
    ts = {"metrics": dict.fromkeys(names, series)}
    util, mem = utilization_figures(ts)
    assert [item.label["value"] for item in util.legend[0].items] == ["GPU 0", "GPU 12", "host CPU"]
    assert [item.label["value"] for item in mem.legend[0].items] == ["GPU 12 memory"]
    trace = chrome_trace(whole_report(timeseries={"epoch": None, **ts}))
    counters = {e["name"] for e in trace["traceEvents"] if e["ph"] == "C"}
    assert counters == {
        "GPU 0 utilization (%)",
        "GPU 12 utilization (%)",
        "GPU 12 memory used (MiB)",
        "GPU 0 power (W)",
        "host CPU (%)",
    }


def test_every_built_in_stage_has_a_color_and_a_headline() -> None:
    from perfmagic.advise.headline import DOING
    from perfmagic.render.colors import STAGE_COLORS
    from perfmagic.schema import STAGES

    assert set(STAGE_COLORS) == set(DOING) == set(STAGES)
