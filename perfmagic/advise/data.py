"""Input pipeline rules: the step waits for data, and why."""

from __future__ import annotations

from typing import NamedTuple

from perfmagic.advise.calls import Source
from perfmagic.advise.card import Card, make_card, severity_for
from perfmagic.advise.fixes import dataset_name, loader_call, loader_site
from perfmagic.advise.host import contention
from perfmagic.advise.loading import loading_kind, loading_says
from perfmagic.advise.sample_cost import cheaper_samples_lines
from perfmagic.advise.tf_fixes import tf_data_code
from perfmagic.advise.trainer_fixes import loader_code, loader_fix_site, trainer_name
from perfmagic.advise.workers import (
    HANDOFF_SHARE,
    STEP_MODEL,
    MoreWorkers,
    loader_model,
    more_workers,
    rank_cpus,
    usable_cpus,
)
from perfmagic.analyze import Analysis
from perfmagic.analyze.steady import Steady
from perfmagic.contract import KnobResult, LoaderConfig
from perfmagic.contract.marks import PipelineMark
from perfmagic.tuning.pairs import described, saving_interval
from perfmagic.units import fmt_bytes, fmt_fraction, fmt_seconds

INPUT_SHARE = 0.05
"""Data wait that makes a run input-bound (torch-tb-profiler; TF Profiler's "moderately")."""
HIGHLY_INPUT_SHARE = 0.20
"""TF Profiler's "HIGHLY input-bound"."""
PREPROCESS_SHARE = 0.10
"""Host work between batch arrival and forward that is worth moving off the critical path."""
PIN_H2D_SHARE = 0.05
"""Host-to-device copy time worth pinning for."""


def _has_workers(a: Analysis) -> bool:
    ld = a.config.loader
    return bool(ld and ld.num_workers)


def _beside(others: float) -> str:
    return f" with {others:.1f} cores other processes kept busy" if others >= 0.5 else ""


def _workers(n: int) -> str:
    return f"{n} DataLoader worker{'s' if n != 1 else ''}"


def input_bound(a: Analysis) -> Card | None:
    """The step waits for the next batch: the verdict, with what the first fix achieves and the upper bound."""
    s = a.steady
    if s is None or s.share("data") < INPUT_SHARE:
        return None
    wait, share, step = s.stage_s("data"), s.share("data"), s.step_s
    ld = a.config.loader
    kind = loading_kind(a)
    if kind == "handoff" or (kind == "io" and _has_workers(a) and share < HANDOFF_SHARE):
        return _handoff(a, s) if share >= HANDOFF_SHARE else None
    contended = contention(a) is not None
    if kind == "cpu" and contended and _uncontended_share(a, s) < INPUT_SHARE:
        return None  # the training thread's loading mostly waited for CPUs: cpu_contention names the cause
    plan = more_workers(a, s)
    remedy = _input_remedy(a, s, kind, plan, contended)
    if remedy is None:
        return None
    verdict = "HIGHLY input-bound" if share >= HIGHLY_INPUT_SHARE else "moderately input-bound"
    workers = f", DataLoader num_workers={ld.num_workers}" if ld else ""
    says = f"; {loading_says(a, kind)}" if kind else ""
    evidence = (
        f"{fmt_fraction(share)} of step time is spent waiting for the next batch: {fmt_seconds(wait)} of a "
        f"{fmt_seconds(step)} step (mean of {s.count} steps after warm-up{workers}{says}). Up to "
        f"{fmt_seconds(wait)} per step if each batch were ready when asked for; {remedy.says}"
    )
    return make_card(
        "input_bound",
        f"Training is {verdict}: {fmt_fraction(share)} of each step waits for data",
        evidence,
        remedy.fix,
        {
            "data_s": wait,
            "data_share": share,
            "steps": s.count,
            "recommended_workers": plan.workers if plan else None,
            "saving_of": "dataloader_workers" if plan else None,  # the plan counts that saving once
        },
        saving_s=remedy.saving_s,
        step_s=step,
        model=remedy.model,
        severity=severity_for(wait, step),  # the size of the problem; the saving is what the fix achieves
    )


def _uncontended_share(a: Analysis, s: Steady) -> float:
    """The data wait's share of the step had the training thread not waited for a CPU while it loaded
    (an estimate: its loading's time on a CPU, against the step less that wait); workers: the share as is."""
    account, wait = a.loading, s.stage_s("data")
    if account is None or account.loaders != "training thread" or account.queued is None:
        return s.share("data")
    queued = wait * account.queued
    return wait * (1.0 - account.queued) / max(s.step_s - queued, 1e-12)


