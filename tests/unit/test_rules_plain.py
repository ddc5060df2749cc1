"""Every rule on plain analyses: data made directly, without a timeline, as a rule sees it.

A rule is a pure function of an :class:`Analysis`; these tests hold it to that (the
analysis has no timeline to reach for). Each rule fires on one analysis and stays
silent on one just across its threshold. The last test checks that the plain data
stands for what :func:`analyze` measures from timelines of the same layout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from analysis_builder import (
    CUDA_TORCH,
    HEALTHY,
    HOST_SAMPLES,
    HOST_SUMMARY,
    LOADER,
    MODEL,
    STEADY_MEANS,
    GiB,
    build,
    plain,
    with_host_memory,
    with_host_table,
    with_memory,
    with_pinned,
)
from report_checks import assert_consistent

from perfmagic.advise import (
    Card,
    advise,
    catalog,
    data,
    distributed,
    gpu,
    gpu_checks,
    host,
    host_memory,
    loop,
    memory,
    pace,
    startup,
    storage,
)
from perfmagic.advise.catalog import RULES
from perfmagic.analyze import Analysis
from perfmagic.schema import MAJOR_FAULTS

CUDA_MODEL = {**MODEL, "device": "cuda:0"}
H100 = {
    "index": 0,
    "name": "NVIDIA H100 80GB HBM3",
    "compute_capability": "9.0",
    "mem_total_bytes": 80 * GiB,
    "mem_used_peak_bytes": 40 * GiB,
    "mem_used_peak_fraction": 0.5,
    "tree_mem_used_bytes": 40 * GiB,
    "allocator": None,
    "numa_node": 1,
    "numa_cpus": [4, 5, 6, 7],
}


def stages(**changes: float) -> dict[str, Any]:
    return {**HEALTHY, **changes}


def on_gpu(util: float = 0.9, peak: float = 0.5, **options: Any) -> Analysis:
    device = {**H100, "mem_used_peak_fraction": peak, "mem_used_peak_bytes": peak * 80 * GiB}
    options.setdefault("devices", [device])
    options.setdefault("torch", CUDA_TORCH)
    return plain(model=CUDA_MODEL, steady_means={**STEADY_MEANS, "gpu0.util": util}, **options)


def four_gpus(*utils: float) -> Analysis:
    devices = [{**H100, "index": i} for i in range(4)]
    means = {**STEADY_MEANS, **{f"gpu{i}.util": u for i, u in enumerate(utils)}}
    return plain(devices=devices, steady_means=means)


IO = {**HOST_SUMMARY, "proc_read_bytes": 500 * 2**20, "read_ops": 100_000, "avg_read_size_bytes": 8 * 1024}


def waiting_on_storage(iowait: float = 0.1, **host: Any) -> Analysis:
    """A data wait while the loaders read 8 KiB at a time and the CPUs wait ``iowait`` for I/O."""
    return plain(
        stages=stages(data=0.02), host={**IO, **host}, steady_means={**STEADY_MEANS, "host.iowait": iowait}
    )


TWO_NODES = {
    **HOST_SUMMARY,
    "numa_nodes": {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]},
    "gpu_affinity": [{"gpu": 0, "numa_node": 1, "allowed_cpus": 8, "allowed_local_fraction": 0.5}],
}
TRACE = {
    "busy_fraction": 0.6,
    "idle_fraction": 0.4,
    "idle_breakdown": {"host_wait": 0.1, "kernel_wait": 0.25},
    "launches": None,
}
GAPS = {"min_s": 0.001, "count": 30, "total_s": 0.06, "fraction": 0.2, "longest_s": 0.004}
BLOCKING = {"steps": 10, "memcpy_per_step": 1.0, "memset_per_step": 1.0}
SLOW_EVERY_8 = [0.05 if k % 8 == 7 else 0.0003 for k in range(40)]
RECOMPILES = [0.004 + (0.3 if k in (10, 25) else 0.0) for k in range(40)]
EVERY_5 = [0.01 if k % 5 == 4 else 0.0 for k in range(30)]
FP32 = {"stages": stages(forward=0.02, backward=0.04)}

Case = Callable[[], Analysis]
CASES: dict[str, tuple[Callable[[Analysis], Card | None], Case, Case]] = {
    # id: (rule, an analysis it fires on, one it stays silent on)
    "input_bound": (data.input_bound, lambda: plain(stages=stages(data=0.02)), lambda: plain()),
    "dataloader_workers": (
        data.dataloader_workers,
        lambda: plain(stages=stages(data=0.02)),
        lambda: plain(stages=stages(data=0.02), loader={**LOADER, "num_workers": 7}),
    ),
    "pin_memory": (
        data.pin_memory,
        lambda: plain(stages=stages(h2d=0.003), counters={"h2d_copies": 60, "h2d_bytes": 6 * GiB}),
        lambda: plain(
            stages=stages(h2d=0.003),
            counters={
                "h2d_copies": 60,
                "h2d_bytes": 6 * GiB,
                "h2d_pinned_bytes": 6 * GiB,
                "h2d_non_blocking": 60,
            },
        ),
    ),
    "preprocess_in_loop": (
        data.preprocess_in_loop,
        lambda: plain(stages=stages(pre=0.01)),
        lambda: plain(stages=stages(other=0.01)),
    ),
    "io_bound": (
        storage.io_bound,
        lambda: waiting_on_storage(),
        lambda: waiting_on_storage(iowait=0.01),
    ),
    "small_files": (
        storage.small_files,
        lambda: waiting_on_storage(),
        lambda: waiting_on_storage(avg_read_size_bytes=1024**2),
    ),
    "cpu_contention": (
        host.cpu_contention,
        lambda: plain(steady_means={**STEADY_MEANS, "host.cpu_util": 0.98}),
        lambda: plain(steady_means={**STEADY_MEANS, "host.cpu_util": 0.6}),
    ),
    "host_memory_pressure": (
        host.host_memory_pressure,
        lambda: plain(host={**HOST_SUMMARY, "mem_available_min_bytes": 3 * GiB}),
        lambda: plain(host={**HOST_SUMMARY, "mem_available_min_bytes": 10 * GiB}),
    ),
    "gpu_memory_pressure": (gpu.gpu_memory_pressure, lambda: on_gpu(peak=0.99), lambda: on_gpu(peak=0.8)),
    # memory: the largest part at 90% of the GPU picks the card; at 50% full none fires
    "activation_memory": (
        memory.activation_memory,
        lambda: with_memory(on_gpu(), total=31 * GiB),
        lambda: with_memory(on_gpu(), total=56 * GiB),
    ),
    "optimizer_memory": (
        memory.optimizer_memory,
        lambda: with_memory(on_gpu(), state=20 * GiB, acts=4 * GiB, total=31 * GiB),
        lambda: with_memory(on_gpu(), state=8 * GiB, acts=16 * GiB, total=31 * GiB),
    ),
    "weight_memory": (
        memory.weight_memory,
        lambda: with_memory(on_gpu(), params=10 * GiB, grads=10 * GiB, acts=4 * GiB, total=31 * GiB),
        lambda: with_memory(on_gpu(), params=10 * GiB, grads=10 * GiB, acts=4 * GiB, total=80 * GiB),
    ),
    "allocator_fragmentation": (
        memory.allocator_fragmentation,
        lambda: with_memory(on_gpu(), acts=2 * GiB, reserved=30 * GiB, retries=3),
        lambda: with_memory(
            on_gpu(), acts=2 * GiB, reserved=30 * GiB, retries=3, alloc_conf="expandable_segments:True"
        ),
    ),
    # forked workers that each grew 300 MiB reading a list of dicts; 4 MiB is a worker's own buffers
    "dataloader_copy_on_read": (
        host_memory.dataloader_copy_on_read,
        lambda: with_host_memory(growth=300 * 2**20),
        lambda: with_host_memory(growth=4 * 2**20),
    ),
    # the DataLoader's pinned batches hold 20 GiB of 64; at 10 GiB, with nothing short, they cost nothing seen
    "pinned_memory_held": (
        host_memory.pinned_memory_held,
        lambda: with_pinned(20 * GiB),
        lambda: with_pinned(10 * GiB),
    ),
    # swap grew 2 GiB and the training read 500 pages back a second; without faults no step paid
    "swap_growth": (
        host_memory.swap_growth,
        lambda: with_host_memory(swap_start_bytes=0, swap_growth_bytes=2 * GiB, means={MAJOR_FAULTS: 500.0}),
        lambda: with_host_memory(swap_start_bytes=0, swap_growth_bytes=2 * GiB, means={MAJOR_FAULTS: 0.0}),
    ),
    # a 10 GiB table on the host whose lookups take 3 ms of a 13.5 ms step, room for it on the GPU;
    # where the GPU has no room, the table on the host is the trade that keeps the model there
    "host_embedding": (
        host_memory.host_embedding,
        lambda: with_host_table(on_gpu(), forward_s=0.003),
        lambda: with_host_table(on_gpu(), forward_s=0.003, total=40 * GiB),
    ),
    "low_gpu_util": (gpu.low_gpu_util, lambda: on_gpu(util=0.2), lambda: on_gpu(util=0.6)),
    "launch_bound": (
        gpu.launch_bound,
        lambda: on_gpu(gpu=TRACE),
        lambda: on_gpu(gpu={**TRACE, "idle_breakdown": {"host_wait": 0.3, "kernel_wait": 0.05}}),
    ),
    "gpu_gaps": (
        gpu_checks.gpu_gaps,
        lambda: on_gpu(gpu={**TRACE, "gaps": GAPS}),
        # the same gaps where the GPU is busy under half the time: low_gpu_util's
        lambda: on_gpu(gpu={**TRACE, "busy_fraction": 0.4, "gaps": GAPS}),
    ),
    "sync_copies": (
        gpu_checks.sync_copies,
        lambda: on_gpu(gpu={**TRACE, "blocking_copies": {**BLOCKING, "time_per_step_s": 0.002}}),
        lambda: on_gpu(gpu={**TRACE, "blocking_copies": {**BLOCKING, "time_per_step_s": 0.0001}}),
    ),
    "jit_compile": (
        gpu.jit_compile,
        lambda: plain(steps=40, stages=stages(forward=RECOMPILES), model={**MODEL, "compiled": True}),
        lambda: plain(steps=40, stages=stages(forward=RECOMPILES)),
    ),
    "amp": (gpu.amp, lambda: on_gpu(**FP32), lambda: on_gpu(counters={"autocast_forwards": 30}, **FP32)),
    "tf32": (
        gpu.tf32,
        lambda: on_gpu(**FP32),
        lambda: on_gpu(
            torch={**CUDA_TORCH, "matmul_allow_tf32": True, "float32_matmul_precision": "high"}, **FP32
        ),
    ),
    "sync_logging": (
        loop.sync_logging,
        lambda: plain(stages=stages(logging=0.002)),
        lambda: plain(stages=stages(logging=0.0003)),
    ),
    "checkpoint_frequency": (
        loop.checkpoint_frequency,
        lambda: plain(stages=stages(checkpoint=EVERY_5)),
        lambda: plain(stages=stages(checkpoint=[0.01 if k == 15 else 0.0 for k in range(30)])),
    ),
    "comm_bound": (
        distributed.comm_bound,
        lambda: plain(stages=stages(comm=0.005)),
        lambda: plain(stages=stages(comm=0.0005)),
    ),
    "rank_straggler": (
        distributed.rank_straggler,
        lambda: plain(stages=stages(forward=0.01), ranks=[{"stages": stages(comm=0.006)}] * 3),
        lambda: plain(ranks=[{}] * 3),
    ),
    "gpu_imbalance": (
        distributed.gpu_imbalance,
        lambda: four_gpus(0.9, 0.0, 0.0, 0.0),
        lambda: four_gpus(0.9, 0.85, 0.8, 0.88),
    ),
    "data_parallel": (
        distributed.data_parallel,
        lambda: plain(model={**MODEL, "data_parallel": True}),
        lambda: plain(),
    ),
    "numa_affinity": (
        host.numa_affinity,
        lambda: on_gpu(host=TWO_NODES, stages=stages(data=0.003)),
        lambda: on_gpu(stages=stages(data=0.003)),
    ),
    "slow_startup": (
        startup.slow_startup,
        lambda: plain(first_extra={"data": 2.0}),
        lambda: plain(first_extra={"data": 0.02}),
    ),
    "step_outliers": (
        pace.step_outliers,
        lambda: plain(steps=40, stages=stages(other=SLOW_EVERY_8)),
        lambda: plain(steps=40),
    ),
    "compute_bound": (pace.compute_bound, lambda: plain(), lambda: plain(stages=stages(data=0.02))),
}


def test_every_rule_has_a_plain_case() -> None:
    assert sorted(CASES) == sorted(r.__name__ for r in RULES)


@pytest.mark.parametrize("rule_id", list(CASES))
def test_rule_on_plain_analysis(rule_id: str) -> None:
    rule, fires, silent = CASES[rule_id]
    card = rule(fires())
    assert card is not None, f"{rule_id} did not fire"
    assert card.id == rule_id and card.evidence and card.fix
    if card.saving_s is not None:
        assert 0 < card.saving_s < card.metrics["step_s"]
    assert_consistent({"advice": [card.to_dict()]})  # a fix that compiles, with nothing left unknown
    assert rule(silent()) is None, f"{rule_id} fired across its threshold"


def test_a_failing_rule_costs_its_card_not_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(a: Analysis) -> Card | None:
        raise ZeroDivisionError("division by zero")

    broken.__name__ = "input_bound"
    monkeypatch.setattr(catalog, "RULES", [broken, *RULES[1:]])
    advice = advise(plain(stages=stages(data=0.02, logging=0.003)))
    assert "input_bound" not in [c.id for c in advice.cards]
    assert "sync_logging" in [c.id for c in advice.cards]
    failed = [w for w in advice.warnings if "input_bound" in w]
    assert failed == [
        "advice rule input_bound failed (ZeroDivisionError: division by zero): its card is missing"
    ]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"stages": stages(data=0.02, pre=0.004, logging=0.002)},
        {"stages": stages(checkpoint=EVERY_5), "first_extra": {"data": 0.5}, "before_s": 0.3},
    ],
    ids=["healthy", "data-pre-logging", "checkpoints-startup"],
)
def test_plain_data_stands_for_what_analyze_measures(options: dict[str, Any]) -> None:
    measured = build(**options)
    made = plain(**options, steady_means={k: v for k, v in HOST_SAMPLES.items()})
    assert measured.steady is not None and made.steady is not None
    assert measured.steady.stages == made.steady.stages
    assert np.allclose(measured.steady.seconds, made.steady.seconds)
    assert np.allclose(measured.breakdown.start, made.breakdown.start)
    assert measured.loop.pre_forward_s == pytest.approx(made.loop.pre_forward_s, abs=1e-9)
    assert measured.loop.calls_per_step == pytest.approx(made.loop.calls_per_step)
    for metric, value in made.steady_means.items():
        assert measured.steady_mean(metric) == pytest.approx(value)
    saved = [(c["fn"], c["bytes"]) for c in measured.config.checkpoints]
    assert saved == [(c["fn"], c["bytes"]) for c in made.config.checkpoints]
    assert [c.id for c in advise(measured).cards] == [c.id for c in advise(made).cards]


def test_steps_of_no_length_cost_no_rule() -> None:
    """A trace whose step marks share one timestamp: every rule still runs, none fails."""
    for analysis in (
        plain(stages={"data": 0.0, "forward": 0.0}),
        plain(stages={"forward": [0.0] * 29 + [0.01]}),
    ):
        advice = advise(analysis)
        assert not [w for w in advice.warnings if "failed" in w]
        assert all(c.saving_s is None or c.saving_s < c.metrics["step_s"] for c in advice.cards)


def test_a_fix_worth_under_two_percent_of_a_step_is_listed_not_shown() -> None:
    far = on_gpu(host=TWO_NODES, stages=stages(data=0.003))  # binding saves ~4% of the step: a card
    near = on_gpu(host=TWO_NODES, stages=stages(data=0.0002))  # ~0.3%: listed only
    assert host.numa_affinity(near) is not None  # the rule fires either way
    assert "numa_affinity" in [c.id for c in advise(far).cards]
    minor = advise(near)
    assert "numa_affinity" not in [c.id for c in minor.cards]
    assert [c.id for c in minor.minor] == ["numa_affinity"]
    assert all(c.saving_s is not None and c.saving_s < 0.02 * c.metrics["step_s"] for c in minor.minor)
