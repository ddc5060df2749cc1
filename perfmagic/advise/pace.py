"""Step-shape rules: irregular steps, and the healthy compute-bound verdict."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmagic.advise.card import Card, make_card
from perfmagic.advise.fixes import dataset_name, model_name
from perfmagic.advise.host import contention, contention_fix, free_cpus
from perfmagic.advise.trainer_fixes import compile_code, loader_code, mixed_precision_code
from perfmagic.analyze import Analysis
from perfmagic.analyze.steady import Steady
from perfmagic.contract import LoaderConfig
from perfmagic.schema import COMPUTE_STAGES
from perfmagic.units import fmt_fraction, fmt_seconds

OUTLIER_RATIO = 2.0
"""A steady step at least this many times the median is an outlier…"""
OUTLIER_MADS = 5.0
"""…and this many (normal-scaled) median absolute deviations above it, so jitter is not."""
OUTLIER_SHARE = 0.05
"""Time lost to outliers, as a share of steady time, worth a card."""
MIN_OUTLIERS = 3
"""Slow steps that make a pattern worth a card: one or two are an event (a preemption, a page-in)."""
PERIODIC_SHARE = 0.6
"""Share of the slow steps' gaps, and of the places the interval predicts, that make them periodic."""
RECURRING_MIN = 5
"""Slow steps on one phase of an interval that make it periodic through other slow steps…"""
RECURRING_FILL = 0.8
"""…and the share of that phase's places they must fill."""
PERIODIC_WORK = 0.25
"""Share of periodic slow steps' extra time on a CPU that makes them the loop's own work, however long
a busy machine made them wait for a CPU besides (an evaluation beside two busy cores: a third)."""
FOLD_FILL = 0.7
"""Share of one phase's places that must be slow when the steps are folded on an interval…"""
FOLD_MARGIN = 0.45
"""…this share more than the median phase (a busy machine's slow steps fill every phase alike)…"""
FOLD_MIN_PLACES = 16
"""…with this many places per phase at least. Random slow steps in 160 steps made a period in 1 of
2,000 draws at 20% slow, none at 25%, 5 at 35%, 1 at 50%; every-8 work, slow at 85% of its places,
was found 96 times in 100 beside 20% random slow steps and 92 beside 27% slow in runs of 2-6."""
FOLD_MAX_PERIOD = 64
"""…and intervals up to this (longer ones leave few places; the gap rule finds them)."""
COMPUTE_SHARE = 0.60
"""Forward+backward+optimizer share of the step that makes a run compute-bound."""


@dataclass(frozen=True)
class _SlowSteps:
    """Steady steps far slower than the median one, and how they recur."""

    steps: np.ndarray
    """Their indices among the steady steps."""
    lost: np.ndarray
    """Per slow step, its extra seconds in the stages no other card accounts for."""
    period: int | None
    """The interval they recur at, if any."""
    folded: bool
    """Whether that interval was found by folding the steps on it (through a busy machine's slow steps)."""


