"""Forward, backward and optimizer step tried with other settings, on copies of the user's model."""

from __future__ import annotations

import copy
import os
import time
from typing import Any

from perfmagic.tuning.result import knob_result

MIN_STEPS = 3
"""Steps timed per setting, after one to warm up."""


def scalar_of(output: Any) -> Any:
    """A scalar to run backward from: the output's ``loss`` where the model computes one (Hugging Face),
    else the mean of its first tensor. The backward pass is the model's; the loss function's cost is not."""
    import torch

    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss
    if isinstance(output, torch.Tensor):
        return output.float().mean()
    values = (
        output.values() if isinstance(output, dict) else output if isinstance(output, (list, tuple)) else ()
    )
    for value in values:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.float().mean()
    raise TypeError(f"no tensor to run backward from in the model's output ({type(output).__name__})")


class TrainingStep:
    """One training step on private copies of the model and optimizer, with a captured batch."""

    def __init__(
        self, model: Any, optimizer: Any | None, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        # copied together, the optimizer's parameter references point at the copied model's
        self.model, self.optimizer, self.args, self.kwargs = copy.deepcopy((model, optimizer, args, kwargs))
        self.model.train()

    def __call__(self) -> None:
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        scalar_of(self.model(*self.args, **self.kwargs)).backward()
        if self.optimizer is not None:
            self.optimizer.step()

    def seconds(self, deadline: float) -> float:
        """Steady seconds per step by ``deadline`` (at least :data:`MIN_STEPS` timed)."""
        self()
        start, steps = time.perf_counter(), 0
        while steps < MIN_STEPS or time.perf_counter() < deadline:
            self()
            steps += 1
        return (time.perf_counter() - start) / steps


def candidate_threads(current: int, cpus: int) -> list[int]:
    values = {current, cpus}
    n = 1
    while n < cpus:
        values.add(n)
        n *= 2
    return sorted(values)


def tune_threads(step: TrainingStep, budget_s: float) -> dict[str, Any] | None:
    """``torch.set_num_threads`` tried on a CPU model: seconds per step for each count."""
    import torch

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    current = torch.get_num_threads()
    candidates = candidate_threads(current, cpus)
    end = time.perf_counter() + budget_s
    tried: list[dict[str, Any]] = []
    notes: list[str] = ["timed with no DataLoader workers running beside it"]
    try:
        for k, threads in enumerate(candidates):
            left = end - time.perf_counter()
            if left <= 0:
                notes.append(f"budget spent before {threads} threads were tried")
                break
            torch.set_num_threads(threads)
            tried.append(
                {
                    "value": threads,
                    "seconds": step.seconds(time.perf_counter() + left / (len(candidates) - k)),
                }
            )
    finally:
        torch.set_num_threads(current)
    baseline = next((t for t in tried if t["value"] == current), None)
    if baseline is None or len(tried) < 2:
        return None
    best = min(tried, key=lambda t: t["seconds"])
    return knob_result("num_threads", "seconds per step", tried, baseline, best, notes)
