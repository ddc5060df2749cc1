"""``perfmagic report`` on the traces people have: PyTorch 1.8/1.9's spellings, tensor cores by name,
ties at the collectives, memory-only traces, steps as recorded and the data a report cannot trust.

Each small trace is written in both spellings: today's (``kernel``, ``gpu_memcpy``, ``cpu_op``, the
GPU's stream in ``args``) and PyTorch 1.8/1.9's (``Kernel``, ``Memcpy``, ``Operator``, ``Runtime``,
the stream only in the thread name ``"stream 7"``). The real older trace is torch-tb-profiler's own
sample (``tests/data/tb_resnet50_v100_pt19.json.gz``, see the README there).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trace_data import real

from perfmagic.analyze.ranks import collective_skew
from perfmagic.analyze.steps import step_breakdown
from perfmagic.analyze.tensor_cores import TENSOR_CORE_TABLE, tensor_core_token, tensor_cores
from perfmagic.render.text import render_text
from perfmagic.trace_report import report_from_traces
from perfmagic.traces import read_trace
from perfmagic.traces.stages import trace_timeline
from perfmagic.units import fmt_bytes

SPELLINGS = ("today", "older")
_CATS = {
    "today": {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset", "op": "cpu_op", "rt": "cuda_runtime"},
    "older": {"kernel": "Kernel", "memcpy": "Memcpy", "memset": "Memset", "op": "Operator", "rt": "Runtime"},
}  # fmt: skip
PID, TID = 4242, 4242
OLDER_TRACE = "tb_resnet50_v100_pt19.json.gz"


class Trace:
    """A small hand-written trace in one spelling."""

    def __init__(self, spelling: str) -> None:
        self.spelling, self.events, self.corr = spelling, [], 100
        self.cat = _CATS[spelling]

    def op(self, name: str, ts: float, dur: float, tid: Any = TID) -> None:
        older = self.spelling == "older"
        self.events.append(
            {"ph": "X", "cat": self.cat["op"], "name": name, "pid": PID, "tid": str(tid) if older else tid,
             "ts": ts, "dur": dur, "args": {}}
        )  # fmt: skip

    def step(self, n: int, ts: float, dur: float) -> None:
        self.op(f"ProfilerStep#{n}", ts, dur)

    def gpu(self, kind: str, name: str, launch: float, ts: float, dur: float, *, args: bool = True) -> None:
        """A kernel, copy or set on device 0, stream 7, launched by a runtime call at ``launch``."""
        self.corr += 1
        rt = {"kernel": "cudaLaunchKernel", "memcpy": "cudaMemcpyAsync", "memset": "cudaMemsetAsync"}[kind]
        self.events.append(
            {"ph": "X", "cat": self.cat["rt"], "name": rt, "pid": PID, "tid": TID, "ts": launch, "dur": 2,
             "args": {"correlation": self.corr}}
        )  # fmt: skip
        where = {"device": 0, "stream": 7} if args else {}
        extra = {"bytes": 1024} if kind == "memcpy" else {}
        self.events.append(
            {"ph": "X", "cat": self.cat[kind], "name": name, "pid": 0,
             "tid": "stream 7" if self.spelling == "older" else 7, "ts": ts, "dur": dur,
             "args": {**where, "correlation": self.corr, **extra}}
        )  # fmt: skip

    def memory(self, ts: float, total: float, delta: float) -> None:
        """An allocator event on CUDA device 0: ``Total Allocated`` today, only its ``Bytes`` before 1.10."""
        args: dict[str, Any] = {"Device Type": 1, "Device Id": 0, "Bytes": delta}
        if self.spelling == "today":
            args["Total Allocated"], args["Total Reserved"] = total, 2 * total
        self.events.append(
            {"ph": "i", "s": "t", "name": "[memory]", "pid": PID, "tid": TID, "ts": ts, "args": args}
        )

    def write(self, path: Path, info: dict[str, Any] | None = None) -> Path:
        doc: Any
        if self.spelling == "older" and info is None:
            doc = self.events  # PyTorch 1.8 wrote the bare event array
        else:
            doc = {"schemaVersion": 1, "traceEvents": self.events}
            if info is not None:
                doc["distributedInfo"] = info
        path.write_text(json.dumps(doc))
        return path


def _training(spelling: str) -> Trace:
    """Three steps of 1 ms, each a copy, a GEMM on tensor cores, an elementwise kernel, a memset."""
    t = Trace(spelling)
    for i in range(3):
        s = 1000.0 * i
        t.step(i + 1, s, 1000)
        t.op("aten::copy_", s + 10, 100)
        t.gpu("memcpy", "Memcpy HtoD (Pageable -> Device)", s + 20, s + 30, 50)
        t.gpu("kernel", "ampere_h16816gemm_256x128_ldg8_stages_64x3_nn", s + 200, s + 210, 300)
        t.gpu("kernel", "void at::native::vectorized_elementwise_kernel<4>(int)", s + 300, s + 520, 100)
        t.gpu("memset", "Memset (Device)", s + 400, s + 630, 10)
    return t


def _report(path: Path) -> Any:
    """The report of one trace or a directory of them (a ``Report``: indexed as its dict)."""
    return report_from_traces([path])


# -- older spellings read as today's --------------------------------------------------


def test_older_spellings_read_as_todays(tmp_path: Path) -> None:
    today = _report(_training("today").write(tmp_path / "today.json"))
    older = _report(_training("older").write(tmp_path / "older.json"))
    assert older["gpu"] is not None
    assert not any("no GPU events" in w for w in older["warnings"])
    keys = ("event_count", "kernel_count", "busy_fraction", "compute_fraction", "memory_fraction", "streams")
    assert {k: older["gpu"][k] for k in keys} == {k: today["gpu"][k] for k in keys}
    assert older["gpu"]["event_count"] == 8  # the two steps HTA's window keeps: 4 events each
    assert older["gpu"]["memcpy_bytes"] == {"HtoD": 2048.0}
    assert older["steps"]["count"] == today["steps"]["count"] == 3


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_copies_and_kernels_without_device_or_stream_go_where_they_ran(spelling: str, tmp_path: Path) -> None:
    t = Trace(spelling)
    t.step(1, 0, 500)
    t.step(2, 500, 500)
    t.gpu("memcpy", "Memcpy HtoD (Pageable -> Device)", 10, 20, 50, args=False)
    t.gpu("kernel", "volta_sgemm_64x64_nt", 100, 110, 100, args=False)
    trace = read_trace(t.write(tmp_path / "t.json"))
    assert trace.gpu.device.tolist() == [0, 0]  # the process Kineto puts a GPU's events on
    assert trace.gpu.stream.tolist() == [7, 7]  # the thread: the copy's and the kernel's stream
    gpu = _report(tmp_path / "t.json")["gpu"]
    assert [s["stream"] for s in gpu["idle_breakdown_by_stream"]] == [7]


def test_the_real_older_trace_has_its_gpu() -> None:
    """torch-tb-profiler's V100 sample: 8,772 kernels, categories ``Kernel``/``Memcpy``/``Memset``."""
    path = real(OLDER_TRACE)
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    steps = sorted(e["ts"] for e in events if e.get("name", "").startswith("ProfilerStep#"))
    launches = {e["args"]["correlation"]: e["ts"] for e in events if e.get("cat") == "Runtime"}
    gpu_events = [e for e in events if e.get("cat") in ("Kernel", "Memcpy", "Memset")]
    window = [e for e in gpu_events if launches.get(e["args"]["correlation"], np.inf) < steps[-1]]
    allocated = np.cumsum(
        [e["args"]["Bytes"] for e in events if e.get("name") == "[memory]" and e["args"]["Device Type"] == 1]
    )

    report = _report(path)
    gpu = report["gpu"]
    assert sum(e["cat"] == "Kernel" for e in gpu_events) == 8772
    assert gpu is not None and not any("no GPU events" in w for w in report["warnings"])
    assert gpu["event_count"] == len(window)
    assert gpu["kernel_count"] == sum(e["cat"] == "Kernel" for e in window)
    assert gpu["devices"] == [{"index": 0, "name": "Tesla V100-DGXS-32GB"}]
    assert report["steps"]["count"] == 6 and report["steps"]["boundary"] == "profiler_step"
    assert report["stages"]["data"]["total_s"] > 0  # enumerate(DataLoader)#
    # its allocator events carry each (de)allocation's bytes only: the peak of their running sum
    assert report["gpu_memory"] == [
        {"device": 0, "allocated_peak_bytes": float(allocated.max()), "reserved_peak_bytes": None}
    ]
    assert gpu["memory"] == report["gpu_memory"]
    # fp32 ResNet-50: cuDNN's and cuBLAS's SIMT kernels, no tensor cores
    assert gpu["tensor_core_fraction"] == 0.0


