"""A real torch loop profiled with stages recorded in windows and with every step recorded: the same
stage shares, bottleneck and checkpoint share, measured in the same test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from torchloops import SleepyDataset, SlowPickle, Stopwatch, Timings, train

import perfmagic
from perfmagic import Report
from perfmagic.collect import schedule

STEPS = 270
"""With windows from step 20 on: 20 + 5 windows of 5 steps recorded fully, 225 steps at their ends only."""

SAVE_EVERY = 50


def profiled(tmp_path: Path, *, full: bool) -> tuple[Report, Timings]:
    """The loop, profiled: a slow DataLoader (the bottleneck), forward, backward and optimizer steps,
    and a ``torch.save`` every :data:`SAVE_EVERY` steps that falls outside the windows; with the loop's
    own timers (the truth of this run, whatever the machine did)."""
    state = {"weights": torch.randn(100_000), "slow": SlowPickle(0.2)}
    path = tmp_path / "checkpoint.pt"

    def save(step: int) -> None:
        if step % SAVE_EVERY == SAVE_EVERY // 2:
            torch.save(state, path)

    outdir = tmp_path / ("full" if full else "windowed")
    with perfmagic.profile(sources=[], outdir=outdir, full=full) as session:
        t = train(STEPS, data_s=0.02, forward_s=0.005, backward_s=0.008, optimizer_s=0.003, extra=save)
    return session.report, t


def stage_timers(t: Timings) -> dict[str, Stopwatch]:
    """The loop's timers of the stages the windows record (the saves are timed on every step)."""
    return {"data": t.data, "forward": t.forward, "backward": t.backward, "optimizer": t.optimizer}


def shares(t: Timings) -> dict[str, float]:
    """Each stage's share of the loop's own step time."""
    timers = {**stage_timers(t), "checkpoint": t.extra}
    return {name: w.total_s / sum(t.step_s) for name, w in timers.items()}


def sampling_error(t: Timings, seen: np.ndarray) -> dict[str, float]:
    """How far the per-step stages' shares in the ``seen`` steps (a mask) are from the whole run's, in the
    loop's own timers: what stages estimated from those steps may miss by, and no more. The saves, timed
    on every step, are out of both; so is the first step, the loop's warm-up."""
    step_s = np.asarray(t.step_s) - np.asarray(t.extra.times_s)
    steady = np.arange(len(step_s)) > 0
    rest = 1.0 - t.extra.total_s / sum(t.step_s)
    errors = {}
    for name, w in stage_timers(t).items():
        times = np.asarray(w.times_s)
        in_seen, in_all = (times[m].sum() / step_s[m].sum() for m in (steady & seen, steady))
        errors[name] = abs(float(in_seen - in_all)) * rest
    return {**errors, "checkpoint": 0.0}


def test_windows_give_the_stage_shares_of_every_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run is held to its own loop's timers: the stage shares from the windows are as close to them
    as full recording's are to its own, within a point (two runs of one loop differ on a busy machine)."""
    # windows from the 20th step on, not after 200 steps and 30 s: the loop stays short
    monkeypatch.setattr(schedule, "FULL_STEPS", 20)
    monkeypatch.setattr(schedule, "FULL_SECONDS", 0.0)
    windowed, windowed_timers = profiled(tmp_path, full=False)
    full, full_timers = profiled(tmp_path, full=True)
    windowed_truth, full_truth = shares(windowed_timers), shares(full_timers)

    recording = windowed["recording"]
    assert recording is not None and recording["mode"] == "windowed" and recording["steps"] == STEPS
    assert recording["full_steps"] <= 20 + 6 * schedule.WINDOW
    assert full["recording"] is not None and full["recording"]["full_steps"] == STEPS
    assert windowed.steps["count"] == full.steps["count"] == STEPS

    def error(report: Report, truth: dict[str, float], name: str) -> float:
        return abs(report.stages.get(name, {}).get("fraction", 0.0) - truth[name])

    errors = {
        name: (error(windowed, windowed_truth, name), error(full, full_truth, name)) for name in full_truth
    }
    # the windows cannot know better than the steps they saw: where a burst of other work slowed the
    # steps between them, their own timers' shares differ from the whole run's by as much
    assert windowed.analysis is not None and windowed.analysis.breakdown.full is not None
    sampling = sampling_error(windowed_timers, windowed.analysis.breakdown.full)
    for name, (windows_error, full_error) in errors.items():
        assert windows_error <= full_error + 0.01 + sampling[name], (name, errors, sampling)
    assert windowed["bottleneck"] == full["bottleneck"] == "data"
    # the saves fall outside the windows: their hook is on every step, their share is whole
    assert full.stages["checkpoint"]["fraction"] >= 0.05, errors


