"""A data wait split the way the training thread spent it: on a CPU, queued for one, or blocked.

A CPU-bound ``__getitem__`` beside busy processes waits for a CPU for much of its fetch; that is CPU
demand, and the report must not call it I/O. Without the run delay (no schedstat, as in some
containers) the split is unknown, and the report says nothing of I/O either.
"""

from __future__ import annotations

import mmap
import os
import time
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


def profiled(tmp_path: Path, dataset: Dataset[Any] | None = None) -> Report:
    model = torch.nn.Sequential(torch.nn.Linear(768, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Computed() if dataset is None else dataset, batch_size=4, num_workers=0)
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


def test_on_a_crowded_machine_only_a_loader_that_sleeps_is_blocked(tmp_path: Path, one_thread: None) -> None:
    """Seen on a 2-CPU VM beside busy processes: an in-memory loader read as "blocked the rest" (the
    hypervisor took the CPU, and no run delay shows that). A fetch that never slept was never blocked."""
    with spinners(2 * len(os.sched_getaffinity(0))):
        in_memory, sleeping = (
            profiled(tmp_path / "memory", InMemory()),
            profiled(tmp_path / "sleep", Sleeping()),
        )
    memory_account = in_memory.analysis.loading if in_memory.analysis is not None else None
    sleep_account = sleeping.analysis.loading if sleeping.analysis is not None else None
    assert memory_account is not None and memory_account.blocked is not None, str(in_memory)
    assert sleep_account is not None and sleep_account.blocked is not None, str(sleeping)
    # in this run: the sleeping loader's fetches spent most of their time asleep (SLEEP_S a sample)
    assert sleep_account.blocked >= 0.5, sleep_account
    assert memory_account.blocked <= 0.2, memory_account
    assert "blocked" not in words(in_memory, "input_bound", "dataloader_workers"), str(in_memory)


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


SLEEP_S = 0.004


class Sleeping(Dataset[Any]):
    """Each sample waits without a CPU, as a read from network storage does."""

    def __len__(self) -> int:
        return 8 * 40

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        time.sleep(SLEEP_S)
        return torch.zeros(768), i % 10


class InMemory(Dataset[Any]):
    """Samples already in memory: a worker builds a batch in well under a millisecond of work."""

    def __init__(self) -> None:
        self.x = torch.randn(8 * 60, 768)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        return self.x[i], i % 10


CHUNK = 1 << 20


class DirectReads(Dataset[Any]):
    """Each sample read from a file past the page cache (``O_DIRECT``): the reader waits on the disk, in
    uninterruptible sleep, as reads of a dataset too large to cache do."""

    def __init__(self, path: Path, chunks: int) -> None:
        self.path, self.chunks = path, chunks

    def __len__(self) -> int:
        return 8 * 40

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
        buffer = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT wants
        try:
            os.preadv(fd, [buffer], (i * 7919 % self.chunks) * CHUNK)
        finally:
            os.close(fd)
        return torch.frombuffer(bytearray(buffer[: 768 * 4]), dtype=torch.float32), i % 10


def trained(tmp_path: Path, dataset: Dataset[Any], workers: int, width: int = 64) -> Report:
    """A small model trained on ``dataset`` through a DataLoader of ``workers`` workers, profiled."""
    model = torch.nn.Sequential(torch.nn.Linear(768, width), torch.nn.ReLU(), torch.nn.Linear(width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(dataset, batch_size=8, num_workers=workers)
    with perfmagic.profile(outdir=tmp_path, interval=0.02) as session:
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(torch.nan_to_num(x)), y).backward()
            opt.step()
    return session.report


def test_sleeping_workers_are_blocked_not_computing(tmp_path: Path, one_thread: None) -> None:
    report = trained(tmp_path, Sleeping(), workers=2)
    loading = report["loading"]
    assert loading is not None and loading["loaders"] == "workers", loading
    # a batch of 8 sleeps at least 8 sleeps; of that time the workers computed little and read no disk
    assert loading["batch_s"] is not None and loading["batch_s"] >= 8 * SLEEP_S, loading
    assert loading["sleep"] is not None and loading["cpu"] is not None and loading["queued"] is not None
    assert loading["sleep"] > loading["cpu"] + loading["queued"] and (loading["disk"] or 0.0) < 0.1, loading
    if report["stages"]["data"]["fraction"] >= 0.05:  # measured in this run: the step waited for them
        text = words(report, "input_bound", "dataloader_workers")
        assert "slept" in text and "CPU-bound" not in text, text


def test_workers_waiting_for_work_are_not_called_blocked(tmp_path: Path, one_thread: None) -> None:
    """Workers that build each batch in a fraction of a step spend the rest waiting for their next index:
    in the kernel, as a worker asleep in ``__getitem__`` is. Their own clocks tell the two apart."""
    report = trained(tmp_path, InMemory(), workers=2, width=2048)
    loading = report["loading"]
    assert loading is not None and loading["loaders"] == "workers", loading
    steady = report.analysis.steady if report.analysis is not None else None
    assert steady is not None and loading["batch_s"] is not None
    # measured in this run: a batch took a worker less than the step it feeds, so each sat idle
    assert loading["batch_s"] < steady.step_s and loading["busy"] is not None and loading["busy"] < 0.5, (
        loading
    )
    assert "dataloader_workers" not in {c["id"] for c in report.advice}, str(report)
    assert "slept" not in words(report, "input_bound"), str(report)


@pytest.mark.parametrize("workers", [0, 2])
def test_reads_from_disk_are_disk_waits(tmp_path: Path, workers: int, one_thread: None) -> None:
    path, chunks = tmp_path / "samples.bin", 32
    with open(path, "wb") as f:
        for _ in range(chunks):
            f.write(os.urandom(CHUNK))
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
    except OSError as e:
        pytest.skip(f"this file system has no O_DIRECT ({e})")
    report = trained(tmp_path, DirectReads(path, chunks), workers=workers)
    loading = report["loading"]
    assert loading is not None and loading["loaders"] == ("workers" if workers else "training thread")
    # the loaders' sampled states found them blocked in disk reads more than anything else blocking them
    disk, blocked = loading["disk"], loading["blocked"]
    assert disk is not None and blocked is not None and disk > 0.05 and disk >= 0.5 * blocked, loading
    if not workers:  # the training thread read them: its data stage waited on storage, by stage too
        assert report["disk_waits"]["data"]["share"] > 0.05, report["disk_waits"]
    if (
        blocked >= 0.5 and report["stages"]["data"]["fraction"] >= 0.05
    ):  # measured: blocked loading held the step
        assert "disk reads" in words(report, "input_bound", "io_bound"), str(report)
