"""Tuning on real loaders and a real model: measured speed-ups that hold when applied, nothing touched."""

from __future__ import annotations

import itertools
import random
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch
from noise import median_error
from torch.utils.data import DataLoader, Dataset

import perfmagic
from perfmagic.render.html import tuning_html

pytestmark = pytest.mark.slow


class Sleepy(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Waits on "storage" for each sample: more workers than CPUs help."""

    def __init__(self, n: int = 8192, wait_s: float = 0.002) -> None:
        self.n, self.wait_s = n, wait_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.wait_s)
        return torch.full((256,), float(i % 7)), torch.tensor(i % 10)


class Busy(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Computes each sample on the CPU: workers help only as far as there are CPUs."""

    def __len__(self) -> int:
        return 8192

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.full((48, 48), float(i % 5) / 10)
        for _ in range(30):
            x = torch.tanh(x @ x.T / 48)
        return x.flatten()[:256], torch.tensor(i % 10)


class FailsInWorkers(Sleepy):
    """Reads a file only the main process can (a path relative to a directory a worker changed)."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.utils.data.get_worker_info() is not None:
            raise FileNotFoundError(f"sample {i}: no such file")
        return super().__getitem__(i)


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    )
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def train(
    loader: DataLoader[Any],
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    steps: int,
    timed_s: float = 0,
) -> float:
    """The loop's mean step in seconds, over the steps after the workers' head start: at least
    ``steps`` steps in all and ``timed_s`` seconds of timed ones.

    The mean, as an epoch's time divides: with workers, steps alternate between a batch ready and a
    wait for one, and a median says nothing of the rate.
    """
    loss_fn = torch.nn.CrossEntropyLoss()
    head_start = 3 + loader.num_workers * (loader.prefetch_factor or 0)
    begin = now = 0.0
    for k, (x, y) in enumerate(loader):
        if k == head_start:
            begin = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        now = time.perf_counter()
        if k + 1 >= steps and k >= head_start and now - begin >= timed_s:
            return (now - begin) / (k + 1 - head_start)
    raise AssertionError(f"the loader ended before {steps} steps and {timed_s} s")


def profiled_and_tuned(dataset: Dataset[Any], steps: int, budget_s: float) -> perfmagic.Report:
    torch.set_num_threads(1)  # as the example notebooks: the loop's pace holds beside a busy core
    model, opt = model_and_optimizer()
    loader = DataLoader(dataset, batch_size=16)
    with perfmagic.profile(sample=False, tune=True, tune_budget=budget_s) as session:
        train(loader, model, opt, steps)
    return session.report


@pytest.mark.parametrize("dataset", [Sleepy(), Busy()], ids=["io-bound", "cpu-bound"])
def test_the_measured_worker_count_gives_the_predicted_step(dataset: Dataset[Any]) -> None:
    report = profiled_and_tuned(dataset, steps=30, budget_s=12)
    tuning = {t["knob"]: t for t in report.to_dict()["tuning"]}
    workers, step = tuning["num_workers"], tuning["step"]
    best = workers["best"]["value"]
    card = next((c for c in report.advice if c["id"] == "dataloader_workers"), None)
    if best != workers["baseline"]["value"]:
        assert card is not None and card["metrics"]["saving_model"] == "measured"
        assert card["metrics"]["recommended_workers"] == best
        # the count chosen was timed again beside the loop's own, in alternating pairs: the promise is
        # their median ratio, its interval their spread
        pairs = workers.get("confirmed")
        if pairs is None:  # a machine so busy that the budget ran out first: the report says so
            assert any("not timed against" in note for note in workers["notes"]), workers
        else:
            assert (
                pairs["pairs"] >= 3 and pairs["low"] <= pairs["ratio"] <= pairs["high"] and pairs["ratio"] < 1
            ), pairs
            low_s, high_s = step["interval_s"]
            assert low_s <= step["best"]["seconds"] <= high_s, step
    else:  # measured: more workers load no faster here (a CPU-bound loader on a busy 2-CPU machine)
        assert card is None
    if isinstance(dataset, Sleepy):  # waiting on storage: workers overlap the waits, CPUs or not
        # what workers take off the step is the batch's wait, however slow a busy machine makes the rest
        batch_wait_s = 16 * dataset.wait_s
        saved_s = workers["baseline"]["seconds"] - workers["best"]["seconds"]
        assert best > 0 and saved_s > 0.5 * batch_wait_s, workers
        # kept workers start an epoch with a batch, not with processes: measured, and faster
        kept = tuning["persistent_workers"]
        assert kept["best"]["value"] is True and kept["speedup"] > 1.5, kept
    # the report shows a bar per worker count tried, and the observed step beside the predicted one
    page = tuning_html(report.to_dict())
    assert page.count('class="pm-knob-row"') >= len(workers["tried"]) + 2, page
    assert "predicted step with num_workers=" in page

    # the fix applied to the same loop, profiled as it was, gives the step tuning predicted (what the
    # profiler spends between stages stays in both). The machine's pace may have changed since
    # (another process on its 2 CPUs): the loop as profiled is timed again beside the fixed one, in
    # pairs, and the prediction is held to the speed-up it promised
    def timed(workers: int) -> float:
        model, opt = model_and_optimizer()
        loader = DataLoader(dataset, batch_size=16, num_workers=workers, persistent_workers=workers > 0)
        try:
            with perfmagic.profile(sample=False):
                return train(loader, model, opt, steps=20, timed_s=0.6)
        finally:
            # kept workers live as long as their loader: ended now, not by a later test's garbage
            # collection (which joins each for up to 5 s: 40 s of a later test's tuning budget)
            ended = getattr(getattr(loader, "_iterator", None), "_shutdown_workers", None)
            if ended is not None:
                ended()

    speedups = [timed(0) / timed(best) for _ in range(6)]
    promised = step["baseline"]["seconds"] / step["best"]["seconds"]
    # beside two busy cores the fixed step's pace moves by up to 2x between runs a second apart: the
    # promise holds where the p10-p90 interval it stated and the range of the pairs share a value, or
    # where it is within 25% of the pairs' median
    measured = statistics.median(speedups)
    stated = sorted(
        step["baseline"]["seconds"] / s for s in step.get("interval_s", [step["best"]["seconds"]] * 2)
    )
    overlap = stated[0] <= max(speedups) and min(speedups) <= stated[1]
    assert overlap or measured == pytest.approx(promised, rel=0.25), (
        speedups,
        workers,
        step,
    )


def test_tuning_leaves_the_model_the_optimizer_and_every_random_stream_as_they_were() -> None:
    model, opt = model_and_optimizer()
    loader = DataLoader(Sleepy(n=512, wait_s=0.0005), batch_size=16, shuffle=True)
    train(loader, model, opt, steps=5)  # momentum buffers exist
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    batch = torch.randn(16, 256)
    states = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state().clone())
    threads = torch.get_num_threads()
    begin = time.perf_counter()
    already = {p.pid for p in psutil.Process().children()}  # e.g. multiprocessing's resource tracker
    heard: list[tuple[str, float]] = []
    results = perfmagic.tune(loader, model, opt, batch, budget_s=3, progress=lambda *p: heard.append(p))
    took = time.perf_counter() - begin
    assert {r["knob"] for r in results} >= {"num_workers", "num_threads"}
    # a live view hears each try as it begins, and the seconds left
    assert heard[0][0] == "num_workers=0" and any(w.startswith("num_threads=") for w, _ in heard), heard
    assert all(3 >= a >= b >= 0 for (_, a), (_, b) in itertools.pairwise(heard)), heard
    # no try begins after the budget; the one in flight then ends: about as long as the longest try
    # seen here (on this machine, now), and 2 s at least
    longest = max(a - b for (_, a), (_, b) in itertools.pairwise(heard))
    assert took <= 3 + max(2.0, 1.5 * longest), (took, heard)
    started = [p for p in psutil.Process().children() if p.pid not in already]  # by tuning: its workers
    assert psutil.wait_procs(started, timeout=5)[1] == []  # every one has ended
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert all(
        torch.equal(m, opt.state[p]["momentum_buffer"])
        for m, p in zip(momentum, model.parameters(), strict=True)
    )
    assert random.getstate() == states[0] and np.array_equal(np.random.get_state()[1], states[1])
    assert torch.equal(torch.get_rng_state(), states[2]) and torch.get_num_threads() == threads


def test_a_dataset_that_fails_in_workers_leaves_a_note_and_the_report() -> None:
    report = profiled_and_tuned(FailsInWorkers(), steps=10, budget_s=4)
    workers = next(t for t in report.to_dict()["tuning"] if t["knob"] == "num_workers")
    assert workers["best"] is None and "no such file" in " ".join(workers["notes"])
    assert report.to_dict()["steps"]["count"] == 10
    card = next((c for c in report.advice if c["id"] == "dataloader_workers"), None)
    assert card is None or card["metrics"]["saving_model"] != "measured"


def seconds_per_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: torch.Tensor) -> float:
    """A few training steps on `batch`, timed here: the truth tuning's measurement is held to."""
    begin = time.perf_counter()
    for _ in range(20):
        opt.zero_grad()
        model(batch).sum().backward()
        opt.step()
    return (time.perf_counter() - begin) / 20


PROMISE_SPREAD = 1.5
"""How far a promise may stand from the test's own timing of the same two settings on a busy machine
(measured beside two busy processes on 2 CPUs: 0.75-1.21 times it)."""


def test_an_oversubscribed_thread_count_is_found_slower() -> None:
    """More intra-op threads than CPUs: tuning measures the faster count on a copy of the model.

    Whether oversubscription is slower depends on the machine (its OpenMP runtime may throttle the
    extra threads), so the test times the counts itself, interleaved, in the same run: the one tuning
    started from, the CPU count, and the count tuning found best (on a busy machine one thread may
    beat both).
    """
    import copy
    import os

    cpus = len(os.sched_getaffinity(0))
    model, opt = model_and_optimizer()
    batch = torch.randn(64, 256)
    torch.set_num_threads(4 * cpus)
    try:
        results = perfmagic.tune(model=model, optimizer=opt, batch=batch, budget_s=6)
        threads = next(r for r in results if r["knob"] == "num_threads")
        best = threads["best"]["value"]
        twin, twin_opt = model_and_optimizer()
        twin.load_state_dict(copy.deepcopy(model.state_dict()))
        timed: dict[int, list[float]] = {n: [] for n in (4 * cpus, cpus, best)}
        for _ in range(5):
            for count, seconds in timed.items():
                torch.set_num_threads(count)
                seconds.append(seconds_per_step(twin, twin_opt, batch))
    finally:
        torch.set_num_threads(1)
    median = {count: statistics.median(seconds) for count, seconds in timed.items()}
    assert threads["baseline"]["value"] == 4 * cpus
    if median[4 * cpus] / median[cpus] > 1.2:  # oversubscription is clearly slower here: tuning finds it
        assert best <= cpus and threads["speedup"] > 1.05, (median, threads)
    # what tuning promises is what the same two counts measure here, in the same run: the ratio of each
    # round's two timings, next to each other in time; where other processes' bursts moved most rounds,
    # as far as the rounds' own spread can tell
    ratios = np.log(np.array(timed[4 * cpus]) / np.array(timed[best]))
    truth, promised = float(np.exp(np.median(ratios))), threads["speedup"] or 1.0
    off = abs(float(np.log(promised / truth)))
    assert off < np.log(PROMISE_SPREAD) or off <= 3 * median_error(ratios), (median, ratios, threads)


def conv_model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 8 * 8, 10),
    )
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def test_compute_knobs_are_timed_in_turns_on_copies_and_leave_torch_as_it_was() -> None:
    """Batches of two images: the step is mostly per-call overhead, so a doubled batch costs far less
    than twice; autocast and channels_last are tried and whatever they measure is reported."""
    from perfmagic.tuning.compute import TrainingStep, tune_compute

    model, opt = conv_model_and_optimizer()
    state = {k: v.clone() for k, v in model.state_dict().items()}  # BatchNorm's running stats too
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two intra-op threads beside a busy core spin: the pace would be the machine's
    try:
        # the compute knobs alone (the thread counts tune() tries first are another test's)
        step = TrainingStep(model, opt, (torch.randn(2, 3, 8, 8),), {})
        results = tune_compute(step, budget_s=6, autocast_seen=False)
    finally:
        torch.set_num_threads(threads)
    knobs = {r["knob"]: r for r in results}
    assert list(knobs) == ["autocast", "channels_last", "batch_size"], results
    assert all(r["best"] is not None for r in results), results
    assert [t["value"] for t in knobs["autocast"]["tried"]] == [None, "bfloat16"]
    assert [t["value"] for t in knobs["channels_last"]["tried"]] == [False, True]
    doubled = knobs["batch_size"]
    assert doubled["unit"] == "seconds per sample" and doubled["best"]["value"] == 4, doubled
    assert doubled["speedup"] > 1.3, doubled
    # on the CPU no reading is one step's peak: none is said, and the notes say why
    assert doubled["device"] == "cpu" and not any("peak_bytes" in t for t in doubled["tried"])
    assert any("not measured on the CPU" in n for n in doubled["notes"]), doubled
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert not torch.is_autocast_enabled("cpu") and not torch.backends.cuda.matmul.allow_tf32
    assert next(model.parameters()).is_contiguous()  # the user's model is not channels_last


