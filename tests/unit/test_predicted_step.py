"""Tuning's predicted step: the measured ratio of the settings it timed, applied to the observed step."""

from __future__ import annotations

import pytest

from perfmagic.contract import KnobResult, Trial
from perfmagic.tuning import predicted_step
from perfmagic.tuning.result import knob_result


def workers(base_s: float, best_s: float) -> list[KnobResult]:
    tried: list[Trial] = [{"value": 0, "seconds": base_s}, {"value": 2, "seconds": best_s}]
    return [knob_result("num_workers", "seconds per step", tried, tried[0], tried[1], [])]


def test_load_drift_between_profile_and_tuning_falls_on_both_settings() -> None:
    # the profile saw a 20 ms step (2 ms outside the benchmarked stages); tuning, on a quieter moment,
    # timed 10 ms now and 4 ms with two workers: the two workers take 60% off the part they can change
    step = predicted_step(workers(0.010, 0.004), step_s=0.020, data_s=0.012, extra_s=0.002)
    assert step is not None and step["best"] is not None
    assert step["best"]["seconds"] == pytest.approx(0.002 + 0.018 * 0.4)
    assert step["best"]["value"] == {"num_workers": 2}
    assert "ratio" in step["notes"][0]


def test_a_prediction_on_a_steady_machine_is_the_timed_step() -> None:
    step = predicted_step(workers(0.010, 0.004), step_s=0.012, data_s=0.006, extra_s=0.002)
    assert step is not None and step["best"] is not None
    assert step["best"]["seconds"] == pytest.approx(0.004 + 0.002)  # the best step timed, and the rest
