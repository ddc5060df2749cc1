"""tf.data: what an input pipeline is made of, and the ``data`` stage of loops that iterate one.

A ``tf.data.Dataset`` is a chain of datasets, each made from the one before
(``_inputs()``). Walking it says what the input-pipeline advice is written in:
whether each ``map`` runs in parallel, whether the pipeline caches and
prefetches. A custom training loop (``for x, y in dataset: train_step(x, y)``)
takes each batch through ``OwnedIterator.__next__``: timed as ``data``, a step
boundary of kind ``batch`` after it, as a torch DataLoader's batches are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perfmagic.collect.patching import Patcher
from perfmagic.collect.recorder import StageRecorder
from perfmagic.collect.tracebacks import drop_own_frame
from perfmagic.contract.marks import PipelineMark
from perfmagic.schema import TF_DATA_MARK

_MAX_DEPTH = 64
"""Datasets walked at most (a pipeline longer than this is described by its last ones)."""


def describe_pipeline(dataset: Any) -> PipelineMark:
    """The ops of a tf.data pipeline, last first, and what the advice reads of them.

    ``ops``: the datasets' kinds (``map``, ``parallel_map``, ``batch``, ``cache``, ``prefetch``, ...);
    ``serial_maps``: maps that run one element at a time; ``prefetch``, ``cache``: present anywhere.
    """
    ops: list[str] = []
    node = dataset
    for _ in range(_MAX_DEPTH):
        if node is None:
            break
        ops.append(_kind(type(node).__name__))
        inputs = node._inputs() if hasattr(node, "_inputs") else []
        node = inputs[0] if inputs else None
    return {
        "ops": ops,
        "serial_maps": ops.count("map"),
        "parallel_maps": ops.count("parallel_map"),
        "prefetch": "prefetch" in ops,
        "cache": "cache" in ops,
    }


def _kind(class_name: str) -> str:
    """``_ParallelMapDataset`` → ``parallel_map``; ``CacheDataset`` → ``cache``."""
    name = class_name.strip("_").removesuffix("DatasetV2").removesuffix("DatasetV1").removesuffix("Dataset")
    out = "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
    return out or class_name


def record_pipeline(recorder: StageRecorder, dataset: Any, seen: set[int]) -> None:
    """Leave a ``tf_data`` mark describing ``dataset`` (once per dataset object)."""
    if id(dataset) in seen:
        return
    seen.add(id(dataset))
    recorder.timeline.add_mark(
        recorder.clock.now() - recorder.origin, TF_DATA_MARK, **describe_pipeline(dataset)
    )


class TfDataLoop:
    """Times ``next()`` on tf.data iterators as ``data``; a ``batch`` boundary follows each batch."""

    def __init__(self, recorder: StageRecorder, on_framework: Callable[[str], None]) -> None:
        self._recorder = recorder
        self._on_framework = on_framework  # told "tensorflow" when a pipeline is iterated
        self._patcher = Patcher()
        self._seen: set[int] = set()

    def install(self) -> None:
        from tensorflow.python.data.ops import iterator_ops

        owned = iterator_ops.OwnedIterator
        recorder, data = self._recorder, self._recorder.stage_id("data")
        next_ = owned.__next__
        init = owned.__init__
        seen, on_framework = self._seen, self._on_framework

        def __init__(it: Any, dataset: Any = None, *args: Any, **kwargs: Any) -> None:
            init(it, dataset, *args, **kwargs)
            if dataset is not None and recorder.on_recorded_thread():
                on_framework("tensorflow")
                record_pipeline(recorder, dataset, seen)

        def __next__(it: Any) -> Any:
            try:
                if not recorder.enter(data):
                    return next_(it)
                try:
                    batch = next_(it)
                finally:
                    recorder.exit()
                recorder.boundary("batch")
                return batch
            except BaseException as e:
                drop_own_frame(e)
                raise

        self._patcher.set(owned, "__init__", __init__)
        self._patcher.set(owned, "__next__", __next__)

    def uninstall(self) -> list[str]:
        return self._patcher.restore()