def test_an_evaluation_pass_outside_the_windows_is_seen_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A validation pass after each epoch, past the start: its DataLoader pass puts the stage hooks back
    for its length, so it is an evaluation (out of the steps) as with every step recorded."""
    monkeypatch.setattr(schedule, "FULL_STEPS", 5)
    monkeypatch.setattr(schedule, "FULL_SECONDS", 0.0)
    epochs, batches = 3, 60
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train_loader = DataLoader(TensorDataset(torch.randn(batches, 8), torch.randn(batches, 1)), batch_size=1)
    val_loader = DataLoader(SleepyDataset(4, delay_s=0.05), batch_size=1)
    evaluations = Stopwatch()
    with perfmagic.profile(sources=[], outdir=tmp_path / "perfmagic") as session:
        for _ in range(epochs):
            for x, y in train_loader:
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
            with evaluations(), torch.no_grad():
                for x, _y in val_loader:
                    model(x)
    report = session.report
    assert report["recording"] is not None and report["recording"]["mode"] == "windowed"
    assert report.steps["count"] == epochs * batches
    assert report["evaluation"]["passes"] == epochs
    assert report["evaluation"]["total_s"] == pytest.approx(evaluations.total_s, rel=0.2)


def class_dicts() -> dict[type, dict[str, object]]:
    """What each class a loop's hot path reads has: the model's layers, the optimizer, the loader's
    iterator, tensors. Changing one makes CPython forget what it specialized for it and its subclasses."""
    from torch.utils.data import dataloader

    classes = [
        *(c for c in (torch.nn.Module, torch.nn.Sequential, torch.nn.Linear, torch.nn.ReLU)),
        torch.optim.Optimizer,
        torch.optim.SGD,
        dataloader._BaseDataLoaderIter,
        dataloader._SingleProcessDataLoaderIter,
        torch.Tensor,
        torch.nn.Parameter,
        torch.nn.parallel.DistributedDataParallel,
    ]
    return {c: dict(vars(c)) for c in classes}


@pytest.mark.parametrize("compiled_in_place", [False, True])
def test_the_windows_time_every_forward_and_change_no_class(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compiled_in_place: bool
) -> None:
    """The hooks come and go with the windows by switching the code of torch's functions, and no class
    changes at a window's edges (on Python 3.13 a class changed 1,000 times is never specialized again:
    every module attribute read 8 times slower for the rest of the process). A model compiled in place
    is timed the same. Torch's own code is back after the profile."""
    monkeypatch.setattr(schedule, "FULL_STEPS", 10)
    monkeypatch.setattr(schedule, "FULL_SECONDS", 0.0)
    # steps this short would get a longer period, with no window in the loop, on a fast machine
    monkeypatch.setattr(schedule, "LONGEST_PERIOD", schedule.PERIOD)
    call = torch.nn.Module.__call__
    torch_code = call.__code__
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    if compiled_in_place:
        model.compile(backend="eager")
        model(torch.randn(4, 8))  # dynamo, once imported, changes Module for good: not perfmagic's doing
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=4)
    dicts: dict[str, list[dict[type, dict[str, object]]]] = {"outside": [], "window": []}
    codes: dict[str, set[bool]] = {"outside": set(), "window": set()}
    before = class_dicts()
    with perfmagic.profile(sources=[], outdir=tmp_path / "perfmagic") as session:
        step = 0
        while step < 10 + 2 * schedule.PERIOD:
            for x, y in loader:
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                step += 1
                if step > 12:  # the windows have begun
                    where = "window" if session.recorder.full else "outside"
                    dicts[where].append(class_dicts())
                    codes[where].add(call.__code__ is torch_code)
    assert dicts["outside"] and dicts["window"]
    first = dicts["outside"][0]
    changed = {c.__name__ for d in dicts["outside"] + dicts["window"] for c in d if d[c] != first[c]}
    assert not changed, f"changed at a window's edge: {changed}"
    assert codes == {"outside": {True}, "window": {False}}  # torch's code between the windows
    assert torch.nn.Module.__call__ is call and call.__code__ is torch_code
    assert class_dicts() == before
    b = session.report.analysis.breakdown
    assert b.full is not None and b.full[12:].any() and not b.full[12:].all()
    timed = b.column("forward")[12:][b.full[12:]]
    assert (timed > 0).all(), "every forward in the windows was timed"
