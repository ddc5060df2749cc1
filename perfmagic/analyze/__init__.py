"""Analysis: turn timelines into the numbers a report shows and the advice rules read.

Pure functions, no I/O. ``analyze`` takes one timeline per process (one per
rank in a multi-process run) and returns an :class:`Analysis`: plain data that
holds everything the rules and the report need, and no timeline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np

from perfmagic.analyze.devices import devices_summary
from perfmagic.analyze.disk_waits import disk_waits
from perfmagic.analyze.evaluation import EvaluationStats, evaluation_stats
from perfmagic.analyze.host import host_summary
from perfmagic.analyze.hotspots import hotspots
from perfmagic.analyze.job_energy import energy_of_job
from perfmagic.analyze.loading import LoadingAccount, loading_account
from perfmagic.analyze.loop import LoopFacts, loop_facts
from perfmagic.analyze.memory import host_memory, memory_section
from perfmagic.analyze.ranks import Straggler, find_straggler
from perfmagic.analyze.samples import window_means
from perfmagic.analyze.steady import Steady, steady_of
from perfmagic.analyze.step_hint import step_hint
from perfmagic.analyze.steps import StepBreakdown, step_breakdown
from perfmagic.analyze.timeseries import profiler_traces, timeseries
from perfmagic.analyze.windows import recording_section
from perfmagic.contract import (
    CollectiveSkew,
    Device,
    DiskWait,
    Energy,
    GpuSection,
    Host,
    Hotspot,
    KnobResult,
    LoaderConfig,
    MemoryPeak,
    NodeClock,
    Recording,
    TimelineMeta,
    Timeseries,
    TorchMeta,
    TorchTrace,
)
from perfmagic.contract.marks import (
    CheckpointMark,
    ModelMark,
    OptimizerMark,
    PipelineMark,
    TorchCounters,
    TrainerMark,
    no_counters,
)
from perfmagic.contract.memory import MemorySection
from perfmagic.schema import (
    STEP_BOUNDARY_PREFIX,
    TF_DATA_MARK,
    THREAD_SAMPLES,
    THREAD_TOKENS,
    TRAINER_MARK,
    TRAINERS,
)
from perfmagic.step_policy import MARK_STEP_HINT
from perfmagic.timeline import Timeline
from perfmagic.traces.nsys_schema import CAPTURE_SUFFIXES


@dataclass(frozen=True)
class StageStats:
    """One stage over the steady steps (the warm-up step left out)."""

    total_s: float
    fraction: float  # of step time; the stages' fractions add up to 1
    median_s: float
    mean_s: float  # per step: the stages' means add up to the mean step


@dataclass(frozen=True)
class StepStats:
    """``count`` is every step; the others are over the steady steps, after ``warmup`` steps."""

    count: int
    median_s: float | None
    p90_s: float | None
    first_s: float | None  # from the window's start to the end of the first step
    per_s: float | None
    warmup: int = 0  # steps left out of the figures as warm-up (the first, when there are three or more)
    samples_per_s: float | None = (
        None  # DataLoader samples per second of steady steps (None: no batches seen)
    )
    tokens_per_s: float | None = None  # token ids per second, for sequence batches
    boundary: str | None = None  # the evidence that delimited the steps (a kind of step_policy.EVIDENCE)
    hint: str | None = None  # no steps: where to call perfmagic.step() (the line after which it goes)


@dataclass(frozen=True)
class TrainingConfig:
    """What the hooks saw of the training set-up (empty where nothing was seen)."""

    dataloaders: list[LoaderConfig] = field(default_factory=list)
    models: list[ModelMark] = field(default_factory=list)
    optimizers: list[OptimizerMark] = field(default_factory=list)
    checkpoints: list[CheckpointMark] = field(default_factory=list)
    torch: TorchMeta = field(default_factory=TorchMeta)  # meta["torch"], its threads as last counted
    counters: TorchCounters = field(default_factory=no_counters)  # forwards, autocast, h2d bytes, syncs, ...
    trainers: list[TrainerMark] = field(default_factory=list)  # frameworks that drove the loop (see TRAINERS)
    pipelines: list[PipelineMark] = field(default_factory=list)  # tf.data pipelines iterated (TF_DATA_MARK)

    @property
    def pipeline(self) -> PipelineMark | None:
        """The tf.data pipeline the training iterated: the last one seen (Keras makes its iterator anew
        each epoch, after any validation pass of the epoch before)."""
        return self.pipelines[-1] if self.pipelines else None

    @property
    def loader(self) -> LoaderConfig | None:
        """The DataLoader the training iterated (the largest one seen)."""
        if not self.dataloaders:
            return None
        return max(self.dataloaders, key=lambda d: d.dataset_len or 0)

    @property
    def model(self) -> ModelMark | None:
        """The model: of the modules called at top level, the one with the most parameters (a loss, a
        metric or a transform called first is not it); the first seen among equals."""
        if not self.models:
            return None
        return max(self.models, key=lambda m: m["parameters"])

    @property
    def trainer(self) -> TrainerMark | None:
        """The framework the user wrote the loop against (``trainer``, ``version``, ``settings``), if any."""
        known = [t for t in self.trainers if t["trainer"] in TRAINERS]
        return min(known, key=lambda t: TRAINERS.index(t["trainer"])) if known else None

    @property
    def gpu_index(self) -> int:
        """The GPU the model lives on (``cuda:1`` → 1; plain ``cuda`` or unknown → 0)."""
        device = (self.model["device"] or "") if self.model else ""
        return int(device.split(":")[1]) if device.startswith("cuda:") else 0


@dataclass(frozen=True)
class RankAnalysis:
    rank: int
    pid: int | None
    breakdown: StepBreakdown
    steady: Steady | None
    steps: StepStats
    stages: dict[str, StageStats]
    gpu: GpuSection | None  # GPU busy/idle of this rank, where its trace had GPU events
    node: str | None = None  # the host it ran on (its hostname; with the node rank where hosts repeat)
    local_rank: int | None = None


@dataclass(frozen=True)
class Analysis:
    """Everything measured about one profiled window, ready for the advice rules."""

    wall_s: float
    framework: str | None
    trainer: str | None  # the training framework that drove the loop (schema.TRAINERS), None for a plain loop
    breakdown: StepBreakdown  # of the primary process (lowest rank with steps)
    steady: Steady | None  # its steps after warm-up
    steps: StepStats
    stages: dict[str, StageStats]
    bottleneck: str | None
    devices: list[Device]
    host: Host
    gpu: GpuSection | None
    ranks: list[RankAnalysis]
    config: TrainingConfig
    warnings: list[str]
    steady_means: dict[str, float] = field(default_factory=dict)  # sampled metrics over the steady steps
    evaluation: EvaluationStats = field(default_factory=lambda: EvaluationStats(0.0, 0.0, 0, None))
    loop: LoopFacts = field(default_factory=LoopFacts)
    loading: LoadingAccount | None = None  # where the loaders' time went (None: no loading measured)
    # per stage, the share of its sampled time the training thread waited on storage (analyze.disk_waits)
    disk_waits: dict[str, DiskWait] = field(default_factory=dict)
    source: str | None = None  # "live", "run" or "trace": what was analysed (a Source)
    whole_process: bool = False  # the window starts with the interpreter (perfmagic run)
    ready_s: float = 0.0  # when perfmagic had started, into the window: its own set-up is not the user's
    argv: list[str] | None = None  # the primary process's command line, where known
    # compact sampled series (see analyze.timeseries)
    timeseries: Timeseries = field(default_factory=lambda: Timeseries(epoch=None, metrics={}))
    torch_traces: list[TorchTrace] = field(default_factory=list)  # torch.profiler traces of the window
    # per stage: the lines sampled most, the DataLoader workers' for data where they sampled (analyze.hotspots)
    hotspots: dict[str, list[Hotspot]] = field(default_factory=dict)
    tuning: list[KnobResult] = field(default_factory=list)  # knobs tried after the window (perfmagic.tuning)
    # across the ranks of a multi-rank trace: who reaches the collectives last (analyze.ranks)
    collective_skew: CollectiveSkew | None = None
    # the rank the others wait for, from the ranks' stage tables (analyze.ranks)
    straggler: Straggler | None = None
    # a job merged from several nodes' records: each node's ranks and clock offset (perfmagic merge)
    nodes: list[NodeClock] | None = None
    energy: Energy | None = None  # the GPUs' joules over the steady steps (analyze.energy)
    # one sampled step's memory per device (analyze.memory); None where no step was sampled
    memory: MemorySection | None = None
    # the allocator's peaks per CUDA device in the primary rank's trace (gpu.memory, kept where the trace
    # has no kernels)
    gpu_memory: list[MemoryPeak] | None = None
    # which steps had every stage hook (analyze.windows); None without steps
    recording: Recording | None = None

    def tuned(self, knob: str) -> KnobResult | None:
        """The measured result of one tuning knob, where it was tried."""
        return next((t for t in self.tuning if t.get("knob") == knob and t.get("best")), None)

    def steady_mean(self, metric: str) -> float | None:
        """A sampled metric's mean over the steady steps (the whole window when too few samples fall there)."""
        return self.steady_means.get(metric)

    def gpu_utils(self) -> list[tuple[Device, float]]:
        """Each GPU with utilization samples, with its mean utilization over the steady steps."""
        return [
            (d, u) for d in self.devices if (u := self.steady_mean(f"gpu{d.get('index')}.util")) is not None
        ]


