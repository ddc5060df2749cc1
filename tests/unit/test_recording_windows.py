"""Stages recorded in windows: the schedule on a fake clock, the hooks' coming and going, and the
analysis that takes stage shares from the fully recorded steps and the rhythm from all of them."""

from __future__ import annotations

import itertools
import os
import re
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from fakeclock import FakeClock

import perfmagic.upkeep
from perfmagic import bootstrap, cli
from perfmagic.analyze import analyze
from perfmagic.analyze.running import RunningStages
from perfmagic.children import FULL_ENV, RUN_DIR_ENV, ChildProfiling
from perfmagic.collect.recorder import StageRecorder
from perfmagic.collect.schedule import (
    FULL_SECONDS,
    FULL_STEPS,
    LONGEST_PERIOD,
    MEASURED_PERIODS,
    OVERHEAD_TARGET,
    PERIOD,
    SETTLING_STEPS,
    STEP_END_COST_S,
    WINDOW,
    WINDOW_STEP_COST_S,
    RecordingSchedule,
    median_and_error,
    period_for,
)
from perfmagic.render.wording import recording_line
from perfmagic.report import build_report
from perfmagic.schema import RECORDING
from perfmagic.session import Session
from perfmagic.timeline import Mark, Timeline
from perfmagic.timeline.file import read_timeline, write_timeline
from perfmagic.upkeep import RecordUpkeep


def recorded_fully(
    clock: FakeClock,
    schedule: RecordingSchedule,
    steps: int,
    step_s: float,
    added_s: float = 0.0,
    jitter: float = 0.0,
    removal_s: Sequence[float] = (),
    stall_every: int = 0,
) -> list[bool]:
    """Per step, whether it is recorded fully, asking the schedule as the recorder does (at step ends,
    once each answer's steps are over). Full recording adds ``added_s`` to a step, the steps after it
    ``removal_s`` (the first, the second…); each step is ``step_s`` times a factor in ``1 ± jitter``
    (fixed pseudo-random), and every ``stall_every``-th stalls for a second more."""
    rng = np.random.default_rng(7)
    full, left, out, since_full = True, 0.0, [], 0
    for ended in range(steps):
        out.append(full)
        since_full = 0 if full else since_full + 1
        cost = added_s if full else removal_s[since_full - 1] if since_full <= len(removal_s) else 0.0
        stall = 1.0 if stall_every and ended % stall_every == 3 else 0.0
        clock.advance(step_s * (1 + jitter * rng.uniform(-1, 1)) + cost + stall)
        left -= 1
        if left <= 0:
            full, left = schedule.plan(ended + 1)
    return out


def is_prime(n: int) -> bool:
    return n > 1 and all(n % k for k in range(2, n))


def windows_per_period(full: list[bool]) -> list[int]:
    """The steps from one window's start to the next, after the start's full steps."""
    starts = [i for i in range(1, len(full)) if full[i] and not full[i - 1]]
    return [b - a for a, b in itertools.pairwise(starts)]


def test_windows_that_measurably_cost_over_one_percent_come_less_often(fake_clock: FakeClock) -> None:
    """Hooks that add 50 ms to a fully recorded 200 ms step, and 30, 12 and 8 ms to the three steps after
    a window (their removal: 60 ms per window step, 3% of the run at 5 in 53; the estimate said
    0.05%) are measured over the first periods, and the period grows so they cost 1% again."""
    schedule = RecordingSchedule(fake_clock)
    periods = 2 * MEASURED_PERIODS + 4
    steps = FULL_STEPS + periods * 160
    removal = (0.03, 0.012, 0.008)
    assert len(removal) == SETTLING_STEPS
    full = recorded_fully(fake_clock, schedule, steps, step_s=0.2, added_s=0.05, removal_s=removal)
    gaps = windows_per_period(full[FULL_STEPS:])
    assert gaps[: MEASURED_PERIODS - 1] == [PERIOD] * (MEASURED_PERIODS - 1)  # measured at the default
    longer = gaps[-1]
    assert set(gaps[MEASURED_PERIODS:]) == {longer} and longer > PERIOD
    added, _ = median_and_error(schedule.cost.added_s)
    assert added == pytest.approx(0.06)
    share = (WINDOW * 0.06 / longer + STEP_END_COST_S) / 0.2
    assert share <= OVERHEAD_TARGET and longer == period_for(0.2, added_s=0.06)


