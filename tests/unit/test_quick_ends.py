"""Step ends the optimizer's wrapper only notes (``collect.quick_ends``): the recorder writes them
later, together, and the timeline must be the one that marking each end at once writes."""

from __future__ import annotations

import gc
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fakeclock import FakeClock
from torch.utils.data import DataLoader, TensorDataset

import perfmagic
from perfmagic.collect import schedule
from perfmagic.collect.recorder import StageRecorder
from perfmagic.schema import RECORDING, THREAD_CPU, THREAD_GC, THREAD_WAIT

STEP_S = 1 / 1024
"""A fast step on the fake clock: the thread clock is read at every 11th step end or so."""


class CallsSuper(torch.optim.SGD):
    """An optimizer whose ``step`` calls its base class's: both classes' steps are wrapped."""

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        return super().step() if closure is None else super().step(closure)


def random_loop(seed: int, clock: FakeClock, outdir: Path) -> tuple[perfmagic.Session, int]:
    """A loop whose steps end by the optimizer, with now and then what must not move their ends: a
    second optimizer continuing the step, a closure, a user stage, a checkpoint, a collection of 2 ms,
    a DataLoader pass. Returns the session and the optimizer steps taken."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model, critic = torch.nn.Linear(4, 2), torch.nn.Linear(4, 1)
    loader = DataLoader(TensorDataset(torch.randn(24, 4)), batch_size=8)

    collecting = [False]  # the loop's own collections take 2 ms; those Python starts take none

    def slow_collection(phase: str, _: dict[str, Any]) -> None:
        if phase == "start" and collecting[0]:
            clock.advance(0.002)

    steps = 0
    with perfmagic.profile(outdir=outdir, interval=3600, clock=clock, sample=False) as session:
        gc.callbacks.append(slow_collection)  # after the thread clock's, which times the collection
        try:
            optimizer = CallsSuper(model.parameters(), lr=0.01)
            second = torch.optim.SGD(critic.parameters(), lr=0.01)
            for _ in range(700):
                clock.advance(STEP_S * rng.choice((0.5, 1.0, 3.0)))
                model(torch.randn(8, 4)).sum().backward()
                r = rng.random()
                if r < 0.03:
                    optimizer.step(lambda: None)  # a closure
                else:
                    optimizer.step()
                steps += 1
                clock.advance(STEP_S / 8)
                if 0.03 <= r < 0.08:  # continues the step: the end just noted is dropped
                    critic(torch.randn(2, 4)).sum().backward()
                    second.step()
                    steps += 1
                elif 0.08 <= r < 0.13:
                    with perfmagic.stage("work"):
                        clock.advance(STEP_S / 4)
                elif 0.13 <= r < 0.16:
                    torch.save({"w": model.weight}, outdir / "ckpt.pt")
                elif 0.16 <= r < 0.20:
                    collecting[0] = True
                    gc.collect()
                    collecting[0] = False
                elif 0.20 <= r < 0.22:
                    for _ in loader:
                        clock.advance(STEP_S / 4)
        finally:
            gc.callbacks.remove(slow_collection)
    return session, steps


@pytest.fixture
def short_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows of 3 steps in 30 after the first 20 steps: the loop goes in and out of them often."""
    for name, value in (("FULL_STEPS", 20), ("FULL_SECONDS", 0.0), ("WINDOW", 3), ("PERIOD", 30)):
        monkeypatch.setattr(schedule, name, value)
    monkeypatch.setattr(schedule, "LONGEST_PERIOD", 30)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.usefixtures("short_windows")
def test_ends_noted_and_written_later_make_the_timeline_of_ends_marked_at_once(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    noted: list[int] = []
    settle = StageRecorder.settle_quick_ends

    def counted(self: StageRecorder, *, at_step_end: bool = False) -> None:
        noted.append(len(self.quick.times))
        settle(self, at_step_end=at_step_end)

    monkeypatch.setattr(StageRecorder, "settle_quick_ends", counted)
    quick, quick_steps = random_loop(seed, FakeClock(), tmp_path / "quick")
    with monkeypatch.context() as m:

        def never(self: StageRecorder, owner: object) -> None:
            self.quick.owner = None  # every step end marked at once

        m.setattr(StageRecorder, "allow_quick_ends", never)
        marked, marked_steps = random_loop(seed, FakeClock(), tmp_path / "marked")

    # most step ends outside the windows were noted: the test is not of the marked path twice
    assert sum(noted) > 300 and max(noted) > 5
    assert quick_steps == marked_steps
    a, b = quick.timeline.spans, marked.timeline.spans
    assert [a.names[i] for i in a.name_id] == [b.names[i] for i in b.name_id]
    for column in ("start", "end", "depth"):
        np.testing.assert_array_equal(getattr(a, column), getattr(b, column), err_msg=column)
    for metric in (THREAD_CPU, THREAD_WAIT, THREAD_GC, RECORDING):
        for x, y in zip(quick.timeline.series(metric), marked.timeline.series(metric), strict=True):
            np.testing.assert_array_equal(x, y, err_msg=metric)
    assert quick.report.steps == marked.report.steps
    assert quick.report.to_dict()["stages"] == marked.report.to_dict()["stages"]
    (stats,) = quick.timeline.marks("torch_stats")
    assert stats.data["optimizer_steps"] == quick_steps