def analyze(timelines: list[Timeline], gpu: GpuSection | None = None) -> Analysis:
    """Analyze the timelines of one window (one per process)."""
    if not timelines:
        raise ValueError("nothing to analyze: no timeline")
    # A launcher or sampling-only process (``perfmagic run``'s own) records no stages: not a rank.
    staged = (
        [t for t in timelines if _has_steps(t)] or [t for t in timelines if t.span_count] or timelines[:1]
    )
    ranks = [_rank(i, t) for i, t in enumerate(staged)]
    with_steps = [r for r in ranks if r.steps.count]
    primary = min(with_steps, key=lambda r: r.rank) if with_steps else ranks[0]
    tl = next(t for t, r in zip(staged, ranks, strict=True) if r is primary)
    sampled = _sampled_timeline(timelines)
    steady = primary.steady
    # the steady window on the sampling process's clock
    offset = float(tl.meta.get("epoch", 0.0)) - float(sampled.meta.get("epoch", 0.0))
    window = (steady.start + offset, steady.end + offset) if steady is not None else (None, None)

    warnings = _unique(w for t in timelines for w in t.meta.get("warnings", []))
    cut = [t for t in timelines if t.meta.get("wall_s") is None]
    if cut:
        pids = ", ".join(str(t.meta.get("pid", "?")) for t in cut)
        warnings.append(
            f"process {pids} ended without finishing its profile (killed, or its kernel died): "
            "this report covers what it had spooled, up to about a second before the end"
        )
    steps = _with_throughput(primary.steps, tl, primary.breakdown, primary.steady)
    if not steps.count:
        steps = replace(steps, hint=step_hint(tl))
        warnings.append(_no_steps_warning(tl, steps.hint))

    straggler = find_straggler([(r.rank, r.steady) for r in ranks if r.steady is not None])
    argv = tl.meta.get("argv")
    config = training_config(tl)
    wall_s = max(_wall(t) for t in timelines)
    means, loop = _means(tl, sampled, steady, window), loop_facts(tl, primary.breakdown, steady)
    workers = config.loader.num_workers if config.loader else 0
    devices = devices_summary(sampled)
    bound = straggler.stage if straggler is not None else bottleneck(primary.stages)
    energy, energy_notes = _energy(timelines, tl, steady, steps, config, means, bound)
    warnings += energy_notes
    return Analysis(
        wall_s=wall_s,
        framework=next((t.meta["framework"] for t in timelines if t.meta.get("framework")), None),
        trainer=config.trainer["trainer"] if config.trainer else None,
        breakdown=primary.breakdown,
        steady=steady,
        steps=steps,
        stages=primary.stages,
        # what holds the job back is the straggler's stage, not the wait it causes on the primary rank
        bottleneck=bound,
        devices=devices,
        energy=energy,
        host=host_summary(sampled),
        gpu=gpu if gpu is not None else primary.gpu,
        ranks=sorted(ranks, key=lambda r: r.rank),
        config=config,
        warnings=warnings,
        steady_means=means,
        evaluation=evaluation_stats(tl, primary.breakdown, wall_s),
        loop=loop,
        loading=loading_account(loop, means, workers) if config.loader else None,
        source=tl.meta.get("source"),
        whole_process=tl.meta.get("source") == "run",
        ready_s=float(tl.meta.get("ready_s") or 0.0),
        argv=list(argv) if argv else None,
        timeseries=timeseries(sampled),
        hotspots=hotspots(tl),
        disk_waits=disk_waits(tl),
        torch_traces=profiler_traces(timelines),
        tuning=list(tl.meta.get("tuning") or []),
        straggler=straggler,
        memory=memory_section(
            tl.meta.get("memory"), devices, host_memory(tl, sampled, config.loader), tl.meta.get("tuning")
        ),
        gpu_memory=tl.meta.get("gpu_memory"),
        recording=recording_section(tl, primary.breakdown, steps.median_s) if steps.count else None,
    )


