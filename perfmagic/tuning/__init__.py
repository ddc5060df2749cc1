"""Tuning: the candidate fixes tried on the user's own loader and model, and their measured effect.

After the profiled window (never inside the user's steps) and within a time budget,
``tune`` rebuilds the user's DataLoader with other worker counts and times one training step
on copies of the model and optimizer with other thread counts, autocast dtypes, TF32, channels_last
and a doubled batch. The user's objects, random
streams and thread count are left exactly as they were (:func:`perfmagic.tuning.guard.untouched`).

Each result is one knob, as the report's ``tuning`` key holds it: ``{knob, unit, baseline:
{value, seconds}, tried: [{value, seconds}], best: {value, seconds}, speedup, budget_s, notes}``.
With the observed step, a last ``step`` entry predicts the step of the best combination.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from perfmagic.contract import KnobResult, Trial
from perfmagic.tuning.guard import untouched, workers_stoppable
from perfmagic.tuning.result import knob_result, seconds_saved

if TYPE_CHECKING:
    from perfmagic.tuning.compute import TrainingStep

DEFAULT_BUDGET_S = 60.0
"""The most a session spends tuning; it also spends at most a quarter of the profiled time."""

BUDGET_SHARE = 0.25

BENCHMARKED = ("data", "h2d", "forward", "backward", "optimizer")
"""The stages a worker count's timing reproduces: the loading, and a training step on copies."""


def default_budget(window_s: float) -> float:
    return min(DEFAULT_BUDGET_S, BUDGET_SHARE * window_s)


def tune(
    loader: Any = None,
    model: Any = None,
    optimizer: Any = None,
    batch: Any = None,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    step_s: float | None = None,
    data_s: float | None = None,
    extra_s: float = 0.0,
    autocast_in_use: bool = False,
    progress: Callable[[str, float], None] | None = None,
) -> list[KnobResult]:
    """Try the knobs that apply to what is given; returns one result per knob tried.

    ``batch`` is what the model is called with: a tuple of arguments, a dict of keyword
    arguments or one argument. ``step_s`` and ``data_s`` (the observed step and its wait for
    data, seconds) give the predicted step, with ``extra_s``, the seconds of the observed step that
    a training step on copies does not reproduce (its logging, checkpoints, code between stages);
    ``autocast_in_use`` (the loop ran under autocast) leaves
    precision untried; ``progress`` hears what is tried as each try begins, and the seconds tuning
    has left. Ctrl-C ends tuning early with what was measured so far.
    """
    from perfmagic.tuning.compute import TrainingStep, tune_compute, tune_threads

    if not budget_s > 0:
        raise ValueError(f"budget_s must be a positive number of seconds, got {budget_s!r}")
    results: list[KnobResult] = []
    # a collection inside a timed try would be charged to one setting: one that finds a dropped
    # DataLoader's iterator joins each of its workers, for up to 5 s
    gc.collect()
    begin = time.perf_counter()

    def left() -> float:
        """Seconds of the budget not spent yet."""
        return budget_s - (time.perf_counter() - begin)

    def say(what: str) -> None:
        if progress is not None:
            progress(what, max(0.0, left()))

    with untouched(), workers_stoppable():
        try:
            step = None
            if model is not None and batch is not None:
                step = TrainingStep(model, optimizer, *_call_of(batch))
            if loader is not None:
                _tune_loader(results, loader, step, budget_s, left, say)
            if step is not None and not _on_cuda(model):
                share = left() / 2
                if share > 0:
                    done = tune_threads(step, share, say)
                    if done is not None:
                        results.append({**done, "budget_s": share})
            if step is not None:  # a knob the budget leaves no time for is listed, and says so
                results += tune_compute(step, left(), autocast_in_use, say)
        except KeyboardInterrupt:
            results.append(
                {
                    **knob_result("interrupted", None, [], None, None, ["Ctrl-C ended tuning"]),
                    "budget_s": budget_s,
                }
            )
    if step_s is not None and data_s is not None:
        predicted = predicted_step(results, step_s, data_s, extra_s)
        if predicted is not None:
            results.append(predicted)
    return results


