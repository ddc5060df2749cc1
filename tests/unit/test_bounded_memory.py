"""Long runs in bounded memory: old steps folded into rows, old samples averaged, the spool keeping it all."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from fakeclock import FakeClock

import perfmagic
import perfmagic.upkeep
from perfmagic.analyze.steps import StepBreakdown, plan_fold, step_breakdown
from perfmagic.collect.recorder import StageRecorder
from perfmagic.render.chrome import PID
from perfmagic.schema import THREAD_CPU
from perfmagic.timeline import Timeline
from perfmagic.timeline.file import SPOOL_NAME, Spooler, read_timeline, write_timeline

ROW_TOLERANCE = 1e-6
"""Folded rows keep durations in float32: a microsecond is far below any step's noise."""


def record_steps(tl: Timeline, steps: int, kind: str, seed: int = 0) -> None:
    """Steps as the hooks record them (a span is appended when it ends, children before parents),
    with an evaluation pass or an epoch end every so often and the thread's CPU sampled per step."""
    rng = np.random.default_rng(seed)
    ids = {n: tl.name_id(n) for n in ("data", "forward", "backward", "optimizer", "work")}
    boundary = {k: tl.name_id("step:" + k) for k in ("optimizer", "batch", "eval_end", "loader_end")}
    # a later part goes on where the earlier one ended
    t = max(1.0, float(tl.spans.end.max()) if tl.raw_span_count() else 1.0) + 1e-3
    cpu = float(tl.series(THREAD_CPU)[1][-1]) if tl.sample_count(THREAD_CPU) else 0.0
    for i in range(steps):
        d, f, b, o = rng.uniform(1e-4, 3e-3, 4)
        if kind == "batch":  # a fetch starts a step; its data span starts a moment before the boundary mark
            tl.add_span(boundary["batch"], t, t, -1)
            if i % 97 == 96:  # the loader is exhausted: an epoch ends
                tl.add_span(boundary["loader_end"], t + 1e-5, t + 1e-5, -1)
                t += 0.01
                continue
            tl.add_span(ids["data"], t - 2e-5, t + d, 0)
        else:
            tl.add_span(ids["data"], t, t + d, 0)
        tl.add_span(ids["work"], t + d + f / 4, t + d + f / 2, 1)  # a user stage inside forward
        tl.add_span(ids["forward"], t + d, t + d + f, 0)
        tl.add_span(ids["backward"], t + d + f, t + d + f + b, 0)
        tl.add_span(ids["optimizer"], t + d + f + b, t + d + f + b + o, 0)
        t += d + f + b + o + rng.uniform(3e-5, 1e-4)  # and a little time in no stage
        if kind == "optimizer":
            tl.add_span(boundary["optimizer"], t, t, -1)
            if i % 61 == 60:  # an evaluation pass after the step: no training step
                tl.add_span(ids["forward"], t + 1e-3, t + 5e-3, 0)
                t += 6e-3
                tl.add_span(boundary["eval_end"], t, t, -1)
        cpu += 0.7 * (d + f + b + o)
        tl.add_sample(THREAD_CPU, t, cpu)


def fold_now(tl: Timeline, keep: int) -> bool:
    """Fold what can go, everything being settled; whether a fold was applied."""
    fold = plan_fold(tl, keep, tl.span_count, tl.sample_count)
    if fold is None:
        return False
    tl.request_fold(fold)
    return tl.apply_fold()


def assert_same_steps(folded: StepBreakdown, whole: StepBreakdown) -> None:
    assert folded.count == whole.count and folded.boundary == whole.boundary
    np.testing.assert_allclose(folded.start, whole.start, rtol=0, atol=ROW_TOLERANCE)
    np.testing.assert_allclose(folded.end, whole.end, rtol=0, atol=ROW_TOLERANCE)
    assert folded.stages == whole.stages
    np.testing.assert_allclose(folded.seconds, whole.seconds, rtol=0, atol=ROW_TOLERANCE)
    assert folded.cpu_s is not None and whole.cpu_s is not None
    np.testing.assert_allclose(folded.cpu_s, whole.cpu_s, rtol=0, atol=ROW_TOLERANCE)


@pytest.mark.parametrize("kind", ["optimizer", "batch"])
def test_folded_steps_give_the_breakdown_of_the_whole_record(kind: str) -> None:
    tl = Timeline()
    folds = 0
    for chunk in range(6):  # recorded in parts, folded between them as a long session would be
        record_steps(tl, 500, kind, seed=chunk)
        folds += fold_now(tl, keep=400)
    reference = Timeline()
    for chunk in range(6):
        record_steps(reference, 500, kind, seed=chunk)
    assert folds == 6 and tl.raw_span_count() < reference.raw_span_count() / 5
    assert_same_steps(step_breakdown(tl), step_breakdown(reference))