@pytest.mark.parametrize("lr", [0.01, torch.tensor(0.01)], ids=["float", "tensor"])
def test_steps_are_timed_on_the_users_weights_not_on_weights_tuning_drove_to_nan(lr: Any) -> None:
    """Hundreds of steps on one batch towards the output's mean drove the copies' weights to NaN, and
    steps on NaN timed faster or slower at random; tuning's copies keep the user's weights, every variant
    too, while their optimizer still steps (its state is built)."""
    from perfmagic.tuning.compute import TrainingStep, compute_variants

    model, _ = conv_model_and_optimizer()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    step = TrainingStep(model, opt, (torch.randn(2, 3, 8, 8),), {})
    variants = [v for settings in compute_variants(step, autocast_seen=False).values() for _, v in settings]
    assert len(variants) == 6  # autocast, channels_last and batch size: the step as it is and one other
    for variant in variants:
        for _ in range(300):
            variant()
        assert variant.optimizer is not None and len(variant.optimizer.state) == len(list(model.parameters()))
        for mine, theirs in zip(model.parameters(), variant.model.parameters(), strict=True):
            assert torch.equal(mine, theirs), "tuning trained its copy away from the user's weights"
    assert opt.param_groups[0]["lr"] == 0.01  # the user's optimizer keeps its rate


