"""Where the loaders' time goes while they build batches: one account that every data rule reads.

The loaders are the training thread itself (no DataLoader workers) or the workers. Their
loading time splits into:

- ``cpu``: on a CPU (thread CPU clocks);
- ``queued``: runnable but waiting for a CPU (Linux run delay): CPU demand, never I/O;
- ``blocked``: neither, and of it ``disk``: uninterruptible sleep (``D``), sampled each tick:
  mostly reads from storage;
- ``sleep``: the rest of the blocked time, in an interruptible sleep: ``time.sleep``, a lock, the network,
  or (for the training thread) workers that have not delivered.

Workers also say how much of their time they build batches at all (``busy``; the rest they
wait for work) and what one batch takes one worker (``batch_s``). A share is None where it
was not measured: without the run delay (no schedstat) CPU demand and blocking cannot be told
apart, and the report says the split is unknown.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

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

Loaders = Literal["training thread", "workers"]


@dataclass(frozen=True)
class LoadingAccount:
    """Shares of the loaders' loading time: ``cpu + queued + blocked`` is 1 where all are measured."""

    loaders: Loaders
    cpu: float | None
    queued: float | None
    blocked: float | None
    disk: float | None  # of ``blocked``, in uninterruptible sleep (None: states not sampled)
    busy: float | None = None  # workers: share of their time spent building batches
    batch_s: float | None = None  # workers: seconds one worker takes to build one batch

    @property
    def cpu_demand(self) -> float | None:
        """On a CPU or queued for one: loading that more CPUs (not more waiting) would speed up."""
        return self.cpu + self.queued if self.cpu is not None and self.queued is not None else None

    @property
    def sleep(self) -> float | None:
        """Blocked in an interruptible sleep: ``time.sleep``, a lock, the network, the workers."""
        return self.blocked - self.disk if self.blocked is not None and self.disk is not None else None


def loading_account(loop: LoopFacts, means: Mapping[str, float], workers: int) -> LoadingAccount | None:
    """The account of the steady steps' loading, from the loop's fetch clocks (no workers) or the
    workers' own (``collect.worker_load``), with the states sampled beside them."""
    if not workers:
        return _split(
            "training thread", loop.data_cpu_share, loop.data_wait_share, means.get(LOADER_THREAD_DISK)
        )
    timed = _finite(means.get(LOADER_BUSY))
    if timed:  # the workers' own account of their fetches
        busy, cpu, queued = timed, means.get(LOADER_BUSY_CPU), means.get(LOADER_BUSY_QUEUED)
    else:  # workers not timed (spawned, or forked before the window): all their time counts as loading
        busy, cpu, queued = float(workers), means.get(CHILDREN_CPU), means.get(CHILDREN_QUEUED)

    def per_busy(value: float | None) -> float | None:
        value = _finite(value)
        return min(1.0, value / busy) if value is not None else None

    account = _split("workers", per_busy(cpu), per_busy(queued), per_busy(means.get(CHILDREN_DISK)))
    if not timed:
        return account
    batches = _finite(means.get(LOADER_BATCHES))
    return replace(account, busy=min(1.0, timed / workers), batch_s=timed / batches if batches else None)


def _split(loaders: Loaders, cpu: float | None, queued: float | None, disk: float | None) -> LoadingAccount:
    """The blocked rest after CPU and queueing, and its uninterruptible part (sampled: at most all of it)."""
    if cpu is None or queued is None:
        return LoadingAccount(loaders, cpu, None, None, None)
    blocked = max(0.0, 1.0 - cpu - queued)
    return LoadingAccount(loaders, cpu, queued, blocked, min(blocked, disk) if disk is not None else None)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
