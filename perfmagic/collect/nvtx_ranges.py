"""NVTX ranges for the stages, only when a tool collects them (Nsight Systems, Nsight Compute)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def _no_range(*_: Any, **__: Any) -> None:
    return None


def nvtx_listened() -> bool:
    """Whether a tool collects NVTX ranges: Nsight Systems and Nsight Compute inject themselves through
    these variables when they start the process. Without one, a range would cost for nothing."""
    return bool(os.environ.get("NVTX_INJECTION64_PATH") or os.environ.get("NVTX_INJECTION32_PATH"))


nvtx_push: Callable[..., Any] = _no_range
nvtx_pop: Callable[..., Any] = _no_range
NVTX = False  # checked before each range: no call at all on the hot path when nothing listens
if nvtx_listened():
    try:
        import nvtx as _nvtx

        nvtx_push, nvtx_pop, NVTX = _nvtx.push_range, _nvtx.pop_range, True
    except Exception:  # nvtx is a dependency, but a broken install must not stop profiling
        pass


class _NoRecorder:
    """Stand-in used when no session is active: stages are NVTX ranges only."""

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        nvtx_push(name, domain="perfmagic")
        try:
            yield
        finally:
            nvtx_pop(domain="perfmagic")


NO_RECORDER = _NoRecorder()
