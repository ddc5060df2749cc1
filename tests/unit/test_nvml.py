"""The NVML layer and source, against the fake NVML: every failure mode leaves a warning and a report."""

from __future__ import annotations

import re
from typing import Any

import fake_nvml as scenarios
import numpy as np
import pynvml
import pytest
from fakeclock import FakeClock

from perfmagic.analyze.devices import devices_summary
from perfmagic.collect.nvml import Nvml
from perfmagic.collect.nvml_counters import FIELDS_PERIOD_S
from perfmagic.collect.nvml_query import NvmlUnavailable
from perfmagic.collect.nvml_source import NvmlSource
from perfmagic.collect.sampler import Sampler, SourceUnavailable
from perfmagic.timeline import Timeline

GiB = 1024**3


class ManualClock:
    """Wall clock for the fake driver, moved by hand so rates are exact."""

    def __init__(self) -> None:
        self.t = 1_750_000_000.0

    def __call__(self) -> float:
        return self.t


INTERVAL = 0.01


def run_sampler(
    clock: FakeClock, source: NvmlSource | None = None, seconds: float = 0.15, during: Any = None
) -> tuple[Timeline, Sampler]:
    """``seconds`` of sampling on the fake clock, ``during`` called half-way: a tick at the start, one
    every :data:`INTERVAL` and one at the stop, ``seconds / INTERVAL + 2`` in all."""
    timeline = Timeline()
    origin = clock.now()
    source = source or NvmlSource(clock=clock)
    sampler = Sampler(timeline, [source], interval=INTERVAL, clock=lambda: clock.now() - origin, timer=clock)
    sampler.start()
    clock.advance(seconds / 2)
    if during is not None:
        during()
    clock.advance(seconds / 2)
    sampler.stop()
    return timeline, sampler


def count(warnings: list[str], *words: str) -> int:
    return sum(all(w in message for w in words) for message in warnings)


def test_two_gpus_fill_the_report_with_real_units(fake_nvml: Any, fake_clock: FakeClock) -> None:
    fake = fake_nvml(scenarios.two_gpus(), fake_clock)
    timeline, sampler = run_sampler(fake_clock, seconds=0.3)

    h100, a100 = devices_summary(timeline)
    assert timeline.meta["nvml"]["available"] is True
    assert timeline.meta["nvml"]["driver_version"] == "550.54.15"
    assert timeline.meta["nvml"]["cuda_driver_version"] == "12.4"
    assert (h100["index"], h100["name"]) == (0, "NVIDIA H100 80GB HBM3")
    assert h100["util_mean"] == pytest.approx(0.87) and h100["util_p95"] == pytest.approx(0.87)
    assert h100["mem_util_mean"] == pytest.approx(0.41)
    assert h100["mem_used_peak_bytes"] == 20 * GiB and h100["mem_total_bytes"] == 80 * GiB
    assert h100["power_mean_w"] == pytest.approx(250.12) and h100["power_limit_w"] == 700.0
    assert h100["sm_clock_mean_mhz"] == 1980 and h100["temperature_max_c"] == 61
    assert h100["throttle_reasons"] == ["sw_power_cap"]
    # energy from the counter: watts x seconds between the first and last tick, exact on the fake clock
    t = timeline.series("gpu0.energy_j")[0]
    assert h100["energy_source"] == "counter"
    assert h100["energy_j"] == pytest.approx(250.12 * (t[-1] - t[0]), abs=2e-3)  # a counter of mJ
    assert h100["pcie_tx_mean_bytes_per_s"] == pytest.approx(2e9, rel=1e-5)
    assert h100["pcie_rx_mean_bytes_per_s"] == pytest.approx(8e9, rel=1e-5)
    # all four NVLink links, not link 0 alone
    assert h100["nvlink_tx_mean_bytes_per_s"] == pytest.approx(4e9, rel=1e-5)
    # the driver's own samples and this process's GPU memory, read after the window
    assert h100["driver_samples"]["count"] >= 1 and h100["driver_samples"]["util_mean"] == pytest.approx(0.87)
    assert h100["tree_mem_used_bytes"] == 18 * GiB
    assert {p["pid"]: p["in_tree"] for p in h100["processes"]} == {
        scenarios.os.getpid(): True,
        4_000_001: False,
    }
    assert timeline.meta["gpu_processes_scope"] == "tree"

    assert a100["util_mean"] == 0.0 and a100["throttle_reasons"] == [] and not a100["lost"]
    assert a100["nvlink_tx_mean_bytes_per_s"] is None
    assert count(sampler.warnings, "GPU 1", "nvlink_tx_bytes_per_s", "not available") == 1
    # GPM is opt-in: nothing touched its counters
    assert "nvmlGpmSampleAlloc" not in fake.calls and h100["sm_active_mean"] is None


