"""The report's devices and host sections from hand-made timelines."""

from __future__ import annotations

import math

import pytest

from perfmagic.analyze.devices import devices_summary, gpu_indices
from perfmagic.analyze.host import host_summary
from perfmagic.timeline import Timeline


def gpu_timeline(ticks: int = 11, dt: float = 0.1) -> Timeline:
    tl = Timeline()
    tl.meta["devices"] = [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "mem_total_bytes": 80 * 2**30, "numa_cpus": [0, 1]}
    ]
    for k in range(ticks):
        t = k * dt
        tl.add_sample("gpu0.util", t, 1.0 if k % 2 else 0.0)
        tl.add_sample("gpu0.mem_used_bytes", t, float(k * 2**30))
        tl.add_sample("gpu0.power_w", t, 300.0)
        tl.add_sample("gpu0.throttle_mask", t, float(0x4 if k < 5 else 0x1))
    return tl


def test_an_empty_timeline_gives_empty_sections() -> None:
    tl = Timeline()
    assert devices_summary(tl) == []
    host = host_summary(tl)
    assert host["cpu_util_mean"] is None and host["per_core_util_mean"] == []
    assert host["avg_read_size_bytes"] is None and host["gpu_affinity"] == []


def test_gpu_figures_and_units() -> None:
    [gpu] = devices_summary(gpu_timeline())
    assert gpu["util_mean"] == pytest.approx(5 / 11)
    assert gpu["util_p95"] == 1.0
    assert gpu["mem_used_peak_bytes"] == 10 * 2**30
    assert gpu["mem_used_peak_fraction"] == pytest.approx(10 / 80)
    assert gpu["throttle_reasons"] == ["sw_power_cap"]  # gpu_idle is not a slowdown
    assert gpu["throttle_fraction"] == {
        "gpu_idle": pytest.approx(6 / 11),
        "sw_power_cap": pytest.approx(5 / 11),
    }
    assert gpu["driver_samples"] is None and gpu["lost"] is False and gpu["processes"] == []


def test_energy_prefers_the_counter_and_falls_back_to_integrating_power() -> None:
    tl = gpu_timeline()
    [gpu] = devices_summary(tl)
    assert (gpu["energy_j"], gpu["energy_source"]) == (pytest.approx(300.0), "power_integral")
    for k in range(11):
        tl.add_sample("gpu0.energy_j", k * 0.1, 29.0 * k)  # the counter disagrees: it wins
    [gpu] = devices_summary(tl)
    assert (gpu["energy_j"], gpu["energy_source"]) == (pytest.approx(290.0), "counter")


def test_missing_values_are_ignored_not_averaged() -> None:
    tl = Timeline()
    tl.add_sample("gpu2.util", 0.0, 0.5)
    tl.add_sample("gpu2.util", 0.1, math.nan)
    assert gpu_indices(tl) == [2]
    [gpu] = devices_summary(tl)
    assert gpu["index"] == 2 and gpu["name"] is None
    assert gpu["util_mean"] == 0.5 and gpu["power_mean_w"] is None and gpu["energy_j"] is None


def test_lost_gpu_and_processes_come_from_marks_and_meta() -> None:
    tl = gpu_timeline()
    tl.add_mark(0.55, "gpu_lost", index=0, reason="GPU is lost")
    tl.meta["gpu_processes"] = [
        {"gpu": 0, "pid": 10, "used_memory_bytes": 2**30, "sm_util": 0.5, "type": "compute", "in_tree": True},
        {
            "gpu": 0,
            "pid": 11,
            "used_memory_bytes": 2**31,
            "sm_util": None,
            "type": "compute",
            "in_tree": False,
        },
    ]
    [gpu] = devices_summary(tl)
    assert gpu["lost"] and gpu["lost_at_s"] == 0.55 and gpu["lost_reason"] == "GPU is lost"
    assert gpu["tree_mem_used_bytes"] == 2**30 and len(gpu["processes"]) == 2


def test_driver_samples_summary() -> None:
    tl = gpu_timeline()
    for k in range(7):
        tl.add_sample("gpu0.util_driver", k / 6, 0.25)
    [gpu] = devices_summary(tl)
    assert gpu["driver_samples"]["count"] == 7
    assert gpu["driver_samples"]["period_s"] == pytest.approx(1 / 6)
    assert gpu["driver_samples"]["util_mean"] == 0.25


def test_host_counters_and_numa_affinity() -> None:
    tl = Timeline()
    tl.meta["host"] = {"cpu_count": 4, "affinity": [0, 1, 2, 3], "numa_nodes": {0: [0, 1], 1: [2, 3]}}
    tl.meta["devices"] = [{"index": 0, "numa_node": 1, "numa_cpus": [2, 3]}]
    for k, (rb, ops) in enumerate([(0, 0), (4096.0 * 100, 100), (4096.0 * 300, 300)]):
        tl.add_sample("host.read_bytes", float(k), rb)
        tl.add_sample("host.read_ops", float(k), float(ops))
        tl.add_sample("host.cpu0_util", float(k), 0.5)
        tl.add_sample("host.cpu1_util", float(k), 1.0)
        tl.add_sample("host.proc_cpu_cores", float(k), 1.5)
    s = host_summary(tl)
    assert s["read_bytes"] == 4096 * 300 and s["read_ops"] == 300
    assert s["avg_read_size_bytes"] == 4096  # small reads: the small-files signal
    assert s["read_mean_bytes_per_s"] == pytest.approx(4096 * 300 / 2)
    assert s["per_core_util_mean"] == [0.5, 1.0]
    assert s["proc_cpu_util_mean"] == 1.5
    assert s["gpu_affinity"] == [
        {
            "gpu": 0,
            "numa_node": 1,
            "local_cpus": 2,
            "allowed_cpus": 4,
            "allowed_local_cpus": 2,
            "allowed_local_fraction": 0.5,
        }
    ]
