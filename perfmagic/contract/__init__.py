"""The typed contract: the report, the timeline's meta and the tuning results as plain typed data.

Everything here is a ``TypedDict`` over JSON-safe values: the report a renderer reads
(:class:`ReportData`), the facts the collectors write into ``Timeline.meta``
(:class:`TimelineMeta`), and what tuning measured (:class:`KnobResult`). Key names are exactly
those the code writes. Layer 0: it imports nothing else of perfmagic.
"""

from __future__ import annotations

from perfmagic.contract.gpu import GpuSection
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
    "Evaluation",
    "GpuProcess",
    "GpuSection",
    "Host",
    "HostMeta",
    "Hotspot",
    "KnobResult",
    "Loading",
    "MinorCard",
    "NodeClock",
    "NvmlMeta",
    "NvmlProcess",
    "PlaceCount",
    "PlanChange",
    "PlanSection",
    "PlanSetAside",
    "Rank",
    "ReportBody",
    "ReportData",
    "SamplerMeta",
    "Series",
    "Severity",
    "Source",
    "StackSample",
    "Stage",
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