def test_counters_become_exact_rates_and_energy(fake_nvml: Any) -> None:
    clock = ManualClock()
    fake_nvml(scenarios.two_gpus(clock=clock))
    nvml = Nvml.open()
    first = nvml.read(0)
    assert first["pcie_tx_bytes_per_s"] is None  # a rate needs two readings
    clock.t += 10.0
    second = nvml.read(0)
    assert second["energy_j"] - first["energy_j"] == pytest.approx(2501.2)
    assert second["pcie_tx_bytes_per_s"] == pytest.approx(2e9)
    assert second["nvlink_rx_bytes_per_s"] == pytest.approx(4e9)
    assert all(0.0 <= second[k] <= 1.0 for k in ("util_gpu", "util_mem"))
    # a counter the driver has not refreshed keeps its last rate instead of reading 0
    assert nvml.read(0)["pcie_tx_bytes_per_s"] == pytest.approx(2e9)
    nvml.close()


def test_a_32_bit_pcie_counter_that_wraps_still_gives_the_rate(fake_nvml: Any) -> None:
    clock = ManualClock()
    fake = fake_nvml(scenarios.two_gpus(clock=clock))
    fake.gpus[0].pcie_counter_bits = 32  # 8 GB/s wraps a 32-bit byte counter every 0.54 s
    nvml = Nvml.open()
    nvml.read(0)
    rates = []
    for _ in range(12):
        clock.t += 0.1
        rates.append(nvml.read(0)["pcie_rx_bytes_per_s"])
    assert rates == pytest.approx([8e9] * 12, rel=1e-4)  # two wraps in there, no gap, no negative
    nvml.close()


def test_unsupported_fields_are_not_available_and_said_once(fake_nvml: Any, fake_clock: FakeClock) -> None:
    fake_nvml(scenarios.fields_not_supported(), fake_clock)
    timeline, sampler = run_sampler(fake_clock)

    [gpu] = devices_summary(timeline)
    assert gpu["util_mean"] == pytest.approx(0.87)  # what works still works
    for key in ("power_mean_w", "energy_j", "temperature_max_c", "pcie_tx_mean_bytes_per_s"):
        assert gpu[key] is None, key
    assert gpu["energy_source"] is None and gpu["throttle_reasons"] == []
    for field in ("power_w", "temperature_c", "energy_j", "pcie_tx_bytes_per_s", "throttle_reasons"):
        assert count(sampler.warnings, field, "not available", "Not Supported") == 1, field
    assert "gpu0.power_w" not in timeline.metrics


