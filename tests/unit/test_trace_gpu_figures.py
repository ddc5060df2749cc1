"""The ``gpu`` section's answers from the GPU timeline, each on a real trace against the raw events.

Every expected value is computed here from the trace's JSON with pandas (``trace_data.gpu_window``:
HolisticTraceAnalysis's window), not with perfmagic's reader. ``h200_train.json.gz`` is a small
training job recorded on an H200 by ``tests/data/record_h200_trace.py``; the others are HTA's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from trace_data import gpu_window, length, raw, real, top_kernels, union

from perfmagic.analyze.gpu import tensor_cores, trace_gpu
from perfmagic.trace_report import report_from_traces
from perfmagic.traces import read_trace

A100 = "a100_rank3_control.json.gz"
H200 = "h200_train.json.gz"


def gpu_of(name: str) -> dict:
    gpu = trace_gpu(read_trace(real(name)))
    assert gpu is not None
    return gpu


@pytest.mark.parametrize("name", [A100, H200])  # the H200's are ns-resolution, many under a µs
def test_top_kernels_share_count_mean_and_tensor_cores(name: str) -> None:
    expected = top_kernels(real(name))
    top = gpu_of(name)["top_kernels"]
    assert [k["name"] for k in top] == expected.index.tolist()
    for k in top:
        row = expected.loc[k["name"]]
        assert k["count"] == row["count"]
        assert k["mean_s"] == pytest.approx(row["mean"] / 1e6)
        assert k["fraction"] == pytest.approx(row["share"], rel=1e-3)  # HTA's span: whole µs on the H200


def test_tensor_cores_as_the_name_says() -> None:
    assert tensor_cores("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>(x::Params)")
    assert tensor_cores("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN")  # the H200 trace's bf16 GEMMs
    assert tensor_cores(
        "sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor"
    )
    assert tensor_cores("ampere_sgemm_128x64_nn") is False
    assert (
        tensor_cores("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma")
        is False
    )
    assert (
        tensor_cores("void fbgemm_gpu::permute_2D_lengths_kernel<int>(int, int)") is None
    )  # FBGEMM: no GEMM
    assert tensor_cores("fb::convex_sum") is None
    # the share of matrix-kernel time on tensor cores, over the A100's window
    window = gpu_window(real(A100))[0]
    kernels = window[window["cat"] == "kernel"]
    says = kernels["name"].map(tensor_cores)
    matrix = kernels[says.notna()]
    expected = matrix[says[says.notna()].astype(bool)]["dur"].sum() / matrix["dur"].sum()
    assert gpu_of(A100)["tensor_core_fraction"] == pytest.approx(expected)
    assert gpu_of(H200)["tensor_core_fraction"] == 1.0  # bf16 autocast


def test_launch_statistics() -> None:
    window = gpu_window(real(A100))[0]
    launched = window[(window["cat"] == "kernel") & (window["launch_name"] == "cudaLaunchKernel")]
    delay = (launched["ts"] - launched["launch"] - launched["launch_dur"]).clip(lower=0)
    short = launched["dur"] < launched["launch_dur"]
    span = (window["ts"] + window["dur"]).max() - window["ts"].min()
    launches = gpu_of(A100)["launches"]
    assert launches["count"] == len(launched)
    assert launches["delay_median_s"] == pytest.approx(delay.median() / 1e6)
    assert launches["delay_p90_s"] == pytest.approx(np.percentile(delay, 90) / 1e6)
    assert launches["shorter_than_launch"] == short.sum()
    lost = (launched["launch_dur"] - launched["dur"])[short].sum()
    assert launches["launch_bound_fraction"] == pytest.approx(lost / span)


def test_synchronizing_calls_per_step() -> None:
    _, ev, steps = gpu_window(real(H200))
    steps = steps.iloc[:-1]  # the window's steps: the last one is left out
    syncs = ev[ev["name"].isin(["cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"])]
    # a blocking cudaMemcpy of a device-to-host copy would count too: this job's copies are all async
    assert not (ev["name"] == "cudaMemcpy").any()
    inside = syncs[syncs["ts"].map(lambda t: ((steps["ts"] <= t) & (t < steps["ts"] + steps["dur"])).any())]
    got = gpu_of(H200)["syncs"]
    assert got["steps"] == len(steps)
    assert got["per_step"] == pytest.approx(len(inside) / len(steps))
    assert got["calls_per_step"] == {
        n: pytest.approx(c / len(steps)) for n, c in inside["name"].value_counts().items()
    }
    # loss.item() and a float() each sync a stream, torch.cuda.synchronize() the device: every step
    assert got["calls_per_step"]["cudaDeviceSynchronize"] == pytest.approx(1.0)


@pytest.mark.parametrize("name", [H200, "sampled_rank-0.json.gz"])
def test_pageable_and_pinned_host_to_device_copies(name: str) -> None:
    window = gpu_window(real(name))[0]
    got = gpu_of(name)["h2d_copies"]
    for host in ("Pageable", "Pinned"):
        copies = window[window["name"] == f"Memcpy HtoD ({host} -> Device)"]
        size = copies["args"].map(lambda a: a["bytes"]).sum()
        assert got[host.lower()] == {
            "count": len(copies),
            "bytes": pytest.approx(size),
            "total_s": pytest.approx(copies["dur"].sum() / 1e6),
        }
    assert got["pinned_bytes_fraction"] == pytest.approx(
        got["pinned"]["bytes"] / (got["pinned"]["bytes"] + got["pageable"]["bytes"])
    )


def test_communication_overlapped_and_exposed() -> None:
    window = gpu_window(real(A100))[0]
    kernels = window[window["cat"] == "kernel"]
    comm = kernels[kernels["name"].str.contains("ncclKernel|ncclDevKernel")]
    compute = kernels.drop(comm.index)
    comm_time = length(union(comm))
    exposed = length(union(pd.concat([comm, compute]))) - length(union(compute))
    span = (window["ts"] + window["dur"]).max() - window["ts"].min()
    got = gpu_of(A100)["comm"]
    assert got["total_s"] == pytest.approx(comm_time / 1e6)
    assert got["exposed_s"] == pytest.approx(exposed / 1e6)
    assert got["exposed_fraction"] == pytest.approx(exposed / span)
    assert 0 < got["overlap_fraction"] < 1
    assert gpu_of(H200)["comm"] is None  # one GPU, no NCCL


def test_peak_allocated_memory() -> None:
    memory = [e["args"] for e in raw(real(H200))["traceEvents"] if e.get("name") == "[memory]"]
    cuda = [m for m in memory if m["Device Type"] == 1]
    assert len(cuda) < len(memory)  # the CPU's allocations are there too
    assert gpu_of(H200)["memory"] == [
        {
            "device": 0,
            "allocated_peak_bytes": max(m["Total Allocated"] for m in cuda),
            "reserved_peak_bytes": max(m["Total Reserved"] for m in cuda),
        }
    ]
    assert gpu_of(A100)["memory"] is None  # recorded without profile_memory


def test_the_cards_read_the_trace_figures() -> None:
    """launch_bound, pin_memory and comm_bound show the trace's figures as their evidence."""
    h200 = {c["id"]: c for c in report_from_traces([real(H200)]).to_dict()["advice"]}
    gpu = gpu_of(H200)
    launch = h200["launch_bound"]["metrics"]
    assert launch["launch_bound_share"] == pytest.approx(gpu["launches"]["launch_bound_fraction"])
    assert launch["launch_delay_p90_s"] == pytest.approx(gpu["launches"]["delay_p90_s"])
    pin = h200["pin_memory"]["metrics"]
    copies = gpu["h2d_copies"]
    assert pin["pinned_share"] == pytest.approx(copies["pinned_bytes_fraction"])
    pageable_s = copies["pageable"]["total_s"]
    assert pin["pageable_time_share"] == pytest.approx(
        pageable_s / (pageable_s + copies["pinned"]["total_s"])
    )
    a100 = report_from_traces([real(A100)])
    comm = next(c for c in a100.to_dict()["advice"] if c["id"] == "comm_bound")["metrics"]
    assert comm["gpu_comm_exposed_share"] == pytest.approx(gpu_of(A100)["comm"]["exposed_fraction"])
    assert not any("pin_memory" in w for w in a100.warnings)  # fed by the trace's copies