def test_a_fold_takes_only_what_is_settled_and_keeps_the_newest_spans() -> None:
    tl = Timeline()
    record_steps(tl, 1000, "optimizer")
    reference = step_breakdown(tl)
    settled = tl.span_count // 2
    fold = plan_fold(tl, keep=100, settled=settled, settled_samples=lambda _: 300)
    assert fold is not None and fold.spans <= settled and fold.samples[THREAD_CPU] <= 300
    tl.request_fold(fold)
    assert tl.apply_fold()
    assert tl.span_base == fold.spans and tl.sample_base(THREAD_CPU) == fold.samples[THREAD_CPU]
    assert_same_steps(step_breakdown(tl), reference)
    # nothing settled beyond what is gone: nothing more can go
    assert plan_fold(tl, keep=100, settled=tl.span_base, settled_samples=tl.sample_count) is None


def test_a_folded_timeline_saves_and_loads_whole(tmp_path: Path) -> None:
    tl = Timeline({"epoch": 100.0})
    record_steps(tl, 800, "optimizer")
    assert fold_now(tl, keep=200)
    write_timeline(tl, tmp_path / "t.jsonl")
    loaded = read_timeline(tmp_path / "t.jsonl")
    assert_same_steps(step_breakdown(loaded), step_breakdown(tl))
    loaded.rebase(99.0)  # one second earlier on the clock of another process
    np.testing.assert_allclose(step_breakdown(loaded).start, step_breakdown(tl).start + 1.0)


def test_the_spool_keeps_every_span_and_sample_that_memory_gave_up(tmp_path: Path) -> None:
    tl, out = Timeline(), open(tmp_path / SPOOL_NAME, "w", encoding="utf-8")  # noqa: SIM115
    spooler = Spooler(tl, out)
    record_steps(tl, 300, "optimizer", seed=1)
    spooler.flush()
    assert fold_now(tl, keep=100)
    for k in range(1000):
        tl.add_sample("host.cpu_util", float(k), float(k % 10))
    spooler.flush()
    tl.thin("host.cpu_util", 600)  # its oldest 600 samples become 300 pair means
    record_steps(tl, 300, "optimizer", seed=2)
    tl.add_sample("host.cpu_util", 1000.0, 5.0)
    spooler.flush()
    t, v = tl.series("host.cpu_util")
    assert len(t) == 701 and tl.sample_count("host.cpu_util") == 1001
    assert np.all(np.diff(t) > 0) and v[:300].mean() == pytest.approx((np.arange(600) % 10).mean())
    out.close()
    spool = read_timeline(tmp_path)
    assert spool.span_count == tl.span_count  # every span, once
    assert len(spool.series("host.cpu_util")[0]) == 1001
    assert spool.folded is None and step_breakdown(spool).count == step_breakdown(tl).count == 600


def test_readers_never_see_columns_cut_half_way() -> None:
    tl = Timeline()
    errors: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            spans = tl.spans
            t, v = tl.series(THREAD_CPU)
            if not len(spans.start) == len(spans.end) == len(spans.name_id) == len(spans.depth):
                errors.append("span columns of different lengths")
            if len(t) != len(v) or (len(t) and not np.all(np.diff(t) >= 0)):
                errors.append("a series cut half-way")

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for seed in range(20):
            record_steps(tl, 200, "optimizer", seed=seed)
            fold = plan_fold(tl, 300, tl.span_count, tl.sample_count)
            if fold is not None:
                tl.request_fold(fold)
                tries = 0
                while not tl.apply_fold():  # the reader holds the columns: the writer tries again later
                    tries += 1
                    assert tries < 1_000_000, "the fold never found the columns free"
                    os.sched_yield()  # lets the GIL go: the reader runs and lets go of the columns
    finally:
        stop.set()
        reader.join()
    assert not errors, errors[:3]
    assert tl.folded is not None and step_breakdown(tl).count == 20 * 200


STEP_S = 1 / 1024
"""A step's length on the fake clock (a power of two: step ends fall on exact times)."""


def folded_session(
    outdir: Path, clock: FakeClock, steps: int, folded_spans: int, nested: bool = False
) -> tuple[perfmagic.Session, int]:
    """A session of at least ``steps`` steps of a ``work`` stage (with an ``inner`` one where ``nested``),
    :data:`STEP_S` each on the fake clock, run on until the sampler thread (ticking every 20 ms of it)
    has folded ``folded_spans`` spans away; returns it, stopped, with the steps it ran."""
    session = perfmagic.profile(outdir=outdir, interval=0.02, clock=clock)
    done = 0
    with session:
        while done < steps or session.timeline.span_base < folded_spans:
            assert done < 10 * steps, "the sampler thread never folded the old steps"
            with perfmagic.stage("work"), perfmagic.stage("inner") if nested else contextlib.nullcontext():
                clock.advance(STEP_S / 2)
            clock.advance(STEP_S / 2)
            perfmagic.step()
            done += 1
    return session, done