class SlowConv(torch.nn.Module):
    """A convolution whose forward waits ``wait_s``: a big model's step, in small."""

    def __init__(self, wait_s: float) -> None:
        super().__init__()
        self.conv, self.wait_s, self.calls = torch.nn.Conv2d(3, 4, 3), wait_s, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        time.sleep(self.wait_s)
        return self.conv(x)


def test_slow_steps_keep_to_the_budget_and_knobs_left_out_say_so() -> None:
    """Steps of 0.2 s and a 0.5 s budget: the first knob gets one turn, and the knobs after it are
    listed as not tried, with why, not left out of the report. Counted in forward calls, so a busy
    machine (slower steps) can only make fewer."""
    from perfmagic.tuning.compute import MIN_STEPS, TrainingStep, tune_compute

    step = TrainingStep(SlowConv(0.2), None, (torch.randn(2, 3, 8, 8),), {})
    results = tune_compute(step, budget_s=0.5, autocast_seen=False)
    # one warm-up and one turn of MIN_STEPS for each of the first knob's two settings
    assert step.model.calls <= 2 * (1 + MIN_STEPS), step.model.calls
    first, *rest = results
    assert first["knob"] == "autocast" and first["best"] is not None
    assert any("only 1 turn" in note for note in first["notes"]), first["notes"]
    assert [r["knob"] for r in rest] == ["channels_last", "batch_size"]
    for r in rest:
        assert r["tried"] == [] and r["best"] is None and "budget was spent" in r["notes"][0], r
    assert "channels_last: not compared (not tried" in tuning_html({"tuning": results})