def test_the_schedule_sees_the_windows_cost_on_a_machine_that_stalls(fake_clock: FakeClock) -> None:
    """The same hooks (60 ms per window step) while one step in 7 stalls for a second, inside the windows
    and out: the schedule still measures 60 ms, and lengthens the period as it would on a quiet machine."""
    schedule = RecordingSchedule(fake_clock)
    steps = FULL_STEPS + (2 * MEASURED_PERIODS + 4) * 160
    recorded_fully(
        fake_clock,
        schedule,
        steps,
        step_s=0.2,
        added_s=0.05,
        removal_s=(0.03, 0.012, 0.008),
        stall_every=7,
    )
    added, _ = median_and_error(schedule.cost.added_s)
    assert added == pytest.approx(0.06, abs=0.01)
    assert schedule.period > PERIOD


@pytest.mark.parametrize(("added_s", "jitter"), [(0.002, 0.0), (0.0, 0.9)])
def test_windows_that_cost_little_or_only_seem_to_keep_the_default_period(
    fake_clock: FakeClock, added_s: float, jitter: float
) -> None:
    """Hooks adding 1% to a fully recorded step (0.1% of the run), and hooks that add nothing to steps
    that vary by ±90% (a busy machine): the default period throughout."""
    schedule = RecordingSchedule(fake_clock)
    steps = FULL_STEPS + 3 * MEASURED_PERIODS * PERIOD
    full = recorded_fully(fake_clock, schedule, steps, step_s=0.2, added_s=added_s, jitter=jitter)
    assert set(windows_per_period(full[FULL_STEPS:])) == {PERIOD}
    assert schedule.cost.periods >= 3 * MEASURED_PERIODS - 1


def test_a_period_whose_hooks_came_in_out_of_turn_is_not_measured(fake_clock: FakeClock) -> None:
    """An evaluation pass installs the hooks between the schedule's edges (the recorder asks the schedule
    again at the next step end): that period counts for nothing, the next ones count again."""
    schedule = RecordingSchedule(fake_clock)
    # among the steps the third window is compared with, just before it
    left, evaluation_at = 0.0, FULL_STEPS + 3 * PERIOD - WINDOW - 2
    counted: list[int] = []
    for ended in range(FULL_STEPS + 4 * PERIOD + SETTLING_STEPS):
        fake_clock.advance(0.2)
        left -= 1
        if left <= 0 or ended + 1 == evaluation_at:
            _, left = schedule.plan(ended + 1)
        if (
            ended + 1 > FULL_STEPS and (ended + 1 - FULL_STEPS) % PERIOD == SETTLING_STEPS
        ):  # a period measured
            counted.append(schedule.cost.periods)
    assert counted == [0, 1, 2, 2, 3]  # the third period, interrupted, is not counted


def test_a_short_profile_records_every_step(fake_clock: FakeClock) -> None:
    full = recorded_fully(fake_clock, RecordingSchedule(fake_clock), FULL_STEPS, step_s=0.5)
    assert all(full)


def test_after_the_start_five_steps_in_every_period_are_recorded(fake_clock: FakeClock) -> None:
    steps = FULL_STEPS + 10 * PERIOD
    full = recorded_fully(fake_clock, RecordingSchedule(fake_clock), steps, step_s=1.0)  # 30 s: step 30
    assert all(full[:FULL_STEPS])
    later = full[FULL_STEPS:]
    assert [sum(later[i : i + PERIOD]) for i in range(0, len(later), PERIOD)] == [WINDOW] * 10
    # each window is whole: WINDOW steps in a row, not scattered
    runs = "".join("1" if f else "0" for f in later).split("0")
    assert sorted({len(run) for run in runs} - {0}) == [WINDOW]


