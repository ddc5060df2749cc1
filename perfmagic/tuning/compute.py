"""Forward, backward and optimizer step tried with other settings, on copies of the user's model."""

from __future__ import annotations

import contextlib
import copy
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from perfmagic.contract import KnobResult, Trial
from perfmagic.tuning.result import knob_result

MIN_STEPS = 3
"""Steps in each turn of :func:`timed_in_turns`, however short the turn."""


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


def at_rest(optimizer: Any) -> Any:
    """``optimizer`` with a learning rate of 0 in every group, returned.

    Its step runs the same kernels, but the weights stay where the user's were. Trained for seconds on
    one captured batch towards an unbounded scalar (:func:`scalar_of`), the copies' weights reached inf
    and NaN within a few hundred steps, and steps on NaN weights timed faster or slower at random.
    A tensor learning rate (``capturable``, ``fused``) stays a tensor.
    """
    for group in getattr(optimizer, "param_groups", ()):
        lr = group.get("lr")
        group["lr"] = lr * 0 if hasattr(lr, "mul_") else 0.0
    return optimizer


class TrainingStep:
    """One training step on private copies of the model and optimizer, with a captured batch."""

    def __init__(
        self, model: Any, optimizer: Any | None, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        # copied together, the optimizer's parameter references point at the copied model's
        self.model, self.optimizer, self.args, self.kwargs = copy.deepcopy((model, optimizer, args, kwargs))
        self.model.train()
        at_rest(self.optimizer)

        self.around: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
        self.device = next((p.device for p in self.model.parameters()), None)

    def __call__(self) -> None:
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        with self.around():
            scalar_of(self.model(*self.args, **self.kwargs)).backward()
        if self.optimizer is not None:
            self.optimizer.step()
        if self.device is not None and self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)  # the step's time is the device's, not its launches'

    @property
    def samples(self) -> int | None:
        """The leading dimension of the batch's first tensor: the samples one step trains on."""
        import torch

        first = next((a for a in (*self.args, *self.kwargs.values()) if isinstance(a, torch.Tensor)), None)
        return int(first.shape[0]) if first is not None and first.dim() else None

    def variant(self, **changes: Any) -> TrainingStep:
        """A copy of this step with ``changes`` (``model``, ``args``, ``kwargs``, ``around``); the
        optimizer is rebuilt over the changed model's parameters."""
        other = copy.copy(self)
        for name, value in changes.items():
            setattr(other, name, value)
        if "model" in changes and self.optimizer is not None:
            other.optimizer = at_rest(
                type(self.optimizer)(other.model.parameters(), **self.optimizer.defaults)
            )
        return other

    def seconds(self, deadline: float) -> float:
        """Steady seconds per step by ``deadline``: one step to warm up, then steps until the deadline
        (at least one: a step slower than its share is still measured, once)."""
        self()
        start, steps = time.perf_counter(), 0
        while steps < 1 or time.perf_counter() < deadline:
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


def tune_threads(
    step: TrainingStep, budget_s: float, say: Callable[[str], None] = lambda what: None
) -> KnobResult | None:
    """``torch.set_num_threads`` tried on a CPU model: seconds per step for each count, the counts
    timed in turns (:func:`timed_in_turns`); ``say`` hears the counts as the try begins."""
    import torch

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    current = torch.get_num_threads()
    candidates = candidate_threads(current, cpus)
    notes: list[str] = ["timed with no DataLoader workers running beside it"]
    say(f"num_threads={', '.join(str(n) for n in candidates)}")
    try:
        turns = timed_in_turns(
            [_on_threads(step, n, torch) for n in candidates], time.perf_counter() + budget_s, notes
        )
    finally:
        torch.set_num_threads(current)
    timed = {n: t for n, t in zip(candidates, turns, strict=True) if t is not None}
    tried: list[Trial] = [{"value": n, "seconds": median_turn(t)} for n, t in timed.items()]
    baseline = next((t for t in tried if t["value"] == current), None)
    if baseline is None or len(tried) < 2:
        return None
    best = min(tried, key=lambda t: t["seconds"])
    result = knob_result("num_threads", "seconds per step", tried, baseline, best, notes)
    result["speedup"] = turn_speedup(timed[current], timed[best["value"]])
    return result


def _on_threads(step: TrainingStep, threads: int, torch: Any) -> Callable[[], None]:
    """``step`` run on ``threads`` intra-op threads (set each call: the counts take turns)."""

    def run() -> None:
        torch.set_num_threads(threads)
        step()

    return run


