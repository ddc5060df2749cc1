"""cpu_contention counts the threads that keep a CPU busy, and never sets what already is."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from analysis_builder import HOST_SAMPLES, LOADER, build

from perfmagic.advise import host
from perfmagic.analyze import Analysis

TWO_CPUS = {"cpu_count": 2, "affinity": [0, 1], "physical_cores": 2}


def waiting(threads: int, workers: int, wait_share: float = 0.3, **samples: float) -> Analysis:
    """A run whose training thread waited ``wait_share`` of each step for a CPU (the run delay, as read)."""
    a = build(
        loader={**LOADER, "num_workers": workers},
        host={**build().host, **TWO_CPUS},
        samples={**HOST_SAMPLES, "host.cpu_util": 0.95, "host.proc_cpu_cores": 1.9, **samples},
        torch={"num_threads": threads},
    )
    assert a.steady is not None
    wait = np.full(a.steady.count, wait_share * a.steady.step_s)
    return dataclasses.replace(a, steady=dataclasses.replace(a.steady, wait_s=wait))


def card(a: Analysis) -> dict[str, Any]:
    c = host.cpu_contention(a)
    assert c is not None, "cpu_contention did not fire"
    return {"title": c.title, "evidence": c.evidence, "fix": c.fix, **c.metrics}


def test_workers_that_sleep_are_no_busy_threads() -> None:
    # Seen with Lightning: 4 workers whose items wait 2 ms each (0.2 cores between them), 2 torch threads:
    # "6 busy threads on 2 free CPUs ... num_workers=1  # was 4", while more workers made it faster
    c = card(waiting(2, 4, **{"host.children_cpu_cores": 0.2, "host.children_wait_cores": 0.0}))
    assert "6 busy threads" not in c["title"] and not c["oversubscribed"], c
    assert "num_workers" not in c["fix"], c["fix"]


def test_workers_that_compute_or_queue_are_busy_threads() -> None:
    c = card(waiting(2, 4, **{"host.children_cpu_cores": 1.4, "host.children_wait_cores": 2.2}))
    assert c["oversubscribed"] and c["title"].startswith("6 busy threads on 2 free CPUs"), c
    assert "num_workers=1  # was 4" in c["fix"] and "torch.set_num_threads(1)  # was 2" in c["fix"], c["fix"]


def test_a_fix_never_sets_the_thread_count_it_already_has() -> None:
    # one torch thread and two busy workers on two CPUs: fewer threads than one cannot be
    c = card(waiting(1, 2, **{"host.children_cpu_cores": 1.5, "host.children_wait_cores": 0.6}))
    assert c["oversubscribed"], c
    assert "set_num_threads(1)  # was 1" not in c["fix"] and "# was 1\n" not in c["fix"] + "\n", c["fix"]
    assert "num_workers=1  # was 2" in c["fix"], c["fix"]


def test_without_worker_samples_every_worker_counts() -> None:
    c = card(waiting(2, 4))
    assert c["oversubscribed"], c