def test_the_first_thirty_seconds_are_recorded_fully_however_many_steps(fake_clock: FakeClock) -> None:
    step_s = 0.01  # 3000 steps in the first 30 s
    steps = int(FULL_SECONDS / step_s) + 3 * PERIOD
    full = recorded_fully(fake_clock, RecordingSchedule(fake_clock), steps, step_s)
    first_partial = full.index(False)
    assert first_partial * step_s >= FULL_SECONDS - WINDOW * step_s
    assert sum(full[first_partial : first_partial + 2 * PERIOD]) == 2 * WINDOW


def test_full_records_every_step(fake_clock: FakeClock) -> None:
    full = recorded_fully(fake_clock, RecordingSchedule(fake_clock, every_step=True), 1000, step_s=1.0)
    assert all(full)


def windowed_loop(
    clock: FakeClock,
    *,
    full: bool,
    steps: int,
    checkpoint_every: int,
    hiccup_every: int = 0,
    slow_batch_every: int = 0,
    preempted: int = -1,
    hook_cost_s: float = 0.0,
    removal_cost_s: Sequence[float] = (),
    after_step: Callable[[Timeline], object] = lambda _: None,
) -> Timeline:
    """A loop on the fake clock whose per-step stages (data, forward, backward) are recorded only while the
    recorder's windowed hooks are in: the optimizer step, its end and checkpoints on every step. Every
    ``hiccup_every`` steps its own Python stalls for a second (``other``), after the start every
    ``slow_batch_every`` steps its batch takes 0.4 s more to load (a cold shard), and step ``preempted``'s forward
    for half a minute (another process took the CPU); a fully recorded step takes
    ``hook_cost_s`` longer, the steps from the one the hooks are taken out in ``removal_cost_s`` (the first,
    the second…); ``after_step`` sees the timeline after each step."""
    tl = Timeline()
    tl.meta["wall_s"] = 0.0
    rec = StageRecorder(tl, origin=clock.now(), clock=clock)
    rec.schedule = RecordingSchedule(clock, every_step=full)
    switched: list[bool] = []
    rec.record_in_windows(lambda on: switched.append(on) or [])

    def stage(name: str, seconds: float) -> None:
        if name in ("data", "forward", "backward") and not rec.full:
            clock.advance(seconds)  # no hook in place: the time passes unrecorded
            return
        with rec.stage(name):
            clock.advance(seconds)

    removals_paid, since_removal = 0, 0
    # forwards of 50 to 70 ms in no cycle that a period of windows could fall in step with
    forward_s = 0.05 + 0.02 * np.random.default_rng(3).random(steps)
    for i in range(steps):  # 0.25 s steps: the first FULL_STEPS outlast FULL_SECONDS
        slow_batch = slow_batch_every and i >= FULL_STEPS and i % slow_batch_every == 0
        stage("data", 0.5 if slow_batch else 0.1)
        stage("forward", forward_s[i] + 30.0 * (i == preempted))
        stage("backward", 0.07)
        removed_now = bool(switched) and switched[-1] is False and len(switched) != removals_paid
        removals_paid = len(switched)
        since_removal = 1 if removed_now else since_removal + 1
        settling = removal_cost_s[since_removal - 1] if since_removal <= len(removal_cost_s) else 0.0
        cost = hook_cost_s if rec.full else settling
        clock.advance(0.01 + cost)  # the loop's own Python: other
        if hiccup_every and i % hiccup_every == 3:
            clock.advance(1.0)
        if i % checkpoint_every == checkpoint_every // 2:
            stage("checkpoint", 2.0)
        stage("optimizer", 0.01)
        rec.boundary("optimizer")
        after_step(tl)
    rec.close()
    tl.meta["wall_s"] = clock.now()
    assert bool(switched) is not full  # the windows came and went, or never did
    return tl


