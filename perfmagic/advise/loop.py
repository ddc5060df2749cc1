"""Training-loop rules: work the loop adds to every step (logging, syncs) or every few (checkpoints)."""

from __future__ import annotations

import math

import numpy as np

from perfmagic.advise.card import Card, make_card
from perfmagic.advise.fixes import nice_interval
from perfmagic.advise.trainer_fixes import (
    HF,
    LIGHTNING,
    checkpoint_interval_code,
    trainer_fix_site,
    trainer_name,
)
from perfmagic.analyze import Analysis
from perfmagic.contract.marks import CheckpointMark
from perfmagic.units import fmt_bytes, fmt_fraction, fmt_seconds

LOGGING_SHARE = 0.05
"""Logging and host-device syncs worth a card, as a share of step time."""
CHECKPOINT_SHARE = 0.03
"""Checkpoint time worth a card, as a share of training time (the fix aims at 2%)."""
TARGET_OVERHEAD = 0.01
"""What logging should cost after the fix, as a share of the step…"""
CHECKPOINT_TARGET = 0.02
"""…and checkpointing."""


def sync_logging(a: Analysis) -> Card | None:
    """Printing, logging, metric writers and host-device syncs on the step's critical path."""
    s = a.steady
    if s is None or s.share("logging") < LOGGING_SHARE:
        return None
    step, spent = s.step_s, s.stage_s("logging")
    calls = a.loop.calls_per_step.get("logging", 0.0)
    c = a.config.counters
    steps = c["optimizer_steps"] or c["batches"]
    syncs = c["syncs"] / steps if steps else 0.0
    traced = a.gpu["syncs"] if a.gpu else None
    if not syncs and traced:  # a trace: its synchronizing CUDA calls
        syncs = traced["per_step"]
    factor = nice_interval(spent / (TARGET_OVERHEAD * step))
    every = nice_interval(factor / calls) if calls > 0 else factor
    lines = [f"LOG_EVERY = {every}  # steps", "if step % LOG_EVERY == 0:"]
    if syncs:
        lines[1:1] = ["running_loss += loss.detach()  # stays on the GPU: no sync"]
        lines += [
            "    print(f'loss {running_loss.item() / LOG_EVERY:.4f}')  # one sync per interval",
            "    running_loss.zero_()",
        ]
    else:
        lines.append("    print(...)  # your logging, unchanged")
    calls_txt = ", ".join(f"{n} {k:.1f}" for n, k in (traced["calls_per_step"] if traced else {}).items())
    sync_txt = (
        f"; {syncs:.1f} host-device syncs per step ({calls_txt or 'item/cpu/tolist/synchronize'})"
        if syncs
        else ""
    )
    return make_card(
        "sync_logging",
        f"Logging takes {fmt_fraction(s.share('logging'))} of each step: log less often",
        # syncs named only where counted: a run with no device has none to drain
        f"Printing, logging{', metric writers and syncs' if syncs else ' and metric writers'} take "
        f"{fmt_seconds(spent)} of a {fmt_seconds(step)} step ({fmt_fraction(s.share('logging'))}, {calls:.1f} calls "
        f"per step{sync_txt}). Each one holds up the training loop"
        + (", and a sync also drains the GPU's queue." if syncs else "."),
        "\n".join(lines),
        {
            "logging_s": spent,
            "logging_share": s.share("logging"),
            "calls_per_step": calls,
            "syncs_per_step": syncs,
            "sync_calls_per_step": traced["calls_per_step"] if traced else None,
            "log_every_steps": every,
        },
        saving_s=spent * (1 - 1 / (calls * every)) if calls > 0 else spent * (1 - 1 / factor),
        step_s=step,
        model=f"logging once every {every} steps keeps it near {fmt_fraction(TARGET_OVERHEAD)} of the step",
    )


