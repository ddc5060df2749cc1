"""The session's status file: rates over its window, on times the test gives; written only while read."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from perfmagic.registry import StatusFile, mark_read, running_sessions


@pytest.fixture(autouse=True)
def read(tmp_path: Path) -> None:
    """The registry was just read, as by an exporter: sessions write."""
    mark_read(tmp_path)


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


def test_a_registry_no_one_reads_gets_no_writes_and_no_stage_totals(tmp_path: Path) -> None:
    """Last read longer ago than READ_WITHIN_S: the session only counts its steps. The first read
    after it gets the file within a second, rates and totals whole."""
    os.utime(tmp_path / "reader", (0, 0))  # read in 1970
    asked: list[float] = []

    def stage_seconds() -> dict[str, float]:
        asked.append(1.0)
        return {"forward": float(len(asked))}

    status = StatusFile({"pid": 1}, directory=tmp_path)
    for tick in range(50):
        status.publish(tick, "forward", stage_seconds, now=tick / 10)
    assert not status.path.exists() and asked == []

    mark_read(tmp_path)
    status.publish(50, "forward", stage_seconds, now=5.0)
    assert json.loads(status.path.read_text())["stage_seconds"] == {"forward": 1.0}
    for tick in range(51, 61):
        status.publish(tick, "forward", stage_seconds, now=tick / 10)
    written = json.loads(status.path.read_text())
    assert written["steps"] == 60 and written["steps_per_s"] == pytest.approx(10.0)
    assert written["stage_seconds"] == {"forward": 2.0} and len(asked) == 2


def test_listing_the_sessions_marks_the_registry_read_even_before_it_exists(tmp_path: Path) -> None:
    """An exporter started before any session: the session it later finds writes at once."""
    directory = tmp_path / "sessions"
    assert running_sessions(directory) == []
    status = StatusFile({"pid": os.getpid()}, directory=directory)
    status.publish(1, "forward", dict, now=0.0)
    assert status.path.exists()
