"""The DataLoader workers' stack samples: counted inside the fetch only, carried back whole through the
shared slots, and put in ``data``'s hot spots in place of the training thread's ``for`` line.

Here the worker is this process (its parent check stood in for), and each sample is a frame handed over
as the worker's sampling thread would read it: no thread, no clock.
"""

from __future__ import annotations

import os
import struct
import sys
from collections.abc import Callable
from typing import Any

import pytest

from perfmagic.analyze.hotspots import hotspots
from perfmagic.collect import worker_stacks
from perfmagic.collect.worker_stacks import HEADER, SLOTS, WorkerSampler, WorkerStacks, read_slot, write_slot
from perfmagic.places import code_place
from perfmagic.schema import STACK_SAMPLES, WORKER_STACKS
from perfmagic.timeline import Timeline


def fetch(work: Callable[[], Any]) -> Any:
    """Stands for torch's fetch: what it calls is the worker's loading."""
    return work()


FETCHES = frozenset({fetch.__code__})


@pytest.fixture
def forked(monkeypatch: pytest.MonkeyPatch) -> Callable[[WorkerStacks], WorkerSampler]:
    """A sampler as a worker forked from this process gets it."""
    monkeypatch.setattr(os, "getppid", os.getpid)

    def fork(stacks: WorkerStacks) -> WorkerSampler:
        stacks.before_fork()
        sampler = stacks.sampler_for_child(FETCHES)
        assert sampler is not None
        return sampler

    return fork


def spectrum(sampler: WorkerSampler) -> int:
    """The dataset's costly function: the sample is taken here, inside the fetch."""
    frame = sys._getframe()
    sampler.count(frame)
    return frame.f_lineno - 1


def test_a_worker_counts_the_users_line_inside_its_fetch(
    forked: Callable[[WorkerStacks], WorkerSampler],
) -> None:
    stacks = WorkerStacks()
    sampler = forked(stacks)
    line = 0
    for _ in range(3):
        line = fetch(lambda: spectrum(sampler))
    sampler.count(sys._getframe())  # outside any fetch (it had ended): the training process's old stack
    sampler.end()
    held, warnings = stacks.close()
    assert held is not None and not warnings
    assert held["workers"] == 1 and held["samples"] == 3
    (place,) = held["places"]
    assert place == {**code_place(__file__, line, "spectrum"), "count": 3}


def test_a_slot_taken_over_keeps_its_former_owners_counts(
    forked: Callable[[WorkerStacks], WorkerSampler],
) -> None:
    stacks = WorkerStacks()
    first = forked(stacks)
    fetch(lambda: spectrum(first))
    first.end()
    for _ in range(SLOTS - 1):  # forks that never fetch: other processes, other workers
        stacks.before_fork()
    again = forked(stacks)  # the slot of the first fork, which has long ended
    fetch(lambda: spectrum(again))
    fetch(lambda: spectrum(again))
    again.end()
    held, _ = stacks.close()
    assert held is not None and (held["workers"], held["samples"]) == (2, 3)
    assert [p["count"] for p in held["places"]] == [3]


def test_a_slot_mid_write_is_not_read_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_stacks, "_READ_TRIES", 3)
    stacks = WorkerStacks()
    stacks.before_fork()
    mapping = stacks._map  # the slot as a killed worker left it: its sequence number odd
    write_slot(mapping, HEADER, b'{"workers": 1, "samples": 5, "places": []}')
    assert read_slot(mapping, 0) == {"workers": 1, "samples": 5, "places": []}
    assert read_slot(mapping, 1) == {}  # never written
    struct.pack_into("<Q", mapping, HEADER, 3)
    assert read_slot(mapping, 0) is None
    held, warnings = stacks.close()
    assert held is None and warnings == [
        "the stack samples of 1 DataLoader worker(s) could not be read (ended while writing)"
    ]


def test_a_worker_is_told_when_the_window_closes(forked: Callable[[WorkerStacks], WorkerSampler]) -> None:
    stacks = WorkerStacks()
    sampler = forked(stacks)
    assert sampler.window_open()
    stacks.close()
    assert not sampler.window_open()  # its next fetch puts torch's fetchers back


def test_a_fork_of_a_worker_samples_nothing() -> None:
    stacks = WorkerStacks()
    stacks.before_fork()
    assert stacks.sampler_for_child(FETCHES) is None  # this process's parent is not the training's
    stacks.close()


def _place(function: str, line: int) -> dict[str, Any]:
    return {
        "function": function,
        "file": "In [2]",
        "line": line,
        "cell": 2,
        "where": f"{function} (In [2], line {line})",
    }


def test_with_sampled_workers_data_is_their_code_not_the_for_line() -> None:
    tl = Timeline()
    for_line = _place("<module>", 5)
    tl.meta[STACK_SAMPLES] = [
        {"stage": "data", "count": 90, **for_line},  # the training thread waiting on the workers
        {"stage": "other", "count": 10, **_place("log", 9)},
    ]
    tl.meta[WORKER_STACKS] = {
        "workers": 2,
        "samples": 1000,
        "places": [{"count": 490, **_place("__getitem__", 15)}, {"count": 450, **_place("spectrum", 8)}],
    }
    spots = hotspots(tl)
    assert [(h["where"], h["share"], h["sampled"]) for h in spots["data"]] == [
        ("__getitem__ (In [2], line 15)", 0.49, "workers"),
        ("spectrum (In [2], line 8)", 0.45, "workers"),
    ]
    assert [(h["where"], h["share"], h["sampled"]) for h in spots["other"]] == [
        ("log (In [2], line 9)", 1.0, "training thread")
    ]
    del tl.meta[WORKER_STACKS]  # workers that did not sample themselves: the training thread's lines
    assert [h["sampled"] for h in hotspots(tl)["data"]] == ["training thread"]


def test_a_record_from_before_places_keeps_its_lines() -> None:
    tl = Timeline()
    tl.meta[STACK_SAMPLES] = [{"stage": "other", "where": "log (train.py:9)", "count": 4}]  # type: ignore[typeddict-item]
    (spot,) = hotspots(tl)["other"]
    assert (spot["function"], spot["file"], spot["line"], spot["cell"]) == ("log", "train.py", 9, None)
