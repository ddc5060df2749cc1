"""The report: ``Report.to_dict()``, the JSON a report file holds, section by section.

Times are in seconds; per-step figures are over the steady steps (the warm-up left out);
fractions are in [0, 1]. Numbers that were not finite (NaN, infinity) are written as ``None``.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict, final

from perfmagic.contract.code import FixSite
from perfmagic.contract.energy import Energy
from perfmagic.contract.gpu import GpuSection, MemoryPeak
from perfmagic.contract.machine import Device, Host
from perfmagic.contract.memory import MemorySection
from perfmagic.contract.meta import CodePlace, Source
from perfmagic.contract.tuning import KnobResult

Severity = Literal["high", "medium", "low", "info"]
"""An advice card's severity, from its saving's share of the step (``advise.card.severity_for``)."""


class Steps(TypedDict):
    """``steps``: ``count`` is every step; the other figures are over the steady steps."""

    count: int
    median_s: float | None
    p90_s: float | None
    first_s: float | None  # from the window's start to the end of the first step
    per_s: float | None  # steps per second
    warmup: int  # steps left out as warm-up
    samples_per_s: float | None  # DataLoader samples per second (None: no batches seen)
    tokens_per_s: float | None  # token ids per second, for sequence batches
    boundary: str | None  # the evidence that delimited the steps (a kind of step_policy.EVIDENCE)
    hint: str | None  # no steps: where to call perfmagic.step()


class Recording(TypedDict):
    """``recording``: which steps had every stage hook in place (``collect.schedule``). Stage figures come
    from those, step times and counts from all; ``calls_per_step`` is an estimate (the Python calls a plain
    step's hooks add), ``overhead_fraction`` too (from what the hooks cost a fast loop in place, over the
    median step) but where the windows' cost was measured (``window_cost_s``): then only the steps' ends
    are estimated."""

    mode: Literal["full", "windowed"]  # windowed: some steps were recorded at their ends only
    full_steps: int
    steps: int
    calls_per_step: float | None  # Python calls perfmagic added per step, on average (None: no steps)
    window_cost_s: float | None  # measured: what full recording added to a step in the windows
    window_cost_error_s: float | None  # its standard error
    overhead_fraction: float | None  # of the median step time


class Stage(TypedDict):
    """``stages[name]``: one stage over the steady steps."""

    total_s: float
    fraction: float  # of step time: the stages' fractions add up to 1
    median_s: float  # per step
    mean_s: float  # per step: the stages' means add up to the mean step


class StepTable(TypedDict):
    """Each step's start and end (on the window's clock) and seconds per stage, to the microsecond.

    A long run's rows are blocks of ``steps_per_row`` steps, each holding the mean per step.
    """

    boundary: str | None  # the evidence the steps were cut at (``step_policy``)
    steps_per_row: int
    start: list[float]
    end: list[float]
    stages: dict[str, list[float]]


class _RankBase(TypedDict):
    rank: int
    pid: int | None
    node: str | None  # the host it ran on (with the node rank where hosts repeat)
    local_rank: int | None
    steps: Steps
    stages: dict[str, Stage]


class Rank(_RankBase, total=False):
    """``ranks[i]``: one process of the window."""

    gpu: GpuSection  # where this rank's trace had GPU events
    step_table: StepTable  # with more than one rank


class Card(TypedDict):
    """``advice[i]``: one piece of advice, with the measured evidence that fired it.

    ``metrics`` is the rule's own evidence; every card's has ``step_s`` (where the step is
    known) and ``saving_model`` (how the saving was estimated), and a one-time cost's
    ``one_time_s``.
    """

    id: str
    severity: Severity
    title: str
    evidence: str
    fix: str
    metrics: dict[str, Any]
    saving_s: float | None  # per steady step
    speedup: float | None  # step / (step - saving)
    replaces: FixSite | None  # the user's statement the fix takes the place of (their call, rewritten)


@final  # no card kind extends it: `"metrics" in card` tells a Card from it
class MinorCard(TypedDict):
    """``advice_minor[i]``: a rule that fired with a saving too small for a card."""

    id: str
    saving_s: float | None
    step_s: float | None


class PlanChange(TypedDict):
    """``plan.changes[i]``: one card's fix, in the order the plan makes them."""

    id: str
    saving_s: float  # marginal: after the changes before it
    alone_s: float  # as the only change
    interval_s: list[float]  # [p10, p90] of the marginal saving
    step_s: float  # predicted, with this change and every one before it
    uncertain: bool  # the interval is wider than ±25% of the saving
    freed_bytes: int | None  # a memory card's: the bytes it frees (its saving_s: minus its step cost)


class PlanSetAside(TypedDict):
    id: str
    reason: str


class PlanSection(TypedDict):
    """``plan``: the cards' fixes as one plan (docs/advice.md#the-plan)."""

    step_s: float  # observed steady step (mean)
    predicted_step_s: float  # with every change made
    changes: list[PlanChange]
    set_aside: list[PlanSetAside]  # cards left out: a knob an earlier card sets otherwise


class Evaluation(TypedDict):
    """``evaluation``: evaluation passes in the window (not part of any step)."""

    total_s: float
    fraction_of_wall: float
    passes: int
    every_steps: float | None  # training steps between two passes (median)


