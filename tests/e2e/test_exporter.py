"""``perfmagic exporter`` and ``/perfmagic/metrics``: Prometheus text under dcgm-exporter's names."""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fake_nvml as fakes
import pytest
import tornado.httpclient
from exporters import BATCHES, Exporters, profiled, training
from jupyter_server.utils import url_path_join
from prometheus_client.parser import text_string_to_metric_families

MiB = 1 << 20

# What dcgm-exporter's default counters name, and the labels it puts on each GPU series
DCGM_NAMES = {
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_GPU_TEMP",
}
RATES = {"DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"}  # from counters: from the second read on
DCGM_LABELS = {"gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id"}


def samples(text: str) -> dict[str, list[Any]]:
    """Each metric's samples, parsed by prometheus_client's own parser."""
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[Callable[[str, str], str]]:
    """``exporter(scenario, hostname)``: an exporter process with that fake NVML; its /metrics URL."""
    exporters = Exporters(tmp_path)
    yield exporters.start
    exporters.close()


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return str(response.read().decode())


def test_the_exporter_speaks_dcgm_exporter_names_units_and_labels(exporter: Any) -> None:
    url = exporter("two_gpus", "node-a")
    first, series = samples(scrape(url)), samples(scrape(url))
    assert first.keys() >= DCGM_NAMES, sorted(DCGM_NAMES - first.keys())
    assert series.keys() >= DCGM_NAMES | RATES, sorted((DCGM_NAMES | RATES) - series.keys())
    pcie = {s.labels["gpu"]: s.value for s in series["DCGM_FI_PROF_PCIE_RX_BYTES"]}
    assert pcie["0"] == pytest.approx(8.0e9, rel=0.05) and pcie["1"] == 0  # bytes per second
    util = {s.labels["modelName"]: s.value for s in series["DCGM_FI_DEV_GPU_UTIL"]}
    assert util == {"NVIDIA H100 80GB HBM3": 87, "NVIDIA A100-SXM4-40GB": 0}  # percent, as DCGM
    h100 = next(s for s in series["DCGM_FI_DEV_FB_USED"] if s.labels["gpu"] == "0")
    assert set(h100.labels) == DCGM_LABELS and h100.value == 20 * 1024  # MiB, as DCGM
    assert h100.labels["Hostname"] == "node-a" and h100.labels["device"] == "nvidia0"
    assert h100.labels["UUID"] == "GPU-00000000-0000-0000-0000-000000000000"
    power = {s.labels["gpu"]: s.value for s in series["DCGM_FI_DEV_POWER_USAGE"]}
    assert power == {"0": pytest.approx(250.12), "1": pytest.approx(62.4)}  # watts
    assert series["perfmagic_nvml_up"][0].value == 1
    assert series["perfmagic_host_cpu_count"][0].value >= 1


def test_a_field_a_gpu_does_not_support_is_left_out_not_zero(exporter: Any) -> None:
    url = exporter("fields_not_supported", "node-b")
    scrape(url)
    series = samples(scrape(url))
    assert "DCGM_FI_DEV_GPU_UTIL" in series
    # this GPU answers NOT_SUPPORTED for power, temperature and the PCIe counters: no series, not a false 0
    assert not {"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP", *RATES} & series.keys()


def test_without_nvml_the_exporter_says_so_and_serves_the_host(exporter: Any) -> None:
    url = exporter("no_library", "node-c")
    series = samples(scrape(url))
    assert series["perfmagic_nvml_up"][0].value == 0
    assert not any(name.startswith("DCGM_") for name in series)
    assert series["perfmagic_host_mem_total_bytes"][0].value > 0
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url.removesuffix("/metrics") + "/other", timeout=10)
    assert e.value.code == 404


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"perfmagic.server": True}}}


