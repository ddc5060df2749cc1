"""The cards as one plan: marginal savings that add up, one value per knob, intervals from the steps."""

from __future__ import annotations

import numpy as np
import pytest

from perfmagic.advise.card import Card, make_card
from perfmagic.advise.catalog import STAGE_OF
from perfmagic.advise.plan import knob_changes, plan_of
from perfmagic.analyze.steady import Steady

STAGES = ["data", "forward", "backward", "optimizer", "other"]


def steady(per_step: dict[str, list[float]]) -> Steady:
    """Steps whose stages take the given seconds (one list per stage, one value per step)."""
    seconds = np.array([per_step.get(name, [0.0] * len(next(iter(per_step.values())))) for name in STAGES]).T
    durations = seconds.sum(axis=1)
    return Steady(0, durations, seconds, STAGES, 0.0, float(durations.sum()))


def card(id: str, saving_s: float, step_s: float, fix: str = "pass") -> Card:
    return make_card(id, id, "measured", fix, {}, saving_s=saving_s, step_s=step_s, model="test")


def test_two_fixes_of_the_data_wait_do_not_both_take_it() -> None:
    # 40 ms of data in a 50 ms step: workers would save 35 ms alone, prefetching 30 ms alone
    s = steady({"data": [0.040] * 10, "forward": [0.006] * 10, "backward": [0.004] * 10})
    cards = [card("dataloader_workers", 0.035, 0.050), card("input_bound", 0.030, 0.050)]
    plan, out = plan_of(cards, s, STAGE_OF)
    assert plan is not None
    assert [c.saving_s for c in out] == pytest.approx([0.035, 0.005])
    assert out[1].metrics["saving_alone_s"] == pytest.approx(0.030)
    # the savings add up to the observed step less the plan's predicted one
    assert sum(c.saving_s or 0 for c in out) == pytest.approx(plan.step_s - plan.predicted_step_s)
    assert [c.step_s for c in plan.changes] == pytest.approx([0.015, 0.010])
    assert out[0].severity == "high" and out[1].severity == "low"  # 10% of the step: demoted from high


def test_fixes_of_the_whole_step_never_promise_more_than_the_step() -> None:
    s = steady({"data": [0.010] * 8, "forward": [0.030] * 8, "backward": [0.020] * 8})
    cards = [card(f"whole_{k}", 0.036, 0.060) for k in range(3)]  # each claims 60% of the step
    plan, out = plan_of(cards, s, STAGE_OF)
    assert plan is not None and plan.predicted_step_s >= 0
    assert sum(c.saving_s or 0 for c in out) == pytest.approx(0.060 - plan.predicted_step_s)
    assert plan.predicted_step_s == pytest.approx(0.0, abs=1e-12)
    assert out[2].saving_s == pytest.approx(0.0, abs=1e-12)


def test_a_card_that_sets_a_knob_otherwise_is_set_aside_with_its_reason() -> None:
    s = steady({"data": [0.040] * 5, "forward": [0.010] * 5})
    more = card("dataloader_workers", 0.030, 0.050, "DataLoader(ds, num_workers=4,  # was 0\n)")
    fewer = card("cpu_contention", 0.010, 0.050, "DataLoader(ds, num_workers=1,  # was 0\n)")
    plan, out = plan_of([more, fewer], s, STAGE_OF)
    assert plan is not None and [c.id for c in out] == ["dataloader_workers"]
    assert plan.set_aside[0].id == "cpu_contention"
    assert "num_workers=1" in plan.set_aside[0].reason and "num_workers=4" in plan.set_aside[0].reason


def test_a_saving_is_uncertain_where_the_steps_spread_wider_than_a_quarter_of_it() -> None:
    # the same mean wait, once steady and once alternating between a ready batch and a long wait
    even = steady({"data": [0.020] * 10, "forward": [0.010] * 10})
    uneven = steady({"data": [0.002, 0.038] * 5, "forward": [0.010] * 10})
    (plan_even, _), (plan_uneven, _) = (
        plan_of([card("input_bound", 0.018, 0.030)], s, STAGE_OF) for s in (even, uneven)
    )
    assert plan_even is not None and plan_uneven is not None
    assert not plan_even.changes[0].uncertain
    assert plan_even.changes[0].low_s == pytest.approx(0.018)
    change = plan_uneven.changes[0]
    assert change.uncertain and change.low_s < 0.018 * 0.75 and change.high_s > 0.018 * 1.25


def test_a_measured_interval_is_kept_and_scaled_to_the_marginal_saving() -> None:
    s = steady({"data": [0.040] * 5, "forward": [0.010] * 5})
    first = card("input_bound", 0.030, 0.050)
    measured = make_card(
        "dataloader_workers",
        "t",
        "e",
        "pass",
        {"saving_interval_s": [0.016, 0.024]},
        saving_s=0.020,
        step_s=0.050,
        model="measured",
    )
    plan, out = plan_of([first, measured], s, STAGE_OF)
    assert plan is not None
    assert out[1].saving_s == pytest.approx(0.010)  # 10 ms of data left
    assert out[1].metrics["saving_interval_s"] == pytest.approx([0.008, 0.012])


def test_cards_without_a_per_step_saving_take_no_part() -> None:
    s = steady({"data": [0.010] * 5, "forward": [0.010] * 5})
    info = make_card("numa_affinity", "t", "e", "pass", {}, saving_s=None, step_s=0.020, model=None)
    once = make_card(
        "slow_startup", "t", "e", "pass", {"one_time_s": 3.0}, saving_s=3.0, step_s=0.020, model="x"
    )
    plan, out = plan_of([info, once], s, STAGE_OF)
    assert plan is not None and plan.changes == [] and out == [info, once]


def test_knob_changes_read_the_fix_as_pasted() -> None:
    fix = "loader = DataLoader(ds,\n    num_workers=2,  # was 0\n)\ntorch.set_num_threads(1)  # was 2\n"
    assert knob_changes(fix) == {"num_workers": ("2", "0"), "torch.set_num_threads": ("1", "2")}