class _Remedy(NamedTuple):
    """What the input-bound card offers against the wait."""

    saving_s: float
    """What it saves per step."""
    says: str
    """The evidence's last sentence: what it achieves."""
    fix: str
    model: str
    """How the saving was estimated."""


def _input_remedy(
    a: Analysis, s: Steady, kind: str | None, plan: MoreWorkers | None, contended: bool
) -> _Remedy | None:
    """More workers where the machine affords them, else cheaper samples, a better tf.data pipeline, or a
    loader with workers; None where another card names the cause (``contended``: CPUs taken by others)."""
    ld, wait = a.config.loader, s.stage_s("data")
    if plan is None and kind == "cpu" and ld and ld.num_workers and contended:
        return None  # workers starved of CPU by a crowded machine: cpu_contention names the cause
    if plan is not None:
        return _more_workers_remedy(a, s, plan)
    if ld is not None and rank_cpus(a) is not None:
        n = ld.num_workers
        says = (
            f"the {_workers(n)} already use{'s' if n == 1 else ''} the CPUs this machine affords"
            if n
            else "this machine has no CPU to spare for DataLoader workers"
        ) + ", so each batch must get cheaper to load."
        fix = "# More workers cannot help here: make each sample cheaper.\n" + _cheaper_samples_fix(a)
        model = "all of the data wait, once samples are cheap enough for the workers to keep up (upper bound)"
        return _Remedy(wait, says, fix, model)
    upper = "all of the data wait, if each batch were ready when the step asks for it (upper bound)"
    if ld is None and a.config.pipeline is not None:
        pipeline = a.config.pipeline
        if _pipeline_complete(pipeline) and contended:
            return None  # nothing in the pipeline to change: its threads wait for CPUs cpu_contention names
        return _Remedy(
            wait, "the tf.data pipeline " + _pipeline_says(pipeline) + ".", tf_data_code(pipeline), upper
        )
    says = (
        "perfmagic saw no torch DataLoader" if ld is None else "this machine's CPU count was not measured"
    ) + ", so it cannot say how many workers would help."
    fix = "\n".join(
        [
            "# Prepare the next batches while the step runs: a torch DataLoader with workers",
            "loader = DataLoader(dataset, batch_size=..., num_workers=N, persistent_workers=True)",
            "# (N: the CPUs you can spare, less one for the training loop), or prefetch in a thread.",
        ]
    )
    return _Remedy(wait, says, fix, upper)


def _more_workers_remedy(a: Analysis, s: Steady, plan: MoreWorkers) -> _Remedy:
    """The planned worker count's saving, and what is left to wait for: then samples must get cheaper."""
    saving, left, more = s.step_s - plan.step_s, plan.wait_left_s, _workers(plan.workers)
    if left > 0:
        says = (
            f"with {more} (see dataloader_workers) the step would save about {fmt_seconds(saving)} and still "
            f"wait {fmt_seconds(left)} ({plan.needed} workers would keep up; this machine affords {plan.cap})."
        )
        fix = f"# With {more}, the step still waits {fmt_seconds(left)}: make each sample cheaper too.\n"
    else:
        says = f"with {more} (see dataloader_workers) it would save all of it."
        fix = (
            f"# With {more} (code on dataloader_workers), batches load while the step runs.\n"
            "# If the wait stays, make each sample cheaper:\n"
        )
    model = f"{_workers(plan.workers)}: {STEP_MODEL}; all of the data wait is the upper bound"
    return _Remedy(saving, says, fix + _cheaper_samples_fix(a), model)


def _pipeline_complete(pipeline: PipelineMark) -> bool:
    """The pipeline maps in parallel, caches and prefetches: nothing left to add to it."""
    return not pipeline["serial_maps"] and pipeline["cache"] and pipeline["prefetch"]


def _pipeline_says(pipeline: PipelineMark) -> str:
    """What a tf.data pipeline lacks, in words."""
    lacks = []
    if pipeline["serial_maps"]:
        n = pipeline["serial_maps"]
        lacks.append(f"maps one element at a time ({n} serial map{'s' if n > 1 else ''})")
    if not pipeline["cache"]:
        lacks.append("recomputes every element each epoch (no cache)")
    if not pipeline["prefetch"]:
        lacks.append("sets no prefetch of its own")
    return (
        "; ".join(lacks)
        if lacks
        else "already maps in parallel, caches and prefetches: each element must get cheaper"
    )


