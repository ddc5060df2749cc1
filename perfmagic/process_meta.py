"""Who a profiled process is: the facts its timeline starts with, and what the exporter knows it by."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfmagic.clock import Clock

if TYPE_CHECKING:
    from perfmagic.contract import TimelineMeta

IDENTITY = ("pid", "hostname", "rank", "local_rank", "node_rank", "world_size", "epoch")
"""The meta keys that tell one training process from another (the exporter's status file)."""


def process_meta(
    clock: Clock, source: str, interval: float, price_per_gpu_hour: float | None
) -> TimelineMeta:
    """The timeline's first facts: when the window began on the wall clock, the process, its rank
    under a launcher (torchrun's environment), how it was started, how it is sampled, and the user's
    price of a GPU hour where given."""
    meta: TimelineMeta = {
        "epoch": clock.wall(),
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "rank": _env_int("RANK"),
        "local_rank": _env_int("LOCAL_RANK"),
        "node_rank": _env_int("GROUP_RANK"),  # torchrun's node rank
        "world_size": _env_int("WORLD_SIZE"),
        "argv": list(sys.argv),
        "python": sys.version.split()[0],
        "source": source,
        "interval": interval,
    }
    if price_per_gpu_hour is not None:
        meta["price_per_gpu_hour"] = price_per_gpu_hour
    return meta


def process_identity(meta: TimelineMeta) -> dict[str, Any]:
    """The exporter's name for the process: its identity in ``meta`` and the program it runs."""
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else None
    return {k: meta.get(k) for k in IDENTITY} | {"program": program}


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