def _energy(
    timelines: list[Timeline],
    tl: Timeline,
    steady: Steady | None,
    steps: StepStats,
    config: TrainingConfig,
    means: dict[str, float],
    bound: str | None,
) -> tuple[Energy | None, list[str]]:
    model_device = next((m["device"] for m in config.models if m["device"]), None)
    epoch_samples = config.loader.dataset_len if config.loader else None
    rates = (steps.samples_per_s, steps.tokens_per_s)
    return energy_of_job(timelines, tl, steady, rates, model_device, epoch_samples, means, bound == "data")


def _with_throughput(
    steps: StepStats, timeline: Timeline, breakdown: StepBreakdown, steady: Steady | None
) -> StepStats:
    samples, tokens = throughput(timeline, breakdown, steady)
    return replace(steps, samples_per_s=samples, tokens_per_s=tokens)


def throughput(
    timeline: Timeline, breakdown: StepBreakdown, steady: Steady | None
) -> tuple[float | None, float | None]:
    """(samples, tokens) per second of steady step time, as the frameworks log them; over the steps whose
    counters are still held where old steps were folded."""
    if steady is None:
        return None, None
    point = timeline.fold_point
    first = max(steady.first, int(np.searchsorted(breakdown.start, point[1])) if point else 0)
    starts, ends = breakdown.start[first:], breakdown.end[first:]
    seconds = float((ends - starts).sum())
    rates: list[float | None] = []
    for metric in (THREAD_SAMPLES, THREAD_TOKENS):
        t, v = timeline.series(metric)
        # a count grows in jumps, one batch at a time: the count at an instant is the last one reached
        counted = np.concatenate(([v[0] if point else 0.0], v)) if len(v) else np.zeros(1)
        grown = (
            counted[np.searchsorted(t, ends, side="right")]
            - counted[np.searchsorted(t, starts, side="right")]
        )
        total = float(grown.sum())
        rates.append(total / seconds if total > 0 and seconds > 0 else None)
    return rates[0], rates[1]


