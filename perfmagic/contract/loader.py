"""The DataLoader's settings as the hooks noted them when the loop first iterated it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perfmagic.contract.code import CallHint
from perfmagic.contract.memory import DatasetContainer


@dataclass(frozen=True)
class LoaderConfig:
    """A ``dataloader`` mark (``perfmagic.collect.loaders.loader_settings``), read once.

    A setting the mark lacks (a timeline an older perfmagic saved) is the DataLoader's own default,
    or None where it has none."""

    num_workers: int = 0
    pin_memory: bool = False
    prefetch_factor: int | None = None  # None: no workers, or a torch that has no such setting
    persistent_workers: bool = False
    batch_size: int | None = None  # None: the user's own batch sampler makes the batches
    drop_last: bool = False
    dataset: str | None = None  # the dataset's class name
    dataset_len: int | None = None  # None: a dataset without a length (an iterable one, mostly)
    iterable: bool = False  # an ``IterableDataset``
    cpu_count: int | None = None  # ``os.cpu_count()`` of the training process
    call: CallHint | None = None  # where fixes find the user's ``DataLoader(...)`` statement
    start_method: str | None = None  # how its workers start ("fork", "spawn", "forkserver"); None: no workers
    dataset_name: str | None = None  # the dataset's name in the code that iterated the loader
    containers: tuple[DatasetContainer, ...] = ()  # the dataset's largest lists and dicts (with workers)

    @classmethod
    def from_mark(cls, mark: Mapping[str, Any]) -> LoaderConfig:
        """The settings of a ``dataloader`` mark's data."""
        return cls(
            num_workers=int(mark.get("num_workers") or 0),
            pin_memory=bool(mark.get("pin_memory")),
            prefetch_factor=mark.get("prefetch_factor"),
            persistent_workers=bool(mark.get("persistent_workers")),
            batch_size=mark.get("batch_size"),
            drop_last=bool(mark.get("drop_last")),
            dataset=mark.get("dataset"),
            dataset_len=mark.get("dataset_len"),
            iterable=bool(mark.get("iterable")),
            cpu_count=mark.get("cpu_count"),
            call=mark.get("call"),
            start_method=mark.get("start_method"),
            dataset_name=mark.get("dataset_name"),
            containers=tuple(mark.get("containers") or ()),
        )
