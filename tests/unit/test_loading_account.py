"""One account of the loaders' time, replayed from the readings the collectors take.

The training thread's fetches (CPU clock, run delay) or the workers' own timed fetches give
the time on a CPU and queued for one; the sampled ``D`` state splits the blocked rest into
disk reads and sleep. Workers that wait for their next index are not loading at all.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import pytest
from analysis_builder import HEALTHY, LOADER, accounted, build

from perfmagic.advise import data, storage
from perfmagic.advise.loading import loading_kind
from perfmagic.advise.workers import loader_model
from perfmagic.analyze import Analysis
from perfmagic.analyze.loading import LoadingAccount, loading_account
from perfmagic.analyze.loop import LoopFacts
from perfmagic.schema import (
    CHILDREN_CPU,
    CHILDREN_DISK,
    CHILDREN_QUEUED,
    LOADER_BATCHES,
    LOADER_BUSY,
    LOADER_BUSY_CPU,
    LOADER_BUSY_QUEUED,
    LOADER_THREAD_DISK,
)
from perfmagic.timeline import Timeline

TWO_CPUS = {"cpu_count": 2, "affinity": [0, 1], "physical_cores": 2}


def run(data_s: float, workers: int, on_cpu: float, waiting: float, **means: float) -> Analysis:
    """A run waiting ``data_s`` a step for batches, on 2 CPUs, with the readings given."""
    a = build(
        stages={**HEALTHY, "data": data_s}, loader={**LOADER, "num_workers": workers}, host={**TWO_CPUS}
    )
    loop = dataclasses.replace(a.loop, data_cpu_share=on_cpu, data_wait_share=waiting)
    return accounted(a, loop=loop, steady_means={**a.steady_means, **means})


def test_the_training_threads_blocked_time_splits_into_disk_reads_and_sleep() -> None:
    loop = LoopFacts(data_cpu_share=0.1, data_wait_share=0.05)
    account = loading_account(loop, {LOADER_THREAD_DISK: 0.6}, workers=0)
    assert account is not None and account.loaders == "training thread"
    assert account.blocked == pytest.approx(0.85) and account.disk == pytest.approx(0.6)
    assert account.sleep == pytest.approx(0.25)
    # sampled states can say more than the clocks left blocked: never more disk than blocked time
    clamped = loading_account(loop, {LOADER_THREAD_DISK: 0.95}, workers=0)
    assert clamped is not None and clamped.disk == pytest.approx(0.85) and clamped.sleep == pytest.approx(0.0)
    # no tick fell in the data stage: blocked, not split
    unsplit = loading_account(loop, {}, workers=0)
    assert unsplit is not None and unsplit.disk is None and unsplit.sleep is None


def test_workers_waiting_for_work_are_not_blocked_loaders() -> None:
    """Two workers that compute each batch in 6 ms and then wait for their next index: busy 30% of the
    time. Counted over their whole time they looked blocked (CPU 27% per worker), so loading read as
    I/O and the machine seemed to afford 8 workers; over their fetches they compute 90% of the time,
    and the rest of it they wait for work: they keep up."""
    means = {
        CHILDREN_CPU: 0.55,
        CHILDREN_QUEUED: 0.0,
        LOADER_BUSY: 0.6,
        LOADER_BUSY_CPU: 0.54,
        LOADER_BUSY_QUEUED: 0.0,
        LOADER_BATCHES: 100.0,
    }
    a = run(0.004, 2, 0.05, 0.0, **means)
    assert a.loading == LoadingAccount(
        "workers", pytest.approx(0.9), 0.0, pytest.approx(0.1), None, 0.3, pytest.approx(0.006)
    )
    assert loading_kind(a) == "handoff"  # they keep up: the step waits for each batch's way over
    untimed = run(0.004, 2, 0.05, 0.0, **{CHILDREN_CPU: 0.55, CHILDREN_QUEUED: 0.0})
    assert loading_kind(untimed) == "io"  # what the process tree alone says
    # the model's batch is what the workers timed, plus their CPU outside the fetch per batch
    assert a.steady is not None
    m = loader_model(a, a.steady)
    assert m.batch_s == pytest.approx(0.006) and m.load_s == pytest.approx(0.006 + 0.01 / 100)


def test_a_slow_pass_of_a_healthy_loop_with_idle_workers_asks_for_no_more_workers() -> None:
    """The flaky case: a slow spell made the wait 12% of a step; two workers built each batch in 2 ms and
    sat idle the rest. Read as blocked loaders, it asked for 3 workers; timed, they keep up."""
    means = {CHILDREN_CPU: 0.1, CHILDREN_QUEUED: 0.0, LOADER_BUSY: 0.08, LOADER_BUSY_CPU: 0.07}
    a = run(0.0018, 2, 0.05, 0.0, **means, **{LOADER_BUSY_QUEUED: 0.0, LOADER_BATCHES: 40.0})
    assert loading_kind(a) == "handoff"
    assert data.dataloader_workers(a) is None
    # nor is a 5% wait for idle workers called input-bound loading (a loaded run's healthy loop)
    assert data.input_bound(run(0.0008, 2, 0.05, 0.0, **means, **{LOADER_BUSY_QUEUED: 0.0})) is None


def test_sleeping_workers_are_blocked_and_the_card_says_they_slept() -> None:
    means = {
        CHILDREN_CPU: 0.1,
        CHILDREN_QUEUED: 0.0,
        CHILDREN_DISK: 0.0,
        LOADER_BUSY: 1.9,
        LOADER_BUSY_CPU: 0.08,
        LOADER_BUSY_QUEUED: 0.02,
        LOADER_BATCHES: 60.0,
    }
    a = run(0.03, 2, 0.02, 0.0, **means)
    assert a.loading is not None and a.loading.busy == pytest.approx(0.95)
    assert loading_kind(a) == "io"
    card = data.input_bound(a)
    assert card is not None and "slept" in card.evidence and "disk reads 0%" in card.evidence, card.evidence
    more = data.dataloader_workers(a)
    assert more is not None and more.metrics["recommended_workers"] > 2


def test_workers_that_never_stop_are_not_the_hand_over_whatever_the_training_thread_does() -> None:
    """Seen beside busy cores: two workers asleep in __getitem__ 96% of their time, and the training
    thread on a CPU 22% of its wait and queued for one 30% as each batch arrived: "the workers keep up,
    the wait is the hand-over". Workers busy all the time do not keep up."""
    means = {
        CHILDREN_CPU: 0.1,
        CHILDREN_QUEUED: 0.05,
        CHILDREN_DISK: 0.0,
        LOADER_BUSY: 1.92,
        LOADER_BUSY_CPU: 0.06,
        LOADER_BUSY_QUEUED: 0.2,
        LOADER_BATCHES: 50.0,
    }
    a = run(0.03, 2, 0.22, 0.3, **means)
    assert loading_kind(a) == "io"
    card = data.input_bound(a)
    assert card is not None and "slept" in card.evidence and "hand" not in card.title.lower(), card
    idle = run(
        0.03, 2, 0.22, 0.3, **{**means, LOADER_BUSY: 0.4, LOADER_BUSY_CPU: 0.35, LOADER_BUSY_QUEUED: 0.0}
    )
    assert loading_kind(idle) == "handoff"  # workers with time to spare: the wait is taking batches over