# -- tensor cores by kernel name ---------------------------------------------------------


@pytest.mark.parametrize("row", TENSOR_CORE_TABLE, ids=lambda r: r.pattern)
def test_each_tensor_core_token_names_its_kernels(row: Any) -> None:
    assert tensor_core_token(row.example) is row
    assert tensor_cores(row.example) is True


def test_the_docs_print_the_tensor_core_table() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "traces.md").read_text()
    for row in TENSOR_CORE_TABLE:
        tokens = " or ".join(f"`{t}`" for t in row.pattern.split("|"))
        assert f"| {tokens} | {row.architecture} | {row.precision} | `{row.example}`" in page, row.pattern


def test_tensor_cores_of_the_issues_kernels() -> None:
    assert tensor_cores("volta_fp16_s884cudnn_fp16_128x128_ldg8_splitK_relu_f2f_exp_small_nhwc_tn_v1")
    assert tensor_cores("ampere_h16816gemm_256x128_ldg8_stages_64x3_nn")
    assert tensor_cores("volta_scudnn_128x64_relu_small_nn_v1") is False  # cuDNN's SIMT convolution
    assert tensor_cores("volta_sgemm_64x64_nt") is False
    assert tensor_cores("void at::native::vectorized_elementwise_kernel<4>(int)") is None


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_kernels_whose_name_does_not_say_are_counted(spelling: str, tmp_path: Path) -> None:
    gpu = _report(_training(spelling).write(tmp_path / "t.json"))["gpu"]
    # the elementwise kernel says nothing; the GEMM is on tensor cores; the memset is no kernel
    assert gpu["tensor_cores_unknown"] == 1
    assert gpu["tensor_core_fraction"] == 1.0
    assert [k["tensor_cores"] for k in gpu["top_kernels"]] == [True, None]


