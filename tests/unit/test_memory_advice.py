"""Where the memory goes: the section's arithmetic, the card the largest part picks, what it frees, and
the bars the reports draw."""

from __future__ import annotations

import dataclasses
import io
from typing import Any

from analysis_builder import CUDA_TORCH, MODEL, GiB, gpu_static, memory_meta, plain, timeline, with_memory
from report_checks import assert_consistent

from perfmagic.advise import advise
from perfmagic.analyze import Analysis
from perfmagic.analyze.memory import memory_section
from perfmagic.report import report_from_timelines

H100 = {
    "index": 0,
    "name": "NVIDIA H100 80GB HBM3",
    "mem_total_bytes": 80 * GiB,
    "mem_used_peak_bytes": 79 * GiB,
    "mem_used_peak_fraction": 0.99,
    "allocator": None,
}


def gpu_run(**memory: Any) -> Analysis:
    a = plain(model={**MODEL, "device": "cuda:0"}, devices=[H100], torch=CUDA_TORCH)
    return with_memory(a, **memory)


def test_the_section_splits_the_peak_and_estimates_the_largest_batch() -> None:
    meta: Any = memory_meta(peak=30 * GiB, reserved=32 * GiB)
    section = memory_section(meta, [])
    assert section is not None
    (d,) = section["devices"]
    assert d["other_bytes"] == 2 * GiB  # the peak less parameters, gradients, state and activations
    assert d["fragmentation_bytes"] == 2 * GiB  # reserved but unused at the peak
    assert d["largest"] == "activations" and abs(d["largest_fraction"] - 20 / 32) < 1e-9  # type: ignore[operator]
    assert d["peak_fraction"] == 32 / 80
    assert d["activation_bytes_per_sample"] == 20 * GiB / 32
    # 80 GiB less what does not grow with the batch (32 - 20), at 0.625 GiB a sample
    assert d["largest_batch"] == 108


def test_activations_at_the_limit_get_checkpointing_of_the_blocks_and_no_contradiction() -> None:
    a = gpu_run(total=31 * GiB)
    cards = {c.id: c for c in advise(a).cards}
    card = cards["activation_memory"]
    assert "gpu_memory_pressure" not in cards  # NVML's 99% is the same problem: one card says it
    assert not {"optimizer_memory", "weight_memory", "allocator_fragmentation"} & set(cards)
    assert "for block in net.layers:" in card.fix and "use_reentrant=False" in card.fix
    assert card.metrics["freed_bytes"] == 4 * (5 * GiB - GiB // 2)  # saved inside, less the inputs kept
    assert abs(card.metrics["step_cost_s"] - 0.004) < 1e-12  # the blocks' forward, run again
    assert "batch_size=16" in card.fix and "effective batch stays 32" in card.fix
    assert "an estimate" in card.evidence
    assert_consistent({"advice": [card.to_dict()]})


def test_a_hugging_face_model_is_told_its_own_switch() -> None:
    card = next(c for c in advise(gpu_run(total=31 * GiB, hf_checkpointing=True)).cards)
    assert card.id == "activation_memory" and card.fix.startswith("net.gradient_checkpointing_enable()")


def test_blocks_that_free_little_leave_the_smaller_batch_with_accumulation() -> None:
    blocks = [
        {"path": f"layers[{i}]", "activations_bytes": GiB, "input_bytes": GiB, "forward_s": 0.001}
        for i in range(4)
    ]
    card = next(
        c for c in advise(gpu_run(total=31 * GiB, blocks=blocks)).cards if c.id == "activation_memory"
    )
    assert "checkpoint" not in card.fix and "batch_size=16" in card.fix
    assert card.metrics["freed_bytes"] == 10 * GiB


def test_memory_cards_wait_for_pressure_or_a_batch_size_question() -> None:
    roomy = gpu_run(total=80 * GiB)
    assert not [c for c in advise(roomy).cards if c.id.endswith("_memory")]
    asked = dataclasses.replace(
        roomy,
        tuning=[{"knob": "batch_size", "best": {"value": 64, "seconds": 0.001}}],  # type: ignore[list-item]
    )
    card = next(c for c in advise(asked).cards if c.id == "activation_memory")
    assert card.metrics["largest_batch"] is not None and "would fit (an estimate" in card.evidence


def test_the_optimizer_card_names_the_users_optimizer() -> None:
    card = next(c for c in advise(gpu_run(state=20 * GiB, acts=4 * GiB, total=31 * GiB)).cards)
    assert card.id == "optimizer_memory"
    # the same parameter groups: every lr, beta and weight decay the user set, whatever the call
    assert "opt = bnb.optim.AdamW8bit(opt.param_groups)" in card.fix
    assert card.metrics["freed_bytes"] == 15 * GiB  # three quarters of 32-bit moments
    momentum = gpu_run(state=20 * GiB, acts=4 * GiB, total=31 * GiB, optimizer="SGD")
    (sharded,) = [c for c in advise(momentum).cards if c.id == "optimizer_memory"]
    assert "opt = ZeroRedundancyOptimizer(opt.param_groups, optimizer_class=torch.optim.SGD)" in sharded.fix
    assert "bnb" not in sharded.fix and sharded.metrics["freed_bytes"] == 10 * GiB


def test_the_report_draws_a_bar_per_device() -> None:
    from perfmagic.render.memory import memory_bars
    from perfmagic.render.png import charts_png

    tl = timeline(devices=[gpu_static()], torch=CUDA_TORCH)
    tl.meta["memory"] = memory_meta(peak=30 * GiB, reserved=32 * GiB)  # type: ignore[typeddict-item]
    report = report_from_timelines([tl])
    data = report.to_dict()
    (bar,) = memory_bars(data)
    assert [c for c, _ in bar.parts] == [
        "parameters",
        "gradients",
        "optimizer_state",
        "activations",
        "other",
        "fragmentation",
    ]
    assert bar.total == 32 * GiB
    assert "Memory on step 3" in str(report) and "peak 30.0 GiB" in str(report)
    assert "Where the memory goes" in report._repr_mimebundle_()["text/html"]
    from PIL import Image

    png = charts_png(data)
    assert png is not None and Image.open(io.BytesIO(png)).height > 290  # the strip below the waterfall


def test_memory_cards_enter_the_plan_with_the_bytes_they_free_and_the_step_they_cost() -> None:
    a = gpu_run(total=31 * GiB)
    advice = advise(a)
    assert advice.plan is not None
    (change,) = [c for c in advice.plan.changes if c.id == "activation_memory"]
    card = next(c for c in advice.cards if c.id == "activation_memory")
    assert change.freed_bytes == card.metrics["freed_bytes"] and card.saving_s is None
    assert change.saving_s == -card.metrics["step_cost_s"]  # checkpointing runs the blocks' forward again
    time_saved = sum(c.saving_s for c in advice.plan.changes if c.freed_bytes is None)
    # the predicted step: the time fixes' savings taken off, the checkpointing's cost put on
    expected = advice.plan.step_s - time_saved + card.metrics["step_cost_s"]
    assert abs(advice.plan.predicted_step_s - expected) < 1e-12
    from perfmagic.render.wording import plan_line
    from perfmagic.report import plan_section

    plan = plan_section(advice.plan)
    line = plan_line({"plan": plan})  # type: ignore[typeddict-item]
    assert line is not None and "the memory changes free 18.0 GiB and cost 4.0 ms per step" in line
    assert_consistent({"advice": [c.to_dict() for c in advice.cards], "plan": plan})