def test_a_long_session_folds_its_steps_and_reports_what_its_full_spool_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_clock: FakeClock
) -> None:
    """The report of the folded session equals the report rebuilt from its spool, which has every span."""
    monkeypatch.setattr(perfmagic.upkeep, "SPAN_BUDGET", 2_000)
    session, steps = folded_session(tmp_path, fake_clock, steps=20_000, folded_spans=6_000, nested=True)
    assert steps == 20_000  # the sampler folded on time: every tick ran where the clock said
    tl = session.timeline
    assert tl.folded is not None and tl.span_base >= 6_000, "the session never folded its old steps"
    assert tl.raw_span_count() == tl.span_count - tl.span_base and len(tl.folded) >= 1_000
    live = session.report.to_dict()
    rebuilt = perfmagic.load(tmp_path / SPOOL_NAME).to_dict()
    assert live["steps"]["count"] == rebuilt["steps"]["count"] == steps
    assert live["steps"]["median_s"] == pytest.approx(STEP_S)
    for stage, figures in rebuilt["stages"].items():
        assert live["stages"][stage]["fraction"] == pytest.approx(figures["fraction"], abs=1e-6), stage
        assert live["stages"][stage]["median_s"] == pytest.approx(figures["median_s"], abs=1e-6), stage
    assert live["steps"]["median_s"] == pytest.approx(rebuilt["steps"]["median_s"], abs=1e-6)
    np.testing.assert_allclose(live["step_table"]["end"], rebuilt["step_table"]["end"], atol=1e-6)
    assert {c["id"] for c in live["advice"]} == {c["id"] for c in rebuilt["advice"]}


def test_the_training_thread_folds_what_a_sampler_thread_left_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_clock: FakeClock
) -> None:
    """A loop of pure Python can starve the sampler thread of the GIL: here it never ticks at all, and
    the spans held stay bounded all the same, with every step in the report and the spool."""
    monkeypatch.setattr(perfmagic.upkeep, "SPAN_BUDGET", 1_000)
    cap = perfmagic.upkeep.BACKLOG_SPANS * 1_000
    held = []
    # the sampler's first tick: in an hour of the fake clock, which the loop's 30,000 steps never reach
    with perfmagic.profile(outdir=tmp_path, interval=3600, clock=fake_clock) as session:
        for i in range(30_000):
            with perfmagic.stage("work"):
                fake_clock.advance(STEP_S / 2)
            fake_clock.advance(STEP_S / 2)
            perfmagic.step()
            if i % 1000 == 999:
                held.append(session.timeline.raw_span_count())
    tl = session.timeline
    # looked at every 1,024 step ends: two spans a step may pass the cap by 2,048 before a look
    assert max(held) <= cap + 2 * 1024 and tl.folded is not None and tl.span_base > 40_000, held
    live = session.report.to_dict()
    rebuilt = perfmagic.load(tmp_path / SPOOL_NAME).to_dict()
    assert live["steps"]["count"] == rebuilt["steps"]["count"] == 30_000
    assert session.timeline.meta["sampler"]["ticks"] == 2  # the opening and the closing one only
    assert live["stages"]["work"]["fraction"] == pytest.approx(
        rebuilt["stages"]["work"]["fraction"], abs=1e-6
    )


def test_spans_go_to_the_spool_once_their_device_times_are_known(
    tmp_path: Path, fake_clock: FakeClock
) -> None:
    from test_steps import InOrderDevice

    tl, out = Timeline(), open(tmp_path / SPOOL_NAME, "w", encoding="utf-8")  # noqa: SIM115
    recorder = StageRecorder(tl, origin=0.0, clock=fake_clock)
    recorder.device_clock = InOrderDevice(lag=0.05, clock=fake_clock)
    spooler = Spooler(tl, out, settled=lambda: recorder.settled_spans)
    with recorder.stage("forward"):
        pass
    recorder.boundary("optimizer")
    spooler.flush()
    assert '"spans"' not in (tmp_path / SPOOL_NAME).read_text()  # device times pending: not on disk yet
    recorder.close()
    spooler.flush()
    out.close()
    np.testing.assert_array_equal(
        read_timeline(tmp_path).spans.end, tl.spans.end
    )  # the device-time ends, written once


def test_the_chrome_trace_of_a_folded_session_has_every_stage_span(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_clock: FakeClock
) -> None:
    monkeypatch.setattr(perfmagic.upkeep, "SPAN_BUDGET", 500)
    session, steps = folded_session(tmp_path, fake_clock, steps=3_000, folded_spans=1)
    assert session.timeline.folded is not None
    path = session.report.to_chrome_trace(tmp_path / "trace.json")
    events = json.loads(path.read_text())["traceEvents"]
    recorded = [e for e in events if e.get("name") == "work" and e.get("ph") == "X" and e["pid"] == PID + 1]
    assert len(recorded) == steps  # as recorded, from the spool: memory no longer holds the early ones