def test_older_driver_and_nvidia_ml_py_fall_back(fake_nvml: Any, fake_clock: FakeClock) -> None:
    fake = fake_nvml(scenarios.older_driver(), fake_clock)
    timeline, sampler = run_sampler(fake_clock, NvmlSource(gpm=True, clock=fake_clock))

    [gpu] = devices_summary(timeline)
    # throttle reasons through the pre-R535 symbol, memory through v1, processes through _v2
    assert gpu["throttle_reasons"] == ["sw_power_cap"]
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] > 1
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1  # tried once, then remembered
    assert gpu["mem_used_peak_bytes"] == 20 * GiB
    assert gpu["tree_mem_used_bytes"] == GiB
    assert gpu["numa_node"] is None and gpu["numa_cpus"] == [0, 1]
    assert gpu["pcie_tx_mean_bytes_per_s"] is None and gpu["nvlink_tx_mean_bytes_per_s"] is not None
    assert count(sampler.warnings, "pcie_tx_bytes_per_s", "not in this nvidia-ml-py") == 1
    assert count(sampler.warnings, "gpm", "not available") == 1
    assert timeline.meta["nvml"]["gpm"] == []


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_UNKNOWN])
def test_gpu_lost_mid_run_leaves_the_others_running(fake_nvml: Any, code: int, fake_clock: FakeClock) -> None:
    fake = fake_nvml(scenarios.gpu_lost(code), fake_clock)

    def lose() -> None:
        fake.gpus[1].lost = True

    timeline, sampler = run_sampler(fake_clock, seconds=0.2, during=lose)

    gpu0, gpu1 = devices_summary(timeline)
    assert gpu1["lost"] and not gpu0["lost"]
    assert gpu1["lost_reason"] in ("GPU is lost", "Unknown Error")
    t0, t1 = timeline.series("gpu0.util")[0], timeline.series("gpu1.util")[0]
    assert t0[-1] > gpu1["lost_at_s"] >= t1[-1]  # GPU 0 kept sampling after GPU 1 was gone
    assert gpu1["util_mean"] == 0.0 and gpu1["mem_total_bytes"] == 40 * GiB  # what was measured stays
    assert count(sampler.warnings, "GPU 1", "was lost") == 1
    assert [s.name for s in sampler.sources] == [] and not any("disabled" in w for w in sampler.warnings)
    assert [p["gpu"] for p in timeline.meta["gpu_processes"]] == [0, 0]


@pytest.mark.parametrize(
    ("scenario", "reason"),
    [
        (scenarios.no_library, "library (libnvidia-ml.so.1) not found"),
        (scenarios.driver_not_loaded, "not loaded"),
    ],
)
def test_no_nvml_means_no_gpu_mode_with_the_reason(
    fake_nvml: Any, scenario: Any, reason: str, fake_clock: FakeClock
) -> None:
    fake_nvml(scenario(), fake_clock)
    with pytest.raises(NvmlUnavailable, match=re.escape(reason)):
        Nvml.open()
    timeline, sampler = run_sampler(fake_clock, seconds=0.05)
    assert count(sampler.warnings, "nvml: no GPU metrics", reason) == 1
    assert timeline.meta["nvml"] == {
        "available": False,
        "reason": timeline.meta["nvml"]["reason"],
        "driver_version": None,
        "cuda_driver_version": None,
    }
    assert reason in timeline.meta["nvml"]["reason"]
    assert devices_summary(timeline) == []


def test_this_machine_without_a_gpu_says_why() -> None:
    try:
        Nvml.open().close()
    except NvmlUnavailable as e:
        assert str(e)
    else:
        pytest.skip("this machine has a working NVML")
    with pytest.raises(SourceUnavailable, match="no GPU metrics"):
        NvmlSource().open(Timeline())


def test_foreign_pids_fall_back_to_every_process_with_a_warning(
    fake_nvml: Any, fake_clock: FakeClock
) -> None:
    fake_nvml(scenarios.foreign_pids(), fake_clock)
    timeline, sampler = run_sampler(fake_clock, seconds=0.1)

    [gpu] = devices_summary(timeline)
    assert timeline.meta["gpu_processes_scope"] == "all"
    assert [p["pid"] for p in gpu["processes"]] == [4_000_001, 4_000_002]
    assert gpu["tree_mem_used_bytes"] is None
    assert count(sampler.warnings, "PID namespace") == 1


