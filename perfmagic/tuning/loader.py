"""The input pipeline tried with other settings: the user's DataLoader rebuilt, never changed."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import psutil

from perfmagic.contract import KnobResult, Trial
from perfmagic.tuning.pairs import confirmed_ratio, described
from perfmagic.tuning.result import knob_result

IO_WORKERS_PER_CPU = 4
"""Workers that wait on storage need no CPU each: up to this many per usable CPU…"""
MAX_WORKERS = 32
"""…and never more than this: beyond it a loader's hand-over, not its workers, sets the pace."""

MIN_BATCHES = 6
"""Batches timed per setting, after the ones its workers had ready when timing began."""

SCAN_SHARE = 0.5
"""Of the worker budget, the share that tries every count; the rest times the best against the baseline."""


def candidate_workers(current: int, cpus: int, worker_bytes: int | None) -> list[int]:
    """Worker counts worth a try: doubling from 1 up to :data:`IO_WORKERS_PER_CPU` per CPU, at most
    :data:`MAX_WORKERS` and as many as half the available memory holds."""
    cap = min(MAX_WORKERS, IO_WORKERS_PER_CPU * max(1, cpus))
    if worker_bytes:
        cap = min(cap, max(1, int(psutil.virtual_memory().available / 2 // worker_bytes)))
    values = {current}
    n = 1
    while n <= cap:
        values.add(n)
        n *= 2
    return sorted(v for v in values if v <= max(cap, current))


def rebuilt(loader: Any, **settings: Any) -> Any:
    """A new DataLoader over the same dataset, batching and collation, with ``settings`` changed."""
    from torch.utils.data import DataLoader

    options: dict[str, Any] = {
        "batch_size": loader.batch_size,
        "collate_fn": loader.collate_fn,
        "drop_last": loader.drop_last,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "num_workers": loader.num_workers,
    }
    if loader.batch_size is None:  # a batch sampler of the user's: keep it
        options["batch_sampler"] = loader.batch_sampler
        del options["batch_size"], options["drop_last"]
    options.update(settings)
    if options["num_workers"] > 0:
        options["prefetch_factor"] = settings.get("prefetch_factor", loader.prefetch_factor or 2)
        options["multiprocessing_context"] = loader.multiprocessing_context
    return DataLoader(loader.dataset, **options)


def seconds_per_batch(
    loader: Any, deadline: float, work: Callable[[Any], None] | None = None
) -> tuple[float | None, float, int]:
    """(steady seconds per batch, seconds to the first batch, batches timed) of one pass, by a deadline.

    The batches its workers make while the first one is awaited are skipped: prefetched batches
    say nothing of the rate batches are made at. ``None`` when fewer than two could be timed.
    """
    ahead = loader.num_workers * (loader.prefetch_factor or 0) if loader.num_workers else 0
    begin = time.perf_counter()
    it = iter(loader)
    try:
        next(it)
        first = time.perf_counter() - begin
        for _ in range(ahead):
            next(it)
        start = last = time.perf_counter()
        timed = 0
        for batch in it:
            if work is not None:  # the training step beside the loading, competing for the CPUs as it will
                work(batch)
            timed, last = timed + 1, time.perf_counter()
            if last >= deadline and (timed >= MIN_BATCHES or (timed >= 2 and last >= deadline + first)):
                break
    except StopIteration:  # a pass shorter than the workers' head start
        return None, time.perf_counter() - begin, 0
    finally:
        del it  # ends the pass's worker processes now
    if timed < 2:
        return None, first, timed
    return (last - start) / timed, first, timed


def tune_workers(
    loader: Any,
    budget_s: float,
    work: Callable[[], None] | None = None,
    say: Callable[[str], None] = lambda what: None,
) -> KnobResult | None:
    """``num_workers`` tried on a rebuilt loader within the budget; the best is the fewest workers within
    5% of the fastest (beyond what keeps up, a worker costs memory and start-up for nothing).

    With ``work`` (a training step on copies of the model), each batch is followed by it and the
    figure is seconds per step: loading and computing on the same CPUs, as in the training. ``say``
    hears each setting as its try begins.
    """
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    rss = psutil.Process().memory_info().rss
    # the current count first, then from the most down: where the budget runs out, the counts left
    # untried are the middle ones, and the two ends say whether more workers help at all
    others = [w for w in candidate_workers(loader.num_workers, cpus, rss) if w != loader.num_workers]
    candidates = [loader.num_workers, *reversed(others)]
    begin = time.perf_counter()
    end = begin + SCAN_SHARE * budget_s
    tried: list[Trial] = []
    notes: list[str] = []
    for k, workers in enumerate(candidates):
        left = end - time.perf_counter()
        if left <= 0:
            notes.append(f"budget spent before {workers} workers were tried")
            break
        share = left / (len(candidates) - k)
        say(f"num_workers={workers}")
        try:
            with warnings.catch_warnings():  # torch's advice on worker counts: these loaders are ours
                warnings.simplefilter("ignore", UserWarning)
                per_batch, first, timed = seconds_per_batch(
                    rebuilt(loader, num_workers=workers),
                    time.perf_counter() + share,
                    None if work is None else lambda batch: work(),
                )
        except Exception as e:  # the dataset's own error (a file gone, a transform that raises)
            notes.append(f"{workers} workers: the loader raised {e!r}; num_workers not tuned further")
            break
        if per_batch is None:
            notes.append(f"{workers} workers: too few batches in {share:.1f} s to time")
            continue
        tried.append({"value": workers, "seconds": per_batch, "start_s": first, "batches": timed})
    unit = "seconds per batch" if work is None else "seconds per step"
    baseline = next((t for t in tried if t["value"] == loader.num_workers), None)
    if baseline is None or len(tried) < 2:  # nothing to compare: only what was seen is said
        return knob_result(
            "num_workers", unit, tried, baseline, None, notes or ["too little time to compare"]
        )
    fastest = min(tried, key=lambda t: t["seconds"])
    # the fewest workers within 5% of the fastest: a worker costs memory and start-up for nothing more
    best = min((t for t in tried if t["seconds"] <= fastest["seconds"] * 1.05), key=lambda t: t["value"])
    if work is not None:
        notes.append("each batch followed by a training step on copies of the model: seconds per step")
    result = knob_result("num_workers", unit, tried, baseline, best, notes)
    if best["value"] != baseline["value"]:
        say(f"num_workers={best['value']} against {baseline['value']}, in turns")
        confirmed = confirmed_ratio(
            rebuilt(loader, num_workers=baseline["value"]),
            rebuilt(loader, num_workers=best["value"]),
            begin + budget_s - time.perf_counter(),
            None if work is None else lambda batch: work(),
        )
        if confirmed is None:
            notes.append(
                f"{best['value']} workers not timed against {baseline['value']} in pairs: tuning's budget was "
                "spent (the scan alone found them faster)"
            )
        else:
            notes.append(described(confirmed, best["value"], baseline["value"]))
            if confirmed["ratio"] > 1 / 1.05:  # the scan's lead was the machine's pace, not the count
                notes.append(f"timed in pairs, {best['value']} workers are no faster: the count is kept")
                return knob_result("num_workers", unit, tried, baseline, baseline, notes)
            result["confirmed"] = confirmed
            result["speedup"] = 1 / confirmed["ratio"]
    return result


def first_batch_kept(loader: Any, workers: int) -> float:
    """Seconds to a second epoch's first batch where the workers are kept (``persistent_workers=True``).

    The epochs are short ones over the first samples (what the workers have in flight when an epoch
    begins would be waited for: a real epoch begins with none), the first run to its end, as in
    training. The workers are ended before returning.
    """
    ahead = workers * (loader.prefetch_factor or 2)
    samples = list(range(min(len(loader.dataset), loader.batch_size * (ahead + 2))))
    kept = rebuilt(loader, num_workers=workers, persistent_workers=True, sampler=samples)
    try:
        for _ in kept:  # the first epoch, whole: its workers start and finish it
            pass
        begin = time.perf_counter()
        next(iter(kept))  # persistent workers: the same processes, sent the new epoch's indices
        return time.perf_counter() - begin
    finally:
        shutdown = getattr(getattr(kept, "_iterator", None), "_shutdown_workers", None)
        if shutdown is not None:  # persistent workers live as long as their loader: end them now
            shutdown()


def tune_persistent_workers(
    loader: Any, workers: Trial, say: Callable[[str], None] = lambda what: None
) -> KnobResult | None:
    """``persistent_workers`` at the best worker count ``workers`` (a ``tried`` entry of
    :func:`tune_workers`, whose ``start_s`` is the epoch's first batch with workers started anew)."""
    if loader.persistent_workers or not workers["value"] or loader.batch_size is None or _iterable(loader):
        return None  # a batch sampler of the user's, or a stream: no short epoch to time
    say("persistent_workers=True")
    notes = [f"at {workers['value']} workers; an epoch's first batch: saved once per epoch"]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            kept = first_batch_kept(loader, workers["value"])
    except Exception as e:  # the dataset's own error
        return knob_result("persistent_workers", None, [], None, None, [*notes, f"the loader raised {e!r}"])
    tried: list[Trial] = [{"value": False, "seconds": workers["start_s"]}, {"value": True, "seconds": kept}]
    best = min(tried, key=lambda t: t["seconds"])
    return knob_result(
        "persistent_workers", "seconds to an epoch's first batch", tried, tried[0], best, notes
    )


def tune_pin_memory(
    loader: Any,
    workers: int,
    device: Any,
    budget_s: float,
    work: Callable[[], None] | None = None,
    say: Callable[[str], None] = lambda what: None,
) -> KnobResult | None:
    """``pin_memory`` on a loader feeding a CUDA model: each batch copied to ``device`` with
    ``non_blocking=True`` (then ``work``, the training step on copies), from pageable memory as now
    against pinned; seconds per batch, the copy waited for."""
    import torch

    if loader.pin_memory or getattr(device, "type", None) != "cuda":
        return None

    def copied(batch: Any) -> None:
        _to_device(batch, device)
        if work is not None:
            work()
        torch.cuda.synchronize(device)

    tried: list[Trial] = []
    notes = [f"at {workers} workers; each batch copied with non_blocking=True"]
    end = time.perf_counter() + budget_s
    for k, pinned in enumerate((False, True)):
        say(f"pin_memory={pinned}")
        share = (end - time.perf_counter()) / (2 - k)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                per_batch, _, _ = seconds_per_batch(
                    rebuilt(loader, num_workers=workers, pin_memory=pinned),
                    time.perf_counter() + share,
                    copied,
                )
        except Exception as e:
            notes.append(f"pin_memory={pinned}: the loader raised {e!r}")
            break
        if per_batch is not None:
            tried.append({"value": pinned, "seconds": per_batch})
    if len(tried) < 2:
        return knob_result("pin_memory", None, tried, None, None, [*notes, "too little time to compare"])
    best = min(tried, key=lambda t: t["seconds"])
    return knob_result("pin_memory", "seconds per batch", tried, tried[0], best, notes)


def _to_device(batch: Any, device: Any) -> Any:
    """The batch's tensors on ``device`` (``non_blocking``), in the batch's own structure."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        items = [_to_device(v, device) for v in batch]
        return (
            type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
        )  # a namedtuple: fields
    return batch


def _iterable(loader: Any) -> bool:
    from torch.utils.data import IterableDataset

    return isinstance(loader.dataset, IterableDataset)