def test_a_loop_already_in_autocast_gets_no_autocast_tried() -> None:
    model, opt = conv_model_and_optimizer()
    results = perfmagic.tune(
        model=model, optimizer=opt, batch=torch.randn(2, 3, 8, 8), budget_s=2, autocast_in_use=True
    )
    assert "autocast" not in {r["knob"] for r in results}


def test_garbage_is_collected_before_the_first_try() -> None:
    """A collection inside a timed try is charged to one setting (one that finds a dropped loader's
    iterator joins its workers, seconds each): tune collects first, with the collector off too."""
    import gc

    collected: list[float] = []

    class Dropped:
        def __del__(self) -> None:
            collected.append(time.perf_counter())

    heard: list[float] = []
    model, opt = model_and_optimizer()
    gc.disable()
    try:
        cycle = Dropped()
        cycle.me = cycle  # type: ignore[attr-defined]
        del cycle
        perfmagic.tune(
            model=model,
            optimizer=opt,
            batch=torch.randn(4, 256),
            budget_s=0.5,
            progress=lambda *_: heard.append(time.perf_counter()),
        )
    finally:
        gc.enable()
    assert collected and heard and collected[0] < heard[0], (collected, heard)


def test_tune_options_are_checked() -> None:
    with pytest.raises(ValueError, match="tune_budget"):
        perfmagic.profile(tune=True, tune_budget=0)
    with pytest.raises(ValueError, match="budget_s"):
        perfmagic.tune(budget_s=-1)


