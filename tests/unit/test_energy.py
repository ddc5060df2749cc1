"""The report's ``energy`` section on timelines laid out by hand: NVML's counter and power samples
as a GPU that idles while the loop waits for data and draws full power while it computes."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fake_nvml as scenarios
import pytest
from fakeclock import FakeClock

from perfmagic.analyze import analyze
from perfmagic.analyze.energy import MEAN_POWER_MODEL, POWER_MODEL
from perfmagic.collect.nvml_source import NvmlSource
from perfmagic.collect.sampler import Sampler
from perfmagic.contract import Energy
from perfmagic.render.energy import fmt_joules
from perfmagic.render.html import report_fragment
from perfmagic.report import report_from_timelines
from perfmagic.schema import RECORDING, THREAD_SAMPLES
from perfmagic.timeline import Timeline

BATCH = 32


@dataclass(frozen=True)
class Loop:
    """An input-bound loop: each step waits ``data_s`` (GPU idle), then computes ``compute_s``."""

    steps: int = 20
    data_s: float = 0.25
    compute_s: float = 0.1
    idle_w: float = 60.0
    busy_w: float = 300.0
    tick_s: float = 0.02

    @property
    def step_j(self) -> float:
        return self.idle_w * self.data_s + self.busy_w * self.compute_s

    def busy_at(self, t: float) -> bool:
        step_s = self.data_s + self.compute_s
        return t % step_s > self.data_s if t < self.steps * step_s else False


def timeline(
    loop: Loop,
    *,
    counter: bool = True,
    gpus: int = 1,
    in_tree: tuple[int, ...] = (0,),
    counter_at: Any = None,
    model_device: str | None = None,
    dataset_len: int | None = None,
    price: float | None = None,
    unrecorded: Callable[[int], bool] = lambda step: False,
) -> Timeline:
    """The loop's spans, step boundaries and batch counts, and every GPU's samples; the ``unrecorded``
    steps' stages are not recorded (outside the recording windows: their ends and times only)."""
    tl = Timeline({"pid": os.getpid(), "epoch": 1000.0, "framework": "torch"})
    tl.meta["devices"] = [{"index": i, "name": "NVIDIA H100", "power_limit_w": 700.0} for i in range(gpus)]
    tl.meta["gpu_processes"] = [
        {"pid": os.getpid(), "gpu": i, "in_tree": True, "used_memory_bytes": 2**30} for i in in_tree
    ]
    if price is not None:
        tl.meta["price_per_gpu_hour"] = price
    tl.add_mark(0.0, "dataloader", num_workers=2, batch_size=BATCH, dataset_len=dataset_len)
    if model_device is not None:
        tl.add_mark(0.0, "model", cls="Net", parameters=10, device=model_device)
    t = 0.0
    for k in range(loop.steps):
        if unrecorded(k) != unrecorded(k - 1):
            tl.add_sample(RECORDING, t, 0.0 if unrecorded(k) else 1.0)
        if not unrecorded(k):
            tl.add_span(tl.name_id("data"), t, t + loop.data_s, 0)
        tl.add_sample(THREAD_SAMPLES, t + loop.data_s, float(BATCH * (k + 1)))
        t += loop.data_s
        if not unrecorded(k):
            tl.add_span(tl.name_id("forward"), t, t + loop.compute_s, 0)
        t += loop.compute_s
        tl.add_span(tl.name_id("step:optimizer"), t, t, -1)
    tl.meta["wall_s"] = t + 0.05
    _samples(tl, loop, gpus, counter, counter_at)
    return tl


