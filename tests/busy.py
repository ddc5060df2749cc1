"""Other processes that keep CPUs busy: the crowded machine a test profiles beside, made in the test."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def spinners(count: int) -> Iterator[None]:
    """``count`` other processes, outside the training's process tree, that each keep a CPU busy."""
    spin = f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"
    pids = [
        int(subprocess.run(["sh", "-c", spin], capture_output=True, text=True, check=True).stdout)
        for _ in range(count)
    ]  # the shell exits: each spinner is no child of this process
    time.sleep(0.3)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def busy_cpus() -> Iterator[None]:
    """Other processes that keep every CPU busy."""
    with spinners(len(os.sched_getaffinity(0))):
        yield


@pytest.fixture
def busy_cpu() -> Iterator[None]:
    """Another process that keeps one CPU busy."""
    with spinners(1):
        yield