def _handoff(a: Analysis, s: Steady) -> Card:
    """The workers keep up; the wait is the training thread taking each batch over from them.

    Loading in the training process instead saves the wait less building a batch there: what a
    worker timed for it, else the workers' CPU per batch (which also holds the pickling)."""
    wait, share, step = s.stage_s("data"), s.share("data"), s.step_s
    ld = a.config.loader
    workers = ld.num_workers if ld else 0
    cores = a.steady_mean("host.children_cpu_cores")
    busy = f" (together {cores:.1f} cores busy)" if cores is not None else ""
    m = loader_model(a, s)
    build = m.batch_s if m.batch_s is not None else (m.load_cpu_s if cores is not None else None)
    saving = max(0.0, wait - build) if build is not None else None
    evidence = (
        f"{fmt_fraction(share)} of step time waits for the next batch ({fmt_seconds(wait)} of a "
        f"{fmt_seconds(step)} step), but the {_workers(workers)} keep up{busy}: the training thread was on a "
        f"CPU {fmt_fraction(a.loop.data_cpu_share)} of that wait, taking each batch over from a worker "
        "(unpickling it from shared memory). More workers cannot shorten it."
    )
    if saving is not None:
        evidence += (
            f" Building a batch in the training process would take about {fmt_seconds(build)} (an estimate: "
            f"what the workers spent per batch), so loading there saves up to {fmt_seconds(saving)} per step."
        )
    crossings = [
        "# Each batch crosses from a worker process: make fewer, cheaper crossings.",
        "# Return tensors (not Python lists or dicts of many small objects) from the Dataset,",
        "# and let the workers collate: a batch of few large tensors unpickles fastest.",
    ]
    in_loop = saving is None or saving > 0  # the estimate leaves loading in the loop something to save
    if in_loop:
        crossings += [
            "# When samples are cheap, loading in the training process may cost less than the hand-over:",
            loader_code(a, ld, num_workers=0) if ld else "loader = DataLoader(dataset, num_workers=0)",
            "# (time a few hundred steps both ways: perfmagic.profile() before and after, then report.compare)",
        ]
    fix = "\n".join(crossings)
    return make_card(
        "input_bound",
        f"Handing batches over from the DataLoader workers takes {fmt_fraction(share)} of each step",
        evidence,
        fix,
        {
            "data_s": wait,
            "data_share": share,
            "steps": s.count,
            "loading": "handoff",
            "data_cpu_share": a.loop.data_cpu_share,
            "build_batch_s": build,
        },
        saving_s=None,
        step_s=step,
        model=None,
        severity=severity_for(wait if saving is None else saving, step),
        replaces=loader_fix_site(a, ld) if ld and in_loop else None,
    )


def _cheaper_samples_fix(a: Analysis) -> str:
    """What a sample costs, as measured, the code that costs it, and how to make it cheaper."""
    return "\n".join(cheaper_samples_lines(a))


def dataloader_workers(a: Analysis) -> Card | None:
    """Too few DataLoader workers for the data wait, given this machine's CPUs (measured where tuned)."""
    s = a.steady
    if s is None or s.share("data") < INPUT_SHARE:
        return None
    tried = a.tuned("num_workers")
    if tried is not None:
        return _measured_workers(a, s, tried)
    plan, ld = more_workers(a, s), a.config.loader
    if plan is None or ld is None:
        return None
    m, workers, needed = plan.loading, plan.workers, plan.needed
    step = s.step_s
    cpus = usable_cpus(a)
    now = "the training loop loads every batch itself" if not m.workers else f"{_workers(m.workers)}"
    batch = f" of {ld.batch_size}" if ld.batch_size else ""
    io = loading_kind(a) == "io"
    affords = (
        f"{loading_says(a, 'io')}, so workers need no CPU each: {cpus} usable CPUs and the memory left afford "
        f"{plan.cap}"
        if io
        else f"the loading's {fmt_seconds(m.load_cpu_s)} and the loop's {fmt_seconds(m.rest_cpu_s)} of CPU work a "
        f"step share {cpus} usable CPUs{_beside(m.others)}"
    )
    evidence = (
        f"num_workers={m.workers}: {now}, about {fmt_seconds(m.load_s)} per batch{batch}, while the rest of the "
        f"step takes {fmt_seconds(m.rest_s)}; {needed} worker{'s' if needed > 1 else ''} would keep up, and "
        f"{affords}. With {workers}: a {fmt_seconds(plan.step_s)} step, {fmt_seconds(plan.wait_left_s)} of it "
        "waiting for data."
    )
    return make_card(
        "dataloader_workers",
        f"Use {_workers(workers)} instead of {m.workers}",
        evidence,
        loader_code(a, ld, num_workers=workers, persistent_workers=True)
        + (
            "\n# torch warns of more workers than CPUs: workers that wait on I/O leave the CPUs idle"
            if io and workers >= (cpus or 0)
            else ""
        ),
        {
            "num_workers": m.workers,
            "recommended_workers": workers,
            "workers_needed": needed,
            "affordable_workers": plan.cap,
            "load_s": m.load_s,
            "rest_s": m.rest_s,
            "usable_cpus": cpus,
            "loading": loading_kind(a),
        },
        saving_s=step - plan.step_s,
        step_s=step,
        model=f"{STEP_MODEL}, with {workers} workers",
        replaces=loader_fix_site(a, ld),
    )