class Loading(TypedDict):
    """``loading``: shares of the loaders' time building batches (``analyze.loading``); None: unmeasured."""

    loaders: Literal["training thread", "workers"]
    cpu: float | None  # on a CPU
    queued: float | None  # runnable, waiting for a CPU (run delay): CPU demand
    blocked: float | None  # neither: ``disk + sleep``
    disk: float | None  # of it, uninterruptible sleep (sampled): mostly disk reads
    sleep: float | None  # of it, an interruptible sleep: time.sleep, a lock, the network, the workers
    busy: float | None  # workers: share of their time building batches (the rest: waiting for work)
    batch_s: float | None  # workers: seconds one worker takes to build one batch


class DiskWait(TypedDict):
    """``disk_waits[stage]``: the share of the stage's sampled time the training thread waited on storage."""

    samples: int  # sampler ticks that found the thread in the stage
    share: float  # of them, in uninterruptible sleep (D)


class Series(TypedDict):
    """A sampled metric: times (on the sampling process's clock) and values (``None``: not read)."""

    t: list[float]
    v: list[float | None]


class Timeseries(TypedDict):
    """``timeseries``: the sampled metrics, binned to a few thousand points."""

    epoch: float | None  # wall-clock time (Unix seconds) of the series' time zero
    metrics: dict[str, Series]  # by metric name: "gpu0.util", "host.cpu_util", …


class Hotspot(CodePlace):
    """``hotspots[stage][i]``: a line the training thread, or in ``data`` the DataLoader workers, were
    sampled in often."""

    samples: int
    share: float  # of that stage's samples (of the workers' samples where ``sampled`` is "workers")
    sampled: Literal["training thread", "workers"]  # whose stack


class _TorchTrace(TypedDict):
    path: str
    clock_name: str  # the trace's label that marks ``clock_t``
    steps: int
    clock_t: float  # on the window's clock


class TorchTrace(_TorchTrace, total=False):
    """``torch_traces[i]``: a profiler trace written in the window (``--trace``): torch.profiler's, or
    TensorFlow's or JAX's where they trained (``profiler``)."""

    profiler: Literal["tensorflow", "jax"]
    input_fraction: float  # TensorFlow only: tf.data's own input wait over the traced steps…
    data_fraction: float  # …and perfmagic's data stage over the same window


class RankSkew(TypedDict):
    rank: int
    late_mean_s: float  # behind the first rank to reach a collective
    late_p90_s: float
    last_count: int  # collectives it reached last
    last_fraction: float


class CollectiveSkew(TypedDict):
    """``collective_skew``: across the ranks of a multi-rank trace, who reaches the collectives last."""

    instances: int
    kernels: int  # collective kernel names every rank launched
    skew_mean_s: float  # last rank's start less the first's
    skew_p90_s: float
    last_rank: int
    ranks: list[RankSkew]


class Straggler(TypedDict):
    """``straggler``: the rank the others wait for, and the stage that makes it slow (per steady step)."""

    rank: int
    stage: str
    work_s: float  # its step outside comm
    others_work_s: float  # the other ranks' median step outside comm
    excess_s: float  # what every rank waits for it
    stage_excess_s: dict[str, float]  # per stage, its time less the other ranks' median
    others_comm_s: float
    comm_s: float
    ranks: int


class NodeClock(TypedDict):
    """``nodes[i]``: one node of a job merged by ``perfmagic merge``, and its clock's offset."""

    directory: str
    node: str | None
    ranks: list[int]
    offset_s: float  # added to its wall clock
    uncertainty_s: float | None
    matched: int  # collectives matched against the reference node's


class ReportBody(TypedDict):
    """The report but its step table (``ReportData`` less ``step_table``)."""

    schema: str  # report.SCHEMA
    source: Source
    framework: str | None
    wall_s: float
    steps: Steps
    stages: dict[str, Stage]  # by stage name, in schema.STAGES order
    bottleneck: str | None  # the stage with most time (the straggler's, in a job)
    devices: list[Device]
    host: Host
    gpu: GpuSection | None
    ranks: list[Rank]
    advice: list[Card]
    warnings: list[str]
    trainer: str | None  # the framework that drove the loop (schema.TRAINERS)
    evaluation: Evaluation
    loading: Loading | None  # None: no DataLoader, or its loading unmeasured
    disk_waits: dict[str, DiskWait]  # by stage; {} where the states were not sampled
    advice_minor: list[MinorCard]
    plan: PlanSection | None  # None: no steady steps to plan on
    timeseries: Timeseries
    hotspots: dict[str, list[Hotspot]]  # by stage
    torch_traces: list[TorchTrace]
    tuning: list[KnobResult]
    collective_skew: CollectiveSkew | None
    nodes: list[NodeClock] | None
    straggler: Straggler | None
    energy: Energy | None  # None: no GPU power or energy sampled over steady steps
    memory: MemorySection | None  # one sampled step's memory per device; None: no step sampled
    gpu_memory: list[MemoryPeak] | None  # a trace's allocator peaks, with or without GPU events
    recording: Recording | None  # None: no stages were recorded (a trace, sampling alone)


class ReportData(ReportBody):
    """The whole report (``perfmagic.report/1``)."""

    step_table: StepTable