def test_stage_shares_from_windows_are_those_of_every_step(fake_clock: FakeClock) -> None:
    steps = FULL_STEPS + 8 * PERIOD
    full = windowed_loop(fake_clock, full=True, steps=steps, checkpoint_every=PERIOD)
    windowed = windowed_loop(fake_clock, full=False, steps=steps, checkpoint_every=PERIOD)
    assert (windowed.series(RECORDING)[1] == 0).any()
    a, b = analyze([full]), analyze([windowed])
    assert b.steps.count == a.steps.count == steps
    assert b.breakdown.full is not None and b.breakdown.full.sum() == FULL_STEPS + 8 * WINDOW
    # the checkpoints after the start fall outside the windows: measured on every step all the same
    saved = b.breakdown.column("checkpoint") > 0
    assert saved[FULL_STEPS:].sum() == 8 and not b.breakdown.full[FULL_STEPS:][saved[FULL_STEPS:]].any()
    for name, stats in a.stages.items():
        assert b.stages[name].fraction == pytest.approx(stats.fraction, abs=0.002), name
    assert b.bottleneck == a.bottleneck == "data"
    assert b.steps.median_s == pytest.approx(a.steps.median_s)
    # how often each stage is entered a step: the windows' count of the per-step stages, every step's of
    # the checkpoints
    assert b.loop.calls_per_step == pytest.approx(a.loop.calls_per_step)

    recording = build_report(b)["recording"]
    assert recording is not None
    assert (recording["mode"], recording["full_steps"], recording["steps"]) == (
        "windowed",
        FULL_STEPS + 8 * WINDOW,
        steps,
    )
    full_recording = build_report(a)["recording"]
    assert full_recording is not None and full_recording["mode"] == "full"
    assert recording["calls_per_step"] is not None and full_recording["calls_per_step"] is not None
    assert recording["calls_per_step"] < full_recording["calls_per_step"]


def test_windows_meet_every_place_of_a_cycle_in_the_loop(fake_clock: FakeClock) -> None:
    """After the start, one batch in 10 loads 0.4 s longer (a cold shard): windows in a period sharing a
    factor with 10 would meet it always or never, and the start's steps never showed it. In a prime period
    the windows meet every place of the cycle in turn, and the data share from them is every step's."""
    assert is_prime(PERIOD) and is_prime(LONGEST_PERIOD)
    steps = FULL_STEPS + 20 * PERIOD
    a, b = (
        analyze(
            [windowed_loop(fake_clock, full=full, steps=steps, checkpoint_every=PERIOD, slow_batch_every=10)]
        )
        for full in (True, False)
    )
    assert b.breakdown.full is not None
    recorded = np.flatnonzero(b.breakdown.full[FULL_STEPS:]) + FULL_STEPS
    assert set(recorded % 10) == set(range(10))
    assert b.stages["data"].fraction == pytest.approx(a.stages["data"].fraction, abs=0.01)