def bottleneck(stages: dict[str, StageStats]) -> str | None:
    """The stage with the largest share of step time."""
    if not stages:
        return None
    return max(stages, key=lambda s: stages[s].total_s)


def _no_steps_warning(timeline: Timeline, hint: str | None) -> str:
    if str(timeline.meta.get("trace_file") or "").endswith(CAPTURE_SUFFIXES):
        return (
            "no training steps in the Nsight Systems capture: no ProfilerStep# or perfmagic NVTX ranges; "
            "name the NVTX range of one iteration with --step-range REGEX (perfmagic.load_trace(path, "
            "step_range=REGEX)), so there is no stage breakdown"
        )
    if timeline.meta.get("source") == "trace":
        return (
            "no training steps in the trace: it has no ProfilerStep# ranges (call prof.step() once per "
            "step while torch.profiler records), so there is no stage breakdown"
        )
    return (
        "no training steps were seen: no perfmagic.step(), optimizer step, DataLoader batch or backward pass "
        "happened in the profiled window, so there is no stage breakdown; "
        + (hint or f"call {MARK_STEP_HINT} at the end of each step")
    )


def step_stats(breakdown: StepBreakdown) -> StepStats:
    """Step figures over the steady steps (warm-up left out), with the count of all steps."""
    s = steady_of(breakdown)
    if s is None:
        return StepStats(0, None, None, None, None, boundary=breakdown.boundary)
    total = float(s.durations.sum())
    return StepStats(
        boundary=breakdown.boundary,
        count=breakdown.count,
        median_s=s.median_s,
        p90_s=float(np.percentile(s.durations, 90)),
        first_s=float(breakdown.end[0]),
        per_s=s.count / total if total > 0 else None,
        warmup=s.first,
    )


