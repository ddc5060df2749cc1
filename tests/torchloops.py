"""Small CPU training loops that time their own stages, to check perfmagic's figures against.

Each stage under test is made slow on purpose (a sleep in the right place), so it is a large,
deterministic share of the step even on a loaded machine; every step also spends
``UNTRACKED_S`` outside any stage, which perfmagic must call ``other``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from perfmagic import Report

UNTRACKED_S = 0.01
TOLERANCE = 0.05  # the bound: 5 percentage points of step time


class Stopwatch:
    """Adds up the ``perf_counter`` time of the blocks it times, and keeps each block's."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self.count = 0
        self.times_s: list[float] = []

    @contextmanager
    def __call__(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.total_s += elapsed
            self.count += 1
            self.times_s.append(elapsed)


class SleepyDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``n`` samples of 8 features; each ``__getitem__`` sleeps ``delay_s`` then applies ``transform``."""

    def __init__(self, n: int, delay_s: float = 0.0, transform: Callable[[torch.Tensor], Any] | None = None):
        self.n = n
        self.delay_s = delay_s
        self.transform = transform

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.delay_s)
        x = torch.full((8,), float(i))
        if self.transform is not None:
            x = self.transform(x)
        return x, torch.ones(1)


class _SlowBackward(torch.autograd.Function):
    """Identity whose backward sleeps: backward time the loop can predict."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, delay_s: float) -> torch.Tensor:
        ctx.delay_s = delay_s
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(ctx.delay_s)
        return grad, None


class SleepyNet(torch.nn.Module):
    """Two linear layers (a module inside a module); forward and backward sleep as asked."""

    def __init__(
        self, forward_s: float = 0.0, backward_s: float = 0.0, hook: Callable[[], None] | None = None
    ):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        self.forward_s = forward_s
        self.backward_s = backward_s
        self.hook = hook

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.forward_s)
        if self.hook is not None:
            self.hook()
        y = self.body(x)
        return _SlowBackward.apply(y, self.backward_s) if self.backward_s else y


class SleepySGD(torch.optim.SGD):
    """SGD whose step sleeps first, then calls ``super().step()`` (a step inside a step)."""

    def __init__(self, params: Any, step_s: float = 0.0) -> None:
        super().__init__(params, lr=0.01)
        self.step_s = step_s

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        time.sleep(self.step_s)
        return super().step(closure)


@dataclass
class Timings:
    """What a loop measured of itself."""

    steps: int = 0
    data: Stopwatch = field(default_factory=Stopwatch)
    untracked: Stopwatch = field(default_factory=Stopwatch)
    forward: Stopwatch = field(default_factory=Stopwatch)
    backward: Stopwatch = field(default_factory=Stopwatch)
    optimizer: Stopwatch = field(default_factory=Stopwatch)
    extra: Stopwatch = field(default_factory=Stopwatch)
    step_s: list[float] = field(default_factory=list)

    @property
    def other_s(self) -> float:
        """The loop's steps outside its named stages: the untracked sleep and the gaps between its own
        timers (which a busy machine widens: a preemption there is in no stopwatch)."""
        named = (self.data, self.forward, self.backward, self.optimizer, self.extra)
        return sum(self.step_s) - sum(w.total_s for w in named)


def train(
    steps: int = 15,
    *,
    data_s: float = 0.0,
    forward_s: float = 0.0,
    backward_s: float = 0.0,
    optimizer_s: float = 0.0,
    model: torch.nn.Module | None = None,
    dataset: Dataset[Any] | None = None,
    extra: Callable[[int], None] | None = None,
) -> Timings:
    """Train ``steps`` steps (one batch of 1 each), timing every stage the way a user would.

    ``extra(step)`` runs inside each step, between backward and the optimizer (so that perfmagic's
    steps, which end at the optimizer step, hold all of it), and is timed as ``extra``.
    """
    model = model if model is not None else SleepyNet(forward_s, backward_s)
    loss_fn = torch.nn.MSELoss()
    opt = SleepySGD(model.parameters(), optimizer_s)
    loader = DataLoader(dataset if dataset is not None else SleepyDataset(steps, data_s), batch_size=1)
    t = Timings()
    it = iter(loader)
    for i in range(steps):
        begin = time.perf_counter()
        with t.data():
            x, y = next(it)
        with t.untracked():
            time.sleep(UNTRACKED_S)
        with t.forward():
            loss = loss_fn(model(x), y)
        with t.backward():
            loss.backward()
        if extra is not None:
            with t.extra():
                extra(i)
        with t.optimizer():
            opt.step()
            opt.zero_grad()
        t.step_s.append(time.perf_counter() - begin)
        t.steps += 1
    return t


