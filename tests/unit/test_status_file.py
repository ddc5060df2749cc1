"""The session's status file: rates over its window, on times the test gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfmagic.registry import StatusFile


def test_rates_start_at_the_loops_first_step_not_at_the_start_up(tmp_path: Path) -> None:
    """Two seconds of start-up (no step, no batch), then 10 steps a second of 8 samples each, the
    batch counted as it is fetched (a step ahead of the step count): both rates are the loop's."""
    status = StatusFile({"pid": 1}, directory=tmp_path)
    for tick in range(60):
        now, steps = tick / 10, max(0, tick - 20)
        status.publish(steps, "forward", dict, now=now, samples=8.0 * (steps + 1) if tick >= 20 else None)
    written = json.loads(status.path.read_text())
    assert written["steps_per_s"] == pytest.approx(10.0)
    assert written["samples_per_s"] == pytest.approx(80.0)


def test_samples_per_step_are_whole_though_the_first_batch_came_long_before_the_first_step(
    tmp_path: Path,
) -> None:
    """The first batch is fetched at once, the first step ends a second later (the first forward's
    start-up); from then on 10 steps a second: 8 samples per step, not more."""
    status = StatusFile({"pid": 1}, directory=tmp_path)
    for tick in range(30):
        now = tick / 10
        steps = 0 if tick < 10 else tick - 9
        status.publish(steps, "forward", dict, now=now, samples=8.0 * (steps + 1))
    written = json.loads(status.path.read_text())
    assert written["samples_per_s"] == pytest.approx(8 * written["steps_per_s"])


def test_no_rate_before_the_loop_and_no_samples_rate_where_samples_are_not_counted(tmp_path: Path) -> None:
    status = StatusFile({"pid": 1}, directory=tmp_path)
    for tick in range(20):
        status.publish(0, None, dict, now=tick / 10)
    assert json.loads(status.path.read_text())["steps_per_s"] is None
    for tick in range(20, 40):
        status.publish(tick, None, dict, now=tick / 10)
    written = json.loads(status.path.read_text())
    assert written["steps_per_s"] == pytest.approx(10.0) and written["samples_per_s"] is None
