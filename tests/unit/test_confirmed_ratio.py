"""The best worker count timed again beside the baseline in alternating slices, on a fake clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from perfmagic.contract import KnobResult, Trial
from perfmagic.tuning import predicted_step
from perfmagic.tuning.pairs import MIN_PAIRS, confirmed_ratio, described, saving_interval
from perfmagic.tuning.result import knob_result
from tests.fakeclock import FakeClock


class PacedLoader:
    """A loader whose every batch takes ``batch_s`` times the machine's pace at that moment.

    ``pace`` is shared between loaders: a neighbour that starts part-way slows both alike.
    """

    prefetch_factor = 2

    def __init__(self, clock: FakeClock, batch_s: float, pace: list[float], workers: int = 0, n: int = 10**6):
        self.clock, self.batch_s, self.pace, self.num_workers, self.n = clock, batch_s, pace, workers, n
        self.passes = 0

    def __iter__(self) -> Iterator[int]:
        self.passes += 1
        for i in range(self.n):
            self.clock.advance(self.batch_s * self.pace[0])
            yield i


def slowed_after(clock: FakeClock, pace: list[float], at_s: float, factor: float) -> None:
    """A neighbour that starts at ``at_s`` and makes every batch ``factor`` times slower."""
    if clock.now() >= at_s:
        pace[0] = factor


def test_a_neighbour_starting_mid_way_falls_on_both_settings(fake_clock: FakeClock) -> None:
    pace = [1.0]
    base = PacedLoader(fake_clock, 0.010, pace)
    best = PacedLoader(fake_clock, 0.004, pace, workers=2)
    confirmed = confirmed_ratio(
        base,
        best,
        budget_s=6.0,
        work=lambda batch: slowed_after(fake_clock, pace, 3.0, 2.5),
        now=fake_clock.now,
    )
    assert confirmed is not None and confirmed["pairs"] >= MIN_PAIRS
    # timed one after the other, the slowdown would land on one setting; in alternating pairs the
    # ratio stays what the settings differ by (one pair may straddle the change)
    assert confirmed["ratio"] == pytest.approx(0.4, rel=0.02)
    assert confirmed["low"] <= confirmed["ratio"] <= confirmed["high"]


def test_a_short_pass_starts_anew_and_the_pair_it_cut_is_dropped(fake_clock: FakeClock) -> None:
    pace = [1.0]
    base = PacedLoader(fake_clock, 0.010, pace, n=30)  # ends every ~1.5 slices
    best = PacedLoader(fake_clock, 0.005, pace, workers=1, n=10**6)
    confirmed = confirmed_ratio(base, best, budget_s=4.0, now=fake_clock.now)
    assert confirmed is not None and base.passes > 1
    assert confirmed["ratio"] == pytest.approx(0.5, rel=0.01)


def test_too_little_budget_for_three_pairs_confirms_nothing(fake_clock: FakeClock) -> None:
    pace = [1.0]
    base, best = PacedLoader(fake_clock, 0.010, pace), PacedLoader(fake_clock, 0.005, pace, workers=1)
    assert confirmed_ratio(base, best, budget_s=0.9, now=fake_clock.now) is None


def test_the_promise_and_its_interval_follow_the_pairs() -> None:
    tried: list[Trial] = [{"value": 0, "seconds": 0.010}, {"value": 4, "seconds": 0.003}]
    result: KnobResult = knob_result("num_workers", "seconds per step", tried, tried[0], tried[1], [])
    # the scan's lead (0.3) was partly luck: timed in pairs the four workers take half the time
    result["confirmed"] = {"pairs": 7, "ratio": 0.5, "low": 0.4, "high": 0.6}
    step = predicted_step([result], step_s=0.022, data_s=0.015, extra_s=0.002)
    assert step is not None and step["best"] is not None
    assert step["best"]["seconds"] == pytest.approx(0.002 + 0.020 * 0.5)
    assert step["interval_s"] == pytest.approx([0.002 + 0.020 * 0.4, 0.002 + 0.020 * 0.6])
    assert "7 alternating pairs" in step["notes"][0]
    # what the card promises to save: the observed step less the predicted one, at both ends
    assert saving_interval(0.022, step) == pytest.approx([0.022 - 0.014, 0.022 - 0.010])
    assert described(result["confirmed"], 4, 0) == (
        "4 workers against 0 in 7 alternating pairs: 0.50 of the time (p10–p90 0.40–0.60)"
    )