def test_the_report_says_what_the_windows_measurably_cost(fake_clock: FakeClock) -> None:
    """Full recording adds 20 ms to a 0.25 s step and taking the hooks out 30, 12 and 8 ms to the three
    steps after a window: the report measures both, 30 ms per window step, from the windows against the steps before
    them, though a 2 s checkpoint falls outside the windows in every period; over 40 windows, closely
    enough for the overhead share to rest on it."""
    steps = FULL_STEPS + 40 * PERIOD
    tl = windowed_loop(
        fake_clock,
        full=False,
        steps=steps,
        checkpoint_every=PERIOD,
        hook_cost_s=0.02,
        removal_cost_s=(0.03, 0.012, 0.008),
    )
    a = analyze([tl])
    recording = build_report(a)["recording"]
    assert recording is not None and recording["window_cost_s"] is not None
    assert recording["window_cost_s"] == pytest.approx(0.03, abs=0.004)
    assert recording["window_cost_error_s"] is not None and recording["window_cost_error_s"] < 0.005
    # 1.1% of the step at 5 in 53: the schedule measured that too, and recorded fewer windows
    assert recording["full_steps"] < FULL_STEPS + 40 * WINDOW
    expected = (
        recording["full_steps"] * recording["window_cost_s"] / steps + STEP_END_COST_S
    ) / a.steps.median_s
    assert recording["overhead_fraction"] == pytest.approx(expected)
    footer = recording_line(build_report(a))
    assert footer is not None and re.search(r"; the windows measured \+(29|30|31) ms ± ", footer)
    # recorded fully throughout: nothing to measure against
    whole = build_report(
        analyze([windowed_loop(fake_clock, full=True, steps=steps, checkpoint_every=PERIOD)])
    )
    assert whole["recording"] is not None and whole["recording"]["window_cost_s"] is None


def test_slow_steps_of_a_busy_machine_do_not_hide_the_windows_cost(fake_clock: FakeClock) -> None:
    """One step in 7 stalls for a second (another process took the CPU), inside the windows and outside
    them alike: the windows' measured cost is still the 30 ms per window step their hooks add, where a
    mean of the steps outside (a stall in every 7th) would have said less than nothing."""
    tl = windowed_loop(
        fake_clock,
        full=False,
        steps=FULL_STEPS + 40 * PERIOD,
        checkpoint_every=PERIOD,
        hiccup_every=7,
        hook_cost_s=0.02,
        removal_cost_s=(0.03, 0.012, 0.008),
    )
    recording = build_report(analyze([tl]))["recording"]
    assert recording is not None and recording["window_cost_s"] is not None
    assert recording["window_cost_s"] == pytest.approx(0.03, abs=0.004)


def test_a_step_longer_than_its_neighbours_is_so_in_the_stage_that_makes_steps_long(
    fake_clock: FakeClock,
) -> None:
    """The loop's own code stalls once in every period, always outside the windows after the start: a long
    step's extra time is ``other``'s, as the long steps of the start showed, not the stages' in their
    shares (which would give data most of a second the loop never spent loading)."""
    steps = FULL_STEPS + 8 * PERIOD
    loops = [
        windowed_loop(fake_clock, full=full, steps=steps, checkpoint_every=PERIOD, hiccup_every=PERIOD)
        for full in (True, False)
    ]
    a, b = (analyze([timeline]) for timeline in loops)
    assert b.breakdown.full is not None
    stalled = np.flatnonzero(np.arange(steps) % PERIOD == 3)
    stalled = stalled[stalled >= FULL_STEPS]  # after the start
    assert (b.breakdown.durations[stalled] > 1.0).all() and not b.breakdown.full[stalled].any()
    for name, stats in a.stages.items():
        assert b.stages[name].fraction == pytest.approx(stats.fraction, abs=0.005), name


def test_one_step_preempted_in_a_window_does_not_decide_where_the_others_time_goes(
    fake_clock: FakeClock,
) -> None:
    """A forward preempted for half a minute in a fully recorded step would, by itself, make every
    longer step's extra time forward's: the loop's own stalls outside the windows stay ``other``'s."""
    steps = FULL_STEPS + 8 * PERIOD
    loops = [
        windowed_loop(
            fake_clock, full=full, steps=steps, checkpoint_every=PERIOD, hiccup_every=PERIOD, preempted=100
        )
        for full in (True, False)
    ]
    a, b = (analyze([timeline]) for timeline in loops)
    assert b.breakdown.full is not None and b.breakdown.full[100]
    assert b.breakdown.column("forward")[100] > 30.0
    for name, stats in a.stages.items():
        assert b.stages[name].fraction == pytest.approx(stats.fraction, abs=0.005), name


