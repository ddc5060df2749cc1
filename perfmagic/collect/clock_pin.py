"""Where a profiler's clock stands on ours: an annotation in its trace, read between two of our readings.

A profiler (torch.profiler, TensorFlow's, JAX's) times its events on its own clock. An annotation
opened and closed between two readings of ours is one event both clocks saw: its midpoint in the
trace is the midpoint of our readings, give or take half the time between them. A thread preempted
between the readings (a busy machine) widens that to milliseconds, so a few annotations are made
and the one read most tightly is kept, by its own name.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

CLOCK_LABEL = "perfmagic.clock"
"""The annotations' names begin with it; a report's trace names the one it pins (``clock_name``)."""

PINS = 3
"""Annotations made: all of them preempted is unlikely where one of them is."""


def pin_clock(
    annotate: Callable[[str], AbstractContextManager[Any]], now: Callable[[], float]
) -> tuple[str, float]:
    """Open and close :data:`PINS` annotations (``annotate(name)``), each between two readings of ``now``;
    returns the name of the one read most tightly and our time of its midpoint."""
    pins = []
    for k in range(PINS):
        name = f"{CLOCK_LABEL}.{k}"
        before = now()
        with annotate(name):
            pass
        after = now()
        pins.append((after - before, name, (before + after) / 2))
    _, name, t = min(pins)
    return name, t


def marker_midpoint_us(events: list[dict[str, Any]], name: str) -> float | None:
    """The midpoint (µs, on the profiler's clock) of the trace event ``name``; None where it is not there."""
    marker = next((e for e in events if e.get("name") == name and "ts" in e), None)
    if marker is None:
        return None
    return float(marker["ts"]) + float(marker.get("dur") or 0.0) / 2