def test_loaders_in_disk_reads_make_the_io_card_say_storage() -> None:
    means = {LOADER_THREAD_DISK: 0.7, "host.iowait": 0.0}
    a = run(0.03, 0, 0.1, 0.02, **means)
    a = dataclasses.replace(a, host={**a.host, "proc_read_bytes": 500 * 1024**2})
    assert a.loading is not None and a.loading.disk == pytest.approx(0.7)
    card = storage.io_bound(a)  # the machine's I/O wait says nothing; the thread's state does
    assert card is not None and card.metrics["blocked_share"] == pytest.approx(0.7)
    assert "disk reads" in card.evidence, card.evidence
    said = data.input_bound(a)
    assert said is not None and "waited on storage (disk reads) 70%" in said.evidence, said.evidence


def test_without_the_run_delay_neither_workers_nor_the_thread_are_called_blocked() -> None:
    means = {CHILDREN_CPU: 0.1, LOADER_BUSY: 1.9, LOADER_BUSY_CPU: 0.08, LOADER_BUSY_QUEUED: math.nan}
    a = run(0.03, 2, 0.02, 0.0, **means)
    assert a.loading is not None and a.loading.queued is None and a.loading.blocked is None
    assert loading_kind(a) is None
    text = " ".join(c.evidence for c in (data.input_bound(a), data.dataloader_workers(a)) if c is not None)
    assert "blocked" not in text and "slept" not in text