def stage_stats(breakdown: StepBreakdown) -> dict[str, StageStats]:
    """Each stage over the steady steps: its total, its share of step time, its mean and median per step."""
    s = steady_of(breakdown)
    if s is None:
        return {}
    total_step = float(s.durations.sum())
    out: dict[str, StageStats] = {}
    for j, name in enumerate(s.stages):
        col = s.seconds[:, j]
        total = float(col.sum())
        out[name] = StageStats(
            total_s=total,
            fraction=total / total_step if total_step > 0 else 0.0,
            median_s=float(np.median(col)),
            mean_s=float(col.mean()),
        )
    return out


def training_config(timeline: Timeline) -> TrainingConfig:
    stats = timeline.marks("torch_stats")
    # the marks' payloads as their hooks wrote them (collect.torch_hooks): read back typed
    counters = cast(TorchCounters, dict(stats[-1].data)) if stats else no_counters()
    torch = timeline.meta["torch"].copy() if "torch" in timeline.meta else TorchMeta()
    if "num_threads" in counters:  # seen at the end: after any set_num_threads of the loop
        torch["num_threads"] = counters["num_threads"]
    return TrainingConfig(
        dataloaders=[LoaderConfig.from_mark(m.data) for m in timeline.marks("dataloader")],
        # a record an older perfmagic wrote has no names, no call: None, as where none was found
        models=[cast(ModelMark, {"variable": None, **m.data}) for m in timeline.marks("model")],
        optimizers=[
            cast(OptimizerMark, {"variable": None, "call": None, **m.data})
            for m in timeline.marks("optimizer")
        ],
        checkpoints=[cast(CheckpointMark, {"t": m.t, **m.data}) for m in timeline.marks("checkpoint")],
        torch=torch,
        counters=counters,
        trainers=[cast(TrainerMark, m.data) for m in timeline.marks(TRAINER_MARK)],
        pipelines=[cast(PipelineMark, m.data) for m in timeline.marks(TF_DATA_MARK)],
    )


def _rank(index: int, timeline: Timeline) -> RankAnalysis:
    breakdown = step_breakdown(timeline)
    rank = timeline.meta.get("rank")
    return RankAnalysis(
        rank=int(rank) if rank is not None else index,
        pid=timeline.meta.get("pid"),
        breakdown=breakdown,
        steady=steady_of(breakdown),
        steps=step_stats(breakdown),
        stages=stage_stats(breakdown),
        gpu=timeline.meta.get("gpu"),
        node=node_name(timeline.meta),
        local_rank=timeline.meta.get("local_rank"),
    )


def node_name(meta: TimelineMeta | Mapping[str, Any]) -> str | None:
    """The node a process ran on: its hostname, with torchrun's node rank (``GROUP_RANK``) where known,
    so that two nodes started on one host stay apart."""
    host, node_rank = meta.get("hostname"), meta.get("node_rank")
    if node_rank is None:
        return host
    return f"{host or 'node'}#{node_rank}"


def _means(
    tl: Timeline, sampled: Timeline, steady: Steady | None, window: tuple[float | None, float | None]
) -> dict[str, float]:
    """The sampled metrics' steady means: the sampling process's and, where the training process is
    another (``perfmagic run``), what only it samples (its thread's states, its DataLoader workers)."""
    means = window_means(sampled, *window)
    if tl is sampled:
        return means
    own = window_means(tl, *((steady.start, steady.end) if steady is not None else (None, None)))
    return {**own, **means}


def _has_steps(timeline: Timeline) -> bool:
    return any(n.startswith(STEP_BOUNDARY_PREFIX) for n in timeline.span_names)


def _sampled_timeline(timelines: list[Timeline]) -> Timeline:
    """The timeline that carries the hardware samples (the sampling process's)."""
    return max(timelines, key=lambda t: len(t.metrics))


def _wall(timeline: Timeline) -> float:
    wall = timeline.meta.get("wall_s")
    if wall is not None:
        return float(wall)
    # A spool of a killed process: the window lasted at least until its last record.
    spans = timeline.spans
    ends = [float(spans.end.max())] if len(spans) else []
    for metric in timeline.metrics:
        t, _ = timeline.series(metric)
        if len(t):
            ends.append(float(t.max()))
    ends += [m.t for m in timeline.marks()]
    return max(ends, default=0.0)


def _unique(items: Any) -> list[str]:
    return list(dict.fromkeys(items))