def _tensors_mapped(step: TrainingStep, fn: Callable[[Any], Any]) -> dict[str, Any]:
    import torch

    def each(v: Any) -> Any:
        return fn(v) if isinstance(v, torch.Tensor) else v

    return {"args": tuple(each(a) for a in step.args), "kwargs": {k: each(v) for k, v in step.kwargs.items()}}


def compute_variants(step: TrainingStep, autocast_seen: bool) -> dict[str, list[tuple[Any, TrainingStep]]]:
    """Per knob, the settings worth timing against the step as it is (value, step), in order.

    ``autocast``: bf16 (and fp16 on CUDA) where the loop ran without autocast; ``tf32``: on CUDA,
    where it is off; ``channels_last``: for a model with 2-D convolutions fed 4-D tensors;
    ``batch_size``: the batch twice over (compared per sample).
    """
    import torch

    device = step.device.type if step.device is not None else "cpu"
    knobs: dict[str, list[tuple[Any, TrainingStep]]] = {}
    if not autocast_seen and device in ("cuda", "cpu"):
        dtypes = [torch.bfloat16] + ([torch.float16] if device == "cuda" else [])
        knobs["autocast"] = [(None, step)] + [
            (str(d).replace("torch.", ""), step.variant(around=_autocast(device, d))) for d in dtypes
        ]
    if device == "cuda" and not torch.backends.cuda.matmul.allow_tf32:
        knobs["tf32"] = [(False, step), (True, step.variant(around=_tf32))]
    convs = any(isinstance(m, torch.nn.Conv2d) for m in step.model.modules())
    if convs and any(isinstance(a, torch.Tensor) and a.dim() == 4 for a in step.args):
        with contextlib.suppress(Exception):  # an optimizer that cannot be rebuilt from its defaults
            as_cl = copy.deepcopy(step.model).to(memory_format=torch.channels_last)
            changed = _tensors_mapped(
                step, lambda t: t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t
            )
            knobs["channels_last"] = [(False, step), (True, step.variant(model=as_cl, **changed))]
    size = step.samples
    if size:
        doubled = _tensors_mapped(step, lambda t: torch.cat([t, t]) if t.dim() and t.shape[0] == size else t)
        knobs["batch_size"] = [(size, step), (2 * size, step.variant(**doubled))]
    return knobs


def _autocast(device: str, dtype: Any) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    import torch

    return lambda: torch.autocast(device, dtype=dtype)


@contextlib.contextmanager
def _tf32() -> Iterator[None]:
    import torch

    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


_NOTES = {
    "autocast": "mixed precision changes the numerics: check the loss curve (fp16 also needs a GradScaler)",
    "tf32": "TF32 matmuls round inputs to 10 mantissa bits: check the loss curve",
    "channels_last": "model and 4-D inputs converted with .to(memory_format=torch.channels_last)",
    "batch_size": "seconds per sample: a larger batch changes the optimisation (learning rate, steps per epoch)",
}

PEAKS_NOTE = {
    "cuda": "peak_bytes: the allocator's peak over one more step of each after the timing, its peak "
    "counters reset for it (torch.cuda.reset_peak_memory_stats); tuning's copies of the model are in it",
    "cpu": "peak memory not measured on the CPU: the process's high-water mark is not one step's",
}


def step_peak_bytes(step: TrainingStep) -> int | None:
    """The CUDA allocator's most bytes in use over one run of ``step``, all the device held counted (the
    user's tensors, tuning's copies); None off CUDA, where no reading is one step's alone."""
    device = step.device
    if device is None or device.type != "cuda":
        return None
    import torch

    # the counter is the process's high-water mark: without the reset an earlier, larger peak hides this one
    torch.cuda.reset_peak_memory_stats(device.index)  # a parameter's device: always indexed
    step()
    return int(torch.cuda.memory_stats(device.index).get("allocated_bytes.all.peak") or 0)


def with_peaks(step: TrainingStep, tried: list[tuple[TrainingStep, Trial]], notes: list[str]) -> None:
    """Each trial's ``peak_bytes`` (its step run once more, on CUDA), and a note saying how they were read;
    a step that raises now (out of memory, say) is noted and keeps no peak."""
    notes.append(PEAKS_NOTE["cuda" if step.device is not None and step.device.type == "cuda" else "cpu"])
    for variant, trial in tried:
        try:
            peak = step_peak_bytes(variant)
        except Exception as e:
            notes.append(f"the peak of {trial['value']} was not read: the step raised {e!r}")
            continue
        if peak is not None:
            trial["peak_bytes"] = peak


