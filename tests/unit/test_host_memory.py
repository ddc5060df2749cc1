"""Host memory: what a dataset holds in Python objects, the workers' USS readings, the section built
from them, and the copy-on-read card's fixes run as pasted."""

from __future__ import annotations

import dataclasses
import multiprocessing
import sys
from typing import Any

import numpy as np
import pytest
from analysis_builder import ROWS_CONTAINER, GiB, with_host_memory, with_pinned
from report_checks import assert_consistent

from perfmagic.advise import advise
from perfmagic.advise.host_memory import dataloader_copy_on_read, pinned_memory_held
from perfmagic.analyze.memory import host_memory
from perfmagic.collect.dataset_memory import MIN_ITEMS, python_containers, start_method
from perfmagic.collect.worker_load import COLUMNS, PID, SAMPLES, USS_FIRST, USS_LAST, worker_memory
from perfmagic.contract.loader import LoaderConfig
from perfmagic.schema import MAJOR_FAULTS, PINNED_BYTES, SWAP_USED
from perfmagic.timeline import Timeline

MiB = 2**20


class Rows:
    def __init__(self, rows: Any, labels: Any = None) -> None:
        self.rows = rows
        self.labels = labels if labels is not None else np.zeros(len(rows))
        self.names = ["a", "b"]  # too short to cost a worker anything

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Any:
        return self.rows[i]


class Wrapper:  # a Subset: the rows are one attribute down
    def __init__(self, dataset: Rows) -> None:
        self.dataset = dataset

    def __getitem__(self, i: int) -> Any:
        return self.dataset[i]


def test_the_largest_lists_and_dicts_are_noted_with_their_item_kind_and_size() -> None:
    n = 2 * MIN_ITEMS
    found = python_containers(Wrapper(Rows([{"x": float(i), "y": i} for i in range(n)])))
    (rows,) = found  # the numpy labels and the short list are not Python objects worth noting
    assert rows["attribute"] == "dataset.rows" and rows["kind"] == "list of dict" and rows["length"] == n
    one = {"x": 1.5, "y": 7}
    each = sys.getsizeof(one) + sys.getsizeof(1.5) + sys.getsizeof(7)
    assert abs(rows["bytes"] - n * each) < 0.05 * n * each  # the list's own pointers on top
    by_id = python_containers(Rows([(1, 1)] * 10, labels={i: str(i) for i in range(n)}))
    assert [c["kind"] for c in by_id] == ["dict of str"]


def test_the_start_method_is_the_loaders_context_else_the_default_unfixed() -> None:
    class Loader:
        multiprocessing_context: Any = None

    loader = Loader()
    before = multiprocessing.get_start_method(allow_none=True)
    assert start_method(loader) == (before or multiprocessing.get_all_start_methods()[0])
    assert multiprocessing.get_start_method(allow_none=True) == before  # asking did not fix it
    loader.multiprocessing_context = multiprocessing.get_context("spawn")
    assert start_method(loader) == "spawn"


def test_each_workers_row_gives_its_first_and_last_reading() -> None:
    rows = np.zeros((8, COLUMNS))
    rows[3, [PID, USS_FIRST, USS_LAST, SAMPLES]] = [4003, 10 * MiB, 30 * MiB, 5000]
    rows[5, PID] = 4005  # a worker that could not read its USS
    assert worker_memory(rows) == [
        {"pid": 4003, "first_uss_bytes": 10 * MiB, "last_uss_bytes": 30 * MiB, "samples": 5000}
    ]


def test_the_host_section_reads_workers_swap_and_pinned_memory() -> None:
    tl, sampled = Timeline(), Timeline()
    tl.meta["worker_memory"] = [
        {"pid": 1, "first_uss_bytes": 10 * MiB, "last_uss_bytes": 40 * MiB, "samples": 100},
        {"pid": 2, "first_uss_bytes": 10 * MiB, "last_uss_bytes": 20 * MiB, "samples": 100},
    ]
    for t, swap, pinned in [(1.0, 100 * MiB, 0), (2.0, 700 * MiB, 64 * MiB), (3.0, 400 * MiB, 32 * MiB)]:
        sampled.add_sample(SWAP_USED, t, float(swap))
        sampled.add_sample(PINNED_BYTES, t, float(pinned))
    loader = LoaderConfig(num_workers=2, start_method="fork", dataset_name="ds", containers=(ROWS_CONTAINER,))  # type: ignore[arg-type]
    host = host_memory(tl, sampled, loader)
    assert host is not None
    assert [w["growth_bytes"] for w in host["workers"]] == [30 * MiB, 10 * MiB]
    assert host["worker_growth_bytes"] == 20 * MiB
    assert host["swap_start_bytes"] == 100 * MiB and host["swap_growth_bytes"] == 600 * MiB
    assert host["pinned_bytes"] == 64 * MiB
    assert host_memory(Timeline(), Timeline(), None) is None  # nothing read: no section


