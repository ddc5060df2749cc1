"""The metric sources a session samples by default."""

from __future__ import annotations

import os

from perfmagic.clock import REAL_CLOCK, Clock
from perfmagic.collect.sampler import Source


def default_sources(clock: Clock = REAL_CLOCK) -> list[Source]:
    """NVML (its slow reads timed on ``clock``), the host, PyTorch's CUDA allocator and DataLoader workers."""
    from perfmagic.collect.cuda import AllocatorSource
    from perfmagic.collect.host import HostSource
    from perfmagic.collect.nvml_source import NvmlSource
    from perfmagic.collect.worker_load import WorkerLoadSource

    return [NvmlSource(clock=clock), HostSource(root_pid=os.getpid()), AllocatorSource(), WorkerLoadSource()]