def _tune_loader(
    results: list[KnobResult],
    loader: Any,
    step: TrainingStep | None,
    budget_s: float,
    left: Callable[[], float],
    say: Callable[[str], None],
) -> None:
    """The DataLoader's knobs: the worker count, then persistent workers and pinned memory with the best
    count. Each result goes into ``results`` as it is measured, so that Ctrl-C keeps it."""
    from perfmagic.tuning.loader import tune_persistent_workers, tune_pin_memory, tune_workers

    share = budget_s * (0.5 if step is not None else 1.0)  # the rest for the step's own knobs
    done = tune_workers(loader, share, step, say)
    if done is None:
        return
    results.append({**done, "budget_s": share})
    best = done["best"]
    # it starts the workers twice: tried only where the budget holds that
    kept = tune_persistent_workers(loader, best, say) if best and left() > 3 * best["start_s"] else None
    if kept is not None:
        results.append({**kept, "budget_s": None})
    if step is not None and best and step.device is not None:
        share = left() / 3
        pinned = tune_pin_memory(loader, best["value"], step.device, share, step, say)
        if pinned is not None:
            results.append({**pinned, "budget_s": share})


def predicted_step(
    results: list[KnobResult], step_s: float, data_s: float, extra_s: float = 0.0
) -> KnobResult | None:
    """The step the best settings predict.

    Worker counts timed beside a training step give the step itself. A thread count, timed
    alone, shortens the step by what it saved only where no worker count was: beside workers
    that load on the same CPUs, faster compute need not make a faster step.
    """
    by_knob = {r["knob"]: r for r in results if r["best"]}  # a knob that could not be compared: no part
    workers, threads = by_knob.get("num_workers"), by_knob.get("num_threads")
    w_best = workers["best"] if workers is not None else None
    t_best = threads["best"] if threads is not None and threads["baseline"] is not None else None
    rest = step_s - data_s
    best: dict[str, Any]
    interval: list[float] | None = None
    w_base = workers["baseline"] if workers is not None else None
    timed_part = step_s - extra_s  # the observed step's data, h2d, forward, backward and optimizer
    if workers is not None and w_best is not None and workers["unit"] == "seconds per step":
        best = {"num_workers": w_best["value"]}
        confirmed = workers.get("confirmed")
        if confirmed is not None and timed_part > 0:
            # the ratio of two settings timed in alternating slices, applied to the observed step: a change
            # in the machine's pace since the profile, or during tuning, falls on both
            step = extra_s + timed_part * confirmed["ratio"]
            interval = [extra_s + timed_part * confirmed["low"], extra_s + timed_part * confirmed["high"]]
            how = (
                f"the observed step's data, h2d, forward, backward and optimizer times {confirmed['ratio']:.2f},"
                f" the median ratio of the step with {w_best['value']} workers to the one with"
                f" {w_base['value'] if w_base else '?'} over {confirmed['pairs']} alternating pairs (each"
                " loading beside a training step on copies of the model), plus the"
                f" {extra_s * 1e3:.1f} ms per step the loop spends outside them"
            )
        elif w_base is not None and w_base["seconds"] > 0 and timed_part > 0:
            ratio = w_best["seconds"] / w_base["seconds"]
            step = extra_s + timed_part * ratio
            how = (
                f"the observed step's data, h2d, forward, backward and optimizer times {ratio:.2f}, the ratio"
                f" of the step measured with {w_best['value']} workers to the one with {w_base['value']}"
                " (each loading beside a training step on copies of the model, one after the other),"
                f" plus the {extra_s * 1e3:.1f} ms per step the loop spends outside them"
            )
        else:
            step = w_best["seconds"] + extra_s
            how = (
                "the step measured with the best worker count, loading beside a training step on copies of"
                f" the model, plus the {extra_s * 1e3:.1f} ms per step the loop spends outside data, h2d,"
                " forward, backward and optimizer"
            )
    elif w_best is not None:
        count, load = w_best["value"], w_best["seconds"]
        best, step = {"num_workers": count}, max(rest, load) if count else rest + load
        how = "with workers, loading overlaps the rest of the step (the step is the longer of the two)"
    elif threads is not None and t_best is not None:
        saved = seconds_saved(threads) or 0.0
        best, step = {"num_threads": t_best["value"]}, step_s - saved
        how = "the observed step less what the best thread count saved on a training step"
    else:
        return None
    observed: Trial = {"value": "observed", "seconds": step_s}
    predicted: Trial = {"value": best, "seconds": step}
    result: KnobResult = {
        **knob_result("step", "seconds per step", [], observed, predicted, [how]),
        "budget_s": None,
    }
    if interval is not None:
        result["interval_s"] = interval
    return result


def _call_of(batch: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(batch, tuple):
        return batch, {}
    if isinstance(batch, dict):
        return (), dict(batch)
    return (batch,), {}


def _on_cuda(model: Any) -> bool:
    return any(p.is_cuda for p in model.parameters())