def _samples(tl: Timeline, loop: Loop, gpus: int, counter: bool, counter_at: Any) -> None:
    joules, n = 0.0, int(tl.meta["wall_s"] / loop.tick_s)
    for k in range(n + 1):
        t = k * loop.tick_s
        busy = loop.busy_at(t - loop.tick_s / 2)  # what the tick ending at t held
        watts = loop.busy_w if busy else loop.idle_w
        joules += watts * loop.tick_s if k else 0.0
        for i in range(gpus):
            tl.add_sample(f"gpu{i}.power_w", t, watts)
            tl.add_sample(f"gpu{i}.util", t, 1.0 if busy else 0.0)
            if counter:
                tl.add_sample(f"gpu{i}.energy_j", t, counter_at(t, joules) if counter_at else joules)


def energy_of(tl: Timeline) -> Energy:
    energy = analyze([tl]).energy
    assert energy is not None
    return energy


def test_the_counter_gives_joules_per_step_and_per_sample() -> None:
    loop = Loop()
    e = energy_of(timeline(loop))
    assert e["source"] == "counter" and e["segments"] == 1
    assert e["gpus"] == [0] and e["gpus_basis"] == "processes"
    assert e["joules_per_step"] == pytest.approx(loop.step_j, rel=0.02)
    assert e["joules_per_sample"] == pytest.approx(loop.step_j / BATCH, rel=0.02)
    assert e["watts_mean"] == pytest.approx(loop.step_j / (loop.data_s + loop.compute_s), rel=0.02)
    assert e["price_per_gpu_hour"] is None and e["cost_per_hour"] is None  # no price, no money


def test_without_the_counter_power_is_integrated_and_said_so() -> None:
    loop = Loop()
    e = energy_of(timeline(loop, counter=False))
    assert e["source"] == "power_integral"
    assert e["joules_per_step"] == pytest.approx(loop.step_j, rel=0.02)


def test_a_counter_that_goes_back_starts_a_new_segment() -> None:
    loop = Loop()
    reset_at = 3.0  # the driver reloaded: the counter restarts from a small number

    def counter(t: float, joules: float) -> float:
        return joules if t < reset_at else joules - 900.0

    e = energy_of(timeline(loop, counter_at=counter))
    assert e["segments"] == 2 and e["source"] == "counter_and_power"
    assert e["joules_per_step"] == pytest.approx(loop.step_j, rel=0.02)


def test_a_stalled_counter_falls_back_to_power_for_that_stretch() -> None:
    loop = Loop()
    frozen = {}

    def counter(t: float, joules: float) -> float:
        if 2.0 <= t < 4.0:  # flat for 2 s while the GPU draws power
            return frozen.setdefault("at", joules)
        return joules - (frozen["gap"] if "gap" in frozen else _gap(frozen, t, joules))

    e = energy_of(timeline(loop, counter_at=counter))
    assert e["source"] == "counter_and_power" and e["segments"] == 1
    assert e["joules_per_step"] == pytest.approx(loop.step_j, rel=0.02)


def _gap(frozen: dict[str, float], t: float, joules: float) -> float:
    """After the stall the counter goes on from where it froze (what it missed is gone)."""
    if "at" not in frozen:
        return 0.0
    frozen["gap"] = joules - frozen["at"]
    return frozen["gap"]


def test_an_input_bound_loop_splits_its_joules_by_stage() -> None:
    loop = Loop()
    e = energy_of(timeline(loop))
    steady = loop.steps - 1  # the first step is warm-up
    data, forward = e["by_stage"]["data"], e["by_stage"]["forward"]
    assert data["basis"] == forward["basis"] == "measured" and e["by_stage_model"] is None
    assert data["joules"] == pytest.approx(loop.idle_w * loop.data_s * steady, rel=0.05)
    assert forward["joules"] == pytest.approx(loop.busy_w * loop.compute_s * steady, rel=0.05)
    assert e["idle_w"] == pytest.approx(loop.idle_w, rel=0.05)
    assert e["busy_w"] == pytest.approx(loop.busy_w, rel=0.05)
    # the GPU idles while the loop waits: its idle power over the waiting time
    assert e["idle_joules"] == pytest.approx(loop.idle_w * loop.data_s * steady, rel=0.05)


