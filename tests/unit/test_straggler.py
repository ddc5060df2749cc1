"""A straggler is a rank slow at its own work, not one a busy machine kept from a CPU."""

from __future__ import annotations

import numpy as np

from perfmagic.analyze.ranks import find_straggler
from perfmagic.analyze.steady import Steady

STEPS = 30


def rank(data_s: float, comm_s: float, queued_s: float | None = None) -> Steady:
    """A rank's steady steps: ``data_s`` of loading, 2 ms of forward, ``comm_s`` waiting in comm; of its
    steps, ``queued_s`` ready to run but without a CPU (its run delay, as read; None: unmeasured)."""
    seconds = np.column_stack([np.full(STEPS, data_s), np.full(STEPS, 0.002), np.full(STEPS, comm_s)])
    wait = None if queued_s is None else np.full(STEPS, queued_s)
    return Steady(0, seconds.sum(axis=1), seconds, ["data", "forward", "comm"], 0.0, 1.0, wait_s=wait)


def test_a_rank_that_waited_for_a_cpu_is_no_straggler() -> None:
    # balanced ranks on a 2-core machine beside other load: rank 1 got less CPU, its loading took 4 ms
    # longer, 3.6 ms of which it was ready to run and queued; rank 0 waited for it in comm
    starved = [(0, rank(0.001, 0.004, queued_s=0.0002)), (1, rank(0.005, 0.0, queued_s=0.0038))]
    assert find_straggler(starved) is None


def test_a_rank_slow_at_its_own_work_is_the_straggler() -> None:
    slow = [(0, rank(0.001, 0.004, queued_s=0.0002)), (1, rank(0.005, 0.0, queued_s=0.0003))]
    found = find_straggler(slow)
    assert found is not None and (found.rank, found.stage) == (1, "data")


def test_without_run_delays_the_work_alone_decides() -> None:
    found = find_straggler([(0, rank(0.001, 0.004)), (1, rank(0.005, 0.0))])
    assert found is not None and found.rank == 1
