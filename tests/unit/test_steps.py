"""Steps and the per-step stage breakdown on synthetic timelines, and the recorder's nesting rules."""

from __future__ import annotations

import gc
import math
import threading
from typing import Any

import numpy as np
import pytest
from fakeclock import FakeClock

from perfmagic.analyze import analyze
from perfmagic.analyze.steps import StepBreakdown, step_breakdown
from perfmagic.collect.recorder import StageRecorder
from perfmagic.schema import STEP_BOUNDARY_PREFIX
from perfmagic.timeline import Timeline


def make_timeline(
    spans: list[tuple[str, float, float, int]], boundaries: dict[str, list[float]] | None = None
) -> Timeline:
    """A timeline of ``(name, start, end, depth)`` stage spans and step boundaries by kind."""
    tl = Timeline()
    for name, start, end, depth in spans:
        tl.add_span(tl.name_id(name), start, end, depth)
    for kind, times in (boundaries or {}).items():
        for t in times:
            tl.add_span(tl.name_id(STEP_BOUNDARY_PREFIX + kind), t, t, -1)
    return tl


def per_step(b: StepBreakdown) -> dict[str, list[float]]:
    return {name: [round(float(v), 9) for v in b.column(name)] for name in b.stages}


def test_empty_timeline_has_no_steps() -> None:
    b = step_breakdown(Timeline())
    assert (b.count, b.boundary, b.stages, b.seconds.shape) == (0, None, ["other"], (0, 1))
    a = analyze([Timeline()])
    assert a.steps.count == 0 and a.stages == {} and a.bottleneck is None
    assert any("no training steps" in w for w in a.warnings)


def test_stages_without_boundaries_are_no_steps() -> None:
    b = step_breakdown(make_timeline([("forward", 0.0, 1.0, 0), ("backward", 1.0, 2.0, 0)]))
    assert b.count == 0


def test_optimizer_steps_split_into_stages_and_other() -> None:
    spans = []
    for k in range(3):
        t = 10.0 * k + 1.0  # 1 s of untracked time before each step's stages
        spans += [("data", t, t + 2, 0), ("forward", t + 2, t + 5, 0), ("backward", t + 5, t + 8, 0)]
        spans += [("optimizer", t + 8, t + 9, 0)]
    b = step_breakdown(make_timeline(spans, {"optimizer": [10.0, 20.0, 30.0]}))
    assert b.boundary == "optimizer"
    # the first step starts with its first stage, the others where the previous one ended
    assert b.start.tolist() == [1.0, 10.0, 20.0] and b.end.tolist() == [10.0, 20.0, 30.0]
    assert b.stages == ["data", "forward", "backward", "optimizer", "other"]
    assert per_step(b) == {
        "data": [2, 2, 2],
        "forward": [3, 3, 3],
        "backward": [3, 3, 3],
        "optimizer": [1, 1, 1],
        "other": [0, 1, 1],
    }


def test_innermost_open_stage_wins() -> None:
    spans = [
        ("train_block", 0.0, 10.0, 0),  # a user stage around everything
        ("forward", 1.0, 5.0, 1),
        ("logging", 2.0, 3.0, 2),  # print inside forward
        ("backward", 6.0, 8.0, 1),
    ]
    b = step_breakdown(make_timeline(spans, {"optimizer": [10.0]}))
    assert per_step(b) == {"forward": [3], "backward": [2], "logging": [1], "train_block": [4], "other": [0]}


def test_user_stages_follow_builtin_ones_and_other_is_last() -> None:
    spans = [("zeta", 0.0, 1.0, 0), ("alpha", 1.0, 2.0, 0), ("comm", 2.0, 3.0, 0)]
    b = step_breakdown(make_timeline(spans, {"optimizer": [4.0]}))
    assert b.stages == ["comm", "alpha", "zeta", "other"]


def test_stages_are_clipped_at_step_edges() -> None:
    spans = [("forward", 0.0, 1.0, 0), ("augment", 1.0, 3.0, 0), ("forward", 3.0, 4.0, 0)]
    b = step_breakdown(make_timeline(spans, {"optimizer": [2.0, 4.0]}))
    assert per_step(b) == {"forward": [1, 1], "augment": [1, 1], "other": [0, 0]}
    # a stage after the last boundary is in no step
    b = step_breakdown(make_timeline([*spans, ("checkpoint", 4.0, 9.0, 0)], {"optimizer": [2.0, 4.0]}))
    assert per_step(b)["checkpoint"] == [0, 0]


