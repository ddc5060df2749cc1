"""Each advice rule on synthetic analyses, on both sides of its threshold."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from analysis_builder import CUDA_TORCH, HEALTHY, HOST, HOST_SAMPLES, LOADER, MODEL, GiB, build, gpu_static

from perfmagic.advise import Card, advise, data, distributed, gpu, host, loop, pace, startup, storage
from perfmagic.advise.catalog import RULES
from perfmagic.advise.fixes import nice_interval
from perfmagic.advise.workers import HANDOFF_S, PARALLEL_EFFICIENCY
from perfmagic.analyze.loading import LoadingAccount
from perfmagic.tuning.result import knob_result
from perfmagic.units import fmt_seconds

IDS = [
    "input_bound",
    "dataloader_workers",
    "pin_memory",
    "preprocess_in_loop",
    "io_bound",
    "small_files",
    "cpu_contention",
    "host_memory_pressure",
    "gpu_memory_pressure",
    "activation_memory",
    "optimizer_memory",
    "weight_memory",
    "allocator_fragmentation",
    "dataloader_copy_on_read",
    "pinned_memory_held",
    "swap_growth",
    "host_embedding",
    "low_gpu_util",
    "launch_bound",
    "gpu_gaps",
    "sync_copies",
    "jit_compile",
    "amp",
    "tf32",
    "sync_logging",
    "checkpoint_frequency",
    "comm_bound",
    "rank_straggler",
    "gpu_imbalance",
    "data_parallel",
    "numa_affinity",
    "slow_startup",
    "step_outliers",
    "compute_bound",
]

CUDA_MODEL = {**MODEL, "device": "cuda:0"}


def stages(**changes: Any) -> dict[str, Any]:
    return {**HEALTHY, **changes}


def check(card: Card | None, rule_id: str) -> Card:
    """A fired card, with everything the contract promises."""
    assert card is not None, f"{rule_id} did not fire"
    assert card.id == rule_id
    assert card.severity in ("high", "medium", "low", "info")
    assert card.title and "\n" not in card.title
    assert card.evidence and card.fix and card.metrics
    if card.saving_s is not None:
        assert card.saving_s > 0
        assert "saving_model" in card.metrics
        assert card.speedup is not None and card.speedup > 1
    return card


# -- catalog -----------------------------------------------------------------


def test_catalog_has_one_rule_per_advice_id_in_order() -> None:
    assert [r.__name__ for r in RULES] == IDS


def test_healthy_run_gets_only_the_compute_bound_card() -> None:
    cards = advise(build()).cards
    assert [c.id for c in cards] == ["compute_bound"]
    assert cards[0].severity == "info"


def test_compute_bound_is_dropped_when_a_real_problem_fires() -> None:
    a = build(stages=stages(data=0.02))
    assert pace.compute_bound(build(stages=stages(data=0.004))) is not None
    ids = [c.id for c in advise(a).cards]
    assert ids[0] == "dataloader_workers" and "compute_bound" not in ids  # the fix of the data wait leads


def test_cards_are_the_plans_changes_and_the_data_wait_is_saved_once() -> None:
    advice = advise(build(stages=stages(data=0.02, logging=0.003)))
    assert advice.plan is not None
    # fixes by their own saving; input_bound, the data wait itself, after the fix that removes it: still
    # shown, as high as the wait is, with no saving of its own (the workers' is counted once)
    alone = [c.metrics["saving_alone_s"] for c in advice.cards[:-1]]
    assert alone == sorted(alone, reverse=True)
    assert [c.id for c in advice.cards] == ["dataloader_workers", "sync_logging", "input_bound"]
    wait = advice.cards[-1]
    assert wait.saving_s is None and wait.severity == "high" and not advice.minor
    # what remains of the wait is no change of the plan, and has no interval to be uncertain about
    assert [c.id for c in advice.plan.changes] == ["dataloader_workers", "sync_logging"]
    assert "uncertain" not in wait.metrics and "saving_interval_s" not in wait.metrics
    total = sum(c.saving_s for c in advice.plan.changes)
    assert total == pytest.approx(advice.plan.step_s - advice.plan.predicted_step_s)
    # the 20 ms of data once, less taking each batch over from a worker, and the logging
    assert total == pytest.approx(0.02 - HANDOFF_S + 0.0027)


def test_missing_data_is_warned_once() -> None:
    a = build(samples={})
    before = list(a.warnings)
    warnings = advise(a).warnings
    assert advise(a).warnings == warnings and a.warnings == before  # advice leaves the analysis as it was
    gpu_warnings = [w for w in warnings if w.startswith("GPU rules")]
    assert len(gpu_warnings) == 1 and "NVML" in gpu_warnings[0]
    assert any(w.startswith("host rules") for w in warnings)


def test_gpu_present_without_trace_warns_about_launch_bound_only() -> None:
    a = build(devices=[gpu_static()], samples={**HOST_SAMPLES, "gpu0.util": 0.9})
    warnings = advise(a).warnings
    assert not any(w.startswith("GPU rules") for w in warnings)
    assert any(w.startswith("launch_bound") for w in warnings)


def test_no_hooks_warns_about_setup_rules() -> None:
    a = build(loader=None, model=None)
    assert any(w.startswith("set-up rules") for w in advise(a).warnings)


def test_nice_interval() -> None:
    assert [nice_interval(x) for x in (0.5, 1, 1.5, 3, 7, 12, 40, 51, 300)] == [
        1,
        1,
        2,
        5,
        10,
        20,
        50,
        100,
        500,
    ]


# -- input -------------------------------------------------------------------


def test_input_bound_fires_from_5_percent_and_says_highly_from_20() -> None:
    assert data.input_bound(build(stages=stages(data=0.0005))) is None  # ~4%
    moderate = check(data.input_bound(build(stages=stages(data=0.0013))), "input_bound")  # ~9%
    assert "moderately" in moderate.title
    card = check(data.input_bound(build(stages=stages(data=0.02))), "input_bound")
    assert "HIGHLY" in card.title and card.severity == "high"
    # workers that keep up take all of the wait, less taking each batch over from them
    assert card.saving_s == pytest.approx(0.02 - HANDOFF_S, rel=0.01)
    assert "Up to 20.0 ms per step" in card.evidence and "save all of it" in card.evidence


def test_input_bound_claims_what_the_affordable_workers_save_and_states_the_bound() -> None:
    two_cpus = {**HOST, "cpu_count": 2, "affinity": [0, 1]}
    a = build(stages=stages(data=0.03), host=two_cpus)  # 30 ms to load, 13.3 ms of rest: 3 workers keep up
    card = check(data.input_bound(a), "input_bound")
    workers = check(data.dataloader_workers(a), "dataloader_workers")
    # two workers and the loop share 2 CPUs: the CPU work of a step (the hand-over included) on the
    # CPUs' worth two of them give
    after = (0.03 + 0.0133 + HANDOFF_S) / (1 + PARALLEL_EFFICIENCY)
    assert card.saving_s == pytest.approx(workers.saving_s) == pytest.approx(0.0433 - after, rel=0.01)
    assert card.speedup == pytest.approx(workers.speedup)
    left = fmt_seconds(after - 0.0133 - HANDOFF_S)
    assert "Up to 30.0 ms per step" in card.evidence and f"still wait {left}" in card.evidence
    assert card.metrics["recommended_workers"] == workers.metrics["recommended_workers"] == 2
    # severity is the size of the problem (88% of the step waits), whatever a fix achieves: on one CPU
    # no worker count shortens the step, and the wait is as high
    slow = build(stages=stages(data=0.1), host={**HOST, "cpu_count": 1, "affinity": [0]})
    assert check(data.input_bound(slow), "input_bound").severity == "high"
    assert data.dataloader_workers(slow) is None
    # the two cards say different things: the worker count on one, cheaper samples on the other
    assert "DataLoader(" in workers.fix and "DataLoader(" not in card.fix
    assert "ms per batch of 64" in card.fix and f"still waits {left}" in card.fix


def test_input_bound_without_a_dataloader_claims_the_whole_wait_and_says_why() -> None:
    card = check(data.input_bound(build(stages=stages(data=0.02), loader=None)), "input_bound")
    assert card.saving_s == pytest.approx(0.02, rel=0.01)
    assert "saw no torch DataLoader" in card.evidence and "upper bound" in card.metrics["saving_model"]
    assert "workers are already busy" not in card.fix and "num_workers=N" in card.fix


def test_dataloader_workers_recommends_what_the_cpus_allow() -> None:
    card = check(data.dataloader_workers(build(stages=stages(data=0.02))), "dataloader_workers")
    # 20 ms to load a batch, 13.3 ms of rest: 2 workers keep up with the loading, but their 34 ms of
    # CPU work a step with the loop's gets 2.2 CPUs' worth on three: a third brings the step to the
    # loop's own
    assert card.metrics["recommended_workers"] == 3 and card.metrics["workers_needed"] == 2
    assert card.saving_s == pytest.approx(0.02 - HANDOFF_S, rel=0.05)
    assert "num_workers=3,  # was 0" in card.fix and "persistent_workers=True" in card.fix
    few = check(
        data.dataloader_workers(
            build(stages=stages(data=0.1), host={**HOST, "cpu_count": 4, "affinity": [0, 1, 2, 3]})
        ),
        "dataloader_workers",
    )
    # 8 workers would keep up, but 114 ms of CPU work a step on 4 CPUs sets the step: three workers
    # and the loop use them all, a fourth adds no CPU
    assert few.metrics["recommended_workers"] == 3 and few.metrics["workers_needed"] == 8


def test_dataloader_workers_is_silent_when_workers_are_maxed_or_data_is_cheap() -> None:
    assert data.dataloader_workers(build(stages=stages(data=0.0005))) is None
    assert (
        data.dataloader_workers(build(stages=stages(data=0.02), loader={**LOADER, "num_workers": 7})) is None
    )
    one_cpu = {**HOST, "cpu_count": 1, "affinity": [0]}
    assert data.dataloader_workers(build(stages=stages(data=0.02), host=one_cpu)) is None


def test_input_bound_with_maxed_workers_says_make_samples_cheaper() -> None:
    card = check(
        data.input_bound(build(stages=stages(data=0.02), loader={**LOADER, "num_workers": 7})), "input_bound"
    )
    assert "More workers cannot help" in card.fix
    assert "already use the CPUs" in card.evidence and "upper bound" in card.metrics["saving_model"]
    assert "pickled" in card.fix  # with workers, batches cross processes
    # these workers neither timed their batches nor sampled their stacks: the card says what it lacks
    assert "the time per sample was not measured" in card.fix and "stacks were not sampled" in card.fix
    assert "perf_counter" not in card.fix and "dataset[i]" not in card.fix  # no snippet to measure it oneself
    compile(card.fix, "fix", "exec")


def _spot(function: str, line: int, share: float, sampled: str = "workers") -> dict[str, Any]:
    where = f"{function} (In [2], line {line})"
    place = {"function": function, "file": "In [2]", "line": line, "cell": 2, "where": where}
    return {**place, "samples": round(share * 1000), "share": share, "sampled": sampled}


def test_the_cheaper_samples_fix_names_what_a_sample_costs_and_the_code_that_costs_it() -> None:
    """A user saw the card hand over a timing snippet for what the profile knew: 10 ms a sample, half of
    it in ``__getitem__``, most of the rest in its FFT. The fix says so, line by line, what to do after."""
    maxed = build(stages=stages(data=0.02), loader={**LOADER, "num_workers": 7})
    spots = [_spot("__getitem__", 15, 0.49), _spot("spectrum", 8, 0.45), _spot("collate", 3, 0.01)]
    account = LoadingAccount("workers", 0.95, 0.03, 0.02, 0.0, busy=0.97, batch_s=0.64)
    a = dataclasses.replace(maxed, loading=account, hotspots={"data": spots})
    card = check(data.input_bound(a), "input_bound")
    assert "a DataLoader worker takes 640.0 ms per batch of 64, 10.0 ms per sample" in card.fix
    lines = card.fix.splitlines()
    named = [line for line in lines if "(In [2], line" in line]
    assert named == ["#    49%  __getitem__ (In [2], line 15)", "#    45%  spectrum (In [2], line 8)"]
    assert "(1000 samples of their stacks)" in card.fix  # the shares' whole, said once
    assert "cached" in card.fix and "GPU" in card.fix and "offline" in card.fix
    compile(card.fix, "fix", "exec")


def test_without_workers_a_sample_costs_the_training_threads_loading() -> None:
    a = build(stages=stages(data=0.02))  # 20 ms of data a step, one batch of 64 a step, no workers
    a = dataclasses.replace(a, hotspots={"data": [_spot("decode", 4, 0.8, "training thread")]})
    fix = check(data.input_bound(a), "input_bound").fix
    assert "the training loop takes 20.0 ms per batch of 64, 313 µs per sample" in fix
    assert "#    80%  decode (In [2], line 4)" in fix
    unknown = build(stages=stages(data=0.02), loader={**LOADER, "batch_size": None})
    fix = check(data.input_bound(unknown), "input_bound").fix
    assert "20.0 ms per batch (its size was not seen: not per sample)" in fix
    assert "stack was not sampled while loading" in fix


def _h2d(**counters: Any) -> Any:
    base = {"h2d_copies": 60, "h2d_bytes": 6 * GiB, "h2d_pinned_bytes": 0, "h2d_non_blocking": 0}
    return build(stages=stages(h2d=0.003), torch=CUDA_TORCH, model=CUDA_MODEL, counters={**base, **counters})


def test_pin_memory() -> None:
    card = check(data.pin_memory(_h2d()), "pin_memory")
    assert card.saving_s == pytest.approx(0.0015, rel=0.01)
    assert "pin_memory=True,  # was False" in card.fix and "non_blocking=True" in card.fix
    assert data.pin_memory(_h2d(h2d_pinned_bytes=6 * GiB, h2d_non_blocking=60)) is None
    small = build(stages=stages(h2d=0.0003), torch=CUDA_TORCH, counters={"h2d_copies": 1, "h2d_bytes": 1})
    assert data.pin_memory(small) is None
    measured = check(
        data.pin_memory(_tuned(_h2d(), "pin_memory", [(False, 0.009), (True, 0.006)])), "pin_memory"
    )
    assert measured.metrics["saving_model"] == "measured" and measured.saving_s == pytest.approx(0.003)
    assert data.pin_memory(_tuned(_h2d(), "pin_memory", [(False, 0.006), (True, 0.0061)])) is None


def test_preprocess_in_loop_measures_each_step_less_built_in_stages() -> None:
    pre = [0.004 + 0.002 * (k % 5) for k in range(30)]
    card = check(data.preprocess_in_loop(build(stages=stages(pre=pre, h2d=0.002))), "preprocess_in_loop")
    # the mean of the steady steps' gaps; the h2d copy between the batch and forward is not preprocessing
    assert card.metrics["preprocess_s"] == pytest.approx(sum(pre[1:]) / 29, rel=1e-6)


def test_preprocess_in_loop() -> None:
    card = check(data.preprocess_in_loop(build(stages=stages(pre=0.01))), "preprocess_in_loop")
    assert card.metrics["preprocess_s"] == pytest.approx(0.01, rel=0.01)
    # 0.2 ms to load + 10 ms to preprocess, 13.3 ms left in the step: one worker keeps up; the step's
    # CPU work (and the hand-over) is then shared by the loop and the worker
    assert "class Preprocessed" in card.fix and "num_workers=1,  # was 0" in card.fix
    after = (0.0235 + HANDOFF_S) / (1 + PARALLEL_EFFICIENCY)
    assert card.saving_s == pytest.approx(0.0235 - after, rel=0.01)
    heavy = check(data.preprocess_in_loop(build(stages=stages(pre=0.03))), "preprocess_in_loop")
    assert heavy.metrics["workers"] == 3  # 30.2 ms of work against 13.3 ms of rest
    assert data.preprocess_in_loop(build(stages=stages(pre=0.0005))) is None
    # time after the optimizer (the "other" tail) is not preprocessing
    assert data.preprocess_in_loop(build(stages=stages(other=0.01))) is None


IO = {**HOST_SAMPLES, "host.proc_read_bytes": 500 * 1024**2, "host.read_bytes": 10 * 1024**2}


def test_io_bound() -> None:
    card = check(
        storage.io_bound(build(stages=stages(data=0.02), samples={**IO, "host.iowait": 0.1})), "io_bound"
    )
    assert card.metrics["blocked_share"] == pytest.approx(0.8)
    assert storage.io_bound(build(stages=stages(data=0.02), samples={**IO, "host.iowait": 0.01})) is None
    # I/O wait while the training itself read nothing is someone else's
    quiet = {**IO, "host.iowait": 0.1, "host.proc_read_bytes": 0.0}
    assert storage.io_bound(build(stages=stages(data=0.02), samples=quiet)) is None


def test_small_files() -> None:
    small = {**IO, "host.iowait": 0.1, "host.read_ops": 10_000.0}  # 1 KiB per read
    card = check(storage.small_files(build(stages=stages(data=0.02), samples=small)), "small_files")
    assert card.metrics["avg_read_size_bytes"] < 64 * 1024
    large = {**small, "host.read_ops": 50.0}  # 200 KiB per read
    assert storage.small_files(build(stages=stages(data=0.02), samples=large)) is None


# -- host --------------------------------------------------------------------


def test_cpu_contention() -> None:
    busy = {**HOST_SAMPLES, "host.cpu_util": 0.98, "host.proc_cpu_cores": 2.0}
    card = check(host.cpu_contention(build(samples=busy)), "cpu_contention")
    assert card.metrics["other_cores"] == pytest.approx(5.84)
    assert host.cpu_contention(build(samples={**busy, "host.cpu_util": 0.6})) is None
    # the machine is saturated by the training itself: no one else to blame
    assert host.cpu_contention(build(samples={**busy, "host.proc_cpu_cores": 7.8})) is None


def test_a_complete_tf_data_pipeline_on_a_crowded_machine_is_left_to_cpu_contention() -> None:
    complete = {
        "ops": ["batch", "cache", "prefetch"],
        "serial_maps": 0,
        "parallel_maps": 0,
        "cache": True,
        "prefetch": True,
    }
    busy = {**HOST_SAMPLES, "host.cpu_util": 0.98, "host.proc_cpu_cores": 2.0}
    crowded = build(stages=stages(data=0.01), loader=None, samples=busy)
    crowded = dataclasses.replace(crowded, config=dataclasses.replace(crowded.config, pipelines=[complete]))
    assert data.input_bound(crowded) is None
    assert check(host.cpu_contention(crowded), "cpu_contention")
    # on a quiet machine the same wait is the elements' own cost
    quiet = dataclasses.replace(crowded, steady_means={**crowded.steady_means, "host.cpu_util": 0.3})
    card = check(data.input_bound(quiet), "input_bound")
    assert "each element must get cheaper" in card.evidence
    # a pipeline with something to add keeps its card beside the contention
    serial = {**complete, "ops": ["map", "batch", "cache", "prefetch"], "serial_maps": 1}
    lacking = dataclasses.replace(crowded, config=dataclasses.replace(crowded.config, pipelines=[serial]))
    assert "num_parallel_calls=AUTOTUNE" in check(data.input_bound(lacking), "input_bound").fix


def test_host_memory_pressure() -> None:
    low = build(samples={**HOST_SAMPLES, "host.mem_available_bytes": 3 * GiB})
    assert check(host.host_memory_pressure(low), "host_memory_pressure").severity == "high"
    tight = build(samples={**HOST_SAMPLES, "host.mem_available_bytes": 5 * GiB})
    assert check(host.host_memory_pressure(tight), "host_memory_pressure").severity == "medium"
    assert (
        host.host_memory_pressure(build(samples={**HOST_SAMPLES, "host.mem_available_bytes": 10 * GiB}))
        is None
    )


TWO_NODES = {**HOST, "numa_nodes": {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}}


def test_numa_affinity() -> None:
    device = gpu_static(numa_node=1, numa_cpus=[4, 5, 6, 7])
    samples = {**HOST_SAMPLES, "gpu0.util": 0.9}
    opts: dict[str, Any] = {
        "devices": [device],
        "samples": samples,
        "model": CUDA_MODEL,
        "stages": stages(data=0.003),
    }
    card = check(host.numa_affinity(build(host=TWO_NODES, **opts)), "numa_affinity")
    assert "--cpunodebind=1 --membind=1" in card.fix and "{4, 5, 6, 7}" in card.fix
    assert host.numa_affinity(build(host={**TWO_NODES, "affinity": [4, 5, 6, 7]}, **opts)) is None
    assert host.numa_affinity(build(host=HOST, **opts)) is None


# -- gpu ---------------------------------------------------------------------


def _gpu(util: float = 0.9, mem: float = 40 * GiB, **options: Any) -> Any:
    samples = {**HOST_SAMPLES, "gpu0.util": util, "gpu0.mem_used_bytes": mem}
    options.setdefault("devices", [gpu_static()])
    return build(samples=samples, torch=CUDA_TORCH, model=CUDA_MODEL, **options)


def test_gpu_memory_pressure() -> None:
    assert check(gpu.gpu_memory_pressure(_gpu(mem=79 * GiB)), "gpu_memory_pressure").severity == "high"
    assert check(gpu.gpu_memory_pressure(_gpu(mem=77 * GiB)), "gpu_memory_pressure").severity == "medium"
    assert gpu.gpu_memory_pressure(_gpu(mem=70 * GiB)) is None


def test_low_gpu_util() -> None:
    card = check(gpu.low_gpu_util(_gpu(util=0.2, stages=stages(data=0.03))), "low_gpu_util")
    assert card.metrics["top_host_stage"] == "data" and "input_bound" in card.fix
    assert card.saving_s == pytest.approx(card.metrics["step_s"] * (1 - 0.2 / 0.9))
    assert gpu.low_gpu_util(_gpu(util=0.6)) is None
    traced = check(gpu.low_gpu_util(_gpu(util=0.9, gpu={"busy_fraction": 0.3})), "low_gpu_util")
    assert traced.metrics["source"] == "trace"
    assert gpu.low_gpu_util(build()) is None  # no GPU: silent


def test_launch_bound() -> None:
    trace = {
        "busy_fraction": 0.6,
        "idle_fraction": 0.4,
        "idle_breakdown": {"host_wait": 0.1, "kernel_wait": 0.25},
        "launches": None,
    }
    card = check(gpu.launch_bound(_gpu(gpu=trace, optimizer={"cls": "AdamW", "fused": None})), "launch_bound")
    assert "reduce-overhead" in card.fix and "fused=True" in card.fix
    quiet = {**trace, "idle_breakdown": {"host_wait": 0.3, "kernel_wait": 0.05}}
    assert gpu.launch_bound(_gpu(gpu=quiet)) is None
    assert gpu.launch_bound(_gpu()) is None  # no trace


def test_jit_compile() -> None:
    forward = [0.004] * 30
    forward[10] = forward[20] = 1.0
    compiled = {**MODEL, "compiled": True}
    loader = {**LOADER, "dataset_len": 1000}
    card = check(
        gpu.jit_compile(build(stages=stages(forward=forward), model=compiled, loader=loader)), "jit_compile"
    )
    assert card.metrics["recompiles"] == 2 and "drop_last=True" in card.fix
    assert gpu.jit_compile(build(stages=stages(forward=forward))) is None  # not compiled
    assert gpu.jit_compile(build(model=compiled)) is None  # compiled, no recompiles


def test_amp() -> None:
    card = check(gpu.amp(_gpu()), "amp")
    assert "bfloat16" in card.fix and card.saving_s == pytest.approx(0.006, rel=0.01)
    volta = check(gpu.amp(_gpu(devices=[gpu_static(cc="7.0")])), "amp")
    assert "GradScaler" in volta.fix
    assert gpu.amp(_gpu(devices=[gpu_static(cc="6.1")])) is None
    assert gpu.amp(_gpu(counters={"autocast_forwards": 30})) is None
    assert gpu.amp(build()) is None  # CPU


def _tuned(a: Any, knob: str, tried: list[tuple[Any, float]]) -> Any:
    """The analysis with ``knob`` measured by tuning: (value, seconds per step), the first the baseline."""
    rows = [{"value": v, "seconds": t} for v, t in tried]
    best = min(rows, key=lambda r: r["seconds"])
    result = knob_result(knob, "seconds per step", rows, rows[0], best, [])
    return dataclasses.replace(a, tuning=[result])


def test_amp_and_tf32_take_what_tuning_measured() -> None:
    ampere = _gpu(devices=[gpu_static(cc="8.0")])
    measured = check(gpu.amp(_tuned(ampere, "autocast", [(None, 0.010), ("float16", 0.004)])), "amp")
    assert (
        measured.metrics["saving_model"] == "measured" and "GradScaler" in measured.fix
    )  # fp16 measured best
    assert measured.saving_s == pytest.approx(0.006)
    assert gpu.amp(_tuned(ampere, "autocast", [(None, 0.004), ("bfloat16", 0.005)])) is None  # no faster
    tf32 = check(gpu.tf32(_tuned(ampere, "tf32", [(False, 0.010), (True, 0.007)])), "tf32")
    assert tf32.metrics["saving_model"] == "measured" and tf32.saving_s == pytest.approx(0.003)
    assert gpu.tf32(_tuned(ampere, "tf32", [(False, 0.007), (True, 0.0071)])) is None


def test_tf32() -> None:
    card = check(gpu.tf32(_gpu(devices=[gpu_static(cc="8.0")])), "tf32")
    assert "set_float32_matmul_precision('high')" in card.fix
    allowed = {**CUDA_TORCH, "float32_matmul_precision": "high"}
    assert (
        gpu.tf32(
            build(
                samples={**HOST_SAMPLES, "gpu0.util": 0.9},
                torch=allowed,
                model=CUDA_MODEL,
                devices=[gpu_static()],
            )
        )
        is None
    )
    assert gpu.tf32(_gpu(devices=[gpu_static(cc="7.5")])) is None


# -- loop --------------------------------------------------------------------


def test_sync_logging() -> None:
    card = check(loop.sync_logging(build(stages=stages(logging=0.002))), "sync_logging")
    assert card.metrics["calls_per_step"] == pytest.approx(1.0)
    assert "LOG_EVERY = 20" in card.fix and "step % LOG_EVERY == 0" in card.fix
    syncing = check(
        loop.sync_logging(build(stages=stages(logging=0.002), counters={"syncs": 30})), "sync_logging"
    )
    assert "loss.detach()" in syncing.fix and syncing.metrics["syncs_per_step"] == 1.0
    assert loop.sync_logging(build(stages=stages(logging=0.0003))) is None


def test_checkpoint_frequency() -> None:
    every_5 = [0.05 if k % 5 == 4 else 0.0 for k in range(30)]
    card = check(loop.checkpoint_frequency(build(stages=stages(checkpoint=every_5))), "checkpoint_frequency")
    assert card.metrics["interval_steps"] == 5  # exact: saves in steps 4, 9, 14, ... (was "about every 4.8")
    assert card.metrics["recommended_interval_steps"] >= 100
    assert "CHECKPOINT_EVERY = " in card.fix and "40.0 MiB" in card.evidence
    rare = [0.001 if k % 10 == 9 else 0.0 for k in range(30)]
    assert loop.checkpoint_frequency(build(stages=stages(checkpoint=rare))) is None


# -- distributed -------------------------------------------------------------


def test_comm_bound() -> None:
    card = check(distributed.comm_bound(build(stages=stages(comm=0.005))), "comm_bound")
    assert "DistributedDataParallel" in card.fix
    ddp = check(
        distributed.comm_bound(build(stages=stages(comm=0.005), model={**MODEL, "ddp": True})), "comm_bound"
    )
    assert "no_sync" in ddp.fix and ddp.saving_s == pytest.approx(0.00375, rel=0.01)
    assert distributed.comm_bound(build(stages=stages(comm=0.0005))) is None


def test_rank_straggler() -> None:
    waiting = {"stages": stages(comm=0.006)}
    card = check(
        distributed.rank_straggler(build(stages=stages(forward=0.01), ranks=[waiting] * 3)), "rank_straggler"
    )
    assert card.metrics["rank"] == 0 and card.metrics["stage"] == "forward"
    assert card.saving_s == pytest.approx(0.006, rel=0.01)
    assert distributed.rank_straggler(build(ranks=[{}] * 3)) is None
    assert distributed.rank_straggler(build()) is None


def test_a_slow_data_rank_is_named_with_its_stage_and_the_others_wait_as_evidence() -> None:
    """Two DDP ranks: rank 1 waits 40 ms per step for data, rank 0 waits as long in comm."""
    a = build(stages=stages(comm=0.04), ranks=[{"stages": stages(data=0.04, comm=0.0005)}])
    card = check(distributed.rank_straggler(a), "rank_straggler")
    assert card.metrics["rank"] == 1 and card.metrics["stage"] == "data"
    assert card.metrics["others_comm_s"] == pytest.approx(0.04, rel=0.05)
    assert card.saving_s == pytest.approx(0.04, rel=0.1)  # the whole excess: against the other rank
    assert "rank 1" in card.fix and "num_workers" in card.fix
    assert a.bottleneck == "data"  # the job's bottleneck is the straggler's stage, not rank 0's wait
    # the wait is no communication cost: the rank that waits least shows how little there is
    assert distributed.comm_bound(a) is None


def test_balanced_ranks_have_no_straggler_and_their_shared_comm_is_comm_bound() -> None:
    a = build(stages=stages(comm=0.005), ranks=[{"stages": stages(comm=0.005)}] * 3)
    assert a.straggler is None and distributed.rank_straggler(a) is None
    check(distributed.comm_bound(a), "comm_bound")


def test_gpu_imbalance() -> None:
    four = [gpu_static(i) for i in range(4)]
    idle = {**HOST_SAMPLES, "gpu0.util": 0.9, "gpu1.util": 0.0, "gpu2.util": 0.0, "gpu3.util": 0.0}
    card = check(distributed.gpu_imbalance(build(devices=four, samples=idle)), "gpu_imbalance")
    assert card.metrics["idle_gpus"] == [1, 2, 3] and card.speedup == pytest.approx(4.0)
    uneven = {**HOST_SAMPLES, "gpu0.util": 0.95, "gpu1.util": 0.5, "gpu2.util": 0.5, "gpu3.util": 0.5}
    assert (
        check(distributed.gpu_imbalance(build(devices=four, samples=uneven)), "gpu_imbalance").metrics[
            "idle_gpus"
        ]
        == []
    )
    even = {**HOST_SAMPLES, "gpu0.util": 0.9, "gpu1.util": 0.85, "gpu2.util": 0.8, "gpu3.util": 0.88}
    assert distributed.gpu_imbalance(build(devices=four, samples=even)) is None


def test_gpu_imbalance_in_memory_as_data_parallel_leaves_it_on_gpu_0() -> None:
    """Even utilization, but GPU 0 holds 1.5x (and >= 1 GiB more) the memory of another working GPU."""
    two = [gpu_static(i) for i in range(2)]

    def memory(gpu0: float, gpu1: float, util1: float = 0.8) -> dict[str, float]:
        return {
            **HOST_SAMPLES,
            "gpu0.util": 0.85,
            "gpu1.util": util1,
            "gpu0.mem_used_bytes": gpu0 * GiB,
            "gpu1.mem_used_bytes": gpu1 * GiB,
        }

    card = check(distributed.gpu_imbalance(build(devices=two, samples=memory(30, 12))), "gpu_imbalance")
    assert card.metrics["signal"] == "memory" and card.metrics["mem_ratio"] == pytest.approx(2.5)
    assert card.title == "GPU 0 holds 2.5x the memory of GPU 1" and card.saving_s is None
    assert "30.0 GiB peak" in card.evidence and "DistributedDataParallel" in card.fix
    assert distributed.gpu_imbalance(build(devices=two, samples=memory(17, 12))) is None  # 1.4x
    assert distributed.gpu_imbalance(build(devices=two, samples=memory(1.5, 0.6))) is None  # < 1 GiB apart
    # an idle GPU's small footprint is no imbalance in memory: its utilization says what matters
    idle = check(distributed.gpu_imbalance(build(devices=two, samples=memory(30, 0.5, 0.0))), "gpu_imbalance")
    assert idle.metrics["signal"] == "utilization" and idle.metrics["idle_gpus"] == [1]
    slow = {**memory(30, 0.5, 0.03), "gpu0.util": 0.2}  # both nearly idle: no utilization spread either
    assert distributed.gpu_imbalance(build(devices=two, samples=slow)) is None


def test_data_parallel() -> None:
    card = check(distributed.data_parallel(build(model={**MODEL, "data_parallel": True})), "data_parallel")
    assert card.severity == "medium" and "DistributedDataParallel" in card.fix
    assert distributed.data_parallel(build()) is None


# -- steps -------------------------------------------------------------------


def test_slow_startup() -> None:
    card = check(startup.slow_startup(build(first_extra={"data": 2.0})), "slow_startup")
    assert card.metrics["where"] == "data"
    # 2 s once is 80% of this window but a sliver of an hour's job: low, with a saving to match
    assert card.severity == "low" and card.metrics["job_s"] == 3600
    assert card.speedup == pytest.approx(3600 / (3600 - 2.0), rel=1e-3)
    assert "0.06% of a 1-hour job" in card.evidence
    before = check(startup.slow_startup(build(before_s=2.0)), "slow_startup")
    assert before.metrics["where"] == "before"
    assert startup.slow_startup(build(first_extra={"data": 0.02})) is None


@pytest.mark.parametrize(
    ("excess_s", "severity"), [(910, "high"), (890, "medium"), (370, "medium"), (350, "low")]
)
def test_slow_startup_severity_is_its_share_of_an_hour_long_job(excess_s: float, severity: str) -> None:
    card = check(startup.slow_startup(build(first_extra={"data": excess_s}, samples={})), "slow_startup")
    assert card.severity == severity  # high from 15 min, medium from 6 min


def test_slow_startup_is_only_the_users_own_second_or_more_and_names_its_line() -> None:
    # 0.6 s of start-up is most of a 1 s window, and still not worth a card
    assert startup.slow_startup(build(first_extra={"data": 0.6})) is None
    a = build(before_s=3.0)
    assert (
        startup.slow_startup(dataclasses.replace(a, ready_s=2.5)) is None
    )  # 2.5 s of it were perfmagic's own
    sleep = {
        "where": "<module> (train.py:4)",
        "samples": 27,
        "share": 0.9,
        "function": "<module>",
        "file": "train.py",
        "line": 4,
        "cell": None,
        "sampled": "training thread",
    }
    card = check(startup.slow_startup(dataclasses.replace(a, hotspots={"startup": [sleep]})), "slow_startup")
    assert "Most of it in <module> (train.py:4) (90%" in card.evidence
    assert card.fix.startswith("# Most of the start-up: <module> (train.py:4)\n")
    assert card.metrics["hot_line"] == "<module> (train.py:4)"


def test_slow_startup_under_perfmagic_run_names_interpreter_and_imports() -> None:
    a = build(before_s=2.5)
    a = dataclasses.replace(a, whole_process=True, argv=["train.py", "--epochs", "3"])
    card = check(startup.slow_startup(a), "slow_startup")
    assert card.severity == "low" and "importing torch" in card.evidence
    assert "python -X importtime train.py --epochs 3" in card.fix
    live = check(startup.slow_startup(build(before_s=2.5)), "slow_startup")
    assert "importing torch" not in live.evidence and "start profiling after it" in live.fix


def test_step_outliers() -> None:
    other = [0.05 if k % 8 == 7 else 0.0003 for k in range(40)]
    card = check(pace.step_outliers(build(steps=40, stages=stages(other=other))), "step_outliers")
    assert card.metrics["period_steps"] == 8 and card.metrics["stage"] == "other"
    assert pace.step_outliers(build(steps=40)) is None
    # slow steps that are checkpoints are checkpoint_frequency's
    ckpt = [0.05 if k % 8 == 7 else 0.0 for k in range(40)]
    assert pace.step_outliers(build(steps=40, stages=stages(checkpoint=ckpt))) is None


def test_periodic_work_stretched_by_a_busy_machine_is_still_the_loops_work() -> None:
    # an evaluation every 8 steps: 30 ms more a step, 10 ms of it on a CPU and 20 ms waiting for one
    other = [0.0302 if k % 8 == 7 else 0.0002 for k in range(40)]
    a = build(steps=40, stages=stages(other=other))
    step = np.array([sum(stages(other=o).values()) for o in other])
    cpu = 0.5 * step + np.where(np.arange(40) % 8 == 7, 0.010 - 0.5 * 0.030, 0.0)
    a = dataclasses.replace(a, steady=dataclasses.replace(a.steady, cpu_s=cpu[1:], wait_s=step[1:] - cpu[1:]))
    card = check(pace.step_outliers(a), "step_outliers")
    assert card.metrics["period_steps"] == 8 and card.metrics["stage"] == "other"


def test_step_outliers_at_epoch_start_recommend_persistent_workers() -> None:
    data = [0.3 if k % 10 == 0 else 0.0002 for k in range(40)]
    loader = {**LOADER, "num_workers": 4, "prefetch_factor": 2, "dataset_len": 640}
    card = check(
        pace.step_outliers(build(steps=40, stages=stages(data=data), loader=loader)), "step_outliers"
    )
    assert "persistent_workers=True,  # was False" in card.fix


def test_compute_bound_with_a_gpu_of_unknown_memory_size() -> None:
    # GPU samples without NVML's static facts: no total memory to weigh the peak against
    a = build(samples={**HOST_SAMPLES, "gpu0.util": 0.9})
    assert a.devices and a.devices[0]["mem_total_bytes"] is None
    check(pace.compute_bound(a), "compute_bound")


def test_compute_bound() -> None:
    card = check(pace.compute_bound(build()), "compute_bound")
    assert card.severity == "info" and "torch.compile" in card.fix
    assert pace.compute_bound(build(stages=stages(data=0.02))) is None


def test_a_few_held_up_steps_on_one_rank_make_no_straggler() -> None:
    """Three of 30 steps a busy machine held up on rank 1 (the other rank waiting for them in comm) move its
    mean work past the ratio, not its typical step: no straggler; slow at every step, it is one."""
    from perfmagic.analyze.ranks import find_straggler
    from perfmagic.analyze.steady import Steady

    def rank(data: np.ndarray, comm: np.ndarray) -> Steady:
        seconds = np.column_stack([data, np.full(30, 0.002), comm])
        return Steady(0, seconds.sum(axis=1), seconds, ["data", "forward", "comm"], 0.0, 1.0)

    held = np.zeros(30)
    held[[7, 15, 23]] = 0.025
    assert find_straggler([(0, rank(np.zeros(30), held)), (1, rank(held, np.zeros(30)))]) is None
    slow = np.full(30, 0.004)
    found = find_straggler([(0, rank(np.zeros(30), slow)), (1, rank(slow, np.zeros(30)))])
    assert found is not None and (found.rank, found.stage) == (1, "data")