def step_outliers(a: Analysis) -> Card | None:
    """A few steps take far longer than the others, for a reason other cards do not cover."""
    s = a.steady
    if s is None or s.count < 5 or s.median_s <= 0:
        return None  # steps of no length (a trace whose step marks share a timestamp) have no outliers
    median = s.median_s
    extra = s.seconds - np.median(s.seconds, axis=0)  # per step and stage, against the median step
    keep = _uncovered_stages(a, s)
    slow = _slow_steps(s, extra, keep)
    step = s.step_s
    lost = float(slow.lost.sum()) / s.count
    if len(slow.steps) < MIN_OUTLIERS or lost < OUTLIER_SHARE * step:
        return None
    by_stage = np.clip(extra[slow.steps], 0, None).sum(axis=0)
    where = s.stages[keep[int(np.argmax(by_stage[keep]))]]
    cause = _slow_cause(s, slow)
    if _crowded_out(a, s, slow, cause):
        return None
    # a step that did no extra work is no periodic work, whatever its spacing
    period = None if where != "data" and cause in ("waited", "off_cpu") else slow.period
    when = f", every {period} steps" if period else ""
    explained = bool(period) or where == "data" or cause in ("gc", "waited")
    why, fix = _slow_loading(a, period) if where == "data" else _slow_work(a, where, cause, period)
    count = len(slow.steps)
    worst = float(s.durations[slow.steps].max())
    return make_card(
        "step_outliers",
        f"{count} slow steps cost {fmt_fraction(lost / step)} of training time",
        f"{count} of {s.count} steps after warm-up took at least {OUTLIER_RATIO:.0f}x the median "
        f"{fmt_seconds(median)} (up to {fmt_seconds(worst)}){when}; their extra time is mostly in {where} "
        f"(+{fmt_seconds(float(by_stage[s.stages.index(where)]) / count)} each): {why}.",
        fix,
        {
            "outliers": count,
            "median_step_s": median,
            "worst_step_s": worst,
            "stage": where,
            "period_steps": period,
            "cause": cause,
        },
        saving_s=lost,
        step_s=step,
        model="the outlier steps brought back to the median step, except time other cards account for",
        # a cause not pinned down (irregular work, or time off the CPU) gets a way to find it, not an alarm
        severity=None if explained else "low",
    )


def _uncovered_stages(a: Analysis, s: Steady) -> list[int]:
    """The columns of the stages whose slow steps no other card accounts for."""
    covered = ["checkpoint"]  # checkpoint_frequency's
    if any(m["compiled"] for m in a.config.models):
        covered += ["forward", "backward"]  # jit_compile's
    return [j for j, n in enumerate(s.stages) if n not in covered]


def _slow_steps(s: Steady, extra: np.ndarray, keep: list[int]) -> _SlowSteps:
    """The outlier steps: far above the median step, and far above its jitter (``OUTLIER_MADS``).

    Where they recur at no interval, work every few steps may still show when the steps are folded on
    one (:func:`_folded`): then the slow steps are that phase's.
    """
    median = s.median_s
    spread = 1.4826 * float(np.median(np.abs(s.durations - median)))
    steps = np.flatnonzero(
        (s.durations >= OUTLIER_RATIO * median) & (s.durations >= median + OUTLIER_MADS * spread)
    )
    lost = _lost_in(extra, steps, keep)
    big = steps[lost >= 0.5 * lost.max()] if len(steps) else steps
    period = _period(big)  # of the big ones: jitter between them does not hide a period
    folded = _folded(s.durations) if period is None else None
    if folded is None:
        return _SlowSteps(steps, lost, period, folded=False)
    period, phase = folded
    steps = phase[s.durations[phase] >= OUTLIER_RATIO * median]
    return _SlowSteps(steps, _lost_in(extra, steps, keep), period, folded=True)


def _lost_in(extra: np.ndarray, steps: np.ndarray, keep: list[int]) -> np.ndarray:
    """Per step of ``steps``, its extra seconds in the ``keep`` stages (a faster stage saves none)."""
    lost: np.ndarray = np.clip(extra[steps][:, keep], 0, None).sum(axis=1)
    return lost


def _slow_cause(s: Steady, slow: _SlowSteps) -> str | None:
    """What the slow steps' extra time was (:func:`_off_step_cause`), ``"worked"`` where they recur."""
    cause = _off_step_cause(s, slow.steps)
    if cause != "gc" and (slow.folded or (slow.period and _worked_share(s, slow.steps) >= PERIODIC_WORK)):
        # a recurrence this exact is the loop's own work, whatever a busy machine made it wait on
        return "worked"
    return cause