# -- the late rank on a tie ---------------------------------------------------------------


def test_a_tie_on_last_goes_to_the_rank_later_on_average() -> None:
    # two collectives: rank 0 is 4 µs late in the first, rank 1 200 µs late in the second
    starts = {
        0: {"ncclKernel_AllReduce": np.array([1004.0, 5000.0])},
        1: {"ncclKernel_AllReduce": np.array([1000.0, 5200.0])},
    }
    skew = collective_skew(starts)
    assert skew is not None
    assert [r["last_count"] for r in skew["ranks"]] == [1, 1]
    assert skew["last_rank"] == 1
    # without the tie, the rank last most often still wins, however little late
    starts[0]["ncclKernel_AllReduce"] = np.array([1004.0, 5000.0, 9001.0])
    starts[1]["ncclKernel_AllReduce"] = np.array([1000.0, 5200.0, 9000.0])
    assert collective_skew(starts)["last_rank"] == 0  # type: ignore[index]


# -- a memory-only trace ------------------------------------------------------------------


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_memory_only_trace_keeps_its_peaks_and_its_length(spelling: str, tmp_path: Path) -> None:
    t = Trace(spelling)
    deltas = [4096, 8192, -4096, 1 << 20, -(1 << 20)]
    total = np.cumsum(deltas)
    for i, (d, a) in enumerate(zip(deltas, total, strict=True)):
        t.memory(100.0 + i * 226.25, float(a), d)
    report = _report(t.write(tmp_path / "m.json", info={"rank": 0, "world_size": 1}))
    assert report["gpu"] is None
    assert report["gpu_memory"][0]["device"] == 0
    assert report["gpu_memory"][0]["allocated_peak_bytes"] == float(total.max())
    assert report["wall_s"] == pytest.approx(905e-6)
    assert any("only the allocator's memory events" in w for w in report["warnings"])
    assert not any("recorded on the CPU only" in w for w in report["warnings"])
    text = render_text(report.to_dict())
    assert "905 µs profiled" in text
    assert f"GPU 0 memory (trace): tensors peaked at {fmt_bytes(float(total.max()))}" in text


