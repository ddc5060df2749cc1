"""The stage recorder's fast nesting check agrees with the rule, ``schema.nests_inside``."""

from __future__ import annotations

import random

import pytest

from perfmagic.collect.recorder import StageRecorder
from perfmagic.schema import STAGES, nests_inside
from perfmagic.timeline import Timeline

USER_STAGES = ("epoch", "my_transform", "eval")


@pytest.mark.parametrize("seed", range(20))
def test_recorder_records_exactly_what_nests_inside_allows(seed: int) -> None:
    """Random nested enters and exits of built-in and user stages, as hooks and ``perfmagic.stage`` make them."""
    rng = random.Random(seed)
    tl = Timeline()
    rec = StageRecorder(tl, origin=0.0)
    frames: list[tuple[str, bool]] = []  # (stage, recorded) of every enter not yet exited
    expected: list[tuple[str, int]] = []  # (stage, depth) of the recorded spans, in the order they close
    enters = 0
    for _ in range(400):
        if frames and rng.random() < 0.45:
            stage, recorded = frames.pop()
            if recorded:
                rec.exit()
                expected.append((stage, sum(r for _, r in frames)))
            continue
        stage = rng.choice(STAGES + USER_STAGES)
        open_stages = [s for s, r in frames if r]
        recorded = rec.enter(rec.stage_id(stage))
        assert recorded == nests_inside(stage, open_stages), (stage, open_stages)
        assert rec.current_stage == (stage if recorded else (open_stages[-1] if open_stages else None))
        frames.append((stage, recorded))
        enters += 1
    rec.close()  # ends the stages left open, innermost first
    while frames:
        stage, recorded = frames.pop()
        if recorded:
            expected.append((stage, sum(r for _, r in frames)))

    spans = tl.spans
    assert [(spans.name_of(i), int(spans.depth[i])) for i in range(len(spans))] == expected
    # the sequences reach both outcomes of the rule, for built-in and for user stages
    assert enters > len(expected) > 0
    assert {name for name, _ in expected} & set(USER_STAGES)