def test_stages_too_short_to_measure_are_modelled_and_add_up() -> None:
    loop = Loop(steps=400, data_s=0.006, compute_s=0.004, tick_s=0.1)  # ten steps a sample
    e = energy_of(timeline(loop))
    stages = e["by_stage"]
    assert {s["basis"] for s in stages.values()} == {"model"}
    assert e["by_stage_model"] in (POWER_MODEL, MEAN_POWER_MODEL)
    assert sum(s["joules"] for s in stages.values()) == pytest.approx(e["joules"], rel=1e-6)


def test_steps_outside_the_recording_windows_split_their_joules_as_the_windows_say() -> None:
    loop = Loop(steps=400, data_s=0.006, compute_s=0.004, tick_s=0.1)
    every_step = energy_of(timeline(loop))["by_stage"]
    windows = energy_of(timeline(loop, unrecorded=lambda k: k >= 50 and k % 50 < 45))["by_stage"]
    assert windows.keys() == every_step.keys() and {"data", "forward"} <= every_step.keys()
    for name, stage in every_step.items():
        assert windows[name]["joules"] == pytest.approx(stage["joules"], rel=0.03, abs=1e-6), name


def test_an_input_bound_gpu_gets_a_power_cap_that_keeps_the_step() -> None:
    loop = Loop()
    e = energy_of(timeline(loop))
    busy_share = loop.compute_s / (loop.data_s + loop.compute_s)
    expected = loop.idle_w + (loop.busy_w - loop.idle_w) * busy_share / 0.9
    assert e["power_cap_w"] == pytest.approx(expected, rel=0.1)
    assert e["power_cap_w"] < loop.busy_w


def test_the_price_gives_cost_per_hour_sample_and_epoch() -> None:
    loop = Loop()
    e = energy_of(timeline(loop, gpus=2, in_tree=(0, 1), price=2.5, dataset_len=50_000))
    samples_per_s = BATCH / (loop.data_s + loop.compute_s)
    assert e["cost_per_hour"] == pytest.approx(5.0)
    assert e["cost_per_sample"] == pytest.approx(5.0 / 3600 / samples_per_s, rel=0.02)
    assert e["cost_per_epoch"] == pytest.approx(5.0 / 3600 / samples_per_s * 50_000, rel=0.02)
    assert e["joules_per_step"] == pytest.approx(2 * loop.step_j, rel=0.02)  # both GPUs


def test_the_training_processes_pick_the_gpus_counted() -> None:
    e = energy_of(timeline(Loop(), gpus=2, in_tree=(1,)))
    assert e["gpus"] == [1] and e["gpus_basis"] == "processes"


def test_an_empty_process_list_falls_back_to_the_models_device_and_says_so() -> None:
    tl = timeline(Loop(), gpus=2, in_tree=(), model_device="cuda:1")
    a = analyze([tl])
    assert a.energy is not None and a.energy["gpus"] == [1] and a.energy["gpus_basis"] == "framework"
    assert any("energy counts GPU 1, the model's device" in w for w in a.warnings)


def test_without_process_or_device_every_gpu_is_counted_and_said() -> None:
    a = analyze([timeline(Loop(), gpus=2, in_tree=())])
    assert a.energy is not None and a.energy["gpus"] == [0, 1] and a.energy["gpus_basis"] == "all"
    assert any("energy counts every GPU (0, 1)" in w for w in a.warnings)


def test_no_gpu_samples_no_energy() -> None:
    tl = timeline(Loop())
    bare = Timeline(dict(tl.meta))
    assert analyze([bare]).energy is None