def test_live_totals_read_the_windows_too(fake_clock: FakeClock) -> None:
    steps = FULL_STEPS + 8 * PERIOD
    full = windowed_loop(fake_clock, full=True, steps=steps, checkpoint_every=PERIOD)
    windowed = windowed_loop(fake_clock, full=False, steps=steps, checkpoint_every=PERIOD)
    shares = []
    for timeline in (full, windowed):
        running = RunningStages()
        running.add_ended(timeline)
        total = sum(running.totals.values())
        shares.append({name: s / total for name, s in running.totals.items()})
    assert shares[1].keys() == shares[0].keys() and "checkpoint" in shares[0]
    for name, share in shares[0].items():
        assert shares[1][name] == pytest.approx(share, abs=0.005), name


def test_live_totals_looked_at_as_the_run_goes_are_those_of_one_look_at_its_end(
    fake_clock: FakeClock,
) -> None:
    """The exporter's status adds up the steps ended each second, while windows come and go: each look
    reads the changes of recording since the last, and the totals are those of one look at the end."""
    live = RunningStages()
    timeline = windowed_loop(
        fake_clock,
        full=False,
        steps=FULL_STEPS + 8 * PERIOD,
        checkpoint_every=PERIOD,
        after_step=live.add_ended,
    )
    live.add_ended(timeline)
    once = RunningStages()
    once.add_ended(timeline)
    assert live.steps == once.steps == FULL_STEPS + 8 * PERIOD
    assert live.totals.keys() == once.totals.keys()
    for name, seconds in once.totals.items():
        assert live.totals[name] == pytest.approx(seconds, rel=1e-9), name


HOST_CPU = "host.cpu_util"


