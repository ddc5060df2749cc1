"""Pinning a profiler's clock to ours: the annotation read most tightly, and its midpoint."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from perfmagic.collect.clock_pin import PINS, marker_midpoint_us, pin_clock


def test_the_pin_read_most_tightly_is_kept_at_its_midpoint() -> None:
    # our readings before and after each annotation: the first pin was preempted for 5 ms
    readings = iter([10.000, 10.005, 10.010, 10.01002, 10.020, 10.02004])
    opened: list[str] = []

    @contextlib.contextmanager
    def annotate(name: str) -> Iterator[None]:
        opened.append(name)
        yield

    name, t = pin_clock(annotate, lambda: next(readings))
    assert opened == [f"perfmagic.clock.{k}" for k in range(PINS)]
    assert name == "perfmagic.clock.1" and abs(t - 10.01001) < 1e-9


def test_the_marker_midpoint_is_read_from_the_trace_by_name() -> None:
    events = [
        {"ph": "X", "name": "perfmagic.clock.0", "ts": 100.0, "dur": 5000.0},
        {"ph": "X", "name": "perfmagic.clock.1", "ts": 6000.0, "dur": 20.0},
    ]
    assert marker_midpoint_us(events, "perfmagic.clock.1") == 6010.0
    assert marker_midpoint_us(events, "perfmagic.clock.2") is None
    assert marker_midpoint_us([{"name": "perfmagic.clock", "ts": 7.0}], "perfmagic.clock") == 7.0