def tune_compute(
    step: TrainingStep, budget_s: float, autocast_seen: bool, say: Callable[[str], None] = lambda what: None
) -> list[KnobResult]:
    """Each knob of :func:`compute_variants` timed within an equal share of the budget, its settings
    in turns (:func:`timed_in_turns`); ``say`` hears each knob as its try begins.

    A setting that raises (an op without a bf16 kernel, memory for the doubled batch) is noted and
    left out; the knob's other settings stand.
    """
    knobs = compute_variants(step, autocast_seen)
    results: list[KnobResult] = []
    end = time.perf_counter() + budget_s
    for k, (knob, settings) in enumerate(knobs.items()):
        unit = "seconds per sample" if knob == "batch_size" else "seconds per step"
        share = (end - time.perf_counter()) / (len(knobs) - k)
        if share <= 0:
            spent = "not tried: tuning's budget was spent before it"
            results.append({**knob_result(knob, unit, [], None, None, [spent]), "budget_s": 0.0})
            continue
        notes = [_NOTES[knob]]
        say(f"{knob}: {', '.join(str(value) for value, _ in settings)}")
        turns = timed_in_turns([variant for _, variant in settings], time.perf_counter() + share, notes)
        # each setting that ran: its turns and its samples per step (a step's, or 1: seconds per step)
        ran = [
            (value, variant, t, value if knob == "batch_size" else 1)
            for (value, variant), t in zip(settings, turns, strict=True)
            if t is not None
        ]
        timed: list[tuple[TrainingStep, Trial]] = [
            (variant, {"value": value, "seconds": median_turn(t) / n}) for value, variant, t, n in ran
        ]
        tried = [trial for _, trial in timed]
        if knob == "batch_size":
            with_peaks(step, timed, notes)
        baseline = tried[0] if turns[0] is not None else None
        best = min(tried, key=lambda t: t["seconds"]) if baseline is not None and len(tried) > 1 else None
        result: KnobResult = {**knob_result(knob, unit, tried, baseline, best, notes), "budget_s": share}
        if best is not None:
            (_, _, base_turns, base_n), (_, _, best_turns, best_n) = ran[0], ran[tried.index(best)]
            result["speedup"] = turn_speedup(base_turns, best_turns, best_n / base_n)
        if knob == "batch_size" and step.device is not None:
            result["device"] = str(step.device)  # as the memory probe names it: "cuda:0", "cpu"
        results.append(result)
    return results


TURNS = 3
"""Turns each setting should get: one slow moment of the machine spoils one turn, not a setting."""

TURN_S = 0.1
"""The shortest turn: several of the scheduler's periods on a busy machine, so that every turn holds
the setting's fair share of the CPUs. In turns of a few short steps the median turn is one nobody
preempted: a single thread beside two busy processes on 2 CPUs timed 12 ms a step that way, 17 ms
over a run, and tuning promised twice what it gave."""


def timed_in_turns(
    steps: Sequence[Callable[[], None]], deadline: float, notes: list[str]
) -> list[list[float] | None]:
    """Seconds per step of each step in each turn, timed in turns (A, B, A, B, ...) until ``deadline``
    (one turn at least; fewer than :data:`TURNS` is noted).

    Timed one after the other, a setting would carry whatever else the machine did meanwhile; in
    turns, drift falls on all alike. A step that raises is noted and gets ``None``.
    """
    per_turn: list[list[float] | None] = [[] for _ in steps]
    for i, s in enumerate(steps):  # warm-up: first-call costs (allocations, lazy state)
        try:
            s()
        except Exception as e:
            notes.append(f"setting {i + 1}: the step raised {e!r}")
            per_turn[i] = None
    turns = 0
    while turns < 1 or time.perf_counter() < deadline:
        for s, times in zip(steps, per_turn, strict=True):
            if times is None:
                continue
            begin, n = time.perf_counter(), 0
            while n < MIN_STEPS or time.perf_counter() - begin < TURN_S:
                s()
                n += 1
            times.append((time.perf_counter() - begin) / n)
        turns += 1
    if turns < TURNS:
        notes.append(f"only {turns} turn{'s' if turns > 1 else ''} in the budget: one slow moment would show")
    return per_turn


def median_turn(seconds: list[float]) -> float:
    """A setting's seconds per step: its median turn."""
    return sorted(seconds)[len(seconds) // 2]


def turn_speedup(baseline: list[float], best: list[float], samples: float = 1.0) -> float:
    """How much faster ``best`` is than ``baseline``: the median over turns of their ratio in the same
    turn, timed next to each other (``samples``: the best's samples per step to the baseline's).

    The ratio of the two settings' median turns could take them from moments apart: on a busy
    machine a neighbour's burst in one and not the other moved the promise by half."""
    ratios = sorted(samples * b / s if s > 0 else math.inf for b, s in zip(baseline, best, strict=True))
    return ratios[len(ratios) // 2]
