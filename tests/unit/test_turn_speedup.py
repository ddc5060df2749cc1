"""What tuning promises for settings timed in turns: turn by turn, not median against median."""

from __future__ import annotations

import pytest

from perfmagic.contract import KnobResult
from perfmagic.tuning.compute import median_turn, turn_speedup
from perfmagic.tuning.result import knob_result, seconds_saved

# The machine was quiet for the best setting's second turn only: each turn the best took half the
# baseline's time, yet its median turn is a quarter of the baseline's.
BASELINE = [1.0, 2.0, 2.0]
BEST = [0.5, 0.5, 1.0]


def test_the_speedup_is_the_median_of_each_turns_ratio() -> None:
    assert median_turn(BASELINE) / median_turn(BEST) == pytest.approx(4.0)  # what medians would promise
    assert turn_speedup(BASELINE, BEST) == pytest.approx(2.0)


def test_a_batch_twice_as_large_is_compared_per_sample() -> None:
    """The doubled batch's step takes the same time as the baseline's: twice the samples a second."""
    assert turn_speedup([1.0, 1.0, 1.0], [1.0, 1.1, 0.9], samples=2.0) == pytest.approx(2.0)


def test_the_seconds_saved_follow_the_speedup() -> None:
    result: KnobResult = knob_result(
        "num_threads",
        "seconds per step",
        [{"value": 8, "seconds": 2.0}, {"value": 1, "seconds": 0.5}],
        {"value": 8, "seconds": 2.0},
        {"value": 1, "seconds": 0.5},
        [],
    )
    result["speedup"] = turn_speedup(BASELINE, BEST)
    assert seconds_saved(result) == pytest.approx(1.0)  # 2 s a step, twice as fast: 1 s saved, not 1.5
    result["best"] = None
    assert seconds_saved(result) is None
