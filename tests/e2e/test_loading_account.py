"""A data wait split the way the training thread spent it: on a CPU, queued for one, or blocked.

A CPU-bound ``__getitem__`` beside busy processes waits for a CPU for much of its fetch; that is CPU
demand, and the report must not call it I/O. Without the run delay (no schedstat, as in some
containers) the split is unknown, and the report says nothing of I/O either.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from busy import spinners

import perfmagic
from perfmagic.report import Report

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset  # noqa: E402


class Computed(Dataset[Any]):
    """Each sample costs CPU in the training thread, as decoding and resizing would (numpy FFTs)."""

    def __len__(self) -> int:
        return 4 * 60

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        x = np.random.default_rng(i).standard_normal((96, 96))
        for _ in range(6):
            x = np.abs(np.fft.ifft2(np.fft.fft2(x))) + 1.0
        return torch.from_numpy(x[:8].reshape(-1).astype(np.float32)), i % 10


def profiled(tmp_path: Path) -> Report:
    model = torch.nn.Sequential(torch.nn.Linear(768, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Computed(), batch_size=4, num_workers=0)
    with perfmagic.profile(outdir=tmp_path) as session:
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return session.report


def words(report: Report, *ids: str) -> str:
    return " ".join(f"{c['title']} {c['evidence']} {c['fix']}" for c in report.advice if c["id"] in ids)


@pytest.fixture
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def test_a_cpu_bound_loader_on_a_crowded_machine_is_not_called_io(tmp_path: Path, one_thread: None) -> None:
    """Seen by a user: "loading waits on I/O: the training thread was on a CPU only 37% of the wait" for a
    numpy __getitem__ beside busy processes. Two spinners a CPU leave the training thread a CPU well under
    half of the time, so only its run delay tells queueing from blocking."""
    with spinners(2 * len(os.sched_getaffinity(0))):
        report = profiled(tmp_path)
    loop = report.analysis.loop if report.analysis is not None else None
    assert loop is not None and loop.data_cpu_share is not None and loop.data_wait_share is not None
    # measured in this run: the training thread queued for a CPU during its fetches, and ran or queued
    # for most of them (a CPU-bound fetch has little else to do)
    assert loop.data_wait_share > 0.1 and loop.data_cpu_share + loop.data_wait_share >= 0.5, loop
    text = words(report, "input_bound", "dataloader_workers")
    assert "input_bound" in {c["id"] for c in report.advice}, str(report)
    assert "I/O" not in text and "blocked" not in text and "need no CPU" not in text, text
    assert "CPU-bound" in text, text
    workers = [c for c in report.advice if c["id"] == "dataloader_workers"]
    assert all(c["metrics"]["loading"] == "cpu" for c in workers), workers


def test_without_schedstat_the_split_is_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def no_schedstat(path: Any, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith("schedstat"):
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_schedstat)
    report = profiled(tmp_path)
    assert report.analysis is not None and report.analysis.loop.data_wait_share is None
    text = words(report, "input_bound", "dataloader_workers")
    assert "I/O" not in text and "blocked" not in text and "CPU-bound" not in text, text