def test_nvmls_counter_sampled_on_the_fake_clock_gives_joules_per_step(
    fake_nvml: Any, fake_clock: FakeClock
) -> None:
    """The whole path: the fake driver's counter rises at its GPU's 250.12 W, the sampler reads it each
    tick while the loop runs 0.05 s steps; only GPU 0 runs this process."""
    fake_nvml(scenarios.two_gpus(), fake_clock)
    tl = Timeline({"pid": os.getpid(), "epoch": 1000.0, "framework": "torch"})
    origin = fake_clock.now()
    sampler = Sampler(
        tl, [NvmlSource(clock=fake_clock)], 0.01, lambda: fake_clock.now() - origin, timer=fake_clock
    )
    sampler.start()
    for _ in range(30):
        t = fake_clock.now() - origin
        tl.add_span(tl.name_id("forward"), t, t + 0.05, 0)
        fake_clock.advance(0.05)
        tl.add_span(tl.name_id("step:optimizer"), t + 0.05, t + 0.05, -1)
    sampler.stop()
    tl.meta["wall_s"] = fake_clock.now() - origin
    e = energy_of(tl)
    assert e["gpus"] == [0] and e["source"] == "counter"
    assert e["joules_per_step"] == pytest.approx(250.12 * 0.05, rel=0.02)


def test_the_reports_show_energy_and_cost_only_where_priced() -> None:
    loop = Loop()
    priced = report_from_timelines([timeline(loop, price=2.5, dataset_len=50_000)], source="live")
    text, page = str(priced), report_fragment(priced.to_dict())
    measured = priced.to_dict()["energy"]
    assert measured is not None and measured["joules_per_sample"] == pytest.approx(
        loop.step_j / BATCH, rel=0.02
    )
    per_sample = fmt_joules(measured["joules_per_sample"])
    assert f"energy/sample: {per_sample}" in text
    assert f"<span>energy/sample</span><b>{per_sample}</b>" in page
    assert "cost: 2.5 per hour (1 GPU × 2.5)" in text and "cost: 2.5 per hour" in page
    assert "nvidia-smi -i 0 -pl" in text  # input-bound: a power cap to try
    card = priced.to_dict()["advice"][0]
    assert card["metrics"]["saving_j_per_hour"] > 0 and card["metrics"]["saving_cost_per_hour"] > 0
    assert "per hour of training" in text
    unpriced = report_from_timelines([timeline(loop)], source="live")
    assert (
        "cost:" not in str(unpriced)
        and "saving_cost_per_hour" not in unpriced.to_dict()["advice"][0]["metrics"]
    )


def _sampler_of(tl: Timeline) -> Timeline:
    """A ``perfmagic run`` sampler's record of ``tl``'s GPUs: their samples and facts, no stages."""
    sampler = Timeline(dict(tl.meta))
    for metric in tl.metrics:
        if metric.startswith("gpu"):
            for t, v in zip(*tl.series(metric), strict=True):
                sampler.add_sample(metric, float(t), float(v))
    return sampler


def test_a_merged_job_sums_each_nodes_gpus() -> None:
    loop = Loop()
    staged = timeline(loop, price=2.0)
    nodes = [_sampler_of(staged), _sampler_of(staged)]
    bare = Timeline(dict(staged.meta))  # the training process: its stages and batches, no GPU samples
    for name, a, b, depth in zip(
        [staged.spans.names[i] for i in staged.spans.name_id],
        staged.spans.start,
        staged.spans.end,
        staged.spans.depth,
        strict=True,
    ):
        bare.add_span(bare.name_id(name), float(a), float(b), int(depth))
    for t, v in zip(*staged.series(THREAD_SAMPLES), strict=True):
        bare.add_sample(THREAD_SAMPLES, float(t), float(v))
    e = analyze([bare, *nodes]).energy
    assert e is not None and e["nodes"] == 2 and e["gpu_count"] == 2 and e["gpus"] == [0, 0]
    assert e["joules_per_step"] == pytest.approx(2 * loop.step_j, rel=0.02)
    assert e["by_stage"]["data"]["joules"] == pytest.approx(2 * loop.idle_w * loop.data_s * 19, rel=0.05)
    assert e["cost_per_hour"] == pytest.approx(4.0)
