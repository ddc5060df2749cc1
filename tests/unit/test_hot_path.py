"""The hot path's budget: the Python calls perfmagic adds to each step of a plain training loop.

A fast step's cost follows them, about 1–2 µs each in place (``benchmarks/hot_path_calls.py``,
README *Measured*). They are counted, not timed, so the test holds on a busy machine.
"""

from __future__ import annotations

import collections
import math
import sys

import pytest
from paths import BENCHMARKS

import perfmagic
from perfmagic.collect import schedule, thread_series, torch_data

sys.path.insert(0, str(BENCHMARKS))
from hot_path_calls import python_calls

ADDED_CALLS_BUDGET = 44
"""Python calls perfmagic may add to a step of DataLoader, forward, loss, backward and SGD, the thread clock's
periodic reads left out: 43.0 with the first step's one-time records (the model, the optimizer, the
DataLoader and where the user built it) and the memory probe's one sampled step
(``collect.torch_memory``) spread over 200. Ten of them are the trampolines through which torch's
functions reach the wrappers, one a hooked call: switching the functions' code rather than the
classes' attributes keeps every class as it is (``collect.windowed_hooks``). That is a fully recorded step's: the first 200 steps and
30 s, and 5 steps in every 53 after them (``collect.schedule``)."""

OUTSIDE_WINDOWS_BUDGET = 4
"""Python calls perfmagic may add to the same step outside the recording windows: the optimizer step's
wrapper, which notes the step's end; the ends noted are written together every few steps
(``collect.quick_ends``). 3.05 with the first step's records spread over 200; its own span is timed in
the windows only."""


def added_calls(steps: int) -> tuple[float, collections.Counter[tuple[str, str]]]:
    """Python calls perfmagic adds per step of ``steps`` plain steps, and by function over all of them."""
    python_calls(8)  # first calls: imports and caches, in neither count
    plain = python_calls(steps)
    with perfmagic.profile(sample=False) as session:
        profiled = python_calls(steps)
    added = profiled.copy()
    added.subtract(plain)
    assert session.report.steps["count"] == steps, session.report.warnings
    return (sum(profiled.values()) - sum(plain.values())) / steps, added


@pytest.fixture(autouse=True)
def no_periodic_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    # the thread's clocks are read every 10 ms, as many calls a step as the steps are short: left out here
    monkeypatch.setattr(thread_series, "THREAD_CLOCK_EVERY_S", math.inf)
    monkeypatch.setattr(torch_data, "DATA_CPU_EVERY_S", math.inf)


def test_a_plain_step_gets_no_more_python_calls_than_its_budget() -> None:
    steps = 200
    per_step, added = added_calls(steps)
    assert per_step <= ADDED_CALLS_BUDGET, [(f, round(n / steps, 2)) for f, n in added.most_common(12)]
    # and the hooks are there: a step is recorded (the count is not low for want of them)
    assert sum(n for (file, _), n in added.items() if file == "recorder.py") >= 10 * steps


def test_a_step_outside_the_windows_gets_a_few_python_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    # no full start and no window: every step after the first is one outside the windows
    monkeypatch.setattr(schedule, "FULL_STEPS", 0)
    monkeypatch.setattr(schedule, "FULL_SECONDS", 0.0)
    monkeypatch.setattr(schedule, "WINDOW", 0)
    steps = 200
    per_step, added = added_calls(steps)
    assert per_step <= OUTSIDE_WINDOWS_BUDGET, [(f, round(n / steps, 2)) for f, n in added.most_common(12)]
    # each step's end is still marked (the report counted every step), its forward is not
    assert added[("torch_forward.py", "call")] <= 7