def rows_of(n: int) -> Rows:
    return Rows([{"x": float(i), "label": i % 3} for i in range(n)])


def test_the_forked_card_says_the_measured_growth_and_its_fix_keeps_the_samples() -> None:
    card = dataloader_copy_on_read(with_host_memory(growth=300 * MiB, workers=4))
    assert card is not None
    assert "300.0 MiB" in card.evidence and "list of dict" in card.title
    assert card.metrics["freed_bytes"] == 4 * 300 * MiB and card.metrics["step_cost_s"] == 0.0
    train_set = rows_of(50)
    before = [train_set[i] for i in range(50)]
    exec(card.fix, {"train_set": train_set})
    assert isinstance(train_set.rows.columns["x"], np.ndarray)  # type: ignore[attr-defined]
    assert [dict(train_set[i]) for i in range(50)] == before and len(train_set) == 50


def test_under_spawn_each_worker_holds_a_pickled_copy_in_shared_tensors_after_the_fix() -> None:
    torch = pytest.importorskip("torch")
    card = dataloader_copy_on_read(with_host_memory(start_method="spawn", workers=3))
    assert card is not None
    assert "pickled copy" in card.evidence and card.metrics["growth_per_worker_bytes"] is None
    assert card.metrics["freed_bytes"] == 3 * ROWS_CONTAINER["bytes"]  # an estimate: the rows' own size
    train_set = rows_of(20)
    exec(card.fix, {"train_set": train_set})
    column = train_set.rows.columns["label"]  # type: ignore[attr-defined]
    assert isinstance(column, torch.Tensor) and column.is_shared()
    assert int(train_set[7]["label"]) == 7 % 3
    small = {**ROWS_CONTAINER, "bytes": 10 * MiB}
    assert dataloader_copy_on_read(with_host_memory(start_method="spawn", containers=[small])) is None


def test_a_list_of_tuples_becomes_one_array() -> None:
    kind = {**ROWS_CONTAINER, "kind": "list of tuple"}
    card = dataloader_copy_on_read(with_host_memory(growth=100 * MiB, containers=[kind]))
    assert card is not None
    train_set = Rows([(i, 2 * i) for i in range(10)])
    exec(card.fix, {"train_set": train_set})
    assert isinstance(train_set.rows, np.ndarray) and train_set.rows.shape == (10, 2)
    assert dataloader_copy_on_read(with_host_memory(growth=100 * MiB, containers=[])) is None


def test_the_host_source_counts_the_trees_major_faults(tmp_path: Any) -> None:
    import mmap
    import os

    from perfmagic.collect.host import HostSource

    path = tmp_path / "pages"
    with open(path, "wb") as f:
        f.write(os.urandom(8 * MiB))
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # out of the page cache: the reads below fault
    source, tl = HostSource(), Timeline()
    source.open(tl)
    source.poll(1.0, tl)
    with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as pages:
        pages.madvise(mmap.MADV_RANDOM)  # no readahead: each page read is its own fault
        assert sum(pages[i] for i in range(0, len(pages), 4096)) >= 0
    source.poll(2.0, tl)
    source.close(tl)
    os.close(fd)
    _, faults = tl.series(MAJOR_FAULTS)
    if not len(faults) or faults[-1] == 0:
        pytest.skip("this file system keeps the file in memory (tmpfs): no read faults")
    assert faults[-1] >= 1024  # per second of the fake clock: most of the file's 2048 pages, each read back


