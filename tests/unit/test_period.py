"""The interval slow steps recur at, through the slow steps a busy machine adds at random."""

from __future__ import annotations

import numpy as np

from perfmagic.advise.pace import _folded, _period

EVERY_8 = list(range(7, 160, 8))


def test_periodic_slow_steps_give_their_interval() -> None:
    assert _period(np.array(EVERY_8)) == 8


def test_random_slow_steps_beside_periodic_ones_leave_the_interval() -> None:
    # a busy machine's preemptions split the gaps of the periodic evaluation (8, 8, 3, 5, 8, ...)
    noisy = sorted([*EVERY_8, 3, 12, 13, 40, 41, 77, 97, 130])
    assert _period(np.array(noisy)) == 8


def test_random_slow_steps_alone_and_a_slow_phase_have_none() -> None:
    assert _period(np.array([6, 18, 22, 50, 51, 87, 119, 120, 159])) is None
    assert _period(np.arange(50, 61)) is None
    rng = np.random.default_rng(0)
    draws = [np.sort(rng.choice(200, rng.integers(3, 20), replace=False)) for _ in range(2000)]
    assert sum(_period(d) is not None for d in draws) <= 10  # what the gap rule alone says of them


def test_work_every_8_steps_is_found_by_folding_through_a_busy_machines_slow_steps() -> None:
    rng = np.random.default_rng(3)
    durations = np.full(160, 0.006)
    durations[rng.random(160) < 0.2] = 0.020  # a neighbour's slow steps, at random
    durations[7::8] = 0.045  # the evaluation
    found = _folded(durations)
    assert found is not None and found[0] == 8 and list(found[1][:3]) == [7, 15, 23]


def test_random_slow_steps_fold_on_no_interval() -> None:
    rng = np.random.default_rng(4)
    for _ in range(200):
        durations = np.full(160, 0.006)
        durations[rng.random(160) < 0.2] = 0.020
        assert _folded(durations) is None


def test_work_every_8_steps_is_found_beside_runs_of_slow_steps_on_most_phases() -> None:
    # two busy cores: a third of the steps slow, in runs, so that every phase has a few
    durations = np.full(160, 0.006)
    for start in range(0, 160, 12):
        durations[start + 1 : start + 5] = 0.020
    durations[7::8] = 0.045  # the evaluation
    found = _folded(durations)
    assert found is not None and found[0] == 8
    alone = durations.copy()
    alone[7::8] = 0.006
    assert _folded(alone) is None  # the runs alone recur every 12 steps, on 4 of its phases
