"""The largest batch that fits, checked by tuning's doubled batch: the peaks tuning reads on the
(simulated) CUDA allocator, and the estimate they confirm or replace."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from analysis_builder import CUDA_TORCH, GiB, gpu_static, memory_meta, plain, timeline
from report_checks import assert_consistent
from sim_cuda import SimCuda, install

from perfmagic.advise.memory import activation_memory
from perfmagic.analyze.memory import memory_section
from perfmagic.contract import KnobResult
from perfmagic.report import report_from_timelines
from perfmagic.tuning.compute import TrainingStep, with_peaks

PER_SAMPLE = 3 * 2**20
"""What the simulated model's forward holds on the device per sample until its backward."""


def doubled(single: int, twice: int, device: str = "cuda:0", batch: int = 32) -> KnobResult:
    """Tuning's ``batch_size`` result with these peaks for the batch and twice it."""
    base = {"value": batch, "seconds": 1e-3, "peak_bytes": single}
    return {
        "knob": "batch_size",
        "unit": "seconds per sample",
        "baseline": base,  # type: ignore[typeddict-item]
        "tried": [base, {"value": 2 * batch, "seconds": 8e-4, "peak_bytes": twice}],  # type: ignore[list-item]
        "best": {"value": 2 * batch, "seconds": 8e-4},
        "speedup": 1.25,
        "notes": [],
        "device": device,
    }


def device_of(tuned: KnobResult | None) -> Any:
    # 2 + 2 + 4 GiB that stay and 20 GiB of activations for 32 samples: a 28 GiB peak of 80 GiB
    section = memory_section(memory_meta(), [], None, [tuned] if tuned else [])  # type: ignore[arg-type]
    assert section is not None
    return section["devices"][0]


def test_a_doubled_batch_that_peaks_as_predicted_confirms_the_estimate() -> None:
    d = device_of(doubled(40 * GiB, 60 * GiB + GiB // 2))  # rose 20.5 GiB; the estimate says 20
    check = d["batch_check"]
    assert check["measured_peak_bytes"] == 48 * GiB + GiB // 2 and check["predicted_peak_bytes"] == 48 * GiB
    assert check["agrees"]
    assert d["largest_batch"] == 32 + 83  # 52 GiB free at 0.625 GiB a sample, as without the check


def test_a_doubled_batch_that_grows_otherwise_puts_its_measured_growth_in_the_estimate() -> None:
    d = device_of(doubled(40 * GiB, 70 * GiB))  # rose 30 GiB: 0.9375 GiB a sample, not 0.625
    check = d["batch_check"]
    assert not check["agrees"] and check["measured_peak_bytes"] == 58 * GiB
    assert d["largest_batch"] == 32 + 55  # 52 GiB free at 0.9375 GiB a sample


def test_peaks_read_on_another_device_or_not_at_all_check_nothing() -> None:
    plain_estimate = device_of(None)["largest_batch"]
    assert device_of(doubled(40 * GiB, 70 * GiB, device="cpu"))["batch_check"] is None
    unread = doubled(40 * GiB, 70 * GiB)
    del unread["tried"][1]["peak_bytes"]
    d = device_of(unread)
    assert d["batch_check"] is None and d["largest_batch"] == plain_estimate


def card_evidence(tuned: KnobResult) -> str:
    a = plain(model={"device": "cuda:0"})
    section = memory_section(memory_meta(), [], None, [tuned])  # type: ignore[arg-type]
    card = activation_memory(dataclasses.replace(a, memory=section, tuning=[tuned]))
    assert card is not None
    assert_consistent({"advice": [card.to_dict()]})
    return card.evidence


def test_the_card_says_how_the_doubled_batch_checked_the_estimate() -> None:
    agreed = card_evidence(doubled(40 * GiB, 60 * GiB + GiB // 2))
    assert "A batch of about 115 would fit (an estimate" in agreed
    assert "checked: the doubled batch (64) peaked at 48.5 GiB, the estimate said 48.0 GiB" in agreed
    off = card_evidence(doubled(40 * GiB, 70 * GiB))
    assert "A batch of about 87 would fit (an estimate at the measured growth of 960.0 MiB per sample" in off
    assert "peaked at 58.0 GiB, the estimate said 48.0 GiB" in off and "takes the measured growth" in off


def test_the_report_carries_the_check_from_the_recorded_tuning() -> None:
    tl = timeline(devices=[gpu_static()], torch=CUDA_TORCH)
    tl.meta["memory"] = memory_meta()  # type: ignore[typeddict-item]
    tl.meta["tuning"] = [doubled(40 * GiB, 70 * GiB)]
    (d,) = report_from_timelines([tl]).to_dict()["memory"]["devices"]
    assert d["batch_check"]["doubled_peak_bytes"] == 70 * GiB and not d["batch_check"]["agrees"]
    assert d["largest_batch"] == 87


class HoldsPerSample(torch.nn.Module):
    """A linear layer whose forward holds ``PER_SAMPLE`` bytes a sample on the simulated allocator until
    the gradient reaches it in backward, as saved activations do."""

    sim: SimCuda  # a class attribute: the copies tuning makes share the one device

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        held = x.shape[0] * PER_SAMPLE
        self.sim.alloc(held)
        y = self.linear(x)
        y.register_hook(lambda grad: self.sim.free(held))
        return y


def test_tuning_reads_each_batchs_peak_on_the_cuda_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = install(monkeypatch, SimCuda())
    HoldsPerSample.sim = sim
    sim.alloc(50 * PER_SAMPLE)  # the user's training peaked higher before tuning: its counter stays up
    sim.free(50 * PER_SAMPLE)
    model = HoldsPerSample()
    step = TrainingStep(model, torch.optim.SGD(model.parameters(), lr=0.1), (torch.randn(8, 4),), {})
    step.device = torch.device("cuda", 0)  # the tensors are the CPU's; the allocator is the simulated one
    twice = step.variant(args=(torch.randn(16, 4),))
    trials: list[Any] = [{"value": 8, "seconds": 1.0}, {"value": 16, "seconds": 1.0}]
    notes: list[str] = []
    with_peaks(step, [(step, trials[0]), (twice, trials[1])], notes)
    assert [t["peak_bytes"] for t in trials] == [8 * PER_SAMPLE, 16 * PER_SAMPLE]
    assert "reset_peak_memory_stats" in notes[0]


def test_on_the_cpu_no_peak_is_said() -> None:
    model = torch.nn.Linear(4, 4)
    step = TrainingStep(model, None, (torch.randn(8, 4),), {})
    trial: Any = {"value": 8, "seconds": 1.0}
    notes: list[str] = []
    with_peaks(step, [(step, trial)], notes)
    assert "peak_bytes" not in trial and "not measured on the CPU" in notes[0]