# -- steps as recorded --------------------------------------------------------------------


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_steps_are_the_profiler_step_ranges_gaps_and_all(spelling: str, tmp_path: Path) -> None:
    t = Trace(spelling)
    for n, (s, d) in enumerate([(0, 100), (150, 150), (350, 150), (500, 100)], start=1):
        t.step(n, s, d)
        t.op("enumerate(DataPipe)#MapperIterDataPipe", s + 5, 20)
    trace = read_trace(t.write(tmp_path / "gaps.json"))
    timeline = trace_timeline(trace, 0)
    b = step_breakdown(timeline)
    assert (b.durations * 1e6).round(3).tolist() == [100, 150, 150, 100]
    data = b.column("data") * 1e6
    assert data.round(3).tolist() == [20, 20, 20, 20]  # DataPipe iteration is data
    warning = next(w for w in timeline.meta["warnings"] if "gaps" in w)
    assert warning.startswith("gaps.json: the trace's ProfilerStep# ranges leave 2 gaps")
    assert "100 µs in all (the longest 50 µs, after step 1)" in warning


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_steps_sharing_one_timestamp_are_a_warning(spelling: str, tmp_path: Path) -> None:
    t = Trace(spelling)
    for n in range(1, 4):
        t.step(n, 1000, 100)
    report = _report(t.write(tmp_path / "same.json"))
    assert any(
        w.startswith("same.json: the trace's 3 ProfilerStep# ranges all start at the same time")
        for w in report["warnings"]
    )


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_reversed_overlapping_and_negative_spans_are_warnings(spelling: str, tmp_path: Path) -> None:
    t = Trace(spelling)
    t.step(3, 0, 120)  # numbered backwards, each overlapping the next by 20 µs
    t.step(2, 100, 120)
    t.step(1, 200, 100)
    t.op("aten::mm", 50, -10)  # a span that ends before it starts
    warnings = _report(t.write(tmp_path / "odd.json"))["warnings"]
    assert any(
        "ProfilerStep# numbers do not rise with time (steps 3, 2, 1 in time order)" in w for w in warnings
    )
    assert any(
        "2 of the trace's ProfilerStep# ranges overlap the one before them (by up to 20 µs)" in w
        for w in warnings
    )
    assert any(w.startswith("odd.json: 1 events left out") and "negative" in w for w in warnings)


# -- a directory of per-rank older traces -------------------------------------------------


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_directory_of_older_per_rank_traces(spelling: str, tmp_path: Path) -> None:
    """No ``distributedInfo`` (PyTorch < 1.10): ranks from the file names, NCCL 2.4-2.6 kernel names."""
    late = {0: [0.0, 4.0], 10: [200.0, 0.0]}  # µs late in each all-reduce
    for rank in (10, 0):  # ranks from the numbers in the file names, not their order
        t = Trace(spelling)
        for i in range(3):
            s = 1000.0 * i
            t.step(i + 1, s, 1000)
            t.gpu("kernel", "ampere_sgemm_128x64_nn", s + 10, s + 20, 200)
            if i < 2:
                t.gpu(
                    "kernel",
                    "ncclAllReduceRingLLKernel_sum_f32(ncclColl)",
                    s + 300,
                    s + 400 + late[rank][i],
                    100,
                )
        t.write(tmp_path / f"worker{rank}.pt.trace.json")
    report = _report(tmp_path)
    assert [r["rank"] for r in report["ranks"]] == [0, 10]
    skew = report["collective_skew"]
    assert skew is not None and skew["instances"] == 2
    assert skew["last_rank"] == 10  # tied at one each; 100 µs late on average against 2
    assert report["gpu"]["comm_fraction"] > 0