def test_fractions_sum_to_one() -> None:
    rng = np.random.default_rng(0)
    spans, t, ends = [], 0.0, []
    for _ in range(20):
        for name in ("data", "forward", "backward", "optimizer"):
            d = float(rng.uniform(0.01, 0.1))
            spans.append((name, t, t + d, 0))
            t += d + float(rng.uniform(0, 0.02))
        ends.append(t)
    a = analyze([make_timeline(spans, {"optimizer": ends})])
    assert a.steps.count == 20
    assert sum(s.fraction for s in a.stages.values()) == pytest.approx(1.0, abs=1e-12)
    # the steady steps (all but the first, the warm-up) cover [end of the first step, end]
    assert a.steps.warmup == 1
    assert sum(s.total_s for s in a.stages.values()) == pytest.approx(ends[-1] - ends[0])


def test_batch_boundaries_are_fetch_to_fetch() -> None:
    fetches = [0.0, 1.0, 2.0, 3.0]  # the fetch at 3.0 found the loader exhausted
    spans = [("data", f, f + 0.25, 0) for f in fetches] + [
        ("forward", f + 0.25, f + 1.0, 0) for f in fetches[:3]
    ]
    b = step_breakdown(make_timeline(spans, {"batch": fetches, "loader_end": [3.25]}))
    assert b.boundary == "batch"
    assert b.start.tolist() == [0.0, 1.0, 2.0] and b.end.tolist() == [1.0, 2.0, 3.0]
    assert per_step(b) == {"data": [0.25] * 3, "forward": [0.75] * 3, "other": [0.0] * 3}


def test_batch_boundaries_over_epochs_leave_the_gap_between_epochs_out() -> None:
    epoch1, epoch2 = [0.0, 1.0, 2.0], [10.0, 11.0, 12.0]  # 2 batches each, then an exhausted fetch
    spans = [("forward", f + 0.5, f + 1.0, 0) for f in (0.0, 1.0, 10.0, 11.0)] + [("checkpoint", 5.0, 6.0, 0)]
    b = step_breakdown(make_timeline(spans, {"batch": epoch1 + epoch2, "loader_end": [2.1, 12.1]}))
    assert b.start.tolist() == [0.0, 1.0, 10.0, 11.0] and b.end.tolist() == [1.0, 2.0, 11.0, 12.0]
    assert per_step(b)["checkpoint"] == [0.0] * 4


def test_break_out_of_the_loader_loop_ends_the_last_step_with_the_last_stage() -> None:
    fetches = [0.0, 1.0, 2.0]  # the loop broke after the third batch: no exhausted fetch
    spans = [("data", f, f + 0.25, 0) for f in fetches] + [
        ("forward", f + 0.25, f + 0.75, 0) for f in fetches
    ]
    b = step_breakdown(make_timeline(spans, {"batch": fetches}))
    assert b.start.tolist() == [0.0, 1.0, 2.0] and b.end.tolist() == [1.0, 2.0, 2.75]
    # no work after the last fetch but the fetch itself: that fetch starts no step
    b = step_breakdown(make_timeline(spans[:3] + spans[3:5], {"batch": fetches}))
    assert b.count == 2


def test_user_boundaries_start_at_the_window_without_stages() -> None:
    b = step_breakdown(make_timeline([], {"user": [1.0, 3.0, 4.0]}))
    assert b.boundary == "user"
    assert b.durations.tolist() == [1.0, 2.0, 1.0]
    assert per_step(b) == {"other": [1.0, 2.0, 1.0]}


