"""The typed contract: the report, the timeline's meta, the torch hooks' marks, the tuning results and
the comparison of two reports, as plain typed data.

The report a renderer reads (:class:`ReportData`), the facts the collectors write into
``Timeline.meta`` (:class:`TimelineMeta`), the set-up the hooks mark (:class:`ModelMark`,
:class:`OptimizerMark`, :class:`CheckpointMark`, :class:`TorchCounters`, :class:`TrainerMark`,
tf.data's :class:`PipelineMark`), what tuning measured (:class:`KnobResult`) and the comparison of two
reports (:class:`ComparisonData`) are ``TypedDict``s over JSON-safe values, their key names exactly
those the code writes. The DataLoader's settings the analysis reads from its mark are a frozen
dataclass (:class:`LoaderConfig`), read by attribute. Layer 0: it imports nothing else of perfmagic.

Each name is imported from its module when first read: a profiled process reads the marks alone
(``contract.marks``) and should not build every ``TypedDict`` of the report as it starts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from perfmagic.contract.comparison import ComparisonData as ComparisonData
    from perfmagic.contract.comparison import ProblemData as ProblemData
    from perfmagic.contract.energy import Energy as Energy
    from perfmagic.contract.energy import StageEnergy as StageEnergy
    from perfmagic.contract.gpu import GpuSection as GpuSection
    from perfmagic.contract.gpu import MemoryPeak as MemoryPeak
    from perfmagic.contract.loader import LoaderConfig as LoaderConfig
    from perfmagic.contract.machine import Device as Device
    from perfmagic.contract.machine import Host as Host
    from perfmagic.contract.marks import CheckpointMark as CheckpointMark
    from perfmagic.contract.marks import ModelMark as ModelMark
    from perfmagic.contract.marks import OptimizerMark as OptimizerMark
    from perfmagic.contract.marks import PipelineMark as PipelineMark
    from perfmagic.contract.marks import TorchCounters as TorchCounters
    from perfmagic.contract.marks import TrainerMark as TrainerMark
    from perfmagic.contract.meta import AllocatorMeta as AllocatorMeta
    from perfmagic.contract.meta import CodePlace as CodePlace
    from perfmagic.contract.meta import DeviceInfo as DeviceInfo
    from perfmagic.contract.meta import GpuProcess as GpuProcess
    from perfmagic.contract.meta import HostMeta as HostMeta
    from perfmagic.contract.meta import NvmlMeta as NvmlMeta
    from perfmagic.contract.meta import NvmlProcess as NvmlProcess
    from perfmagic.contract.meta import PlaceCount as PlaceCount
    from perfmagic.contract.meta import SamplerMeta as SamplerMeta
    from perfmagic.contract.meta import Source as Source
    from perfmagic.contract.meta import StackSample as StackSample
    from perfmagic.contract.meta import ThreadStateSample as ThreadStateSample
    from perfmagic.contract.meta import TimelineMeta as TimelineMeta
    from perfmagic.contract.meta import TorchMeta as TorchMeta
    from perfmagic.contract.meta import WorkerStacksMeta as WorkerStacksMeta
    from perfmagic.contract.report import Card as Card
    from perfmagic.contract.report import CollectiveSkew as CollectiveSkew
    from perfmagic.contract.report import DiskWait as DiskWait
    from perfmagic.contract.report import Evaluation as Evaluation
    from perfmagic.contract.report import Hotspot as Hotspot
    from perfmagic.contract.report import Loading as Loading
    from perfmagic.contract.report import MinorCard as MinorCard
    from perfmagic.contract.report import NodeClock as NodeClock
    from perfmagic.contract.report import PlanChange as PlanChange
    from perfmagic.contract.report import PlanSection as PlanSection
    from perfmagic.contract.report import PlanSetAside as PlanSetAside
    from perfmagic.contract.report import Rank as Rank
    from perfmagic.contract.report import Recording as Recording
    from perfmagic.contract.report import ReportBody as ReportBody
    from perfmagic.contract.report import ReportData as ReportData
    from perfmagic.contract.report import Series as Series
    from perfmagic.contract.report import Severity as Severity
    from perfmagic.contract.report import Stage as Stage
    from perfmagic.contract.report import Steps as Steps
    from perfmagic.contract.report import StepTable as StepTable
    from perfmagic.contract.report import Straggler as Straggler
    from perfmagic.contract.report import Timeseries as Timeseries
    from perfmagic.contract.report import TorchTrace as TorchTrace
    from perfmagic.contract.tuning import Confirmation as Confirmation
    from perfmagic.contract.tuning import KnobResult as KnobResult
    from perfmagic.contract.tuning import Trial as Trial

HOMES: dict[str, tuple[str, ...]] = {
    "comparison": (
        "ComparisonData",
        "ProblemData",
    ),
    "energy": (
        "Energy",
        "StageEnergy",
    ),
    "gpu": (
        "GpuSection",
        "MemoryPeak",
    ),
    "loader": ("LoaderConfig",),
    "machine": (
        "Device",
        "Host",
    ),
    "marks": (
        "CheckpointMark",
        "ModelMark",
        "OptimizerMark",
        "PipelineMark",
        "TorchCounters",
        "TrainerMark",
    ),
    "meta": (
        "AllocatorMeta",
        "CodePlace",
        "DeviceInfo",
        "GpuProcess",
        "HostMeta",
        "NvmlMeta",
        "NvmlProcess",
        "PlaceCount",
        "SamplerMeta",
        "Source",
        "StackSample",
        "ThreadStateSample",
        "TimelineMeta",
        "TorchMeta",
        "WorkerStacksMeta",
    ),
    "report": (
        "Card",
        "CollectiveSkew",
        "DiskWait",
        "Evaluation",
        "Hotspot",
        "Loading",
        "MinorCard",
        "NodeClock",
        "PlanChange",
        "PlanSection",
        "PlanSetAside",
        "Rank",
        "Recording",
        "ReportBody",
        "ReportData",
        "Series",
        "Severity",
        "Stage",
        "Steps",
        "StepTable",
        "Straggler",
        "Timeseries",
        "TorchTrace",
    ),
    "tuning": (
        "Confirmation",
        "KnobResult",
        "Trial",
    ),
}
"""The module of each name, by module (the imports above, for the type checker, name the same)."""

_MODULE_OF = {name: module for module, names in HOMES.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> object:
    """The contract's ``name``, imported from its module on first use."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
