"""Time off a CPU in a fetch that never went to sleep is CPU contention, never blocked loading.

Seen beside two busy processes on a 2-CPU VM: an in-memory loader (``num_workers=0``) showed
"loading is blocked, not computing: on a CPU 10%, waiting for one 11%, blocked the rest" and an
input-bound card beside ``cpu_contention``. Its fetches never slept: the hypervisor had taken the
virtual CPU, which no run delay shows.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from analysis_builder import HEALTHY, HOST_SAMPLES, LOADER, accounted, build
from fakeclock import FakeClock

from perfmagic.advise import data, host
from perfmagic.analyze import Analysis
from perfmagic.collect.threadclock import ThreadClock, wait_off_cpu

TWO_CPUS = {"cpu_count": 2, "affinity": [0, 1], "physical_cores": 2}


def test_a_fetch_that_never_slept_waited_for_a_cpu_all_the_time_it_was_off_one() -> None:
    # 5 ms of wall, 0.2 ms on a CPU, no run delay: taken by others unless the thread slept
    def never_slept() -> int:
        return 7

    def slept() -> int:
        return 8

    assert wait_off_cpu(0.005, 0.0002, 0.0, 7, never_slept) == pytest.approx(0.0048)
    assert wait_off_cpu(0.005, 0.0002, 0.0, 7, slept) == 0.0
    assert wait_off_cpu(0.005, 0.0002, 0.0, None, never_slept) == 0.0  # no count: not taken as steal
    # a run delay over what the wall clock leaves (two CPUs' clocks) is kept as read
    assert wait_off_cpu(0.005, 0.0002, 0.006, 7, never_slept) == 0.006
    assert math.isnan(wait_off_cpu(0.005, 0.0002, math.nan, 7, never_slept))  # unknown stays unknown


def test_the_thread_clock_counts_sleeps_as_its_clock_replays_them() -> None:
    asleep, never = FakeClock(cpu_share=0.5), FakeClock(cpu_share=0.6, wait_share=0.4)
    for clock in (asleep, never):
        thread = ThreadClock(clock)
        try:
            before = thread.sleeps()
            clock.advance(0.01)
            assert (thread.sleeps() != before) is (clock is asleep)
        finally:
            thread.close()


def crowded_run(data_s: float, on_cpu: float, waiting: float, *, crowded: bool = True) -> Analysis:
    """A loop that loads in the training thread on 2 CPUs, other processes keeping them busy or not."""
    load = {"host.cpu_util": 0.95, "host.proc_cpu_cores": 1.0} if crowded else {"host.cpu_util": 0.3}
    a = build(
        stages={**HEALTHY, "data": data_s},
        loader={**LOADER, "num_workers": 0},
        host={**build().host, **TWO_CPUS},
        samples={**HOST_SAMPLES, **load},
    )
    assert a.steady is not None
    wait = np.full(a.steady.count, (0.3 if crowded else 0.0) * a.steady.step_s)
    steady = dataclasses.replace(a.steady, wait_s=wait)
    return accounted(
        a, steady=steady, loop=dataclasses.replace(a.loop, data_cpu_share=on_cpu, data_wait_share=waiting)
    )


def test_a_data_wait_that_is_mostly_queueing_on_a_crowded_machine_is_the_contention_card() -> None:
    a = crowded_run(0.001, on_cpu=0.13, waiting=0.87)  # 7% of the step, 0.13 ms of it loading
    assert a.loading is not None and a.loading.blocked == pytest.approx(0.0)
    assert host.cpu_contention(a) is not None
    assert data.input_bound(a) is None


def test_a_loader_slow_on_its_own_is_input_bound_on_a_crowded_machine_too() -> None:
    card = data.input_bound(crowded_run(0.003, on_cpu=0.7, waiting=0.3))  # 2.1 ms of loading
    assert card is not None and "CPU-bound" in card.evidence


def test_without_contention_the_wait_is_the_loaders_own() -> None:
    a = crowded_run(0.001, on_cpu=0.13, waiting=0.87, crowded=False)
    assert host.cpu_contention(a) is None
    assert data.input_bound(a) is not None