def test_a_step_that_holds_an_evaluation_pass_starts_where_it_ended() -> None:
    # optimizer steps end at 1, 2, 8 and 9; an evaluation pass (no_grad forwards) runs in [3, 7]
    spans = [("forward", t, t + 0.5, 0) for t in (0.0, 1.0, 3.0, 4.0, 5.0, 6.0, 7.5, 8.0)]
    spans += [("checkpoint", 7.0, 7.5, 0)]  # saved after the evaluation: still in the step
    tl = make_timeline(spans, {"optimizer": [1.0, 2.0, 8.0, 9.0], "loader_end": [7.0], "eval_end": [7.0]})
    b = step_breakdown(tl)
    assert b.start.tolist() == [0.0, 1.0, 7.0, 8.0] and b.end.tolist() == [1.0, 2.0, 8.0, 9.0]
    assert per_step(b)["forward"] == [0.5] * 4
    assert per_step(b)["checkpoint"] == [0.0, 0.0, 0.5, 0.0]
    # without an optimizer (inference) the passes are the steps: nothing is cut
    tl = make_timeline(spans, {"batch": [0.0, 1.0, 2.0], "loader_end": [2.1], "eval_end": [2.1]})
    assert step_breakdown(tl).start.tolist() == [0.0, 1.0]


# -- the recorder's rules ----------------------------------------------------


def record(fn: object) -> Timeline:
    tl = Timeline()
    rec = StageRecorder(tl, origin=0.0)
    fn(rec)  # type: ignore[operator]
    rec.close()
    return tl


def names_and_depths(tl: Timeline) -> list[tuple[str, int]]:
    s = tl.spans
    return [(s.name_of(i), int(s.depth[i])) for i in np.argsort(s.start, kind="stable")]


def test_recorder_does_not_nest_a_stage_in_itself() -> None:
    def run(rec: StageRecorder) -> None:
        with rec.stage("forward"), rec.stage("forward"), rec.stage("logging"), rec.stage("forward"):
            pass

    assert names_and_depths(record(run)) == [("forward", 0), ("logging", 1)]


@pytest.mark.parametrize("opaque", ["data", "checkpoint", "comm"])
def test_nothing_builtin_nests_in_data_checkpoint_or_comm(opaque: str) -> None:
    def run(rec: StageRecorder) -> None:
        with rec.stage(opaque):
            with rec.stage("forward"), rec.stage("logging"):
                pass
            with rec.stage("my_transform"):  # the user asked for this one
                pass

    assert names_and_depths(record(run)) == [(opaque, 0), ("my_transform", 1)]


def test_recorder_ignores_other_threads() -> None:
    def run(rec: StageRecorder) -> None:
        def worker() -> None:
            with rec.stage("forward"):
                rec.boundary("user")

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        with rec.stage("backward"):
            pass

    assert names_and_depths(record(run)) == [("backward", 0)]


def test_close_ends_stages_left_open() -> None:
    tl = Timeline()
    rec = StageRecorder(tl, origin=0.0)
    assert rec.enter(rec.stage_id("forward")) and rec.enter(rec.stage_id("logging"))
    rec.close()
    assert sorted(names_and_depths(tl)) == [("forward", 0), ("logging", 1)]


def test_a_closed_recorder_records_nothing_and_stages_open_at_close_end_quietly() -> None:
    tl = Timeline()
    rec = StageRecorder(tl, origin=0.0)
    with rec.stage("epoch"):  # the session stops inside a stage
        rec.close()
    with rec.stage("forward"):  # a wrapper that outlived the session
        rec.boundary("optimizer")
    assert names_and_depths(tl) == [("epoch", 0)]


class FakeDeviceClock:
    """The device reaches each point of its queue ``lag`` seconds after the host (on ``clock``) put it there."""

    def __init__(self, lag: float, clock: FakeClock) -> None:
        self.lag, self.clock = lag, clock
        self.host_times: list[float] = []
        self.reached = float("inf")  # tokens below this one have run on the device
        self.resolved = 0
        self.closed = False

    def event_token(self) -> object:
        self.host_times.append(self.clock.now())
        return len(self.host_times) - 1

    def done(self, token: object) -> bool:
        return int(token) < self.reached  # type: ignore[call-overload]

    def resolve(self, tokens: list[object]) -> list[float | None]:
        self.resolved += len(tokens)
        return [self.host_times[int(k)] + self.lag for k in tokens]  # type: ignore[call-overload]

    def close(self) -> None:
        self.closed = True


