"""What the hooks note of a DataLoader when the loop first iterates it: its settings and its call."""

from __future__ import annotations

import os
from types import FrameType
from typing import Any

from perfmagic.collect.call_hints import call_hint
from perfmagic.collect.dataset_memory import python_containers, start_method
from perfmagic.collect.torch_memory import name_in_caller


def loader_settings(loader: Any, torch: Any, frame: FrameType | None) -> dict[str, Any]:
    """The ``dataloader`` mark of ``loader``, iterated from ``frame`` (or a caller of it)."""
    try:
        length: int | None = len(loader.dataset)
    except Exception:  # no __len__ (TypeError), or one that raises whatever its author chose
        length = None
    return {
        "num_workers": loader.num_workers,
        "pin_memory": bool(loader.pin_memory),
        "prefetch_factor": getattr(loader, "prefetch_factor", None),  # torch >= 1.7
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),  # torch >= 1.7
        "batch_size": loader.batch_size,
        "drop_last": bool(loader.drop_last),
        "dataset": type(loader.dataset).__name__,
        "dataset_len": length,
        "iterable": isinstance(loader.dataset, torch.utils.data.IterableDataset),
        "cpu_count": os.cpu_count(),
        "call": call_hint(loader, frame),  # where fixes find the user's DataLoader(...) statement
        # what its workers copy: only workers copy, so a loader without them is not looked into
        "start_method": start_method(loader) if loader.num_workers else None,
        "dataset_name": name_in_caller(loader.dataset, frame) if loader.num_workers else None,
        "containers": python_containers(loader.dataset) if loader.num_workers else [],
    }
