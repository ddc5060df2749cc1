"""The ``data`` stage of torch loops: DataLoader fetches and worker start-up, with the batches' sizes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from perfmagic.collect.loaders import loader_settings
from perfmagic.collect.patching import Patcher
from perfmagic.collect.recorder import StageRecorder
from perfmagic.collect.threadclock import cpu_only_reading, voluntary_switches, wait_off_cpu
from perfmagic.collect.tracebacks import drop_own_frame
from perfmagic.collect.windowed_hooks import WindowedHooks
from perfmagic.schema import (
    THREAD_DATA_CPU,
    THREAD_DATA_TIMED,
    THREAD_DATA_WAIT,
    THREAD_SAMPLES,
    THREAD_TOKENS,
)

if TYPE_CHECKING:
    from perfmagic.collect.torch_hooks import TorchStages

DATA_CPU_EVERY_S = 0.01
"""Shortest time between the starts of two fetches whose CPU time is measured (``THREAD_DATA_CPU``)."""


class _TimedFetches:
    """CPU, wall and run-queue seconds of the fetches timed so far, and when the last one began.

    Against each other they tell CPU demand (the training thread's own loading, taking batches over
    from workers, or waiting for a CPU) from blocked waiting; a fetch in which the thread never went to
    sleep was never blocked (``threadclock.wait_off_cpu``). A clock read is a system call that costs
    a fast loop: fetches are timed :data:`DATA_CPU_EVERY_S` apart."""

    __slots__ = ("cpu_s", "last_began", "queued_s", "wall_s")

    def __init__(self) -> None:
        self.cpu_s = self.wall_s = self.queued_s = 0.0
        self.last_began = -DATA_CPU_EVERY_S


def install_data(
    stages: TorchStages, torch: Any, rec: StageRecorder, p: Patcher, windowed: WindowedHooks
) -> None:
    """Time ``_BaseDataLoaderIter.__next__`` (in the windows, ``windowed``) and ``DataLoader.__iter__`` as
    ``data``."""
    from torch.utils.data import dataloader as dl

    data_id = rec.stage_id("data")
    # id(iterator) -> when its pass began and what had trained by then (optimizer steps, forwards with grad)
    passes: dict[int, tuple[float, int, int]] = {}
    windowed.set(
        dl._BaseDataLoaderIter,
        "__next__",
        lambda orig: _next_batch(stages, torch, rec, orig, data_id, passes),
    )
    p.set(dl.DataLoader, "__iter__", _start_iter(stages, dl.DataLoader.__iter__, data_id, passes))


def _next_batch(
    stages: TorchStages,
    torch: Any,
    rec: StageRecorder,
    orig_next: Callable[[Any], Any],
    data_id: int,
    passes: dict[int, tuple[float, int, int]],
) -> Callable[[Any], Any]:
    """``_BaseDataLoaderIter.__next__``: a batch boundary, the fetch as ``data``, samples and tokens counted."""
    stats = stages.stats
    boundary = rec.boundary
    add_sample, perf_counter, origin = rec.timeline.add_sample, rec.clock.now, rec.origin
    thread_clock = rec.thread_clock.read if rec.thread_clock else cpu_only_reading  # (CPU, run-queue) s
    sleeps = rec.thread_clock.sleeps if rec.thread_clock else voluntary_switches
    # a sample each batch: the series' own appends, not a method call (taken at the first batch counted:
    # a loop whose batches have no size has no series)
    appends_samples: list[Callable[[float], None]] = []
    now = stages.now
    timed = _TimedFetches()
    counted = [0, 0]  # samples and tokens taken so far: throughput as the frameworks log it
    Tensor = torch.Tensor

    evaluation, stepped = stages.evaluation, stages.stepped

    def next_batch(it: Any) -> Any:
        boundary("batch")
        stepped.clear()  # a batch between two optimizer steps: they are two iterations
        entered = rec.enter(data_id)
        began = perf_counter()
        cpu = thread_clock() if entered and began - timed.last_began >= DATA_CPU_EVERY_S else None
        slept = sleeps() if cpu is not None else None
        try:
            batch = orig_next(it)
        except StopIteration:
            boundary("loader_end")  # this fetch found the epoch over: it starts no step
            began_pass = passes.pop(id(it), None)
            trained = (stats["optimizer_steps"], stats["grad_enabled_forwards"])
            if began_pass is not None and began_pass[1:] == trained:  # trained nothing: an evaluation
                evaluation.seen(began_pass[0])
            raise
        except BaseException as e:
            drop_own_frame(e)
            raise
        finally:
            if entered:
                rec.exit()
                if cpu is not None:
                    on_cpu, waiting = thread_clock()
                    wall, on_cpu = perf_counter() - began, on_cpu - cpu[0]
                    queued = wait_off_cpu(wall, on_cpu, waiting - cpu[1], slept, sleeps)
                    timed.cpu_s += on_cpu
                    timed.wall_s += wall
                    timed.last_began, timed.queued_s = began, timed.queued_s + queued
                    t = now()
                    add_sample(THREAD_DATA_CPU, t, timed.cpu_s)
                    add_sample(THREAD_DATA_TIMED, t, timed.wall_s)
                    add_sample(THREAD_DATA_WAIT, t, timed.queued_s)
        stats["batches"] += 1
        size = batch_size(batch, Tensor)
        if size is not None:
            t = perf_counter() - origin
            counted[0] += size[0]
            if not appends_samples:
                appends_samples.extend(rec.timeline.sample_appenders(THREAD_SAMPLES))
            appends_samples[0](t)
            appends_samples[1](counted[0])
            if size[1]:
                counted[1] += size[1]
                add_sample(THREAD_TOKENS, t, counted[1])
        return batch

    return next_batch


def _start_iter(
    stages: TorchStages,
    orig_iter: Callable[[Any], Any],
    data_id: int,
    passes: dict[int, tuple[float, int, int]],
) -> Callable[[Any], Any]:
    """``DataLoader.__iter__``: its worker start-up as ``data``, and when each pass began (``passes``)."""
    rec, stats, now, torch = stages.recorder, stages.stats, stages.now, stages.torch

    def record_loader(loader: Any) -> None:
        settings = loader_settings(loader, torch, sys._getframe(2))  # 2: the loop's `for`, or above
        rec.timeline.add_mark(now(), "dataloader", **settings)

    def start_iter(loader: Any) -> Any:
        stages.record_once("loader", record_loader, loader)
        # a pass that trains nothing is an evaluation: seen by the fetch hooks, so in place for the pass
        rec.record_fully_now()
        entered = rec.enter(data_id)
        try:
            it = orig_iter(loader)
        except BaseException as e:
            drop_own_frame(e)
            raise
        finally:
            if entered:
                rec.exit()
        passes[id(it)] = (now(), stats["optimizer_steps"], stats["grad_enabled_forwards"])
        return it

    return start_iter


def batch_size(batch: Any, tensor_cls: Any) -> tuple[int, int] | None:
    """(samples, token ids) of a batch: the leading dimension of its ``input_ids`` or first tensor, and
    the ids in ``input_ids`` (or in its one 2-D integer tensor: a sequence batch); None without a tensor.

    Runs on every batch: one pass over the batch's values, the dtype asked of 2-D tensors only.
    """
    if isinstance(batch, dict):
        ids = batch.get("input_ids")
        if isinstance(ids, tensor_cls) and ids.dim() == 2:
            return int(ids.shape[0]), int(ids.numel())
        values: Any = batch.values()
    elif isinstance(batch, (list, tuple)):
        values = batch
    else:
        values = (batch,)
    first = None
    first_is_ids = False
    id_tensors = 0
    for v in values:
        if not isinstance(v, tensor_cls):
            continue
        shape = v.shape
        if not shape:
            continue
        is_ids = len(shape) == 2 and not v.is_floating_point() and not v.is_complex()
        id_tensors += is_ids
        if first is None:
            first, first_is_ids = v, is_ids
    if first is None:
        return None
    return int(first.shape[0]), int(first.numel()) if first_is_ids and id_tensors == 1 else 0