def stage_total_s(report: Report, stage: str) -> float:
    """perfmagic's seconds in ``stage`` over every step (the report's stage figures leave out the warm-up)."""
    return float(sum(report["step_table"]["stages"].get(stage, ())))


def step_total_s(report: Report) -> float:
    """perfmagic's total step time over every step: the sum of all stages, ``other`` included."""
    return sum(stage_total_s(report, name) for name in report["step_table"]["stages"])


def assert_stage_matches(report: Report, stage: str, measured_s: float, *, min_share: float = 0.15) -> None:
    """perfmagic's total for ``stage`` is the loop's own figure within 5 points of step time.

    ``min_share`` guards the test itself: a stage that is a sliver of the step would pass anyway.
    """
    total = step_total_s(report)
    got = stage_total_s(report, stage)
    assert measured_s >= min_share * total, (
        f"test loop too weak: {stage} is {measured_s / total:.0%} of step time"
    )
    assert abs(got - measured_s) <= TOLERANCE * total, (
        f"{stage}: perfmagic {got / total:.1%} of step time, the loop measured {measured_s / total:.1%}; "
        f"stages: { {k: round(v['fraction'], 3) for k, v in report.stages.items()} }"
    )


def assert_other_matches(report: Report, t: Timings, *, also_untracked_s: float = 0.0) -> None:
    """perfmagic's ``other`` holds the loop's untracked time, and about the loop's own ``other``.

    The untracked sleep is in no hook, so ``other`` holds at least it (less the 5-point tolerance).
    Above that the bound is 10 points: the loop's stopwatches also hold the Python between the
    calls perfmagic hooks (torch's optimizer wrapper around its step, the loss call's
    glue), which perfmagic rightly counts as ``other`` and a busy machine stretches many times over.
    A stage's time lost to ``other`` still fails: its own ``assert_stage_matches`` catches it.
    """
    total = step_total_s(report)
    got = stage_total_s(report, "other")
    untracked = t.untracked.total_s + also_untracked_s
    loop_other = t.other_s + also_untracked_s
    shares = {k: round(v["fraction"], 3) for k, v in report.stages.items()}
    assert got >= untracked - TOLERANCE * total, (
        f"other: perfmagic {got / total:.1%} of step time, less than the loop's untracked "
        f"{untracked / total:.1%}; stages: {shares}"
    )
    assert abs(got - loop_other) <= 2 * TOLERANCE * total, (
        f"other: perfmagic {got / total:.1%} of step time, the loop measured {loop_other / total:.1%}; "
        f"stages: {shares}"
    )


def assert_steps_match(report: Report, t: Timings) -> None:
    """Same number of steps; the same total step time within 5% and median within 10%.

    perfmagic's steps end at the optimizer step and the loop's after ``zero_grad``: the same
    work split a little differently, so single steps (and on a loaded machine, the median)
    differ more than the total.
    """
    assert report.steps["count"] == t.steps
    loop_total, loop_median = sum(t.step_s), statistics.median(t.step_s)
    assert abs(step_total_s(report) - loop_total) <= TOLERANCE * loop_total, (
        step_total_s(report),
        loop_total,
    )
    assert abs(report.steps["median_s"] - loop_median) <= 2 * TOLERANCE * loop_median, (
        report.steps["median_s"],
        loop_median,
    )


class SlowPickle:
    """An object that takes ``delay_s`` to pickle: slow work inside ``torch.save`` or a collective."""

    def __init__(self, delay_s: float = 0.01) -> None:
        self.delay_s = delay_s

    def __reduce__(self) -> tuple[Any, ...]:
        time.sleep(self.delay_s)
        return (SlowPickle, (self.delay_s,))


class SlowStream:
    """A text stream whose every write takes ``delay_s`` (a slow terminal or notebook pipe)."""

    def __init__(self, delay_s: float = 0.002) -> None:
        self.delay_s = delay_s
        self.text: list[str] = []

    def write(self, s: str) -> int:
        time.sleep(self.delay_s)
        self.text.append(s)
        return len(s)

    def flush(self) -> None:
        pass
