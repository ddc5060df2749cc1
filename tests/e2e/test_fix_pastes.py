"""A card's fix, pasted in place of the user's statement in the loop it profiled, runs: one step of the
loop with the fix in it, the user's names and arguments kept, only the change made."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torchloops
from notebook_runs import printed_json, run_cells
from report_checks import pasted_module

import perfmagic
from perfmagic import Report

SAMPLE_S = 0.03
"""Each sample's load time: the data wait dominates a step of the tiny model on any machine."""


class SlowSamples(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``n`` samples, each ``delay_s`` to load (a decode, a remote read)."""

    def __init__(self, n: int, delay_s: float = SAMPLE_S) -> None:
        self.n, self.delay_s = n, delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.delay_s)
        return torch.full((8,), float(i)), torch.ones(1)


def train_shuffled(train_set: Any, epochs: int = 1) -> int:
    """The loop as a user writes it: the DataLoader by its full name, shuffled; returns the steps run."""
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=4, shuffle=True, drop_last=True)
    steps = 0
    for _ in range(epochs):
        for x, y in train_loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            steps += 1
    return steps


class LoaderSpy:
    """Stands in for ``DataLoader`` in a pasted module: builds the real one, keeps its arguments."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> torch.utils.data.DataLoader[Any]:
        self.calls.append(kwargs)
        return torch.utils.data.DataLoader(*args, **kwargs)


def _profile(tmp_path: Path, job: Any) -> Report:
    with perfmagic.profile(sample=True, outdir=tmp_path) as session:
        job()
    return session.report


def _card(report: Report, *ids: str) -> dict[str, Any]:
    cards = [c for c in report.advice if c["id"] in ids and c.get("replaces")]
    assert cards, f"no card of {ids} replaces the user's DataLoader call:\n{report}"
    return cards[0]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_the_workers_fix_is_the_users_own_call_and_runs_in_their_loop(tmp_path: Path) -> None:
    report = _profile(tmp_path, lambda: train_shuffled(SlowSamples(48)))
    card = _card(report, "dataloader_workers")
    workers = card["metrics"]["recommended_workers"]
    fix = card["fix"]
    assert card["replaces"]["file"] == __file__
    assert "train_loader = torch.utils.data.DataLoader(" in fix, fix  # their name for it, and its spelling
    assert "shuffle=True" in fix and "drop_last=True" in fix and "batch_size=4" in fix, fix
    assert f"num_workers={workers},  # was 0" in fix, fix
    pasted = pasted_module(card)
    spy = LoaderSpy()
    pasted.torch = _TorchWith(spy)
    assert pasted.train_shuffled(SlowSamples(8, delay_s=0.0)) == 2  # the fixed loop trains
    (called,) = spy.calls
    assert called == {
        "batch_size": 4,
        "shuffle": True,
        "drop_last": True,
        "num_workers": workers,
        "persistent_workers": True,
    }


def test_the_plain_loops_fix_goes_where_its_loader_was_built(tmp_path: Path) -> None:
    """torchloops.train builds its loader with a bare ``DataLoader(``, iterated through ``iter``/``next``."""
    report = _profile(tmp_path, lambda: torchloops.train(12, data_s=SAMPLE_S))
    card = _card(report, "dataloader_workers", "input_bound")
    assert card["replaces"]["file"] == torchloops.__file__
    site = card["replaces"]
    assert site["where"] == f"tests/torchloops.py:{site['line']}", site  # as the user names the line
    assert card["fix"].startswith(f"# in place of {site['where']}:\nloader = DataLoader(\n"), card["fix"]
    pasted = pasted_module(card)
    timings = pasted.train(1)
    assert timings.steps == 1


class _TorchWith:
    """``torch``, except that ``torch.utils.data.DataLoader`` is the spy."""

    def __init__(self, spy: LoaderSpy) -> None:
        self.utils = SimpleNamespace(data=SimpleNamespace(DataLoader=spy))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


NOTEBOOK = [
    "%load_ext perfmagic\nimport json\nimport time\nimport torch",
    "class Slow(torch.utils.data.Dataset):\n"
    "    def __len__(self):\n        return 64\n\n"
    "    def __getitem__(self, i):\n        time.sleep(0.03)\n        return torch.ones(8), torch.ones(1)",
    "\ntrain_set = Slow()\ntrain_loader = torch.utils.data.DataLoader(train_set, batch_size=4, shuffle=True)",
    "%%gpuprofile --quiet -v report\n"
    "model = torch.nn.Linear(8, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
    "for x, y in train_loader:\n"
    "    torch.nn.functional.mse_loss(model(x), y).backward()\n    opt.step()\n    opt.zero_grad()",
    "card = next(c for c in report.advice if c['id'] == 'dataloader_workers')\n"
    "get_ipython().run_cell(card['fix'])  # as the user pastes it into a cell and runs it\n"
    "x, y = next(iter(train_loader))  # a step's batch, from the fixed loader\n"
    "print(json.dumps({'card': card, 'workers': train_loader.num_workers,\n"
    "                  'sampler': type(train_loader.sampler).__name__, 'batch': list(x.shape)}))",
]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_in_a_notebook_the_fix_is_the_set_up_cells_statement_and_runs_pasted(tmp_path: Path) -> None:
    """The loader is built in cell 3 (after a blank line the notebook shows), the loop profiled in cell 4:
    the fix names ``In [3], line 3``, is that statement with the workers added, and pasted into a cell
    it builds a loader that keeps the user's shuffling."""
    out = printed_json(run_cells(NOTEBOOK, tmp_path))
    card = out["card"]
    assert card["replaces"]["where"] == "In [3], line 3", card["replaces"]
    assert "train_loader = torch.utils.data.DataLoader(" in card["fix"], card["fix"]
    assert "shuffle=True" in card["fix"] and "batch_size=4" in card["fix"], card["fix"]
    assert out["workers"] == card["metrics"]["recommended_workers"] > 0
    assert out["sampler"] == "RandomSampler" and out["batch"] == [4, 8]