def test_a_run_without_a_dataloader_has_no_loading_account() -> None:
    a = build(stages=HEALTHY, loader=None)
    assert a.loading is None and loading_kind(a) is None


torch = pytest.importorskip("torch")


def test_forked_workers_count_their_fetches_and_the_training_process_is_never_patched() -> None:
    from torch.utils.data._utils import fetch

    from perfmagic.collect.worker_load import WorkerLoadSource

    original = fetch._MapDatasetFetcher.fetch
    source, timeline = WorkerLoadSource(), Timeline()
    source.open(timeline)
    fetcher = fetch._MapDatasetFetcher(list(range(100)), True, lambda batch: batch, False)
    assert fetcher.fetch([1, 2]) == [1, 2] and fetch._MapDatasetFetcher.fetch is original
    source.poll(1.0, timeline)
    assert LOADER_BUSY not in timeline.metrics  # the training process's own fetch: no worker row
    child = forked(lambda: fetch._MapDatasetFetcher.fetch is not original and fetcher.fetch([3]) == [3])
    assert os.waitpid(child, 0)[1] == 0
    source.poll(2.0, timeline)
    source.poll(3.0, timeline)
    t, batches = timeline.series(LOADER_BATCHES)
    assert t.tolist() == [3.0] and batches.tolist() == [0.0]  # rates from the first tick after a worker wrote
    source.close(timeline)
    after = forked(lambda: fetch._MapDatasetFetcher.fetch is original)  # closed: a child times nothing
    assert os.waitpid(after, 0)[1] == 0 and fetch._MapDatasetFetcher.fetch is original


def test_worker_rows_add_up_each_workers_batches() -> None:
    from torch.utils.data._utils import fetch

    from perfmagic.collect.worker_load import WorkerLoadSource

    source, timeline = WorkerLoadSource(), Timeline()
    source.open(timeline)
    fetcher = fetch._MapDatasetFetcher(list(range(10)), True, lambda batch: batch, False)
    source.poll(0.0, timeline)
    children = [forked(lambda n=n: all(fetcher.fetch([i]) == [i] for i in range(n))) for n in (2, 5)]
    assert all(os.waitpid(pid, 0)[1] == 0 for pid in children)
    source.poll(0.5, timeline)  # the first reading: its totals are the base
    before = source_totals(source)
    assert os.waitpid(forked(lambda: fetcher.fetch([0]) == [0]), 0)[1] == 0
    source.poll(1.0, timeline)
    assert before[0] == 7 and source_totals(source)[0] == 8
    _, rate = timeline.series(LOADER_BATCHES)
    assert rate.tolist() == [2.0]  # one batch in half a second
    source.close(timeline)


