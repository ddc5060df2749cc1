"""The typed contract: the report, the timeline's meta, the torch hooks' marks, the tuning results and
the comparison of two reports, as plain typed data.

The report a renderer reads (:class:`ReportData`), the facts the collectors write into
``Timeline.meta`` (:class:`TimelineMeta`), the set-up the hooks mark (:class:`ModelMark`,
:class:`OptimizerMark`, :class:`CheckpointMark`, :class:`TorchCounters`, :class:`TrainerMark`,
tf.data's :class:`PipelineMark`), what tuning measured (:class:`KnobResult`) and the comparison of two
reports (:class:`ComparisonData`) are ``TypedDict``s over JSON-safe values, their key names exactly
those the code writes. The DataLoader's settings the analysis reads from its mark are a frozen
dataclass (:class:`LoaderConfig`), read by attribute. Layer 0: it imports nothing else of perfmagic.
"""

from __future__ import annotations

from perfmagic.contract.comparison import ComparisonData, ProblemData
from perfmagic.contract.energy import Energy, StageEnergy
from perfmagic.contract.gpu import GpuSection, MemoryPeak
from perfmagic.contract.loader import LoaderConfig
from perfmagic.contract.machine import Device, Host
from perfmagic.contract.marks import (
    CheckpointMark,
    ModelMark,
    OptimizerMark,
    PipelineMark,
    TorchCounters,
    TrainerMark,
)
from perfmagic.contract.meta import (
    AllocatorMeta,
    CodePlace,
    DeviceInfo,
    GpuProcess,
    HostMeta,
    NvmlMeta,
    NvmlProcess,
    PlaceCount,
    SamplerMeta,
    Source,
    StackSample,
    ThreadStateSample,
    TimelineMeta,
    TorchMeta,
    WorkerStacksMeta,
)
from perfmagic.contract.report import (
    Card,
    CollectiveSkew,
    DiskWait,
    Evaluation,
    Hotspot,
    Loading,
    MinorCard,
    NodeClock,
    PlanChange,
    PlanSection,
    PlanSetAside,
    Rank,
    Recording,
    ReportBody,
    ReportData,
    Series,
    Severity,
    Stage,
    Steps,
    StepTable,
    Straggler,
    Timeseries,
    TorchTrace,
)
from perfmagic.contract.tuning import Confirmation, KnobResult, Trial

__all__ = [
    "AllocatorMeta",
    "Card",
    "CheckpointMark",
    "CodePlace",
    "CollectiveSkew",
    "ComparisonData",
    "Confirmation",
    "Device",
    "DeviceInfo",
    "DiskWait",
    "Energy",
    "Evaluation",
    "GpuProcess",
    "GpuSection",
    "Host",
    "HostMeta",
    "Hotspot",
    "KnobResult",
    "LoaderConfig",
    "Loading",
    "MemoryPeak",
    "MinorCard",
    "ModelMark",
    "NodeClock",
    "NvmlMeta",
    "NvmlProcess",
    "OptimizerMark",
    "PipelineMark",
    "PlaceCount",
    "PlanChange",
    "PlanSection",
    "PlanSetAside",
    "ProblemData",
    "Rank",
    "Recording",
    "ReportBody",
    "ReportData",
    "SamplerMeta",
    "Series",
    "Severity",
    "Source",
    "StackSample",
    "Stage",
    "StageEnergy",
    "StepTable",
    "Steps",
    "Straggler",
    "ThreadStateSample",
    "TimelineMeta",
    "Timeseries",
    "TorchCounters",
    "TorchMeta",
    "TorchTrace",
    "TrainerMark",
    "Trial",
    "WorkerStacksMeta",
]