def _measured_workers(a: Analysis, s: Steady, tried: KnobResult) -> Card | None:
    """The worker count that tuning measured fastest on this very loader, and the step it predicts."""
    base, best = tried["baseline"], tried["best"]
    if base is None or best is None or best["value"] == base["value"]:
        return None  # measured: more workers do not load faster here
    ld = a.config.loader or LoaderConfig()
    step = a.tuned("step")
    rest = max(s.step_s - s.stage_s("data"), best["seconds"])
    predicted = step["best"]["seconds"] if step and step["best"] else rest
    table = ", ".join(f"{t['value']}: {fmt_seconds(t['seconds'])}" for t in tried["tried"])
    said = (
        described(c, best["value"], base["value"])
        if "confirmed" in tried and (c := tried["confirmed"])
        else None
    )
    pairs = f" Timed again: {said}." if said else ""
    return make_card(
        "dataloader_workers",
        f"Use {_workers(best['value'])} instead of {base['value']} (measured)",
        f"Tried on this loader after the window: {tried['unit']} by num_workers — {table}.{pairs} With the"
        f" rest of the step that predicts a {fmt_seconds(predicted)} step instead of {fmt_seconds(s.step_s)}.",
        loader_code(a, ld, num_workers=best["value"], persistent_workers=True),
        {
            "num_workers": base["value"],
            "recommended_workers": best["value"],
            "tried": tried["tried"],
            "predicted_step_s": predicted,
            "saving_interval_s": saving_interval(s.step_s, step) if step else None,
        },
        saving_s=max(0.0, s.step_s - predicted),
        step_s=s.step_s,
        model="measured",
        replaces=loader_fix_site(a, ld),
    )


def pin_memory(a: Analysis) -> Card | None:
    """Host-to-device copies from pageable memory, or blocking."""
    s = a.steady
    c = a.config.counters
    copied: float = c["h2d_bytes"]
    pinned: float = c["h2d_pinned_bytes"]
    copies, non_blocking = c["h2d_copies"], c["h2d_non_blocking"]
    traced = a.gpu["h2d_copies"] if a.gpu and not copied else None
    pageable_time = None
    if traced:  # a trace: each copy's host memory is in its name; non_blocking is not
        copied = traced["pageable"]["bytes"] + traced["pinned"]["bytes"]
        pinned = traced["pinned"]["bytes"]
        copy_s = traced["pageable"]["total_s"] + traced["pinned"]["total_s"]
        pageable_time = traced["pageable"]["total_s"] / copy_s if copy_s > 0 else 0.0
    if s is None or not copied or s.share("h2d") < PIN_H2D_SHARE:
        return None
    pinned_share = pinned / copied
    async_share = non_blocking / copies if copies else None
    if pageable_time is not None:
        # a pageable copy is slower and blocks the host: the signal is their share of the copy time
        if pageable_time < 0.5:
            return None
    elif pinned_share >= 0.5 and (async_share or 0.0) >= 0.5:
        return None
    h2d = s.stage_s("h2d")
    tried = a.tuned("pin_memory")
    base, best = (tried["baseline"], tried["best"]) if tried is not None else (None, None)
    if best is not None and best["value"] is not True:
        return None  # tried on this loader after the window: pinned batches copied no faster here
    ld = a.config.loader
    rewrites = ld is not None and not ld.pin_memory
    fix = loader_code(a, ld, pin_memory=True) + "\n" if ld and rewrites else ""
    if trainer_name(a) is None:  # a framework copies batches itself, non-blocking from pinned memory
        fix += "# and in the loop, copy with .to(device, non_blocking=True): copies overlap with compute"
    return make_card(
        "pin_memory",
        "Copy batches from pinned memory, without blocking",
        f"Host-to-device copies take {fmt_fraction(s.share('h2d'))} of the step ({fmt_seconds(h2d)}); "
        f"{fmt_fraction(pinned_share)} of the {fmt_bytes(copied)} copied came from pinned memory"
        + (
            f" and {non_blocking} of {copies} copies were non_blocking."
            if async_share is not None
            else f" (GPU trace: {traced['pageable']['count']} copies from pageable memory took "
            f"{fmt_fraction(pageable_time)} of the copy time, {traced['pinned']['count']} from pinned the rest)."
            if traced
            else "."
        ),
        fix,
        {
            "h2d_s": h2d,
            "h2d_bytes": copied,
            "pinned_share": pinned_share,
            "non_blocking_share": async_share,
            "pageable_time_share": pageable_time,
        },
        saving_s=base["seconds"] - best["seconds"] if base and best else h2d / 2,
        step_s=s.step_s,
        model="measured"
        if tried
        else "half the copy time: pinned copies run about twice as fast and non_blocking ones overlap compute",
        replaces=loader_fix_site(a, ld) if rewrites else None,
    )