def test_gpm_opt_in_reads_sm_activity_where_supported(fake_nvml: Any, fake_clock: FakeClock) -> None:
    fake_nvml(scenarios.two_gpus(), fake_clock)
    timeline, sampler = run_sampler(fake_clock, NvmlSource(gpm=True, clock=fake_clock), seconds=0.3)

    h100, a100 = devices_summary(timeline)
    assert timeline.meta["nvml"]["gpm"] == [0]
    assert h100["sm_active_mean"] == pytest.approx(0.625)
    assert h100["sm_occupancy_mean"] == pytest.approx(0.31)
    assert h100["tensor_active_mean"] == pytest.approx(0.12)
    assert h100["dram_bw_util_mean"] == pytest.approx(0.48)
    assert a100["sm_active_mean"] is None
    assert count(sampler.warnings, "GPU 1", "gpm", "Hopper") == 1


def test_slow_queries_stay_off_the_tick(fake_nvml: Any, fake_clock: FakeClock) -> None:
    fake = fake_nvml(scenarios.two_gpus(), fake_clock)
    _, sampler = run_sampler(fake_clock)

    ticks = sampler.ticks
    assert ticks == 0.15 / INTERVAL + 2
    assert fake.calls["nvmlDeviceGetFieldValues"] == 2 * ticks  # one batched call per GPU per tick
    assert fake.calls["nvmlDeviceGetSamples"] == 2 * 2  # gpu and memory utilization, once per GPU
    assert fake.calls["nvmlDeviceGetProcessUtilization"] == 2
    assert fake.calls["nvmlShutdown"] == 1


def test_a_slow_counter_batch_is_read_once_a_second_and_its_rates_hold(
    fake_nvml: Any, fake_clock: FakeClock
) -> None:
    """An H200 took 4.3 ms per field-values batch: at 10 Hz that alone was 4% of a core. On the fake clock
    each of GPU 0's batches takes 4 ms: the counts are exact however busy the machine (a CI run on real
    time once saw 107 fast reads for 225 ticks)."""
    fake = scenarios.two_gpus()
    fake.gpus[0].field_values_s = 0.004
    fake_nvml(fake, fake_clock)
    timeline, sampler = run_sampler(fake_clock, seconds=2.2)
    # the opening tick's slow batch puts the schedule 4 ms late: ticks at 0.014 s + 10 ms steps to 2.204 s,
    # with the opening and the closing tick
    assert sampler.ticks == 220 + 2
    calls = fake.per_gpu["nvmlDeviceGetFieldValues"]
    # two slow batches in a row (0 and 14 ms) tell it slow; then once a second: at 1.024 s and 2.034 s
    assert calls == [2 + int(2.2 / FIELDS_PERIOD_S), sampler.ticks], calls
    assert sampler.busy_s == pytest.approx(4 * 0.004)  # the fake driver's time, all of it GPU 0's batches
    t, rx = timeline.series("gpu0.pcie_rx_bytes_per_s")
    assert len(rx) == sampler.ticks - 1  # every tick's but the first (a rate needs two readings)
    assert t[0] == pytest.approx(0.014) and not np.isnan(rx).any()  # repeated between reads
    assert np.mean(rx) == pytest.approx(8.0e9, rel=1e-5)  # microsecond stamps: 2e-6


def test_mig_instances_are_listed_and_sampled(fake_nvml: Any, fake_clock: FakeClock) -> None:
    fake_nvml(scenarios.mig(), fake_clock)
    timeline, sampler = run_sampler(fake_clock, seconds=0.1)

    [gpu] = devices_summary(timeline)
    assert gpu["mig_enabled"] is True
    assert [m["gpu_instance_id"] for m in gpu["mig_instances"]] == [1, 2]
    assert gpu["mig_instances"][0]["mem_used_peak_bytes"] == (80 * GiB // 7) // 2
    assert gpu["util_mean"] is None and count(sampler.warnings, "util", "not available") == 1
