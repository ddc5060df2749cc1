"""The step policy: which evidence delimits the steps, and how each kind cuts them."""

from __future__ import annotations

import itertools

import pytest
from test_steps import make_timeline

from perfmagic.analyze import analyze
from perfmagic.analyze.steps import step_breakdown
from perfmagic.collect.recorder import StageRecorder
from perfmagic.step_policy import EVIDENCE, delimiting_kind
from perfmagic.timeline import Timeline

FORWARDS = [("forward", t, t + 0.25, 0) for t in (0.0, 1.0, 2.0, 3.0)]
"""Four forwards a second apart; each kind below marks the same four iterations its own way."""

MARKED = {
    "profiler_step": [1.0, 2.0, 3.0, 4.0],
    "user": [0.9, 1.9, 2.9, 3.9],
    "optimizer": [0.8, 1.8, 2.8, 3.8],
    "batch": [0.0, 1.0, 2.0, 3.0, 4.0],
    "backward": [0.5, 1.5, 2.5, 3.5],
}


def test_the_evidence_order_is_documented_and_complete() -> None:
    assert EVIDENCE == ("profiler_step", "user", "optimizer", "batch", "backward")
    assert set(MARKED) == set(EVIDENCE)
    assert delimiting_kind([]) is None


@pytest.mark.parametrize("stronger, weaker", list(itertools.combinations(EVIDENCE, 2)))
def test_the_stronger_evidence_delimits_every_step(stronger: str, weaker: str) -> None:
    tl = make_timeline(FORWARDS, {stronger: MARKED[stronger], weaker: MARKED[weaker]})
    b = step_breakdown(tl)
    assert b.boundary == delimiting_kind([weaker, stronger]) == stronger
    assert b.end.tolist() == (MARKED[stronger][1:] if stronger == "batch" else MARKED[stronger])


@pytest.mark.parametrize("kind", [k for k in EVIDENCE if k != "batch"])
def test_boundaries_other_than_batches_end_steps(kind: str) -> None:
    b = step_breakdown(make_timeline(FORWARDS, {kind: MARKED[kind]}))
    assert b.count == 4 and b.start.tolist() == [0.0, *MARKED[kind][:-1]]
    assert b.column("forward").tolist() == [0.25] * 4


def test_batch_boundaries_start_steps() -> None:
    b = step_breakdown(make_timeline(FORWARDS, {"batch": MARKED["batch"]}))
    assert (b.start.tolist(), b.end.tolist()) == ([0.0, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0])


def test_an_evaluation_pass_is_cut_out_of_backward_rhythm_steps() -> None:
    spans = [*FORWARDS, ("forward", 1.6, 1.7, 0)]  # an evaluation forward inside [1.55, 1.8]
    tl = make_timeline(spans, {"backward": MARKED["backward"], "eval_start": [1.55], "eval_end": [1.8]})
    b = step_breakdown(tl)
    assert b.start.tolist() == [0.0, 0.5, 1.8, 2.5] and b.end.tolist() == [0.5, 1.55, 2.5, 3.5]


def record_boundaries(kinds: list[str]) -> StageRecorder:
    recorder = StageRecorder(Timeline(), origin=0.0)
    for kind in kinds:
        if kind != "backward" or recorder.rhythm_wanted:  # what the backward hook does
            recorder.boundary(kind)
    return recorder


def test_the_recorder_marks_the_rhythm_until_stronger_evidence_appears() -> None:
    rec = record_boundaries(["backward", "backward", "optimizer", "backward", "optimizer", "backward"])
    assert rec.boundary_counts == {"backward": 2, "optimizer": 2} and rec.step_count == 2
    rec = record_boundaries(["batch", "backward", "batch", "backward"])
    assert rec.boundary_counts == {"batch": 2} and not rec.rhythm_wanted
    rec = record_boundaries(["backward"] * 35)
    assert rec.step_count == 35 and rec.rhythm_wanted
    rec = record_boundaries(["eval_start", "eval_end", "loader_end", "backward"])
    assert rec.boundary_counts["backward"] == 1, "an evaluation pass is no evidence of steps"


def test_boundaries_marked_late_and_at_once_are_counted_together() -> None:
    """An evaluation pass's start is marked once the pass is over (``boundary_at``), its end at once:
    each kind counts all of its boundaries, whichever came first."""
    rec = StageRecorder(Timeline(), origin=0.0)
    rec.boundary_at("eval_start", 0.1)
    rec.boundary("eval_start")
    rec.boundary("eval_end")
    rec.boundary_at("eval_end", 0.2)
    assert rec.boundary_counts == {"eval_start": 2, "eval_end": 2}


def test_an_explicit_step_wins_over_the_optimizer_in_the_recorder_too() -> None:
    rec = record_boundaries(["batch", "optimizer", "user", "batch", "optimizer", "user"])
    assert rec.step_count == 2
    assert step_breakdown(rec.timeline).boundary == "user"


def test_no_evidence_gives_no_steps_and_a_warning_that_says_what_to_add() -> None:
    a = analyze([make_timeline(FORWARDS)])
    assert a.steps.count == 0 and a.steps.boundary is None
    (warning,) = [w for w in a.warnings if "no training steps" in w]
    assert "perfmagic.step()" in warning and "backward pass" in warning


def test_steps_say_which_evidence_delimited_them() -> None:
    assert analyze([make_timeline(FORWARDS, {"backward": MARKED["backward"]})]).steps.boundary == "backward"
