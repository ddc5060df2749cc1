"""``perfmagic report``: traces torch.profiler wrote, read and analyzed.

The real GPU traces (HolisticTraceAnalysis's test data, see their README) are in
``tests/data``; the reference numbers below are HTA 0.5.0's.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trace_data import real

from perfmagic.analyze.gpu import gpu_summary, trace_gpu
from perfmagic.cli import main
from perfmagic.trace_report import report_from_traces
from perfmagic.traces import TraceFormatError, read_trace
from perfmagic.traces.events import COMMUNICATION, COMPUTATION, MEMORY, GpuEvents
from perfmagic.traces.kineto import _whole
from perfmagic.traces.stages import profiler_steps

# trace, rank, HTA idle %, compute %, non-compute %, steps HTA uses, ProfilerStep# count
HTA_TEMPORAL = [
    ("a100_rank3_control.json.gz", 3, 16.20, 61.23, 22.57, range(1009, 1014), 6),
    ("v100_ns_resolution.json.gz", 0, 2.63, 96.75, 0.62, range(101, 105), 5),
    ("sampled_rank-0.json.gz", 0, 53.56, 17.71, 28.74, range(551, 552), 2),
    ("sampled_rank-1.json.gz", 1, 54.72, 22.57, 22.72, range(551, 552), 2),
]


# -- the GPU figures against HolisticTraceAnalysis -----------------------------------


@pytest.mark.parametrize(("name", "rank", "idle", "compute", "non_compute", "steps", "_"), HTA_TEMPORAL)
def test_temporal_breakdown_matches_hta(
    name: str, rank: int, idle: float, compute: float, non_compute: float, steps: range, _: int
) -> None:
    trace = read_trace(real(name))
    assert trace.rank == rank
    gpu = trace_gpu(trace)
    assert gpu is not None
    # HTA rounds its percentages to 2 decimals
    assert gpu["idle_fraction"] * 100 == pytest.approx(idle, abs=0.006)
    assert gpu["compute_fraction"] * 100 == pytest.approx(compute, abs=0.006)
    assert gpu["non_compute_fraction"] * 100 == pytest.approx(non_compute, abs=0.006)
    assert gpu["busy_fraction"] + gpu["idle_fraction"] == pytest.approx(1.0)
    assert gpu["profiler_steps"] == list(steps)


def test_v100_stream_7_idle_breakdown_matches_hta() -> None:
    gpu = trace_gpu(read_trace(real("v100_ns_resolution.json.gz")))
    assert gpu is not None
    (stream,) = gpu["idle_breakdown_by_stream"]
    assert stream["stream"] == 7
    assert stream["host_wait_s"] * 1e6 == pytest.approx(1709)
    assert stream["kernel_wait_s"] * 1e6 == pytest.approx(8404)
    assert stream["other_s"] == 0
    assert round(stream["host_wait"], 2) == 0.17
    assert round(stream["kernel_wait"], 2) == 0.83
    # one stream: the whole-GPU breakdown is the same
    assert gpu["idle_breakdown"]["kernel_wait"] == pytest.approx(stream["kernel_wait"])


def test_ns_resolution_counts_whole_microseconds_like_hta() -> None:
    trace = read_trace(real("v100_ns_resolution.json.gz"))
    assert trace.ns_resolution
    assert not read_trace(real("a100_rank3_control.json.gz")).ns_resolution
    hta = trace_gpu(trace)
    _, starts, _ = profiler_steps(trace)
    exact = gpu_summary(trace.gpu, launched_before=float(starts.max()), whole_us=False)
    assert hta is not None and exact is not None
    # HTA's inward rounding makes each few-µs kernel up to 2 µs shorter: ~1 point more idle
    assert exact["idle_fraction"] * 100 == pytest.approx(1.68, abs=0.01)
    assert hta["idle_fraction"] - exact["idle_fraction"] == pytest.approx(0.0095, abs=0.001)


@pytest.mark.parametrize("name", ["a100_rank3_control.json.gz", "v100_ns_resolution.json.gz"])
def test_the_streamed_read_is_the_whole_documents(name: str) -> None:
    """A trace is decoded half a MiB at a time (each cut between two events); the events are
    those of the whole document read at once."""
    path = real(name)
    streamed, whole = read_trace(path), _whole(path)
    for side in ("cpu", "gpu"):
        a, b = getattr(streamed, side), getattr(whole, side)
        assert a.names == b.names and len(a) == len(b) > 1000
        for column in ("name_id", "start", "dur", "correlation"):
            assert np.array_equal(getattr(a, column), getattr(b, column), equal_nan=True), (side, column)
    assert streamed.distributed == whole.distributed and streamed.device_properties == whole.device_properties


def test_gpu_extras_a100() -> None:
    gpu = trace_gpu(read_trace(real("a100_rank3_control.json.gz")))
    assert gpu is not None
    assert gpu["streams"] == [7, 20, 21, 22]
    assert gpu["devices"] == [{"index": 3, "name": "NVIDIA A100-PG509-200"}]
    assert gpu["kernel_count"] < gpu["event_count"]
    assert gpu["comm_fraction"] > 0.3  # NCCL all-to-all and all-reduce
    assert set(gpu["memcpy_bytes"]) == {"HtoD", "DtoH", "DtoD"}
    top = gpu["top_kernels"]
    assert len(top) == 10 and top[0]["total_s"] >= top[-1]["total_s"]
    assert sum(gpu["idle_breakdown"].values()) == pytest.approx(1.0)


# -- steps, stages, ranks ------------------------------------------------------------


@pytest.mark.parametrize(("name", "rank", "steps"), [(t[0], t[1], t[6]) for t in HTA_TEMPORAL])
def test_steps_stages_and_rank_of_real_traces(name: str, rank: int, steps: int) -> None:
    report = report_from_traces([real(name)]).to_dict()
    assert report["source"] == "trace" and report["framework"] == "torch"
    assert report["steps"]["count"] == steps
    assert [r["rank"] for r in report["ranks"]] == [rank]
    assert report["ranks"][0]["gpu"] == report["gpu"]
    stages = report["stages"]
    assert {"forward", "backward", "optimizer"} <= set(stages)
    assert sum(s["fraction"] for s in stages.values()) == pytest.approx(1.0)
    assert stages["backward"]["total_s"] > 0


def test_a100_backward_matches_its_annotations() -> None:
    """The engine's events, joined, cover what the trainer's own ``## backward ##`` ranges show."""
    report = report_from_traces([real("a100_rank3_control.json.gz")]).to_dict()
    assert report["stages"]["backward"]["median_s"] == pytest.approx(0.0346, abs=0.002)
    assert report["stages"]["data"]["total_s"] > 0
    assert report["stages"]["logging"]["total_s"] > 0  # cudaStreamSynchronize calls