def forked(work: Any) -> int:
    """A forked child (a DataLoader worker's stand-in) that does ``work`` and exits 0 if it held, else 1,
    without running the parent's exit handlers or pytest."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if work() else 1
        finally:
            os._exit(code)
    return pid


def source_totals(source: Any) -> list[float]:
    rows = source._rows
    assert rows is not None
    return [float(x) for x in rows.sum(axis=0)]


def test_disk_waits_are_the_sampled_share_of_each_stage_in_uninterruptible_sleep() -> None:
    from perfmagic.analyze.disk_waits import disk_waits
    from perfmagic.schema import THREAD_STATES

    timeline = Timeline()
    timeline.meta[THREAD_STATES] = [
        {"stage": "checkpoint", "state": "D", "count": 6},
        {"stage": "checkpoint", "state": "R", "count": 2},
        {"stage": "checkpoint", "state": "S", "count": 2},
        {"stage": "forward", "state": "R", "count": 40},
        {"stage": "logging", "state": "D", "count": 3},  # too few ticks to say anything
    ]
    assert disk_waits(timeline) == {
        "checkpoint": {"samples": 10, "share": 0.6},
        "forward": {"samples": 40, "share": 0.0},
    }


def test_a_checkpoint_card_says_how_much_of_saving_waited_on_storage() -> None:
    from perfmagic.advise import loop

    stages = {**HEALTHY, "checkpoint": [0.05 if i % 2 else 0.0 for i in range(40)]}
    a = build(stages=stages, steps=40)
    card = loop.checkpoint_frequency(
        dataclasses.replace(a, disk_waits={"checkpoint": {"samples": 20, "share": 0.7}})
    )
    assert (
        card is not None
        and "waited on storage up to 70%" in card.evidence
        and card.metrics["disk_wait_share"] == 0.7
    )
    quiet = loop.checkpoint_frequency(a)  # states not sampled: nothing said of storage
    assert quiet is not None and "storage" not in quiet.evidence and quiet.metrics["disk_wait_share"] is None


def test_the_handoff_card_weighs_the_wait_against_building_batches_in_the_loop() -> None:
    """Workers that keep up: loading in the training process saves the wait less building a batch
    there, which the workers timed. A wait about as long as building the batch is no medium card."""
    means = {CHILDREN_CPU: 0.2, CHILDREN_QUEUED: 0.0, LOADER_BUSY: 0.4, LOADER_BUSY_CPU: 0.38}
    dear = run(0.012, 2, 0.4, 0.1, **means, **{LOADER_BUSY_QUEUED: 0.0, LOADER_BATCHES: 40.0})
    assert loading_kind(dear) == "handoff" and dear.loading is not None and dear.loading.batch_s is not None
    card = data.input_bound(dear)
    assert card is not None and card.metrics["build_batch_s"] == pytest.approx(dear.loading.batch_s)
    saving = 0.012 - dear.loading.batch_s
    assert saving < 0.1 * card.metrics["step_s"] and card.severity == "low", card
    assert "saves up to" in card.evidence and "an estimate" in card.evidence
    cheap = run(0.012, 2, 0.4, 0.1, **means, **{LOADER_BUSY_QUEUED: 0.0, LOADER_BATCHES: 400.0})
    bigger = data.input_bound(cheap)
    assert bigger is not None and bigger.severity != "low", bigger


def test_the_handoff_card_offers_no_in_loop_loading_that_its_estimate_says_saves_nothing() -> None:
    means = {CHILDREN_CPU: 0.2, CHILDREN_QUEUED: 0.0, LOADER_BUSY: 0.6, LOADER_BUSY_CPU: 0.55}
    dear = run(0.012, 2, 0.4, 0.1, **means, **{LOADER_BUSY_QUEUED: 0.0, LOADER_BATCHES: 40.0})
    card = data.input_bound(dear)
    assert card is not None and card.metrics["build_batch_s"] >= 0.012, card  # building costs the whole wait
    assert "num_workers=0" not in card.fix and card.replaces is None and "saves up to 0" in card.evidence, (
        card
    )


def test_a_forked_worker_reads_its_own_uss_as_it_reads_the_parents_objects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    from torch.utils.data._utils import fetch

    from perfmagic.collect import worker_load

    monkeypatch.setattr(worker_load, "USS_EVERY_S", 0.0)  # a reading after every fetch
    monkeypatch.setattr(worker_load, "USS_COST", math.inf)
    source, timeline = worker_load.WorkerLoadSource(), Timeline()
    source.open(timeline)
    held = [n * 1000 for n in range(100_000)]  # the parent's int objects: reading one writes its count
    fetcher = fetch._MapDatasetFetcher(held, True, lambda batch: batch, False)
    child = forked(lambda: all(fetcher.fetch(list(range(i, i + 1000))) for i in range(0, len(held), 1000)))
    assert os.waitpid(child, 0)[1] == 0
    source.close(timeline)
    (worker,) = timeline.meta["worker_memory"]
    assert worker["pid"] == child and worker["samples"] == len(held)
    # it copied the pages of the ints it read: at least half their bytes (the list's own pages on top)
    assert worker["last_uss_bytes"] - worker["first_uss_bytes"] >= len(held) * sys.getsizeof(10**6) // 2
