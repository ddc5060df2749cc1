"""What a DataLoader's dataset holds as Python objects, and how its workers start.

A forked worker shares its parent's pages until it writes one; reading a Python object writes its
reference count, so a worker that reads a dataset of lists and dicts copies the pages those objects
lie on (copy-on-read). Numpy arrays and tensors are one object over one buffer: their samples are
read without a write. A worker started by ``spawn`` or ``forkserver`` unpickles its own copy of the
dataset instead. These are noted once, when the loop first iterates the DataLoader.
"""

from __future__ import annotations

import itertools
import multiprocessing
import sys
from collections import Counter
from typing import Any

from perfmagic.contract.memory import DatasetContainer

MIN_ITEMS = 1000
"""Items a list or dict of the dataset needs to be noted: smaller ones cost its workers little."""
SAMPLED = 8
"""Items whose sizes stand for the container's (its first ones)."""
KEPT = 3
"""The largest containers noted."""


def python_containers(dataset: Any, depth: int = 2) -> list[DatasetContainer]:
    """The dataset's largest list and dict attributes (and those of a dataset it wraps: a ``Subset``'s
    ``dataset``), largest first, each with an estimate of its bytes."""
    found: list[DatasetContainer] = []
    _look(dataset, "", found, depth, {id(dataset)})
    return sorted(found, key=lambda c: -c["bytes"])[:KEPT]


def _look(obj: Any, prefix: str, found: list[DatasetContainer], depth: int, seen: set[int]) -> None:
    attributes = getattr(obj, "__dict__", None)
    if not isinstance(attributes, dict):
        return
    for name, value in list(attributes.items()):
        if id(value) in seen or not isinstance(name, str):
            continue
        seen.add(id(value))
        if isinstance(value, list | dict) and len(value) >= MIN_ITEMS:
            found.append(_container(f"{prefix}{name}", value))
        elif depth > 1 and hasattr(type(value), "__getitem__") and not isinstance(value, type):
            _look(value, f"{prefix}{name}.", found, depth - 1, seen)


def _container(path: str, value: list[Any] | dict[Any, Any]) -> DatasetContainer:
    items = list(itertools.islice(value.values() if isinstance(value, dict) else value, SAMPLED))
    kinds = Counter(type(item).__name__ for item in items)
    kind = f"{type(value).__name__} of {kinds.most_common(1)[0][0]}" if kinds else type(value).__name__
    each = sum(_size(item) for item in items) / len(items) if items else 0.0
    keys = (
        sum(sys.getsizeof(k) for k in itertools.islice(value, SAMPLED)) / len(items)
        if isinstance(value, dict) and items
        else 0.0
    )
    return {
        "attribute": path,
        "kind": kind,
        "length": len(value),
        "bytes": int(sys.getsizeof(value) + len(value) * (each + keys)),
    }


def _size(item: Any) -> int:
    """An item's bytes with those of the objects it holds, one level down (a dict's keys are mostly
    shared strings: left out)."""
    inner: Any = item.values() if isinstance(item, dict) else item if isinstance(item, list | tuple) else ()
    return sys.getsizeof(item) + sum(sys.getsizeof(v) for v in inner)


def start_method(loader: Any) -> str:
    """How the loader's workers start: its ``multiprocessing_context``'s method, else the process's
    default (asked without fixing it, which ``multiprocessing.get_context()`` would)."""
    context = getattr(loader, "multiprocessing_context", None)
    if context is not None:
        method = context if isinstance(context, str) else context.get_start_method()
        return str(method)
    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
