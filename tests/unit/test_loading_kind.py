"""What a data wait is: CPU demand (computing or queued for a CPU), blocked loaders, or the hand-over.

The shares replay what the training thread's clocks measured over its fetches: on a CPU, and runnable
without one (the scheduler's run delay).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from analysis_builder import HEALTHY, LOADER, accounted, build

from perfmagic.advise import data
from perfmagic.advise.loading import loading_kind
from perfmagic.analyze import Analysis

TWO_CPUS = {"cpu_count": 2, "affinity": [0, 1], "physical_cores": 2}


def measured(on_cpu: float | None, waiting: float | None, workers: int = 0, **means: float) -> Analysis:
    """A run input-bound on 30 ms of data per step, its fetches measured as given."""
    a = build(
        stages={**HEALTHY, "data": 0.03},
        loader={**LOADER, "num_workers": workers},
        host={**build().host, **TWO_CPUS},
    )
    loop = dataclasses.replace(a.loop, data_cpu_share=on_cpu, data_wait_share=waiting)
    return accounted(a, loop=loop, steady_means={**a.steady_means, **means})


def card_text(a: Analysis, rule: Any) -> str:
    card = rule(a)
    return f"{card.evidence}\n{card.fix}" if card is not None else ""


def test_a_loader_queued_for_a_cpu_is_cpu_bound_not_waiting_on_io() -> None:
    # a CPU-bound __getitem__ beside a busy process: on a CPU 37% of the wait, queued for one 60%
    a = measured(0.37, 0.60)
    assert loading_kind(a) == "cpu"
    text = card_text(a, data.input_bound)
    assert "CPU-bound" in text and "waited for a CPU 60%" in text and "I/O" not in text
    workers = data.dataloader_workers(a)
    assert workers is None or workers.metrics["loading"] == "cpu"
    assert workers is None or "need no CPU" not in workers.evidence


def test_a_loader_that_sleeps_is_blocked() -> None:
    a = measured(0.04, 0.01)
    assert loading_kind(a) == "io"
    assert "blocked" in card_text(a, data.input_bound)


def test_without_the_run_delay_the_split_is_unknown_and_no_io_card_fires() -> None:
    a = measured(0.37, None)  # no schedstat: the 63% off a CPU may be queueing or blocking
    assert loading_kind(a) is None
    text = card_text(a, data.input_bound) + card_text(a, data.dataloader_workers)
    assert "blocked" not in text and "I/O" not in text and "need no CPU" not in text


def test_workers_starved_of_cpu_are_cpu_demand() -> None:
    # two workers on a CPU each, queued half the time: the loaders want CPUs they do not get
    starved = measured(
        0.05, 0.02, workers=2, **{"host.children_cpu_cores": 0.6, "host.children_wait_cores": 0.5}
    )
    assert loading_kind(starved) == "cpu"
    sleeping = measured(
        0.05, 0.02, workers=2, **{"host.children_cpu_cores": 0.1, "host.children_wait_cores": 0.0}
    )
    assert loading_kind(sleeping) == "io"
    unknown = measured(0.05, 0.02, workers=2, **{"host.children_cpu_cores": 0.6})
    assert loading_kind(unknown) is None


def test_the_training_thread_queued_to_take_a_batch_over_is_the_handoff() -> None:
    assert loading_kind(measured(0.55, 0.1, workers=2)) == "handoff"
    assert loading_kind(measured(0.2, 0.5, workers=2)) == "handoff"  # the hand-over's work, waiting for a CPU
