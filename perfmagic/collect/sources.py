"""The sources a session samples: the metric sources by default, and where the training thread is."""

from __future__ import annotations

import os

from perfmagic.clock import REAL_CLOCK, Clock
from perfmagic.collect.sampler import Source
from perfmagic.collect.stacks import StackSource, StageCursor


def default_sources(clock: Clock = REAL_CLOCK) -> list[Source]:
    """NVML (its slow reads timed on ``clock``), the host, PyTorch's CUDA allocator and DataLoader workers."""
    from perfmagic.collect.cuda import AllocatorSource
    from perfmagic.collect.host import HostSource
    from perfmagic.collect.nvml_source import NvmlSource
    from perfmagic.collect.worker_load import WorkerLoadSource

    return [NvmlSource(clock=clock), HostSource(root_pid=os.getpid()), AllocatorSource(), WorkerLoadSource()]


def session_sources(given: list[Source] | None, clock: Clock, stages: StageCursor | None) -> list[Source]:
    """The sources a window samples: ``given``, else the defaults; first, where the training thread is by
    stage, when stages are recorded (first in each tick: the sampler has just won the GIL from the
    training thread, before other sources' I/O hands it back and forth, which would favour moments in
    torch calls)."""
    sources = list(given if given is not None else default_sources(clock))
    return [StackSource(stages), *sources] if stages is not None else sources