def test_an_embedding_table_left_on_the_host_of_a_gpu_model_is_noted() -> None:
    torch = pytest.importorskip("torch")
    from perfmagic.collect.torch_memory import host_embeddings, host_tables

    class Recommender(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.users = torch.nn.Embedding(10_000, 16)
            self.towers = torch.nn.ModuleList([torch.nn.EmbeddingBag(100, 16), torch.nn.Linear(16, 1)])

    model = Recommender()
    table = 10_000 * 16 * 4
    # the towers on the GPU (bytes as the probe counts them by device), the user table on the CPU
    on_gpu = {"cuda:0": table // 2, "cpu": table + 100 * 16 * 4}
    tables = host_tables(model, torch)
    assert [path for path, _ in tables] == ["users", "towers[0]"]
    timed: Any = {"users": {"path": "users", "activations_bytes": 0, "input_bytes": 80, "forward_s": 0.003}}
    (found,) = host_embeddings(tables, on_gpu, timed)  # the bag: under 25% of the parameters
    assert found == {
        "path": "users",
        "bytes": table,
        "parameter_share": table / sum(on_gpu.values()),
        "forward_s": 0.003,
    }
    big_gpu = {"cuda:0": 4 * table, "cpu": table}  # 20% of the parameters: not worth noting
    assert host_embeddings(tables, big_gpu, {}) == []


def test_the_copy_on_read_card_is_a_change_of_the_plan_that_costs_no_step_time() -> None:
    import math

    from perfmagic.advise import advise
    from perfmagic.render.wording import plan_line
    from perfmagic.report import plan_section

    advice = advise(with_host_memory(growth=300 * MiB))
    assert advice.plan is not None
    (change,) = [c for c in advice.plan.changes if c.id == "dataloader_copy_on_read"]
    assert change.freed_bytes == 2 * 300 * MiB and math.copysign(1.0, change.saving_s) == 1.0  # 0.0, not -0.0
    line = plan_line({"plan": plan_section(advice.plan)})  # type: ignore[typeddict-item]
    assert line is not None and "the memory changes free 600.0 MiB and cost 0 µs per step" in line, line


def test_the_text_and_html_reports_say_the_host_figures_without_a_sampled_step() -> None:
    from perfmagic.render.memory import memory_html, memory_lines

    a = with_host_memory(growth=300 * MiB, pinned_bytes=64 * MiB, swap_start_bytes=0, swap_growth_bytes=MiB)
    report: Any = {"memory": a.memory}
    lines = memory_lines(report)
    assert lines[0] == "Host memory"  # no step was sampled: no device lines above it
    assert "  DataLoader workers (fork): unique memory grew 300.0 MiB each on average (2 measured)" in lines
    assert "  dataset train_set.rows: list of dict, 1,000,000 items, about 400.0 MiB" in lines
    assert "  pinned (page-locked) memory held: 64.0 MiB at most" in lines
    assert "  swap grew 1.0 MiB during the run" in lines
    page = memory_html(report)
    assert (
        "<h3>Host memory</h3>" in page
        and "grew 300.0 MiB each" in page
        and "Where the memory goes" not in page
    )


def test_pinned_batches_of_a_large_share_of_the_machine_get_fewer_batches_in_flight() -> None:
    a = with_pinned(20 * GiB)  # 31% of 64 GiB; copies take 13% of the step: pinning pays, stays on
    card = pinned_memory_held(a)
    assert card is not None and card.severity == "low"  # nothing ran short: a share held, no cost seen
    assert "prefetch_factor=1,  # was 2" in card.fix and "pin_memory=False" not in card.fix
    # 4 workers × 2 + 1 batches of 2 GiB in flight; with prefetch_factor=1, 4 + 1
    assert card.metrics["batches_in_flight"] == 9 and card.metrics["freed_bytes"] == 8 * GiB
    assert card.saving_s is None and card.metrics["step_cost_s"] == 0.0 and "an estimate" in card.evidence
    advice = advise(a)
    assert "pinned_memory_held" in {c.id for c in advice.cards}
    assert_consistent({"advice": [c.to_dict() for c in advice.cards]})


def test_pinned_batches_whose_copies_take_little_of_the_step_go_pageable() -> None:
    card = pinned_memory_held(with_pinned(20 * GiB, h2d_s=0.0001))
    assert card is not None and "pin_memory=False,  # was True" in card.fix
    assert card.metrics["freed_bytes"] == 18 * GiB  # the 9 batches in flight, not the 2 GiB pinned otherwise
    assert abs(card.metrics["step_cost_s"] - 0.0001) < 1e-12  # pageable copies: about twice the copy time


def test_pinned_memory_speaks_where_memory_ran_short_and_never_with_two_values() -> None:
    assert pinned_memory_held(with_pinned(10 * GiB)) is None  # 16% of the machine, nothing short
    short = with_pinned(10 * GiB, available=4 * GiB)  # 6% left at the lowest
    card = pinned_memory_held(short)
    assert card is not None and card.severity == "medium"
    assert "available memory fell to 4.0 GiB" in card.evidence
    assert card.metrics["freed_bytes"] == 10 * GiB * 4 // 9  # 4 of the 9 batches of the 10 GiB held
    cards = advise(short).cards
    pressure = next(c for c in cards if c.id == "host_memory_pressure")
    assert "prefetch_factor" not in pressure.fix and "num_workers=2)" in pressure.fix  # one says the queue
    assert_consistent({"advice": [c.to_dict() for c in cards]})


def test_pinned_memory_the_loader_cannot_lower_gets_no_card() -> None:
    # copies take 13% of the step and one batch per worker is queued already: the memory buys the copies
    assert pinned_memory_held(with_pinned(20 * GiB, prefetch=1)) is None
    unpinned = with_pinned(20 * GiB)
    ld = dataclasses.replace(unpinned.config.dataloaders[0], pin_memory=False)
    config = dataclasses.replace(unpinned.config, dataloaders=[ld])
    assert pinned_memory_held(dataclasses.replace(unpinned, config=config)) is None  # not the loader's