def test_a_gpu_trace_says_which_rules_it_cannot_feed() -> None:
    """A trace has GPU kernels but no NVML or host samples: the warnings say so, not "no GPU"."""
    warnings = report_from_traces([real("a100_rank3_control.json.gz")]).warnings
    assert any("a trace carries no NVML samples" in w for w in warnings)
    assert not any("no NVIDIA GPU was seen" in w for w in warnings)


def test_cpu_only_trace_has_no_gpu_section() -> None:
    report = report_from_traces([real("cpu_only_gloo_rank34.json.gz")]).to_dict()
    assert report["gpu"] is None
    assert "gpu" not in report["ranks"][0]
    assert report["ranks"][0]["rank"] == 34
    assert report["steps"]["count"] == 1
    assert any("no GPU events" in w for w in report["warnings"])


def test_two_files_of_one_rank_are_refused() -> None:
    path = real("sampled_rank-0.json.gz")
    with pytest.raises(TraceFormatError, match="both rank 0"):
        report_from_traces([path, path])


def test_cli_merges_two_ranks(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "perfmagic.cli",
            "report",
            "--json",
            str(out),
            "--html",
            str(tmp_path / "out.html"),
            str(real("sampled_rank-1.json.gz")),
            str(real("sampled_rank-0.json.gz")),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "GPU (trace): busy 46%" in result.stdout
    assert (tmp_path / "out.html").read_text().startswith("<!DOCTYPE html>")
    report = json.loads(out.read_text())
    assert report["source"] == "trace"
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert [r["steps"]["count"] for r in report["ranks"]] == [2, 2]
    idle = [r["gpu"]["idle_fraction"] * 100 for r in report["ranks"]]
    assert idle == [pytest.approx(53.56, abs=0.006), pytest.approx(54.72, abs=0.006)]
    assert report["gpu"] == report["ranks"][0]["gpu"]  # the primary rank's


# -- bad input -----------------------------------------------------------------------


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


BAD_INPUTS = {
    "truncated gzip": ("t.json.gz", gzip.compress(b'{"traceEvents": []}' * 50)[:40], "truncated gzip"),
    "not gzip": ("n.json.gz", b'{"traceEvents": []}', "not gzip-compressed"),
    "invalid JSON": ("i.json", b'{"traceEvents": [', "invalid JSON"),
    "a JSON list": ("l.json", b"[]", "the JSON is a list"),
    "no traceEvents": ("o.json", b'{"schemaVersion": 1}', "has no 'traceEvents'"),
    "missing file": ("missing.json", None, "cannot read trace"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_a_clear_error(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name, data, message = BAD_INPUTS[case]
    path = tmp_path / name if data is None else _write(tmp_path / name, data)
    with pytest.raises(TraceFormatError, match=message) as info:
        read_trace(path)
    assert str(path) in str(info.value)
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("perfmagic report: ") and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


# -- the timeline from a trace -------------------------------------------------------


def _event(
    name: str, ts: float, dur: float, tid: int = 1, cat: str = "user_annotation", **args: Any
) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_stages_from_a_synthetic_trace(tmp_path: Path) -> None:
    """Each rule on a hand-made trace: times in µs, two steps of 1000 µs."""
    events = []
    for k, t0 in enumerate((0.0, 1000.0)):
        events += [
            _event(f"ProfilerStep#{k + 7}", t0, 1000),
            _event("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t0 + 10, 100),
            # a sync inside the loader is part of loading the batch, not logging
            _event("cudaStreamSynchronize", t0 + 20, 50, cat="cuda_runtime"),
            _event("## forward ##", t0 + 200, 200),
            _event("DistributedDataParallel.forward", t0 + 210, 150),  # forward in forward: one stage
            _event("cudaStreamSynchronize", t0 + 300, 20, cat="cuda_runtime"),  # logging inside forward
            # backward on the engine's thread, with a gap in which the main thread does nothing
            _event("autograd::engine::evaluate_function: AddmmBackward0", t0 + 450, 100, tid=2, cat="cpu_op"),
            _event("autograd::engine::evaluate_function: AddmmBackward0", t0 + 600, 100, tid=2, cat="cpu_op"),
            _event("Optimizer.step#SGD.step", t0 + 800, 100),
            _event("nccl:all_reduce", t0 + 920, 30),
        ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    report = report_from_traces([path]).to_dict()
    assert report["steps"]["count"] == 2
    assert report["steps"]["median_s"] == pytest.approx(1e-3)
    per_step = {name: s["total_s"] / 2 * 1e6 for name, s in report["stages"].items()}
    assert per_step == {
        "data": pytest.approx(100),
        "forward": pytest.approx(180),
        "backward": pytest.approx(250),
        "optimizer": pytest.approx(100),
        "logging": pytest.approx(20),
        "comm": pytest.approx(30),
        "other": pytest.approx(320),
    }
    assert report["gpu"] is None


def _copy(
    ts: float,
    dur: float,
    corr: int,
    memcpy: str,
    gpu_ts: float,
    gpu_dur: float,
    call: str = "cudaMemcpyAsync",
) -> list[dict[str, Any]]:
    """The runtime call that launches a copy (``correlation`` ``corr``) and the GPU memcpy it runs."""
    return [
        _event(call, ts, dur, cat="cuda_runtime", correlation=corr),
        _event(
            memcpy, gpu_ts, gpu_dur, tid=7, cat="gpu_memcpy", device=0, stream=7, correlation=corr, bytes=4096
        ),
    ]


def test_host_to_device_copies_are_h2d_not_logging(tmp_path: Path) -> None:
    """A blocking ``.to("cuda")`` syncs inside ``aten::copy_``: the whole copy is h2d, and its sync no
    logging; a device-to-host ``.item()`` stays a sync; a device-to-device copy is no h2d. Two steps of
    1000 µs, each the same."""
    events = []
    for k, t0 in enumerate((0.0, 1000.0)):
        c = 10 * k
        events += [
            _event(f"ProfilerStep#{k}", t0, 1000),
            # x.to("cuda") from pageable memory: copy, then wait for it
            _event("aten::to", t0 + 100, 300, cat="cpu_op"),
            _event("aten::_to_copy", t0 + 105, 290, cat="cpu_op"),
            _event("aten::empty_strided", t0 + 106, 4, cat="cpu_op"),
            _event("aten::copy_", t0 + 112, 278, cat="cpu_op"),
            *_copy(t0 + 115, 10, c + 1, "Memcpy HtoD (Pageable -> Device)", t0 + 200, 150),
            _event("cudaStreamSynchronize", t0 + 130, 255, cat="cuda_runtime"),
            # loss.item(): a sync
            _event("aten::item", t0 + 500, 100, cat="cpu_op"),
            _event("aten::_local_scalar_dense", t0 + 505, 90, cat="cpu_op"),
            *_copy(t0 + 510, 15, c + 2, "Memcpy DtoH (Device -> Pageable)", t0 + 560, 5),
            _event("cudaStreamSynchronize", t0 + 530, 60, cat="cuda_runtime"),
            _event("## forward ##", t0 + 650, 250),
            # a non-blocking copy from pinned memory inside the forward pass
            _event("aten::to", t0 + 700, 20, cat="cpu_op"),
            _event("aten::_to_copy", t0 + 701, 18, cat="cpu_op"),
            _event("aten::copy_", t0 + 702, 16, cat="cpu_op"),
            *_copy(t0 + 705, 7, c + 3, "Memcpy HtoD (Pinned -> Device)", t0 + 710, 2),
            # a device-to-device copy is forward work
            _event("aten::copy_", t0 + 750, 20, cat="cpu_op"),
            *_copy(t0 + 752, 8, c + 4, "Memcpy DtoD (Device -> Device)", t0 + 765, 5),
            # a blocking cudaMemcpy outside any copy op (an extension's): the copy itself
            *_copy(t0 + 950, 30, c + 5, "Memcpy HtoD (Pageable -> Device)", t0 + 955, 20, call="cudaMemcpy"),
        ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    report = report_from_traces([path]).to_dict()
    assert report["steps"]["count"] == 2
    per_step = {name: s["total_s"] / 2 * 1e6 for name, s in report["stages"].items()}
    assert per_step == {
        "h2d": pytest.approx(300 + 20 + 30),
        "forward": pytest.approx(250 - 20),
        "logging": pytest.approx(60),
        "other": pytest.approx(1000 - 350 - 230 - 60),
    }


def test_a100_h2d_is_its_batch_copies() -> None:
    """The A100 job copies each batch from pinned memory (``aten::to`` launching ``Memcpy HtoD``): that
    is its h2d time; its syncs all wait for device-to-host copies and stay logging. Counted here from
    the raw events, over the steps the report uses (the first is warm-up)."""
    path = real("a100_rank3_control.json.gz")
    events = [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#"))
    main_thread = next((e["pid"], e["tid"]) for e in events if e["name"].startswith("ProfilerStep#"))
    on_main = [e for e in events if (e["pid"], e["tid"]) == main_thread]
    htod = {e["args"]["correlation"] for e in events if e["name"].startswith("Memcpy HtoD")}
    launches = [e for e in on_main if e.get("args", {}).get("correlation") in htod]
    copies = [
        op
        for op in on_main
        if op["name"] == "aten::to" and any(op["ts"] <= e["ts"] < op["ts"] + op["dur"] for e in launches)
    ]
    assert len(copies) == len(launches) == 150

    def steady_total(ops: list[dict[str, Any]]) -> float:
        return sum(op["dur"] for op in ops if any(a <= op["ts"] < b for a, b in steps[1:])) / 1e6

    report = report_from_traces([path]).to_dict()
    assert report["stages"]["h2d"]["total_s"] == pytest.approx(steady_total(copies))
    syncs = [e for e in on_main if e["name"] == "cudaStreamSynchronize"]
    assert report["stages"]["logging"]["total_s"] == pytest.approx(steady_total(syncs))


def test_gpu_definitions_on_synthetic_events() -> None:
    """Two streams; µs. Compute [0,10] and [40,50]; NCCL [5,30] on stream 2; memcpy [60,70]."""
    events = GpuEvents(
        names=["gemm", "ncclKernel_AllReduce", "Memcpy HtoD (Pinned -> Device)"],
        name_id=np.array([0, 0, 1, 2]),
        kind=np.array([COMPUTATION, COMPUTATION, COMMUNICATION, MEMORY], dtype=np.int8),
        start=np.array([0.0, 40.0, 5.0, 60.0]),
        dur=np.array([10.0, 10.0, 25.0, 10.0]),
        device=np.zeros(4, dtype=np.int64),
        stream=np.array([1, 1, 2, 1]),
        launch=np.array([-5.0, 45.0, 0.0, 44.0]),  # the second gemm was launched late
        bytes=np.array([0.0, 0.0, 0.0, 4096.0]),
    )
    gpu = gpu_summary(events)
    assert gpu is not None
    # span 70; busy [0,30] + [40,50] + [60,70] = 50; compute 20
    assert gpu["idle_fraction"] == pytest.approx(20 / 70)
    assert gpu["compute_fraction"] == pytest.approx(20 / 70)
    assert gpu["non_compute_fraction"] == pytest.approx(30 / 70)
    assert gpu["comm_fraction"] == pytest.approx(25 / 70)
    # whole GPU: gap [30,40] ends with a late launch (host wait); [50,60] launched early, 10 µs: kernel wait
    assert gpu["idle_breakdown"] == {"host_wait": 0.5, "kernel_wait": 0.5, "other": 0.0}
    # stream 1 alone: gaps 30 (host wait) and 10 (kernel wait)
    stream_1 = next(s for s in gpu["idle_breakdown_by_stream"] if s["stream"] == 1)
    assert (stream_1["host_wait_s"], stream_1["kernel_wait_s"]) == (
        pytest.approx(30e-6),
        pytest.approx(10e-6),
    )
    assert gpu["memcpy_bytes"] == {"HtoD": 4096.0}
    assert [k["name"] for k in gpu["top_kernels"]] == ["ncclKernel_AllReduce", "gemm"]
    # HTA's window: only what was launched before the cut
    cut = gpu_summary(events, launched_before=1.0)
    assert cut is not None and cut["event_count"] == 2


def test_a_trace_recorded_here_on_cpu(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule

    data = torch.utils.data.TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "cpu_trace.json"
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
    ) as prof:
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            prof.step()
    report = report_from_traces([path]).to_dict()
    assert report["steps"]["count"] == 3
    for stage in ("data", "backward", "optimizer"):
        assert report["stages"][stage]["total_s"] > 0, stage
    assert "forward" not in report["stages"]
    assert any("does not show the forward pass" in w for w in report["warnings"])
    assert report["gpu"] is None


def test_a_traced_window_reports_the_gpu_of_its_own_trace(tmp_path: Path) -> None:
    """``--trace`` writes a torch.profiler trace: the live report reads its GPU figures, so launch_bound
    and the other trace rules can speak (here with a real GPU trace standing for the one written)."""
    from analysis_builder import timeline

    from perfmagic.report import report_from_timelines
    from perfmagic.schema import TORCH_TRACE_MARK

    written = tmp_path / "torch_trace.json.gz"
    written.write_bytes(real("v100_ns_resolution.json.gz").read_bytes())
    tl = timeline(samples={"host.cpu_util": 0.3, "host.proc_cpu_cores": 1.0})
    tl.add_mark(0.0, TORCH_TRACE_MARK, path=str(written), clock_name="perfmagic.clock", steps=3)
    report = report_from_timelines([tl])
    expected = trace_gpu(read_trace(written))
    assert expected is not None and report["gpu"]["busy_fraction"] == pytest.approx(expected["busy_fraction"])
    assert not any(w.startswith("launch_bound stayed silent") for w in report.warnings)

    written.write_bytes(b'{"traceEvents": [')  # cut short: the report goes on without it
    assert report_from_timelines([tl])["gpu"] is None


def _clean_events() -> list[dict[str, Any]]:
    events = []
    for k in range(5):
        t0 = k * 1000.0
        events += [
            _event(f"ProfilerStep#{k}", t0, 1000),
            _event("## forward ##", t0 + 100, 400),
            _event("cudaLaunchKernel", t0 + 150, 10, cat="cuda_runtime", correlation=k + 1),
            _event("gemm", t0 + 200, 300, cat="kernel", device=0, stream=7, correlation=k + 1),
        ]
    return events


ODD_EVENTS = {
    "NaN dur": {"dur": float("nan")},
    "null dur": {"dur": None},
    "negative dur": {"dur": -5000},
    "infinite ts": {"ts": float("inf")},
    "a number for a name": {"name": 123},
    "a list for a pid": {"pid": [1, 2]},
    "a correlation above int64": {"args": {"correlation": 2**70}},
    "a string for a stream": {"cat": "kernel", "args": {"stream": "seven", "device": 0}},
}


@pytest.mark.parametrize("case", list(ODD_EVENTS))
def test_an_odd_value_costs_its_event_not_the_report(case: str, tmp_path: Path) -> None:
    clean = tmp_path / "clean.json"
    clean.write_text(json.dumps({"traceEvents": _clean_events()}))
    odd = _event("## forward ##", 2600, 100)
    odd.update(ODD_EVENTS[case])
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"traceEvents": [*_clean_events(), odd]}))
    out = tmp_path / "out.json"
    assert main(["report", "--json", str(out), str(path)]) == 0
    report = json.loads(out.read_text())
    expected = report_from_traces([clean]).to_dict()
    assert report["steps"] == expected["steps"] and report["stages"] == expected["stages"]
    assert report["gpu"]["busy_fraction"] == pytest.approx(expected["gpu"]["busy_fraction"])
    (left_out,) = [w for w in report["warnings"] if "left out" in w]
    assert left_out.startswith("odd.json: 1 events left out"), left_out


def test_odd_trace_facts_are_ignored_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    doc = {
        "traceEvents": _clean_events(),
        "distributedInfo": {"rank": float("nan")},
        "baseTimeNanoseconds": 1e400,
    }
    path.write_text(json.dumps(doc))
    trace = read_trace(path)
    assert trace.rank is None and trace.base_time_ns == 0


def test_steps_that_share_one_timestamp_give_a_report(tmp_path: Path) -> None:
    events = [_event(f"ProfilerStep#{k}", 500.0, 0) for k in range(5)] + [_event("## forward ##", 100, 200)]
    path = tmp_path / "same.json"
    path.write_text(json.dumps({"traceEvents": events}))
    report = report_from_traces([path])
    assert not [w for w in report.warnings if "failed" in w]


def test_perfmagics_own_trace_keeps_its_stages(tmp_path: Path) -> None:
    """perfmagic --trace writes each stage it records as a ## stage ## range: a report of the trace
    shows the forward pass (it used to fall into "other", 40% of the step)."""
    torch = pytest.importorskip("torch")
    import perfmagic

    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.randn(64, 256), torch.randint(0, 10, (64,))) for _ in range(16)]
    with perfmagic.profile(outdir=tmp_path, trace=5, sample=False) as session:
        for x, y in torch.utils.data.DataLoader(data, batch_size=None):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    (written,) = session.report["torch_traces"]
    traced = report_from_traces([written["path"]]).to_dict()
    assert not any("does not show the forward pass" in w for w in traced["warnings"])
    # the traced steps are few and run under torch.profiler, their shares whatever a busy machine made of
    # them: the forward pass is there, beside the backward pass, not in "other"
    assert traced["stages"]["forward"]["total_s"] > 0 and traced["stages"]["backward"]["total_s"] > 0


@pytest.mark.parametrize("name", ["cpu_only_gloo_rank34.json.gz", "a100_rank3_control.json.gz"])
def test_a_traces_warnings_speak_of_a_trace_not_of_a_live_run(name: str) -> None:
    """Nothing a trace lacks is blamed on a live run's causes: no NVML to find, no sampler left off, no
    perfmagic.step() to call."""
    warnings = report_from_traces([real(name)]).warnings
    said = "\n".join(warnings)
    for live_cause in ("seen through NVML", "sampler off", "perfmagic.step()", "the PyTorch hooks saw"):
        assert live_cause not in said, said
    assert any("a trace" in w for w in warnings), said