def preprocess_in_loop(a: Analysis) -> Card | None:
    """Per-batch host work in the training loop, between the DataLoader and the model."""
    s = a.steady
    if s is None:
        return None
    pre = a.loop.pre_forward_s
    step = s.step_s
    if pre < PREPROCESS_SHARE * step:
        return None
    m = loader_model(a, s)
    cap = rank_cpus(a)
    needed = m.workers_needed(extra_load_s=pre)
    more = dataloader_workers(a)  # one worker count for both cards: dataloader_workers' where it fires
    workers = (
        int(more.metrics["recommended_workers"])
        if more is not None
        else max(m.workers, 1 if cap is None else min(cap, needed or cap))
    )
    if workers == 0:
        return None
    saving = step - m.step_with(workers, extra_load_s=pre)
    if saving <= 0:
        return None
    ld = a.config.loader
    fix = "\n".join(
        [
            "# Do the per-batch work in the Dataset, so DataLoader workers run it in parallel with the step:",
            "import torch",
            "",
            "",
            "def transform(x):",
            "    return x  # move here the code now between `for x, y in loader:` and model(x)",
            "",
            "",
            "class Preprocessed(torch.utils.data.Dataset):",
            "    def __init__(self, base, transform):",
            "        self.base, self.transform = base, transform",
            "",
            "    def __len__(self):",
            "        return len(self.base)",
            "",
            "    def __getitem__(self, i):",
            "        x, y = self.base[i]",
            "        return self.transform(x), y",
            "",
            "",
            _preprocessed_loader(a, ld, workers),
            "# (or, on a GPU: move the batch first and run the transform there)",
        ]
    )
    return make_card(
        "preprocess_in_loop",
        f"Move the per-batch preprocessing out of the training loop ({fmt_fraction(pre / step)} of each step)",
        f"Between a batch's arrival and the forward pass, the training loop spends {fmt_seconds(pre)} per step "
        f"({fmt_fraction(pre / step)} of a {fmt_seconds(step)} step) in code outside any training stage: "
        "preprocessing that runs serially with the step.",
        fix,
        {"preprocess_s": pre, "preprocess_share": pre / step, "workers": workers},
        saving_s=saving,
        step_s=step,
        model=f"the preprocessing joins the batch's loading in {workers} DataLoader worker(s): "
        f"{STEP_MODEL}, the preprocessing counted as loading",
        replaces=loader_site(ld) if trainer_name(a) is None else None,
    )


def _preprocessed_loader(a: Analysis, ld: LoaderConfig | None, workers: int) -> str:
    """The user's DataLoader call over ``Preprocessed(<their dataset>, transform)``, with ``workers``."""
    call = loader_call(ld) if trainer_name(a) is None else None
    dataset = call.passed().get("dataset") if call else None
    if ld is None or call is None or dataset is None:
        return "\n".join(
            [
                f"dataset = Preprocessed({dataset_name(ld)}, transform)",
                loader_code(a, ld, num_workers=workers, persistent_workers=True) if ld else "",
            ]
        )
    wrapped = Source(f"Preprocessed({dataset}, transform)")
    return loader_code(a, ld, dataset=wrapped, num_workers=workers, persistent_workers=True)
