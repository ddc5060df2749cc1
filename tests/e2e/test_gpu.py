"""Telemetry on a real GPU (``pytest -m gpu``; skipped without CUDA), and ``benchmarks/gpu_check.py``
on this machine (its no-GPU path and its CPU smoke run), so the one-shot GPU check cannot fail on a
typo when it finally runs on a GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paths import BENCHMARKS

from perfmagic.analyze.devices import devices_summary
from perfmagic.collect.nvml import Nvml
from perfmagic.collect.nvml_source import NvmlSource
from perfmagic.collect.sampler import Sampler
from perfmagic.render.telemetry import NVIDIA_SMI_HEADER, write_nvidia_smi_csv
from perfmagic.timeline import Timeline

torch = pytest.importorskip("torch")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
GPU_CHECK = BENCHMARKS / "gpu_check.py"


def _gpu_check(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OUT": str(out)}
    return subprocess.run(
        [sys.executable, str(GPU_CHECK), *args], env=env, capture_output=True, text=True, timeout=240
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path")
def test_gpu_check_without_a_gpu_says_why_and_exits_2(tmp_path: Path) -> None:
    done = _gpu_check(tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no usable CUDA GPU here" in done.stdout and "Traceback" not in done.stdout + done.stderr
    assert (tmp_path / "gpu-check.txt").read_text() == done.stdout  # the summary also lands in $OUT


def test_gpu_check_cpu_smoke_runs_every_summary_line(tmp_path: Path) -> None:
    done = _gpu_check(tmp_path, "--cpu-smoke")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all checks passed" in done.stdout
    # the hot path phase ran overhead.py to its end: its figure, not judged in a smoke run
    assert "[n/a ] hot path       windowed profile" in done.stdout, done.stdout
    assert "steps:" in (tmp_path / "gpu-check-report.txt").read_text()
    assert (tmp_path / "gpu-check-report.json").stat().st_size > 0


@pytest.mark.gpu
@needs_gpu
def test_nvml_reads_every_gpu_in_the_documented_units() -> None:
    nvml = Nvml.open()
    try:
        assert nvml.device_count() >= 1 and nvml.driver_version
        for i in range(nvml.device_count()):
            info = nvml.static_info(i)
            assert info["name"] and info["mem_total_bytes"] > 0
            r = nvml.read(i)
            assert not r["lost"]
            if not info["mig_enabled"]:  # a MIG-enabled GPU has no whole-GPU utilization
                assert 0.0 <= r["util_gpu"] <= 1.0 and 0.0 <= r["util_mem"] <= 1.0
            assert 0 <= r["mem_used_bytes"] <= r["mem_total_bytes"]
            assert r["power_w"] is None or 0 < r["power_w"] < 2000
            assert r["energy_j"] is None or r["energy_j"] > 0
            assert r["sm_clock_mhz"] is None or r["sm_clock_mhz"] > 0
    finally:
        nvml.close()


@pytest.mark.gpu
@needs_gpu
def test_sampling_real_cuda_work(tmp_path: Path) -> None:
    timeline = Timeline({"epoch": time.time()})
    origin = time.perf_counter()
    sampler = Sampler(timeline, [NvmlSource()], interval=0.1, clock=lambda: time.perf_counter() - origin)
    x = torch.randn(4096, 4096, device="cuda")
    sampler.start()
    end = time.perf_counter() + 3.0
    while time.perf_counter() < end:
        for _ in range(20):
            x = torch.tanh(x @ x)
        torch.cuda.synchronize()
    sampler.stop()

    gpu = devices_summary(timeline)[_nvml_index_of_current_cuda_device(timeline)]
    if not gpu["mig_enabled"]:
        assert gpu["util_mean"] > 0.3  # the matmuls kept it busy
    assert gpu["mem_used_peak_bytes"] >= 3 * 4096 * 4096 * 4
    if gpu["energy_j"] is not None:
        assert gpu["energy_source"] == "counter" and gpu["energy_j"] > 0
    driver = gpu["driver_samples"]
    assert driver is None or (driver["count"] > 0 and 0.0 <= driver["util_mean"] <= 1.0)
    pids = {p["pid"] for p in gpu["processes"]}
    if timeline.meta["gpu_processes_scope"] == "tree":
        assert os.getpid() in pids and gpu["tree_mem_used_bytes"] > 0

    path = tmp_path / "gpu.csv"
    assert write_nvidia_smi_csv(timeline, path) > 0
    smi = shutil.which("nvidia-smi")
    if smi:  # the header is exactly the one nvidia-smi prints
        query = "timestamp,name,pstate,temperature.gpu,utilization.gpu,utilization.memory,memory.total,memory.used,power.draw"
        out = subprocess.run(
            [smi, f"--query-gpu={query}", "--format=csv"], capture_output=True, text=True, timeout=30
        )
        assert out.stdout.splitlines()[0] == NVIDIA_SMI_HEADER == path.read_text().splitlines()[0]


def _nvml_index_of_current_cuda_device(timeline: Timeline) -> int:
    """CUDA and NVML number GPUs differently (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER): match UUIDs."""
    devices = timeline.meta["devices"]
    uuid = str(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", ""))
    for d in devices:
        if uuid and str(d.get("uuid") or "").endswith(uuid):
            return int(d["index"])
    return 0 if len(devices) == 1 else torch.cuda.current_device()