def test_the_changes_of_recording_are_kept_whole_where_old_samples_are_averaged(
    fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long run's upkeep averages old samples in pairs; an average of an install and a removal would be
    neither, so the changes of recording stay as they were and the report is that of the whole record."""
    steps = FULL_STEPS + 8 * PERIOD
    whole = windowed_loop(fake_clock, full=False, steps=steps, checkpoint_every=PERIOD)
    monkeypatch.setattr(perfmagic.upkeep, "SERIES_BUDGET", 4)
    upkeeps: list[RecordUpkeep] = []

    def bound(timeline: Timeline) -> None:
        if not upkeeps:
            upkeeps.append(RecordUpkeep(timeline, fake_clock, [], lambda: True))
        timeline.add_sample(HOST_CPU, fake_clock.now(), 1.0)  # as the sampler would
        upkeeps[0].tick()

    kept = windowed_loop(fake_clock, full=False, steps=steps, checkpoint_every=PERIOD, after_step=bound)
    assert kept.sample_base(HOST_CPU) > 0, "the upkeep averaged nothing"
    assert (
        kept.sample_base(RECORDING) == 0 and kept.sample_count(RECORDING) == whole.sample_count(RECORDING) > 8
    )
    np.testing.assert_array_equal(kept.series(RECORDING)[1], whole.series(RECORDING)[1])
    a, b = analyze([whole]), analyze([kept])
    assert b.breakdown.full is not None and a.breakdown.full is not None
    assert (b.breakdown.full == a.breakdown.full).all()


def test_a_record_that_held_the_changes_of_recording_as_marks_reads_as_it_did(
    fake_clock: FakeClock, tmp_path: Path
) -> None:
    """Records written before the changes of recording were a series held them as ``recording`` marks."""
    windowed = windowed_loop(fake_clock, full=False, steps=FULL_STEPS + 8 * PERIOD, checkpoint_every=PERIOD)
    old = Timeline(windowed.meta)
    spans = windowed.spans
    old.add_spans(
        spans.names,
        array("i", spans.name_id.tolist()),
        array("d", spans.start.tolist()),
        array("d", spans.end.tolist()),
        array("b", spans.depth.tolist()),
    )
    for metric in set(windowed.metrics) - {RECORDING}:
        t, v = windowed.series(metric)
        old.add_samples(metric, array("d", t.tolist()), array("d", v.tolist()))
    t, v = windowed.series(RECORDING)
    old.add_marks(
        [*windowed.marks(), *(Mark(a, "recording", {"full": bool(on)}) for a, on in zip(t, v, strict=True))]
    )
    write_timeline(old, tmp_path / "old.jsonl")

    read = read_timeline(tmp_path / "old.jsonl")
    assert not read.marks("recording")
    np.testing.assert_array_equal(read.series(RECORDING)[1], v)
    report, expected = build_report(analyze([read])), build_report(analyze([windowed]))
    assert report["recording"] == expected["recording"]
    assert report["stages"] == expected["stages"]


@pytest.mark.parametrize(("options", "every_step"), [(["--full"], True), ([], False)])
def test_run_full_reaches_each_process_session(
    options: list[str], every_step: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``perfmagic run --full``: each profiled process's session records every step."""
    args = cli._parser().parse_args(["run", *options, "python", "x.py"])
    monkeypatch.setattr(os, "environ", cli._child_env(args, tmp_path, tmp_path, None))
    started: list[Session] = []
    monkeypatch.setattr(bootstrap.Session, "start", lambda self: started.append(self) or self)
    monkeypatch.setattr(bootstrap.atexit, "register", lambda *a: None)
    monkeypatch.setattr(bootstrap, "ENDING_SIGNALS", ())
    bootstrap.start_from_env()
    assert started[0].options.full is every_step


@pytest.mark.parametrize("full", [True, False])
def test_a_profiles_children_record_as_it_does(
    full: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``perfmagic.profile(full=True)``: the Python processes the block starts record every step too."""
    monkeypatch.setattr(
        os, "environ", {k: v for k, v in os.environ.items() if not k.startswith("PERFMAGIC_")}
    )
    children = ChildProfiling(tmp_path, 0.1, full)
    children.start()
    assert (FULL_ENV in os.environ) is full
    children.stop()
    assert FULL_ENV not in os.environ and RUN_DIR_ENV not in os.environ


def test_short_steps_get_fewer_windows_so_the_hooks_stay_under_the_target(fake_clock: FakeClock) -> None:
    """The estimated cost of a period's hooks, over its steps, against the step: 5 ms steps keep the
    default period; shorter ones get a longer one, down to the longest where even the steps' ends alone
    would pass the target."""

    def cost_share(period: int, step_s: float) -> float:
        added_s = WINDOW * WINDOW_STEP_COST_S / period + STEP_END_COST_S
        return added_s / step_s / (1 + 1e-9)  # not failed by a rounding

    assert period_for(0.005) == PERIOD and cost_share(PERIOD, 0.005) <= OVERHEAD_TARGET
    ends_only_s = STEP_END_COST_S / OVERHEAD_TARGET  # the steps' ends alone cost the target
    for step_s in (1.1 * ends_only_s, 1.3 * ends_only_s, 1.6 * ends_only_s):
        period = period_for(step_s)
        assert PERIOD < period < LONGEST_PERIOD and cost_share(period, step_s) <= OVERHEAD_TARGET
        assert is_prime(period)
        shorter = max(n for n in range(PERIOD, period) if is_prime(n))
        assert cost_share(shorter, step_s) > OVERHEAD_TARGET  # the shortest such period
    assert period_for(0.9 * ends_only_s) == LONGEST_PERIOD
    # the schedule measures the start's steps on its clock: steps too short even for their ends alone get
    # one window in the longest period
    short_s = 0.9 * ends_only_s
    steps = int(FULL_SECONDS / short_s) + 2 * LONGEST_PERIOD
    full = recorded_fully(fake_clock, RecordingSchedule(fake_clock), steps, step_s=short_s)
    later = full[full.index(False) :]
    assert sum(later[:LONGEST_PERIOD]) == WINDOW
