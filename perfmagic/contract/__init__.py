"""The typed contract: the report, the timeline's meta and the tuning results as plain typed data.

The report a renderer reads (:class:`ReportData`), the facts the collectors write into
``Timeline.meta`` (:class:`TimelineMeta`) and what tuning measured (:class:`KnobResult`) are
``TypedDict``s over JSON-safe values, their key names exactly those the code writes. The
DataLoader's settings the analysis reads from its mark are a frozen dataclass
(:class:`LoaderConfig`), read by attribute. Layer 0: it imports nothing else of perfmagic.
"""

from __future__ import annotations

from perfmagic.contract.energy import Energy, StageEnergy
from perfmagic.contract.gpu import GpuSection, MemoryPeak
from perfmagic.contract.loader import LoaderConfig
from perfmagic.contract.machine import Device, Host
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
    "CodePlace",
    "CollectiveSkew",
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
    "NodeClock",
    "NvmlMeta",
    "NvmlProcess",
    "PlaceCount",
    "PlanChange",
    "PlanSection",
    "PlanSetAside",
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
    "TorchMeta",
    "TorchTrace",
    "Trial",
    "WorkerStacksMeta",
]
