"""Host memory on real DataLoaders: forked workers that read a list of dicts copy its pages as they
read (copy-on-read), and the card's fix, pasted, stops it.

Each worker reads its own USS; the test compares the list's growth with that of the same rows as
numpy columns, measured the same way in the same test.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import perfmagic
from perfmagic.collect.worker_load import WorkerLoadSource

ROWS = 200_000


class Rows(Dataset[Any]):
    def __init__(self, rows: Any) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        row = self.rows[i]
        return torch.tensor([float(row["x"]), float(row["y"])]), int(row["label"])


def profile_epoch(tmp_path: Path, train_set: Rows) -> dict[str, Any]:
    """One epoch through 2 forked workers, a tiny model trained on it; the report as a dict."""
    loader = DataLoader(train_set, batch_size=256, num_workers=2, multiprocessing_context="fork")
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with perfmagic.profile(sources=[WorkerLoadSource()], outdir=tmp_path) as session:
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return dict(session.report.to_dict())


@pytest.mark.skipif("fork" not in torch.multiprocessing.get_all_start_methods(), reason="needs fork")
def test_forked_workers_copy_a_list_of_dicts_and_the_pasted_fix_stops_it(tmp_path: Path) -> None:
    train_set = Rows([{"x": i, "y": i * 0.5, "label": i % 2} for i in range(ROWS)])
    first = train_set[123]
    report = profile_epoch(tmp_path / "list", train_set)
    host = report["memory"]["host"]
    assert host["start_method"] == "fork" and host["dataset_name"] == "train_set"
    assert host["containers"][0]["attribute"] == "rows" and host["containers"][0]["kind"] == "list of dict"
    assert len(host["workers"]) == 2
    growth = host["worker_growth_bytes"]
    (card,) = [c for c in report["advice"] if c["id"] == "dataloader_copy_on_read"]
    assert card["metrics"]["growth_per_worker_bytes"] == growth
    assert card["metrics"]["freed_bytes"] == 2 * growth
    assert "list of dict" in card["title"] and "train_set.rows" in card["title"]

    exec(card["fix"], {"train_set": train_set})  # as pasted, under the user's names
    x, label = train_set[123]
    assert torch.equal(x, first[0]) and label == first[1]  # the same samples, read from numpy columns
    fixed = profile_epoch(tmp_path / "columns", train_set)
    fixed_host = fixed["memory"]["host"]
    assert len(fixed_host["workers"]) == 2
    assert not [c for c in fixed["advice"] if c["id"] == "dataloader_copy_on_read"]
    # the workers read as many samples; the arrays' pages stay shared
    assert fixed_host["worker_growth_bytes"] * 2 < growth, (fixed_host["worker_growth_bytes"], growth)


def test_pinned_memory_held_is_read_from_the_simulated_host_allocator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from perfmagic.collect.cuda import AllocatorSource
    from tests.sim_cuda import SimCuda, install

    sim = install(monkeypatch, SimCuda())
    sim.alloc(64 * 2**20)  # the device is in use: the allocator source reads it
    pinned = [0, 96 * 2**20, 32 * 2**20]  # buffers pinned, then some given back
    with perfmagic.profile(sources=[AllocatorSource()], outdir=tmp_path, interval=0.02) as session:
        for held in pinned:
            sim.pinned_bytes = held
            time.sleep(0.2)  # several of the sampler's ticks
    host = session.report.to_dict()["memory"]["host"]
    assert host["pinned_bytes"] == max(pinned)
    assert host["workers"] == [] and host["swap_growth_bytes"] is None  # neither was sampled


def test_a_cpu_only_run_reads_no_pinned_memory(tmp_path: Path) -> None:
    from perfmagic.collect.cuda import AllocatorSource

    if torch.cuda.is_initialized():
        pytest.skip("CUDA is in use in this process: its host allocator would be read")
    with perfmagic.profile(sources=[AllocatorSource()], outdir=tmp_path, interval=0.02) as session:
        time.sleep(0.1)
    memory = session.report.to_dict()["memory"]
    assert memory is None or memory["host"] is None or memory["host"]["pinned_bytes"] is None


def test_spawned_workers_each_hold_a_pickled_copy(tmp_path: Path) -> None:
    """Spawned workers are not measured (they run no forked code of perfmagic's): the card says each
    unpickles the dataset, from its estimated size."""
    train_set = Rows([{"x": i, "y": i * 0.5, "label": i % 2} for i in range(2 * ROWS)])
    loader = DataLoader(train_set, batch_size=4096, num_workers=2, multiprocessing_context="spawn")
    model = torch.nn.Linear(2, 2)
    with perfmagic.profile(sources=[WorkerLoadSource()], outdir=tmp_path) as session:
        for x, y in loader:
            torch.nn.functional.cross_entropy(model(x), y).backward()
    report = session.report.to_dict()
    host = report["memory"]["host"]
    assert host["start_method"] == "spawn" and host["workers"] == []
    (card,) = [c for c in report["advice"] if c["id"] == "dataloader_copy_on_read"]
    assert "each holds a pickled copy" in card["evidence"]
    assert card["metrics"]["freed_bytes"] == 2 * host["containers"][0]["bytes"]
    assert "share_memory_()" in card["fix"]