def checkpoint_frequency(a: Analysis) -> Card | None:
    """Checkpoints saved so often that saving takes a large share of training time."""
    s = a.steady
    if s is None or "checkpoint" not in s.stages or s.share("checkpoint") < CHECKPOINT_SHARE:
        return None
    col = s.seconds[:, s.stages.index("checkpoint")]
    saved_in = np.flatnonzero(col > 0)  # steady steps that saved a checkpoint
    saves = len(saved_in)
    step, spent = s.step_s, s.stage_s("checkpoint")
    per_save = float(col.sum()) / saves
    interval = float(np.median(np.diff(saved_in))) if saves > 1 else float(s.count)
    every = f"every {interval:g} steps" if saves > 1 else f"once in {s.count} steps"
    train_step = step - spent
    new_interval = max(nice_interval(per_save / (CHECKPOINT_TARGET * train_step)), math.ceil(interval) + 1)
    calls = _calls_by_checkpoint(a, s.first)
    sizes = [
        sum(c["bytes"] or 0 for c in group) for group in calls.values() if all(c["bytes"] for c in group)
    ]
    size = f" ({fmt_bytes(float(np.median(sizes)))} each)" if sizes else ""
    group = next(iter(calls.values()), [])
    waits = a.disk_waits.get("checkpoint")
    on_disk = (
        f" Saving waited on storage up to {fmt_fraction(waits['share'])} of that time (sampled)."
        if waits
        else ""
    )
    fix = checkpoint_interval_code(a, new_interval, every) or "\n".join(
        [
            f"CHECKPOINT_EVERY = {new_interval}  # steps; now {every}",
            "if step % CHECKPOINT_EVERY == 0:",
            *(f"    {_save_line(c)}" for c in group),
            *([] if group else ["    torch.save(checkpoint, path)  # your save, unchanged"]),
            "# or save in the background: torch.distributed.checkpoint.async_save(state_dict, checkpoint_id=path)",
        ]
    )
    return make_card(
        "checkpoint_frequency",
        f"Checkpoints take {fmt_fraction(s.share('checkpoint'))} of training time: save every {new_interval} steps",
        f"{saves} checkpoints in {s.count} steps after warm-up ({every}), {fmt_seconds(per_save)} each{size}, "
        f"{len(group) or 1} save call{'s' if len(group) > 1 else ''} per checkpoint: "
        f"{fmt_fraction(s.share('checkpoint'))} of training time.{on_disk}",
        fix,
        {
            "saves": saves,
            "seconds_per_save": per_save,
            "interval_steps": interval,
            "recommended_interval_steps": new_interval,
            "checkpoint_share": s.share("checkpoint"),
            "bytes_per_checkpoint": float(np.median(sizes)) if sizes else None,
            "disk_wait_share": waits["share"] if waits else None,
        },
        saving_s=spent - per_save / new_interval,
        step_s=step,
        model=f"a checkpoint every {new_interval} steps instead of {every}: the saves' own time, at least"
        " (a save also slows the steps after it: the page cache, memory)",
        replaces=trainer_fix_site(a, "checkpoint_call" if trainer_name(a) == LIGHTNING else "call")
        if trainer_name(a) in (HF, LIGHTNING)
        else None,
    )


def _calls_by_checkpoint(a: Analysis, first: int) -> dict[int, list[CheckpointMark]]:
    """The save calls of each steady step that saved, by step index (several calls make one checkpoint)."""
    ends = a.breakdown.end
    groups: dict[int, list[CheckpointMark]] = {}
    for call in a.config.checkpoints:
        k = int(np.searchsorted(ends, call["t"]))
        if first <= k < len(ends):
            groups.setdefault(k, []).append(call)
    return groups


def _save_line(call: CheckpointMark) -> str:
    """The user's save call, unchanged, with what it saves: the fix changes when, never what."""
    fn = call["fn"]
    keys = call["keys"] if "keys" in call else None
    if keys:
        what = "{" + ", ".join(f"{k!r}: ..." for k in keys) + "}"
        return f"{fn}(checkpoint, path)  # unchanged: {what}"
    thing = "model.state_dict()" if call["what"] == "state_dict" else "obj"
    return f"{fn}({thing}, path)  # unchanged"
