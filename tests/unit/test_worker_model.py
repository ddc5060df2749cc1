"""The DataLoader worker model: workers share the CPUs with the loop and with other processes' load."""

from __future__ import annotations

import dataclasses

import pytest
from analysis_builder import HEALTHY, LOADER, accounted, build

from perfmagic.advise import data
from perfmagic.advise.workers import HANDOFF_S, PARALLEL_EFFICIENCY, WORKER_BATCH_S, LoaderModel
from perfmagic.analyze import Analysis

# an FFT per sample in the loop's own process: 5 ms of CPU a batch, a 0.3 ms training step
CPU_LOADING = LoaderModel(
    wait_s=0.005, rest_s=0.0003, workers=0, load_cpu_s=0.005, rest_cpu_s=0.0003, cpus=2, others=0.0
)


def test_cpu_bound_loading_takes_every_cpu_the_light_loop_leaves() -> None:
    # one CPU for the loop would leave it idle: the loop needs 0.3 ms of its step
    assert CPU_LOADING.best_workers(cap=2) == 2
    two_cpus = 1 + PARALLEL_EFFICIENCY  # the second CPU does not double CPU-bound work
    assert CPU_LOADING.step_with(2) == pytest.approx((0.005 + 0.0003 + HANDOFF_S) / two_cpus)
    # one worker only moves the loading: the step is still a whole batch's making, and passing it
    assert CPU_LOADING.step_with(1) == pytest.approx(0.005 + WORKER_BATCH_S)


def test_beside_a_busy_core_the_count_holds_and_the_promise_shrinks() -> None:
    busy = dataclasses.replace(CPU_LOADING, others=1.0)
    assert busy.best_workers(cap=2) == CPU_LOADING.best_workers(cap=2) == 2
    # three busy processes of ours and one other on 2 CPUs: a fair share, 1.5 CPUs
    assert busy.cpus_for(2) == pytest.approx(1 + 0.5 * PARALLEL_EFFICIENCY)
    assert busy.step_with(2) == pytest.approx((0.005 + 0.0003 + HANDOFF_S) / busy.cpus_for(2))
    assert busy.step_with(2) > CPU_LOADING.step_with(2)


def test_loading_that_sleeps_wants_the_workers_that_keep_up() -> None:
    sleeping = dataclasses.replace(
        CPU_LOADING, wait_s=0.032, load_cpu_s=0.001, rest_s=0.004, rest_cpu_s=0.004
    )
    # 32 ms of waiting a batch against a 4 ms step: 8 workers keep up, each on a CPU a fraction of
    # the time; with what a batch costs to pass, 7 come within 5% of them
    assert sleeping.workers_needed() == 8
    assert sleeping.best_workers(cap=16) == 7
    assert sleeping.step_with(16) == pytest.approx(0.004 + HANDOFF_S)
    assert sleeping.step_with(7) <= 1.05 * sleeping.step_with(16)


def test_a_loop_that_waits_on_the_device_leaves_its_cpu_to_the_workers() -> None:
    # a 20 ms GPU step the loop spends 1 ms of CPU on: both CPUs can load
    on_gpu = LoaderModel(0.03, 0.02, 0, load_cpu_s=0.03, rest_cpu_s=0.001, cpus=2, others=0.0)
    assert on_gpu.best_workers(cap=2) == 2
    assert on_gpu.step_with(2) == pytest.approx(0.02 + HANDOFF_S)
    on_cpu = dataclasses.replace(on_gpu, rest_cpu_s=0.02)  # the same step computed on a CPU
    assert on_cpu.step_with(2) == pytest.approx((0.03 + 0.02 + HANDOFF_S) / (1 + PARALLEL_EFFICIENCY))


def test_on_one_cpu_no_worker_count_shortens_cpu_bound_loading() -> None:
    one = dataclasses.replace(CPU_LOADING, cpus=1)
    assert all(one.step_with(w) >= 0.0053 for w in (1, 2, 4))


def _beside(others: float) -> Analysis:
    """A loop loading 30 ms of CPU work a batch itself on 2 CPUs, ``others`` cores busy beside it."""
    a = build(stages={**HEALTHY, "data": 0.03}, loader={**LOADER, "num_workers": 0})
    host = {**a.host, "cpu_count": 2, "affinity": [0, 1]}
    loop = dataclasses.replace(a.loop, data_cpu_share=0.95, data_wait_share=0.03)
    means = {**a.steady_means, "host.cpu_util": (1.0 + others) / 2, "host.proc_cpu_cores": 1.0}
    return accounted(a, host=host, loop=loop, steady_means=means)


def test_the_recommendation_is_the_same_on_a_quiet_and_a_busy_machine() -> None:
    quiet, busy = data.dataloader_workers(_beside(0.0)), data.dataloader_workers(_beside(1.0))
    assert quiet is not None and busy is not None
    assert quiet.metrics["recommended_workers"] == busy.metrics["recommended_workers"] == 2
    # what it saves is the machine's: less beside the other process
    assert quiet.saving_s is not None and busy.saving_s is not None
    assert busy.saving_s < quiet.saving_s
