"""The start-up rule: the first step, with everything before it, takes far longer than a steady one."""

from __future__ import annotations

import shlex

from perfmagic.advise.card import Card, make_card
from perfmagic.advise.trainer_fixes import loader_code
from perfmagic.analyze import Analysis
from perfmagic.contract import Hotspot
from perfmagic.schema import BEFORE_FIRST_STEP
from perfmagic.units import fmt_fraction, fmt_seconds

STARTUP_SHARE = 0.10
"""Start-up beyond one step (perfmagic's own start left out), as a share of the profiled window, worth
a card…"""
STARTUP_MIN_S = 1.0
"""…if it lasts this long at least (less is not worth a user's time whatever the window)…"""
STARTUP_ABSOLUTE_S = 20 * 60.0
"""…or this long whatever the window (SageMaker Debugger MaxInitializationTime: 20 minutes)…"""
STARTUP_SPOT_SHARE = 0.3
"""Share of the start-up's stack samples from which its hottest line is named."""
STARTUP_STEPS = 5.0
"""…and at least this many median steps."""
STARTUP_JOB_S = 3600.0
"""A one-time cost is weighed against a job of at least this long (the window, when longer): start-up
that dominates a short profile is a small share of a real training job."""
_STARTUP_FIX = {
    "before": "# Set-up ran inside the profiled window (model build, dataset load): start profiling after it,\n"
    "# or make it lazy (open files in Dataset.__getitem__ or a worker_init_fn, not in __init__).",
    "data": "# The first batch: DataLoader workers start and the Dataset initialises (opens files,\n"
    "# builds indexes). Do that work once and cache it on disk; start workers once for all epochs.",
    "forward": "# The first forward pass: compilation, autotuning and lazy initialisation.\n"
    "# Warm up before timing, and cache compiled graphs across runs:\n"
    "os.environ['TORCHINDUCTOR_FX_GRAPH_CACHE'] = '1'",
}


def slow_startup(a: Analysis) -> Card | None:
    """The first step, with everything before it, takes far longer than a steady step."""
    b, s = a.breakdown, a.steady
    if s is None or b.count < 3 or a.steps.first_s is None or a.wall_s <= 0 or s.step_s <= 0:
        return None  # steps of no length (marks that share a timestamp) have no pace to compare with
    median = s.median_s
    excess = a.steps.first_s - a.ready_s - median
    if excess < max(STARTUP_STEPS * median, STARTUP_MIN_S) or (
        excess < STARTUP_SHARE * a.wall_s and excess < STARTUP_ABSOLUTE_S
    ):
        return None
    parts = {"before": float(b.start[0]) - a.ready_s}
    for j, name in enumerate(b.stages):
        parts[name] = float(b.seconds[0, j]) - s.stage_s(name)
    where = max(parts, key=lambda k: parts[k])
    label = "before the first step" if where == "before" else f"in {where}"
    interpreter = where == "before" and a.whole_process
    if interpreter:
        label += ", which includes starting Python" + (" and importing torch" if a.config.torch else "")
    job = max(a.wall_s, STARTUP_JOB_S)
    job_steps = b.count + (job - a.wall_s) / s.step_s  # a job that long, at the steady pace
    weighed = (
        f"{fmt_fraction(excess / a.wall_s)} of the profiled {fmt_seconds(a.wall_s)}"
        if job == a.wall_s
        else f"{fmt_fraction(excess / a.wall_s)} of the profiled {fmt_seconds(a.wall_s)}, "
        f"{_percent(excess / job)} of a {job / 3600:g}-hour job"
    )
    spot = _startup_spot(a)
    line = (
        f" Most of it in {spot['where']} ({fmt_fraction(spot['share'])} of its stack samples)."
        if spot
        else ""
    )
    return make_card(
        "slow_startup",
        f"Start-up takes {fmt_seconds(excess)} before training runs at speed",
        f"The first step finished {fmt_seconds(a.steps.first_s)} into the window against a median step of "
        f"{fmt_seconds(median)}: {fmt_seconds(excess)} of start-up ({weighed}), {fmt_seconds(parts[where])} "
        f"of it {label}.{line}",
        (f"# Most of the start-up: {spot['where']}\n" if spot else "") + _startup_fix(a, where, interpreter),
        {
            "first_step_s": a.steps.first_s,
            "startup_excess_s": excess,
            "one_time_s": excess,
            "where": where,
            "startup_share": excess / a.wall_s,
            "job_s": job,
            "hot_line": spot["where"] if spot else None,
        },
        saving_s=excess / job_steps,
        step_s=job / job_steps,
        model=f"the start-up's extra time spread over the steps of a {fmt_seconds(job)} job at the steady pace "
        "(a one-time cost: the longer the job, the smaller its share)",
    )


def _startup_spot(a: Analysis) -> Hotspot | None:
    """The user's line the training thread was sampled in most before the first step, if it stands out."""
    spots = a.hotspots.get(BEFORE_FIRST_STEP) or []
    return spots[0] if spots and spots[0]["share"] >= STARTUP_SPOT_SHARE else None


def _percent(x: float) -> str:
    """A share, with two decimals below 1% (a one-time cost's share of a long job is often that small)."""
    return fmt_fraction(x) if x >= 0.01 else f"{x * 100:.2f}%"


def _startup_fix(a: Analysis, where: str, interpreter: bool) -> str:
    md, ld = a.config.model, a.config.loader
    if interpreter:
        script = shlex.join(a.argv) if a.argv else "train.py"
        return "\n".join(
            [
                "# The time before the first step includes starting Python"
                + (" and importing torch (1-3 s that" if a.config.torch else " (a fraction of a second that"),
                "# no change to the script removes). To find what takes the rest:",
                f"# $ python -X importtime {script} 2> imports.log  (in a shell: import time per module)",
                f"# $ python -m cProfile -s cumtime {script} | head -40  (the set-up: dataset indexing, model build)",
            ]
        )
    if where in ("forward", "backward") and md and md["compiled"]:
        return (
            "# torch.compile compiles during the first step; cache it across runs:\n"
            + _STARTUP_FIX["forward"]
        )
    fix = _STARTUP_FIX.get(where, f"# The first step's {where} does one-time work: move it before the loop.")
    if where == "data" and ld and ld.num_workers:
        fix += "\n" + loader_code(a, ld, persistent_workers=True)
    return fix