def _crowded_out(a: Analysis, s: Steady, slow: _SlowSteps, cause: str | None) -> bool:
    """Whether the thread's wait for CPUs accounts for the slow steps: cpu_contention's to report.

    Off-CPU time counts too: a thread of the process preempted while it holds the GIL stalls the
    training thread.
    """
    crowded = contention(a)
    return (
        crowded is not None
        and cause not in ("worked", "gc")
        and (cause == "waited" or slow.period is None)
        and (crowded.wait_s is None or crowded.wait_s * s.count >= 0.5 * slow.lost.sum())
    )


def _epoch_steps(ld: LoaderConfig | None) -> int | None:
    """Steps per epoch of the loader, where its dataset's length and batch size are known."""
    if ld and ld.dataset_len and ld.batch_size:
        return -(-ld.dataset_len // ld.batch_size)
    return None


def _slow_loading(a: Analysis, period: int | None) -> tuple[str, str]:
    """Why steps are slow in ``data``, and the fix: workers started again each epoch, else slow samples."""
    ld = a.config.loader
    if period and period == _epoch_steps(ld) and ld and ld.num_workers and not ld.persistent_workers:
        return (
            "at each epoch's start, when DataLoader workers are started again",
            loader_code(a, ld, persistent_workers=True),
        )
    dataset = dataset_name(ld)
    return "some batches are much slower to load", "\n".join(
        [
            "# find the slow samples:",
            "import time",
            "times = []",
            f"for i in range(len({dataset})):",
            f"    t = time.perf_counter(); {dataset}[i]; times.append((time.perf_counter() - t, i))",
            "print(sorted(times)[-10:])  # the ten slowest: (seconds, index)",
        ]
    )


_GC_FIX = "\n".join(
    [
        "import gc",
        "gc.freeze()  # after building the model and the data: long-lived objects leave the collector's scans",
        "gc.set_threshold(50_000, 50, 100)  # fewer young collections (the default first threshold is 700)",
    ]
)


def _slow_work(a: Analysis, where: str, cause: str | None, period: int | None) -> tuple[str, str]:
    """Why steps are slow in ``where`` (not ``data``), from the thread's time in them, and the fix."""
    if cause == "gc":
        return "Python's garbage collector ran in them (measured with gc.callbacks)", _GC_FIX
    if cause == "waited":
        c = contention(a)
        return (
            "the training thread waited for a CPU in them (runnable, not running): other processes or more "
            "busy threads than CPUs",
            "# The slow steps waited for a CPU: give the training the CPUs it uses\n"
            + (
                contention_fix(c)
                if c
                else "# $ ps -eo pid,pcpu,etime,comm --sort=-pcpu | head  (in a shell: who else runs)"
            ),
        )
    if cause == "off_cpu":
        return (
            f"the training thread was off the CPU for the extra time in {where}, without waiting for one: "
            "sleeping, reading files, waiting on a lock or on the device",
            "\n".join(
                [
                    "# Find what the slow steps wait on: time the suspect calls, or sample the thread's stack",
                    "import perfmagic",
                    f"with perfmagic.stage('suspect'):  # inside {where}, around the call you suspect",
                    "    ...",
                    "# $ py-spy dump --pid PID  (in a shell, while a slow step is in progress)",
                ]
            ),
        )
    if period:
        return f"periodic work in {where}: evaluation, metrics or garbage collection in the loop", "\n".join(
            [
                f"# the loop does extra work every {period} steps: do it less often, or off the critical path",
                f"# in your loop: `if step % {period * 10} == 0:` before that work (it runs every {period} steps now)",
                "# if it is Python's garbage collector: gc.freeze() after set-up keeps long-lived objects out",
            ]
        )
    why = (
        f"extra work in {where} at irregular steps"
        + (" (the thread computed more in them)" if cause == "worked" else "")
        + ": data-dependent work, garbage collection or a memory allocator"
    )
    return why, "\n".join(
        [
            "# Find the irregular work: name the parts of the step and compare slow steps with the rest",
            "import perfmagic",
            f"with perfmagic.stage('suspect'):  # inside {where}",
            "    ...",
            "import gc; gc.freeze()  # after set-up: long-lived objects leave the garbage collector's scans",
        ]
    )


def _period(indices: np.ndarray) -> int | None:
    """The interval the slow steps recur at, else ``None``.

    Periodic means: 60% of the gaps between slow steps (and at least two) are the same
    interval, and the slow steps fill 60% of the places that interval predicts between
    the first and the last one. Runs of consecutive slow steps (gap 1) are a slow phase,
    not periodic work. Failing that, :func:`_recurring` looks through slow steps of
    another cause (a busy machine's) that break the gaps.
    """
    gaps = np.diff(indices)
    if len(gaps) < 2:
        return None
    values, counts = np.unique(gaps, return_counts=True)
    best = int(np.argmax(counts))
    period = int(values[best])
    if period <= 1 or counts[best] < max(2, PERIODIC_SHARE * len(gaps)):
        return _recurring(indices)
    places = (int(indices[-1]) - int(indices[0])) // period + 1
    return period if len(indices) >= PERIODIC_SHARE * places else _recurring(indices)


def _recurring(indices: np.ndarray) -> int | None:
    """The interval at which most slow steps fall on one phase, the places of that phase nearly all slow.

    Slow steps a busy machine adds at random split the gaps of periodic work; the steps
    that fall every ``p`` steps still do. ``p`` must hold :data:`RECURRING_MIN` slow
    steps and 60% of them, in :data:`RECURRING_FILL` of the places it predicts: as strict
    as the gap rule on random slow steps (the same false alarms in 5,000 random draws).
    """
    idx = np.asarray(indices, dtype=np.int64)
    best: tuple[int, int] | None = None  # (slow steps on the phase, period)
    for period in range(2, (int(idx[-1] - idx[0]) // 2 + 1) if len(idx) else 0):
        phases, counts = np.unique(idx % period, return_counts=True)
        k = int(np.argmax(counts))
        hits = int(counts[k])
        if hits < max(RECURRING_MIN, PERIODIC_SHARE * len(idx)):
            continue
        on = idx[idx % period == phases[k]]
        if hits >= RECURRING_FILL * ((int(on[-1]) - int(on[0])) // period + 1) and (
            best is None or hits > best[0]
        ):
            best = (hits, period)
    return best[1] if best else None


def _folded(durations: np.ndarray) -> tuple[int, np.ndarray] | None:
    """The shortest interval one phase of which is slow nearly every time, and that phase's steps.

    Steps folded on an interval ``p`` (step ``i`` on phase ``i % p``): work every ``p`` steps makes one
    phase slow at :data:`FOLD_FILL` of its places, while slow steps a busy machine adds at random or
    in runs fall on every phase alike (the median phase stays :data:`FOLD_MARGIN` under it). Slow:
    :data:`OUTLIER_RATIO` times the median step. Each phase needs :data:`FOLD_MIN_PLACES` places:
    a few steps that happen to line up make no period.
    """
    slow = durations >= OUTLIER_RATIO * float(np.median(durations))
    for period in range(2, min(FOLD_MAX_PERIOD, len(durations) // FOLD_MIN_PLACES) + 1):
        phase = np.arange(len(durations)) % period
        filled = np.bincount(phase, weights=slow, minlength=period) / np.bincount(phase, minlength=period)
        if filled.max() >= FOLD_FILL and np.median(filled) <= filled.max() - FOLD_MARGIN:
            return period, np.flatnonzero(phase == int(np.argmax(filled)))
    return None


def _worked_share(s: Steady, outliers: np.ndarray) -> float:
    """The share of the slow steps' extra time the thread spent on a CPU besides the collector."""
    if s.cpu_s is None or not len(outliers):
        return 0.0
    extra = float((s.durations[outliers] - np.median(s.durations)).sum())
    cpu = s.cpu_s - (s.gc_s if s.gc_s is not None else 0.0)
    worked = float((cpu[outliers] - np.median(cpu)).sum())
    return worked / extra if extra > 0 else 0.0


def _off_step_cause(s: Steady, outliers: np.ndarray) -> str | None:
    """What the slow steps' extra time mostly was, from the thread's measured time in each step.

    The largest of the extra garbage-collection time (``"gc"``), CPU time (``"worked"``: extra
    work) and run-queue wait (``"waited"``: runnable, no CPU free) names it when it is at least
    half the extra time; else ``"off_cpu"`` (sleep, I/O, a lock, the device). None where the
    thread's CPU time was not measured.
    """
    if s.cpu_s is None or not len(outliers):
        return None
    extra = float((s.durations[outliers] - np.median(s.durations)).sum())
    if extra <= 0:
        return None

    def more(values: np.ndarray | None) -> float:
        return 0.0 if values is None else float((values[outliers] - np.median(values)).sum())

    # the collector runs on the thread's CPU: "worked" is the CPU time besides it; on a tie, in this order
    collected = more(s.gc_s)
    shares = {"gc": collected, "worked": more(s.cpu_s) - collected, "waited": more(s.wait_s)}
    cause = max(shares, key=lambda k: shares[k])
    return cause if shares[cause] >= 0.5 * extra else "off_cpu"


def compute_bound(a: Analysis) -> Card | None:
    """Forward, backward and optimizer dominate: a healthy run; the next levers."""
    s = a.steady
    if s is None or s.share(*COMPUTE_STAGES) < COMPUTE_SHARE:
        return None
    md = a.config.model
    t = a.config.torch
    c = a.config.counters
    on_gpu = bool(md and (md["device"] or "").startswith("cuda"))
    levers: list[str] = []
    if on_gpu and not c["autocast_forwards"]:
        levers += (mixed_precision_code(a, bf16=True) or "").splitlines() or [
            "with torch.autocast('cuda', dtype=torch.bfloat16):  # mixed precision",
            "    loss = ...",
        ]
    compile_fix = compile_code(a)
    if (md and not md["compiled"]) or (md is None and compile_fix):  # no torch model: Keras, JAX
        model = model_name(a)
        levers += (compile_fix or "").splitlines() or [
            f"{model} = torch.compile({model})  # fused kernels, less Python overhead"
        ]
    ld = a.config.loader
    # an unmeasured peak counts as free memory; a GPU of unknown size is left out
    peak = max(
        ((d["mem_used_peak_fraction"] or 0.0) for d in a.devices if d["mem_total_bytes"]),
        default=None,
    )
    if ld and ld.batch_size and (not on_gpu or (peak is not None and peak < 0.5)):
        levers.append(
            f"loader = DataLoader(dataset, batch_size={2 * ld.batch_size})  "
            f"# was {ld.batch_size}; scale the learning rate with it"
        )
    free = free_cpus(a)
    if not on_gpu and free and "num_threads" in t and t["num_threads"] < free:
        levers.append(f"torch.set_num_threads({free})  # was {t['num_threads']}")
    shares = ", ".join(f"{n} {fmt_fraction(s.share(n))}" for n in COMPUTE_STAGES if n in s.stages)
    return make_card(
        "compute_bound",
        "Compute-bound: the model's own work sets the pace",
        f"Forward, backward and optimizer take {fmt_fraction(s.share(*COMPUTE_STAGES))} of the "
        f"{fmt_seconds(s.step_s)} step ({shares}); nothing else holds the step back. Faster steps now come "
        "from doing the math faster.",
        "\n".join(["# the next levers:", *levers])
        if levers
        else "# the model's math is the step: profile its operators",
        {"compute_share": s.share(*COMPUTE_STAGES)},
        saving_s=None,
        step_s=s.step_s,
        model=None,
        severity="info",
    )