def test_device_clock_extends_stages_until_the_device_is_done() -> None:
    fake_clock = FakeClock(start=0.0)  # the fake device's times are the host's, on the timeline's clock
    tl = Timeline()
    rec = StageRecorder(tl, origin=0.0, clock=fake_clock)
    rec.device_clock = FakeDeviceClock(lag=5.0, clock=fake_clock)
    with rec.stage("forward"):
        fake_clock.advance(0.25)
    fake_clock.advance(0.125)
    rec.boundary("optimizer")
    host = tl.spans
    assert (host.start.tolist(), host.end.tolist()) == ([0.0, 0.375], [0.25, 0.375])
    rec.close()
    s = tl.spans
    assert (s.start.tolist(), s.end.tolist()) == (
        [5.0, 5.375],
        [5.25, 5.375],
    )  # the step ends on the device too


def test_a_closed_recorder_has_its_device_clock_free_what_it_holds(
    fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finished session lives on in reference cycles until the collector runs: a child forked before then
    would free the clock's CUDA events there (which aborts it). The parent's recorder has the clock free
    them as it closes; a forked child's copy keeps them."""
    import perfmagic.collect.forked_child as forked_child

    monkeypatch.setattr(forked_child, "_KEPT_BY_FORKED_CHILD", [])  # this process is no forked child
    forked = StageRecorder(Timeline(), origin=0.0, clock=fake_clock)
    kept = forked.device_clock = FakeDeviceClock(lag=0.0, clock=fake_clock)
    forked.stop_recording()
    assert not kept.closed
    rec = StageRecorder(Timeline(), origin=0.0, clock=fake_clock)
    clock = rec.device_clock = FakeDeviceClock(lag=0.0, clock=fake_clock)
    with rec.stage("forward"):
        fake_clock.advance(0.25)
    assert rec.close() == [] and clock.closed and clock.resolved == 2
    assert rec.device_clock is clock  # still there to say which devices its event tokens covered


def test_device_times_that_cannot_be_read_leave_host_times(fake_clock: FakeClock) -> None:
    class BrokenClock(FakeDeviceClock):
        def resolve(self, tokens: list[object]) -> list[float | None]:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    tl = Timeline()
    rec = StageRecorder(tl, origin=0.0, clock=fake_clock)
    rec.device_clock = BrokenClock(lag=5.0, clock=fake_clock)
    with rec.stage("forward"):
        pass
    host = tl.spans
    warnings = rec.close()
    assert tl.spans.end.tolist() == host.end.tolist()
    assert len(warnings) == 1 and "illegal memory access" in warnings[0]


def test_device_spans_of_a_long_run_are_resolved_as_the_device_passes_them(fake_clock: FakeClock) -> None:
    """Hours of training must not keep every CUDA event alive until the end."""
    tl = Timeline()
    rec = StageRecorder(tl, origin=0.0, clock=fake_clock)
    clock = rec.device_clock = FakeDeviceClock(lag=0.5, clock=fake_clock)
    clock.reached = 0  # the device is behind: nothing can be resolved without waiting
    for _ in range(1500):
        with rec.stage("forward"):
            fake_clock.advance(1 / 1024)
        rec.boundary("optimizer")
    assert clock.resolved == 0  # never waited for the device on the hot path
    clock.reached = float("inf")  # the device caught up
    for _ in range(10):
        with rec.stage("forward"):
            fake_clock.advance(1 / 1024)
        rec.boundary("optimizer")
    assert clock.resolved > 0 and rec.pending_device_spans < 2 * 10  # only the spans since the drain
    early = tl.spans
    assert early.end[0] == pytest.approx(clock.host_times[1] + 0.5, abs=1e-6)  # already device-timed
    assert rec.close() == []
    assert tl.spans.end[-1] == pytest.approx(clock.host_times[-1] + 0.5, abs=1e-6)


class InOrderDevice:
    """A device as unkind as a GPU: each event token is reached ``lag`` seconds (of ``clock``) after the host put
    it in the queue, in order, and a query says so only then (a fake that catches up all at once hides
    pile-ups). Resolving waits for the device: the clock moves on to the last token."""

    def __init__(self, lag: float, clock: FakeClock) -> None:
        self.lag, self.clock = lag, clock
        self.queries = 0

    def event_token(self) -> object:
        return self.clock.now() + self.lag

    def done(self, token: object) -> bool:
        self.queries += 1
        return self.clock.now() >= float(token)  # type: ignore[arg-type]

    def resolve(self, tokens: list[object]) -> list[float | None]:
        last = max((float(t) for t in tokens), default=0.0)  # type: ignore[arg-type]
        self.clock.advance(max(0.0, last - self.clock.now()))
        return [float(t) for t in tokens]  # type: ignore[arg-type]

    def close(self) -> None:
        pass


def test_pending_device_spans_stay_bounded_in_a_gpu_bound_loop(fake_clock: FakeClock) -> None:
    """The newest event of a GPU-bound loop is never done: waiting for it let ~20 spans a step pile up.
    Here the device is 2 ms (eight 1/4096 s stages) behind the host, and a drain is due every 2048 spans."""
    from perfmagic.collect.device_times import DRAIN_AT

    tl = Timeline()
    rec = StageRecorder(tl, origin=0.0, clock=fake_clock)
    device = rec.device_clock = InOrderDevice(lag=8 / 4096, clock=fake_clock)
    most = 0
    for _ in range(30_000):
        for stage in ("forward", "backward", "optimizer"):
            with rec.stage(stage):
                fake_clock.advance(1 / 4096)
        rec.boundary("optimizer")
        most = max(most, rec.pending_device_spans)
    assert most <= 2 * DRAIN_AT, most
    assert device.queries < 30_000  # a few queries per drain, not one per span
    assert rec.close() == []


def test_a_span_whose_end_token_is_lost_keeps_its_host_times(fake_clock: FakeClock) -> None:
    class StartsOnly(InOrderDevice):
        def resolve(self, tokens: list[object]) -> list[float | None]:
            return [float(t) + 10.0 if i % 2 == 0 else None for i, t in enumerate(tokens)]  # type: ignore[arg-type]

    tl = Timeline()
    rec = StageRecorder(tl, origin=0.0, clock=fake_clock)
    rec.device_clock = StartsOnly(lag=0.0, clock=fake_clock)
    with rec.stage("forward"):
        pass
    host = tl.spans
    rec.close()
    assert tl.spans.start.tolist() == host.start.tolist() and (tl.spans.end >= tl.spans.start).all()


def test_a_failing_device_event_token_never_masks_the_users_error(fake_clock: FakeClock) -> None:
    class FailingDevice(InOrderDevice):
        calls = 0

        def event_token(self) -> object:
            self.calls += 1
            if self.calls > 1:
                raise RuntimeError("CUDA error: device-side assert triggered")
            return super().event_token()

    tl = Timeline()
    rec = StageRecorder(tl, origin=0.0, clock=fake_clock)
    rec.device_clock = FailingDevice(lag=0.0, clock=fake_clock)
    with pytest.raises(ValueError, match="the user's own"), rec.stage("forward"):
        raise ValueError("the user's own error")
    rec.boundary("optimizer")
    assert rec.device_clock is None
    warnings = rec.close()
    assert any("device-side assert" in w for w in warnings) and len(tl.spans) == 2


@pytest.mark.parametrize("listened", [True, False])
def test_nvtx_ranges_only_when_a_tool_collects_them(listened: bool) -> None:
    """Nsight tools announce themselves in NVTX_INJECTION64_PATH; without one a range costs for nothing."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("NVTX_INJECTION")}
    if listened:
        env["NVTX_INJECTION64_PATH"] = "/nonexistent/libinjection.so"  # as nsys sets it, to its own library
    probe = "import nvtx, perfmagic.collect.recorder as r; print(r._nvtx_push is nvtx.push_range)"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(listened)


STEP_S = 1 / 1024
"""A fast step on the fake clock (a power of two: sums of steps are exact)."""


def test_fast_steps_read_the_thread_clock_sparingly_and_still_get_their_cpu(fake_clock: FakeClock) -> None:
    """A CPU clock read costs a fast loop more than it seems: ~1 ms steps read it once per 10 ms (every 11th
    step end here), and the steps' CPU seconds still add up to what the thread spent (shared by time
    between readings). The fake clock's thread spends 3/4 of its time on a CPU."""
    from perfmagic.collect.thread_series import THREAD_CLOCK_EVERY_S
    from perfmagic.schema import THREAD_CPU

    tl = Timeline()
    rec = StageRecorder(tl, fake_clock.now(), clock=fake_clock)
    for _ in range(200):
        fake_clock.advance(STEP_S)
        rec.boundary("user")
    rec.close()
    every = math.ceil(THREAD_CLOCK_EVERY_S / STEP_S)
    assert every == 11
    # at the start, at every 11th step end, at the close
    assert tl.sample_count(THREAD_CPU) == 1 + 200 // every + 1
    b = step_breakdown(tl)
    assert b.count == 200 and b.cpu_s is not None and b.wait_s is not None
    assert float(b.cpu_s.sum()) == pytest.approx(0.75 * 200 * STEP_S, rel=1e-12)
    np.testing.assert_allclose(b.cpu_s, 0.75 * STEP_S, rtol=1e-9)  # shared by time: every step alike
    assert float(b.wait_s.sum()) == 0.0


