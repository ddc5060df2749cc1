"""Telemetry on a real GPU (``pytest -m gpu``; skipped without CUDA)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from perfmagic.analyze.devices import devices_summary
from perfmagic.collect.nvml import Nvml, NvmlSource
from perfmagic.collect.sampler import Sampler
from perfmagic.render.telemetry import NVIDIA_SMI_HEADER, write_nvidia_smi_csv
from perfmagic.timeline import Timeline

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_nvml_reads_every_gpu_in_the_documented_units() -> None:
    nvml = Nvml.open()
    try:
        assert nvml.device_count() >= 1 and nvml.driver_version
        for i in range(nvml.device_count()):
            info = nvml.static_info(i)
            assert info["name"] and info["mem_total_bytes"] > 0
            r = nvml.read(i)
            assert not r["lost"]
            assert 0.0 <= r["util_gpu"] <= 1.0 and 0.0 <= r["util_mem"] <= 1.0
            assert 0 <= r["mem_used_bytes"] <= r["mem_total_bytes"]
            assert r["power_w"] is None or 0 < r["power_w"] < 2000
            assert r["energy_j"] is None or r["energy_j"] > 0
            assert r["sm_clock_mhz"] is None or r["sm_clock_mhz"] > 0
    finally:
        nvml.close()


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

    gpu = devices_summary(timeline)[torch.cuda.current_device()]
    assert gpu["util_mean"] > 0.3  # the matmuls kept it busy
    assert gpu["mem_used_peak_bytes"] >= 3 * 4096 * 4096 * 4
    if gpu["energy_j"] is not None:
        assert gpu["energy_source"] == "counter" and gpu["energy_j"] > 0
    assert gpu["driver_samples"] is None or gpu["driver_samples"]["count"] > 0
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
