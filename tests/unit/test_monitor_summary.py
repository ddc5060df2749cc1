"""``%gpumonitor stop`` leaves a summary in place of the panel: per GPU, then the host's CPU; without a
GPU, one line that says so and still gives the host's CPU. On the fake NVML and the fake clock."""

from __future__ import annotations

from typing import Any

import fake_nvml as scenarios
import numpy as np
from fakeclock import FakeClock

from perfmagic.collect.nvml_source import NvmlSource
from perfmagic.monitor import Monitor
from perfmagic.render.notebook import monitor_bundle
from perfmagic.timeline import Timeline
from perfmagic.units import fmt_fraction


class HostCpu:
    """The host's CPU as a source: 25% busy, 75% at the tick at 1 s."""

    name = "host"

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def open(self, timeline: Timeline) -> None:
        pass

    def poll(self, now: float, timeline: Timeline) -> None:
        timeline.add_sample("host.cpu_util", now, 0.75 if now == 1.0 else 0.25)

    def close(self, timeline: Timeline) -> None:
        pass


def monitored(clock: FakeClock, during: Any = None) -> tuple[Monitor, list[str]]:
    """A monitor run for 3 s on the fake clock (``during`` called at 1.5 s), stopped."""
    monitor = Monitor(interval=0.5, clock=clock, sources=[NvmlSource(clock=clock), HostCpu()])
    monitor.start()
    clock.advance(1.5)
    if during is not None:
        during()
    clock.advance(1.5)
    return monitor, monitor.stop()


def mean_of(monitor: Monitor, metric: str) -> str:
    return fmt_fraction(float(np.mean(monitor.timeline.series(metric)[1])))


def test_the_summary_gives_each_gpus_utilization_memory_and_power_and_the_host_cpu(
    fake_nvml: Any, fake_clock: FakeClock
) -> None:
    fake = fake_nvml(scenarios.two_gpus(), fake_clock)

    def calmer() -> None:
        fake.gpus[0].util_gpu = 50  # the mean falls under the 87% peak

    monitor, warnings = monitored(fake_clock, calmer)
    summary = monitor.summary()
    assert summary.seconds == 3.0 and summary.no_gpu is None
    h100, _ = summary.gpus
    assert h100.util_peak == 0.87 and 0.5 < (h100.util_mean or 0) < 0.87
    text = monitor_bundle(summary, warnings)["text/plain"].splitlines()
    assert text[0] == "perfmagic monitor stopped after 3.00 s:"
    assert text[1] == (
        f"  GPU 0 (NVIDIA H100 80GB HBM3): utilization mean {mean_of(monitor, 'gpu0.util')}, peak 87%; "
        "memory peak 20.0 GiB / 80.0 GiB; power mean 250 W"
    )
    assert text[2] == (
        "  GPU 1 (NVIDIA A100-SXM4-40GB): utilization mean 0%, peak 0%; memory peak 4.0 MiB / 40.0 GiB; "
        "power mean 62 W"
    )
    assert text[3] == f"  host CPU mean {mean_of(monitor, 'host.cpu_util')}, peak 75%"
    page = monitor_bundle(summary, warnings)["text/html"]
    assert "<td>GPU 0 <small>NVIDIA H100 80GB HBM3</small></td>" in page and "<td>87%</td>" in page
    assert "20.0 GiB / 80.0 GiB" in page and "250 W" in page and "Host CPU mean" in page


def test_without_a_gpu_the_summary_says_so_in_one_line_with_the_host_cpu(
    fake_nvml: Any, fake_clock: FakeClock
) -> None:
    fake_nvml(scenarios.no_library(), fake_clock)
    monitor, warnings = monitored(fake_clock)
    summary = monitor.summary()
    assert not summary.gpus and summary.no_gpu
    bundle = monitor_bundle(summary, warnings)
    (line,) = bundle["text/plain"].splitlines()  # the sampler's warning is the reason: not said twice
    assert line == (
        f"perfmagic monitor stopped after 3.00 s: no GPU ({summary.no_gpu}); "
        f"host CPU mean {mean_of(monitor, 'host.cpu_util')}, peak 75%"
    )
    assert bundle["text/html"].count("<br>") == 0 and "<table" not in bundle["text/html"]