def test_a_collection_in_one_fast_step_is_that_steps_alone(fake_clock: FakeClock) -> None:
    """GC seconds are read at every step (a counter in Python): a collection inside one ~1 ms step between
    two clock readings is that step's, not spread over its neighbours. The collection takes 2 ms of the
    fake clock (a callback after the thread clock's own moves it)."""

    def slow_collection(phase: str, _: dict[str, Any]) -> None:
        if phase == "start":
            fake_clock.advance(0.002)

    tl = Timeline()
    rec = StageRecorder(tl, fake_clock.now(), clock=fake_clock)
    gc.disable()  # no collection of the collector's own choosing in the other steps
    gc.callbacks.append(slow_collection)
    try:
        for i in range(40):
            fake_clock.advance(STEP_S)
            if i == 25:
                gc.collect()
            rec.boundary("user")
    finally:
        gc.callbacks.remove(slow_collection)
        gc.enable()
    rec.close()
    b = step_breakdown(tl)
    assert b.gc_s is not None
    assert int(np.argmax(b.gc_s)) == 25 and b.gc_s[25] == pytest.approx(0.002)
    assert float(np.delete(b.gc_s, 25).sum()) == 0.0


def test_a_run_delay_that_outgrows_the_wall_clock_is_held_to_what_the_step_leaves() -> None:
    """The thread clock's readings from a failing run on this VM: the kernel's run delay grew 5.7 ms
    between two readings 1.1 ms apart (a wait timed on two CPUs' scheduler clocks). A step's wait is at
    most its wall time less its CPU time, and the contention card never saves more than a step."""
    from perfmagic.advise import advise
    from perfmagic.schema import THREAD_CPU, THREAD_WAIT

    ms = 1e-3
    spans = [
        ("forward", 17.148 * ms, 17.64 * ms, 0),
        ("backward", 17.672 * ms, 17.927 * ms, 0),
        ("optimizer", 18.002 * ms, 18.089 * ms, 0),
        ("forward", 18.161 * ms, 18.274 * ms, 0),
        ("backward", 18.288 * ms, 18.423 * ms, 0),
        ("optimizer", 18.452 * ms, 18.516 * ms, 0),
        ("forward", 18.561 * ms, 18.641 * ms, 0),
        ("backward", 18.651 * ms, 18.767 * ms, 0),
        ("optimizer", 18.789 * ms, 18.837 * ms, 0),
    ]
    tl = make_timeline(spans, {"optimizer": [18.094 * ms, 18.521 * ms, 18.839 * ms]})
    for t, cpu, wait in [(0.394, 4.69096, 4.41190), (18.094, 4.69548, 4.41992), (19.178, 4.69656, 4.42564)]:
        tl.add_sample(THREAD_CPU, t * ms, cpu)
        tl.add_sample(THREAD_WAIT, t * ms, wait)
    b = step_breakdown(tl)
    assert b.wait_s is not None and b.cpu_s is not None and b.count == 3
    assert np.all(b.cpu_s + b.wait_s <= b.end - b.start + 1e-12), (b.cpu_s, b.wait_s, b.end - b.start)
    assert b.wait_s[1:].sum() > 0  # the wait is kept, only what the step cannot hold goes
    a = analyze([tl])
    card = next((c for c in advise(a).cards if c.id == "cpu_contention"), None)
    assert card is None or card.saving_s < a.steady.step_s, (card, a.steady)