async def test_the_server_extension_serves_the_same_metrics_to_a_token_holder(
    jp_fetch: Any, http_server_client: Any, jp_base_url: str, fake_nvml: Any
) -> None:
    fake_nvml(fakes.two_gpus())
    with pytest.raises(tornado.httpclient.HTTPClientError) as e:
        await http_server_client.fetch(url_path_join(jp_base_url, "perfmagic/metrics"))
    assert e.value.code == 403
    response = await jp_fetch("perfmagic", "metrics")
    series = samples(response.body.decode())
    assert series.keys() >= DCGM_NAMES
    assert {s.labels["gpu"]: s.value for s in series["DCGM_FI_DEV_FB_USED"]} == {"0": 20 * 1024, "1": 4}


def test_a_running_session_is_exported_with_its_rank_and_pace(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    exporters = Exporters(tmp_path)
    job = training(registry, rank=3)
    try:
        url = exporters.start("two_gpus", "node-a", registry)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            series = samples(scrape(url))
            paced = series.get("perfmagic_training_steps_per_second") or []
            if (
                paced
                and series["perfmagic_training_steps"][0].value >= 20
                and "perfmagic_training_bottleneck" in series
            ):
                break
            time.sleep(0.3)
        (steps,) = series["perfmagic_training_steps"]  # the parser names a counter without its _total
        assert steps.labels["rank"] == "3" and int(steps.labels["pid"]) in profiled(job), steps
        assert steps.labels["Hostname"] == "node-a" and steps.value >= 20
        assert 5 < paced[0].value < 200  # a step every 10 ms, however busy the machine
        (stage,) = series["perfmagic_training_stage"]
        assert stage.labels["stage"] in {"forward", "other"} and stage.value == 1
        # the script's steps are a 10 ms forward stage and little else: the shares and the bottleneck say so
        seconds = {s.labels["stage"]: s.value for s in series["perfmagic_training_stage_seconds"]}
        assert seconds["forward"] > 0.9 * sum(seconds.values()), seconds
        (bottleneck,) = series["perfmagic_training_bottleneck"]
        assert bottleneck.labels["stage"] == "forward" and bottleneck.labels["rank"] == "3"
    finally:
        job.terminate()
        job.wait(timeout=30)
        exporters.close()


def test_joules_per_sample_are_the_training_gpus_power_over_its_samples(tmp_path: Path) -> None:
    """The fake GPU draws 250.12 W and runs the training process; the loop takes 8 samples a step."""
    registry = tmp_path / "registry"
    exporters = Exporters(tmp_path)
    job = training(registry, rank=0, script=BATCHES)
    try:
        deadline = time.monotonic() + 60
        while not profiled(job) and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = ",".join(str(p) for p in sorted(profiled(job)))
        url = exporters.start("training_gpu", "node-a", registry, FAKE_NVML_PIDS=pids)
        while time.monotonic() < deadline:
            series = samples(scrape(url))
            if series.get("perfmagic_training_joules_per_sample") and series.get(
                "perfmagic_training_steps_per_second"
            ):
                break
            time.sleep(0.3)
        (joules,) = series["perfmagic_training_joules_per_sample"]
        (pace,) = series["perfmagic_training_steps_per_second"]
        assert joules.labels["rank"] == "0" and int(joules.labels["pid"]) in profiled(job)
        # one status, one window: 8 samples a step (give or take a batch at the window's edges)
        assert joules.value == pytest.approx(250.12 / (8 * pace.value), rel=0.1)
    finally:
        job.terminate()
        job.wait(timeout=30)
        exporters.close()


def test_the_status_file_goes_when_the_session_ends_however_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import perfmagic
    from perfmagic.registry import running_sessions

    monkeypatch.setenv("PERFMAGIC_REGISTRY_DIR", str(tmp_path))
    with pytest.raises(KeyboardInterrupt), perfmagic.profile(sample=False, outdir=tmp_path / "out"):
        deadline = time.monotonic() + 30
        while not running_sessions(tmp_path) and time.monotonic() < deadline:
            perfmagic.step()
            time.sleep(0.05)
        (status,) = running_sessions(tmp_path)
        assert status["pid"] == os.getpid() and status["steps"] >= 1
        raise KeyboardInterrupt  # Ctrl-C in the cell
    assert running_sessions(tmp_path) == [] and not list(tmp_path.glob("*.json"))
