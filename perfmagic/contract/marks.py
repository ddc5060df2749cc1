"""What the hooks record of the training's set-up, as the analysis reads it (``TrainingConfig``): the
``model``, ``optimizer``, ``checkpoint``, ``trainer`` and ``tf_data`` marks, and the ``torch_stats`` counters written
as the torch hooks come out.

Each mark's payload is written whole by its hook (``collect.torch_forward``, ``collect.torch_optimizer``,
``collect.torch_checkpoint``, ``collect.frameworks``, ``collect.keras``, ``collect.tfdata``,
``collect.torch_hooks``); the analysis reads them
back typed.
"""

from __future__ import annotations

from typing import Any, TypedDict

from perfmagic.contract.code import CallHint
from perfmagic.contract.meta import CodePlace


class CallSite(TypedDict):
    """The user's line that made a call (``collect.stacks.call_site``): as compiled, to read its source,
    and as its user knows it (``place``)."""

    file: str
    line: int
    function: str
    place: CodePlace


class ModelMark(TypedDict):
    """``model``: a module the training called at top level, as first called."""

    cls: str  # its class
    variable: str | None  # the name the user's code calls it by ("net"); None: not found (or an older record)
    parameters: int
    param_dtype: str | None  # the first parameter's ("float32"); None without parameters
    device: str | None  # the first parameter's ("cuda:0")
    data_parallel: bool  # an nn.DataParallel
    ddp: bool  # a DistributedDataParallel
    compiled: bool  # torch.compile's OptimizedModule
    training: bool  # in training mode
    call_site: CallSite | None  # the user's line that called it (None: only library code called it)


class OptimizerMark(TypedDict):
    """``optimizer``: an optimizer the training stepped, as first stepped."""

    cls: str  # its class: "AdamW"
    variable: str | None  # the name the user's code steps it by ("opt"); None: not found (or an older record)
    foreach: bool | None  # its defaults' ``foreach`` and ``fused`` (None: the optimizer's own choice)
    fused: bool | None
    parameters: int
    call: CallHint | None  # where fixes find the user's statement that built it (None: an older record)


class _TorchCounters(TypedDict):
    forwards: int
    autocast_forwards: int
    autocast_dtypes: dict[str, int]  # forwards under autocast, by dtype
    grad_enabled_forwards: int
    h2d_copies: int  # host-to-device copies
    h2d_bytes: int
    h2d_pinned_bytes: int  # of them, from pinned memory
    h2d_non_blocking: int  # copies asked with non_blocking=True
    syncs: int  # host-device synchronizations the loop called (``.item()``, ``.cpu()``, …)
    optimizer_steps: int
    batches: int  # DataLoader batches


class TorchCounters(_TorchCounters, total=False):
    """``torch_stats``: what the torch hooks counted over the window (all 0 without them)."""

    num_threads: int  # torch's intra-op threads as the hooks came out (after any set_num_threads)


def no_counters() -> TorchCounters:
    """The counters of a window without torch hooks: nothing counted."""
    return TorchCounters(
        forwards=0,
        autocast_forwards=0,
        autocast_dtypes={},
        grad_enabled_forwards=0,
        h2d_copies=0,
        h2d_bytes=0,
        h2d_pinned_bytes=0,
        h2d_non_blocking=0,
        syncs=0,
        optimizer_steps=0,
        batches=0,
    )


class _CheckpointMark(TypedDict):
    t: float  # when the save began, on the timeline's clock (the mark's own time)
    fn: str  # the call that saved: "torch.save", "lightning.Trainer.save_checkpoint", …
    seconds: float
    bytes: int | None  # what it wrote (None: unknown, as for a stream without a size)
    what: str  # "state_dict", "dict", a framework's routine ("checkpoint"), else the object's type


class CheckpointMark(_CheckpointMark, total=False):
    """``checkpoint``: one save the training made (``collect.torch_checkpoint``)."""

    keys: list[str]  # a checkpoint dict's top-level keys (the first 32)
    files: int  # a framework's routine: the saves inside it


class PipelineMark(TypedDict):
    """``tf_data``: a tf.data pipeline the training iterated (``collect.tfdata.describe_pipeline``)."""

    ops: list[str]  # the datasets' kinds, last first: "prefetch", "batch", "map", …
    serial_maps: int  # maps that run one element at a time
    parallel_maps: int
    prefetch: bool  # a prefetch anywhere in it
    cache: bool


class TrainerMark(TypedDict):
    """``trainer``: the framework that drove the loop (``collect.frameworks``, ``collect.keras``)."""

    trainer: str  # schema.TRAINERS
    version: str | None
    settings: dict[str, Any]  # what it was told, as the user's code set it: each framework its own