TRAIN_SCRIPT = """
import time, torch
from torch.utils.data import DataLoader, Dataset
class Sleepy(Dataset):
    def __len__(self): return 2048
    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.full((64,), float(i % 7)), torch.tensor(i % 10)
torch.set_num_threads(1)
model = torch.nn.Linear(64, 10)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for k, (x, y) in enumerate(DataLoader(Sleepy(), batch_size=16)):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    if k == 20:
        break
"""


def test_perfmagic_run_tune_tunes_in_the_training_process(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    script, out = tmp_path / "train.py", tmp_path / "out.json"
    script.write_text(TRAIN_SCRIPT)
    cmd = [sys.executable, "-m", "perfmagic.cli", "run", "--quiet", "--tune", "--tune-budget", "8"]
    done = subprocess.run(
        [*cmd, "--json", str(out), "--", sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    workers = next((t for t in report["tuning"] if t["knob"] == "num_workers"), None)
    assert workers is not None, (report["tuning"], report["warnings"])
    assert workers["best"]["value"] > 0 and workers["speedup"] > 1.5, workers
    text = perfmagic.load(out).__str__()
    assert "tuning (tried after the window, on copies)" in text and "predicted step" in text


def test_tuning_at_interpreter_exit_stops_every_worker_it_started() -> None:
    """``perfmagic run`` tunes in an atexit handler, after torch has marked Python as exiting."""
    from torch.utils.data import _utils

    from perfmagic.tuning import tune

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    loader = DataLoader(Sleepy(n=4096, wait_s=0.0005), batch_size=16)
    _utils.python_exit_status = True  # what torch's atexit hook sets
    try:
        results = tune(loader, budget_s=3)
        assert _utils.python_exit_status is True  # put back for the exit that follows
    finally:
        _utils.python_exit_status = False
    assert any(r["knob"] == "num_workers" and len(r["tried"]) >= 2 for r in results), results
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()]
    assert not [p for p in left if p.status() != psutil.STATUS_ZOMBIE], left


def test_the_live_panel_says_what_tuning_tries_and_how_long_it_has_left() -> None:
    from perfmagic.render.live import LivePanel

    shown: list[str] = []
    model, opt = model_and_optimizer()
    loader = DataLoader(Sleepy(n=512, wait_s=0.0005), batch_size=16)
    with perfmagic.profile(sample=False, tune=True, tune_budget=3) as session:
        panel = LivePanel(session)

        def refreshed() -> None:
            panel.update(force=True)
            shown.append(panel._status.value)

        session.add_tick_listener(refreshed)
        train(loader, model, opt, steps=10)
    panel.close()
    tuning = [s for s in shown if "tuning " in s]
    assert any("num_workers=0" in s for s in tuning) and any("num_threads=" in s for s in tuning), shown[-5:]
    assert all(" s left" in s for s in tuning)
