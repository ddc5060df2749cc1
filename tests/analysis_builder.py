"""Synthetic analyses for rule tests: timelines laid out from per-step stage times, then ``analyze``;
or the same layouts as plain :class:`Analysis` data, with no timeline (:func:`plain`).

Each step is laid out in the order a training loop runs: ``data``, the unattributed
``pre`` gap (host work between batch and forward), ``h2d``, ``forward``, ``backward``,
``optimizer``, ``logging``, ``checkpoint``, ``comm``, and the ``other`` tail; a
``step:optimizer`` boundary closes it. A stage's time is a number (every step) or a
sequence (one per step). Samples are constant series over the window.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perfmagic.analyze import (
    Analysis,
    RankAnalysis,
    TrainingConfig,
    analyze,
    bottleneck,
    stage_stats,
    step_stats,
)
from perfmagic.analyze.loading import loading_account
from perfmagic.analyze.loop import LoopFacts
from perfmagic.analyze.ranks import find_straggler
from perfmagic.analyze.steady import steady_of
from perfmagic.analyze.steps import StepBreakdown
from perfmagic.contract import GpuSection, Host, LoaderConfig
from perfmagic.contract.marks import no_counters
from perfmagic.schema import STAGES
from perfmagic.timeline import Timeline

GiB = 1024**3
LAYOUT = ("data", "pre", "h2d", "forward", "backward", "optimizer", "logging", "checkpoint", "comm", "other")
"""``pre`` and ``other`` are gaps: time in no stage."""

HEALTHY: dict[str, float] = {
    "data": 0.0002,
    "forward": 0.004,
    "backward": 0.008,
    "optimizer": 0.001,
    "other": 0.0003,
}

LOADER: dict[str, Any] = {
    "num_workers": 0,
    "pin_memory": False,
    "prefetch_factor": None,
    "persistent_workers": False,
    "batch_size": 64,
    "drop_last": False,
    "dataset": "Images",
    "dataset_len": 64 * 1000,
    "iterable": False,
    "cpu_count": 8,
}
MODEL: dict[str, Any] = {
    "cls": "Net",
    "variable": "net",
    "parameters": 1_000_000,
    "param_dtype": "float32",
    "device": "cpu",
    "data_parallel": False,
    "ddp": False,
    "compiled": False,
    "training": True,
    "call_site": None,
}
OPTIMIZER: dict[str, Any] = {
    "cls": "SGD",
    "variable": "opt",
    "foreach": None,
    "fused": None,
    "parameters": 1_000_000,
    "call": None,
}
"""An optimizer's mark, as its hook writes one whole; a run's ``optimizer`` sets some of it."""
TORCH: dict[str, Any] = {
    "torch_version": "2.13.0",
    "cuda_version": None,
    "cuda_available": False,
    "cuda_device_count": 0,
    "num_threads": 8,
    "cudnn_benchmark": False,
    "cudnn_allow_tf32": True,
    "matmul_allow_tf32": False,
    "float32_matmul_precision": "highest",
    "distributed": False,
}
HOST: dict[str, Any] = {
    "cpu_count": 8,
    "physical_cores": 8,
    "affinity": list(range(8)),
    "numa_nodes": {0: list(range(8))},
    "mem_total_bytes": 64 * GiB,
}
HOST_SAMPLES: dict[str, float] = {
    "host.cpu_util": 0.3,
    "host.proc_cpu_cores": 2.0,
    "host.mem_available_bytes": 40 * GiB,
    "host.iowait": 0.0,
    "host.rss_bytes": 2 * GiB,
}
CUDA_TORCH = {**TORCH, "cuda_version": "12.8", "cuda_available": True, "cuda_device_count": 1}


def gpu_static(index: int = 0, cc: str = "9.0", mem_total: int = 80 * GiB, **extra: Any) -> dict[str, Any]:
    """NVML's static facts of one GPU, as ``meta["devices"]`` holds them."""
    return {
        "index": index,
        "name": "NVIDIA H100 80GB HBM3",
        "mem_total_bytes": mem_total,
        "compute_capability": cc,
        "numa_node": extra.pop("numa_node", 0),
        "numa_cpus": extra.pop("numa_cpus", None),
        **extra,
    }


def whole_host(facts: dict[str, Any]) -> Any:
    """A report's ``host`` section with ``facts`` and every other key unmeasured, as the analysis
    writes one (its readers index it: every key is there)."""
    unmeasured: dict[str, Any] = dict.fromkeys(Host.__annotations__)
    return {**unmeasured, "per_core_util_mean": [], "gpu_affinity": [], **facts}


def whole_gpu(figures: dict[str, Any] | None) -> Any:
    """A ``gpu`` section (a trace's) with ``figures`` and every other figure unmeasured or none, as the
    trace analysis writes one (its readers index it: every key is there); None stays None."""
    if figures is None:
        return None
    unmeasured: dict[str, Any] = dict.fromkeys(GpuSection.__annotations__)
    counts = dict.fromkeys(("window_s", "idle_s", "event_count", "kernel_count", "tensor_cores_unknown"), 0)
    lists = {
        k: []
        for k in (
            "top_kernels",
            "kernels",
            "idle_breakdown_by_stream",
            "streams",
            "profiler_steps",
            "devices",
        )
    }
    idle = {"host_wait": None, "kernel_wait": None, "other": None, **figures.get("idle_breakdown", {})}
    gaps = {"min_s": 0.0, "count": 0, "total_s": 0.0, "fraction": None, "longest_s": 0.0}
    return {
        **unmeasured,
        **counts,
        **lists,
        "memcpy_bytes": {},
        "gaps": gaps,
        **figures,
        "idle_breakdown": idle,
    }


def _at(value: float | Sequence[float], k: int) -> float:
    return float(value) if isinstance(value, (int, float)) else float(value[k])


@dataclass(frozen=True)
class Run:
    """One process's training run, as both builders lay it out."""

    steps: int = 30
    stages: dict[str, float | Sequence[float]] | None = None
    first_extra: dict[str, float] | None = None
    before_s: float = 0.0
    after_s: float = 0.01
    loader: dict[str, Any] | None = field(default_factory=lambda: LOADER)
    model: dict[str, Any] | None = field(default_factory=lambda: MODEL)
    optimizer: dict[str, Any] | None = None
    torch: dict[str, Any] | None = field(default_factory=lambda: TORCH)
    counters: dict[str, Any] | None = None
    checkpoint_bytes: int | None = 40 * 1024**2
    trainer: dict[str, Any] | None = None  # a ``trainer`` mark: {"trainer": name, "settings": {...}}

    @property
    def stage_table(self) -> dict[str, list[float]]:
        """Seconds of each ``LAYOUT`` entry in each step (the first step's extra included)."""
        stages = dict(HEALTHY if self.stages is None else self.stages)
        extra = self.first_extra or {}
        return {
            name: [
                _at(stages.get(name, 0.0), k) + (extra.get(name, 0.0) if k == 0 else 0.0)
                for k in range(self.steps)
            ]
            for name in LAYOUT
        }


def timeline(
    *,
    host: dict[str, Any] | None = HOST,
    samples: dict[str, float] | None = None,
    devices: list[dict[str, Any]] | None = None,
    rank: int | None = None,
    pid: int = 1000,
    **run_options: Any,
) -> Timeline:
    """One process's timeline (``run_options``: the fields of :class:`Run`)."""
    run = Run(**run_options)
    loader, model, optimizer, torch, steps = run.loader, run.model, run.optimizer, run.torch, run.steps
    tl = Timeline({"pid": pid, "rank": rank, "epoch": 1000.0, "framework": "torch"})
    if torch is not None:
        tl.meta["torch"] = dict(torch)
    if host is not None:
        tl.meta["host"] = dict(host)
    if devices is not None:
        tl.meta["devices"] = devices
    t = run.before_s
    if loader is not None:
        tl.add_mark(t, "dataloader", **loader)
    if model is not None:
        tl.add_mark(t, "model", **{**MODEL, **model})
    if optimizer is not None:
        tl.add_mark(t, "optimizer", **{**OPTIMIZER, **optimizer})
    if run.trainer is not None:
        tl.add_mark(t, "trainer", **{"version": None, **run.trainer})
    table = run.stage_table
    for k in range(steps):
        for name in LAYOUT:
            seconds = table[name][k]
            if seconds <= 0:
                continue
            if name not in ("pre", "other"):
                tl.add_span(tl.name_id(name), t, t + seconds, 0)
                if name == "checkpoint":
                    tl.add_mark(
                        t,
                        "checkpoint",
                        fn="torch.save",
                        seconds=seconds,
                        bytes=run.checkpoint_bytes,
                        what="dict",
                    )
            t += seconds
        tl.add_span(tl.name_id("step:optimizer"), t, t, -1)
    end = t + run.after_s
    tl.meta["wall_s"] = end
    n = max(2, int(end / 0.05) + 1)
    for metric, value in (samples or {}).items():
        for i in range(n):
            tl.add_sample(metric, end * i / (n - 1), value)
    stats = {
        "forwards": steps,
        "autocast_forwards": 0,
        "autocast_dtypes": {},
        "grad_enabled_forwards": steps,
        "h2d_copies": 0,
        "h2d_bytes": 0,
        "h2d_pinned_bytes": 0,
        "h2d_non_blocking": 0,
        "syncs": 0,
        "optimizer_steps": steps,
        "batches": steps,
    }
    tl.add_mark(end, "torch_stats", **{**stats, **(run.counters or {})})
    return tl


def build(
    *, gpu: dict[str, Any] | None = None, ranks: Sequence[dict[str, Any]] = (), **options: Any
) -> Analysis:
    """An analysis of one process (``options`` as :func:`timeline`), plus ``ranks`` (options per extra rank)."""
    options.setdefault("samples", HOST_SAMPLES)
    main = timeline(rank=0 if ranks else None, **options)
    others = [
        timeline(
            rank=i + 1, pid=1001 + i, samples={}, **{k: v for k, v in options.items() if k != "samples"} | r
        )
        for i, r in enumerate(ranks)
    ]
    return analyze([main, *others], gpu=whole_gpu(gpu))


# -- plain analyses: no timeline at all ----------------------------------------

HOST_SUMMARY: dict[str, Any] = {
    **HOST,
    "cpu_util_mean": 0.3,
    "mem_available_min_bytes": 40 * GiB,
    "rss_peak_bytes": 2 * GiB,
    "proc_read_bytes": 0,
    "read_ops": 0,
    "avg_read_size_bytes": None,
    "gpu_affinity": [],
}
STEADY_MEANS: dict[str, float] = {
    "host.cpu_util": 0.3,
    "host.proc_cpu_cores": 2.0,
    "host.iowait": 0.0,
}


def breakdown(run: Run) -> StepBreakdown:
    """A step table laid out as :func:`timeline` lays out spans (``pre`` counts as ``other``)."""
    table = run.stage_table
    columns = [s for s in STAGES if s != "other" and any(v > 0 for v in table.get(s, ()))] + ["other"]
    seconds = np.zeros((run.steps, len(columns)))
    for name, values in table.items():
        column = name if name in columns else "other"  # pre: time in no stage
        seconds[:, columns.index(column)] += np.maximum(values, 0.0)
    durations = seconds.sum(axis=1)
    end = run.before_s + np.cumsum(durations)
    return StepBreakdown("optimizer", end - durations, end, columns, seconds)


def plain(
    *,
    host: dict[str, Any] | None = HOST_SUMMARY,
    steady_means: dict[str, float] | None = STEADY_MEANS,
    devices: Sequence[dict[str, Any]] = (),
    gpu: dict[str, Any] | None = None,
    ranks: Sequence[dict[str, Any]] = (),
    whole_process: bool = False,
    argv: list[str] | None = None,
    **run_options: Any,
) -> Analysis:
    """An :class:`Analysis` made directly from plain data, as a rule sees it: no timeline involved.

    ``ranks``: per extra rank, the ``stages`` of its steps. ``pre`` (host work between a
    batch and the forward pass) and ``logging`` calls (one per step where logged) become
    the loop facts :func:`analyze` measures from spans.
    """
    run = Run(**run_options)
    b = breakdown(run)
    steady = steady_of(b)
    assert steady is not None
    pre = float(np.mean(run.stage_table["pre"][steady.first :]))
    calls = {
        n: float(np.count_nonzero(steady.seconds[:, j] > 0)) / steady.count
        for j, n in enumerate(steady.stages)
        if n != "other" and steady.seconds[:, j].any()
    }
    rank_rows = [RankAnalysis(0, 1000, b, steady, step_stats(b), stage_stats(b), None)]
    for i, r in enumerate(ranks):
        rb = breakdown(dataclasses.replace(run, stages=r.get("stages", run.stages)))
        rank_rows.append(
            RankAnalysis(i + 1, 1001 + i, rb, steady_of(rb), step_stats(rb), stage_stats(rb), None)
        )
    steps = run.steps
    counters = {
        **no_counters(),
        "forwards": steps,
        "optimizer_steps": steps,
        "batches": steps,
        "syncs": 0,
        **(run.counters or {}),
    }
    saving = b.column("checkpoint") if "checkpoint" in b.stages else np.zeros(steps)
    saves = saving > 0
    saved = {"fn": "torch.save", "bytes": run.checkpoint_bytes, "what": "dict"}
    return accounted(
        Analysis(
            wall_s=float(b.end[-1]) + run.after_s,
            framework="torch",
            trainer=run.trainer["trainer"] if run.trainer else None,
            breakdown=b,
            steady=steady,
            steps=step_stats(b),
            stages=stage_stats(b),
            bottleneck=bottleneck(stage_stats(b)),
            devices=[dict(d) for d in devices],
            host=whole_host(host or {}),
            gpu=whole_gpu(gpu),
            ranks=rank_rows,
            config=TrainingConfig(
                dataloaders=[LoaderConfig.from_mark(run.loader)] if run.loader else [],
                models=[{**MODEL, **run.model}] if run.model else [],
                optimizers=[{**OPTIMIZER, **run.optimizer}] if run.optimizer else [],
                checkpoints=[
                    {"t": t, "seconds": seconds, **saved}
                    for t, seconds in zip(b.start[saves].tolist(), saving[saves].tolist(), strict=True)
                ],
                torch=dict(run.torch or {}),
                counters=counters,
                trainers=[{"version": None, **run.trainer}] if run.trainer else [],
            ),
            warnings=[],
            steady_means=dict(steady_means or {}),
            loop=LoopFacts(pre_forward_s=pre, calls_per_step=calls),
            whole_process=whole_process,
            argv=argv,
            straggler=find_straggler([(r.rank, r.steady) for r in rank_rows if r.steady is not None]),
        )
    )


def accounted(a: Analysis, **changes: Any) -> Analysis:
    """``a`` with ``changes``, and its loading account made anew from its loop facts and sampled means."""
    a = dataclasses.replace(a, **changes)
    ld = a.config.loader
    workers = ld.num_workers if ld else 0
    return dataclasses.replace(a, loading=loading_account(a.loop, a.steady_means, workers) if ld else None)


# -- the memory probe's record (collect.torch_memory) ------------------------------

BLOCKS = [
    {"path": f"layers[{i}]", "activations_bytes": 5 * GiB, "input_bytes": GiB // 2, "forward_s": 0.001}
    for i in range(4)
]


def memory_meta(
    *,
    params: int = 2 * GiB,
    grads: int = 2 * GiB,
    state: int = 4 * GiB,
    acts: int = 20 * GiB,
    peak: int | None = None,
    reserved: int | None = None,
    total: int = 80 * GiB,
    retries: int = 0,
    **changes: Any,
) -> dict[str, Any]:
    """``meta["memory"]`` of one CUDA device: the peak is the four parts unless given, the allocator
    reserves ``reserved`` (the peak unless given)."""
    peak = params + grads + state + acts if peak is None else peak
    device = {
        "device": "cuda:0",
        "parameters_bytes": params,
        "gradients_bytes": grads,
        "optimizer_state_bytes": state,
        "activations_bytes": acts,
        "peak_bytes": peak,
        "peak_stage": "backward",
        "peak_source": "cuda_allocator",
        "reserved_at_peak_bytes": peak if reserved is None else reserved,
        "forward_start_bytes": params + state,
        "backward_start_bytes": params + state + acts,
        "total_bytes": total,
        "alloc_retries": retries,
        "ooms": 0,
    }
    return {
        "step": 3,
        "model": "Net",
        "model_name": "net",
        "hf_checkpointing": False,
        "param_dtype": "float32",
        "alloc_conf": None,
        "optimizer": "AdamW",
        "optimizer_name": "opt",
        "batch_size": 32,
        "blocks_path": "layers",
        "blocks": BLOCKS,
        "devices": [device],
        **changes,
    }


def with_memory(a: Analysis, **options: Any) -> Analysis:
    """``a`` with the memory section of :func:`memory_meta` (``options``)."""
    from perfmagic.analyze.memory import memory_section

    return dataclasses.replace(a, memory=memory_section(memory_meta(**options), a.devices))  # type: ignore[arg-type]


def whole_report(**sections: Any) -> dict[str, Any]:
    """A report as the report builder writes one (of :func:`plain`'s analysis), ``sections`` replacing
    its own: every key a renderer reads is there, as in a real report."""
    from perfmagic.report import build_report

    return {**build_report(plain()).to_dict(), **sections}


MiB = 2**20
ROWS_CONTAINER: dict[str, Any] = {
    "attribute": "rows",
    "kind": "list of dict",
    "length": 1_000_000,
    "bytes": 400 * MiB,
}
"""A dataset's list of a million dicts, as ``collect.dataset_memory`` notes it."""


def with_host_memory(
    *,
    growth: int | None = None,
    workers: int = 2,
    start_method: str = "fork",
    containers: Sequence[dict[str, Any]] = (ROWS_CONTAINER,),
    means: dict[str, float] | None = None,
    loader: dict[str, Any] | None = None,
    run: dict[str, Any] | None = None,
    **host: Any,
) -> Analysis:
    """A CPU run whose DataLoader ``train_set`` has ``workers`` workers, each of which grew by ``growth``
    bytes (None: none measured, as under spawn), and the memory section of that alone (``host``: other
    ``memory.host`` fields; ``means``: steady means of sampled metrics beside the defaults; ``loader``: other
    DataLoader settings; ``run``: other options of :func:`plain`)."""
    from perfmagic.analyze.memory import memory_section

    mark = {**LOADER, "num_workers": workers, "start_method": start_method, "dataset_name": "train_set"}
    a = plain(
        loader={**mark, "containers": list(containers), **(loader or {})},
        steady_means={**STEADY_MEANS, **(means or {})},
        **(run or {}),
    )
    measured = (
        []
        if growth is None
        else [
            {
                "pid": 100 + k,
                "first_uss_bytes": 10 * MiB,
                "last_uss_bytes": 10 * MiB + growth,
                "samples": 5000,
                "growth_bytes": growth,
            }
            for k in range(workers)
        ]
    )
    section: Any = {
        "start_method": start_method,
        "dataset_name": "train_set",
        "containers": list(containers),
        "workers": measured,
        "worker_growth_bytes": growth,
        "pinned_bytes": None,
        "swap_start_bytes": None,
        "swap_growth_bytes": None,
        "embeddings": [],
        **host,
    }
    return dataclasses.replace(a, memory=memory_section(None, a.devices, section))


def with_pinned(
    pinned: int, *, h2d_s: float = 0.002, available: int = 40 * GiB, prefetch: int = 2, **host: Any
) -> Analysis:
    """A run whose DataLoader (4 workers, ``pin_memory=True``, ``prefetch_factor=prefetch``) pins 2 GiB batches
    that take ``h2d_s`` of a step to copy, its host allocator holding up to ``pinned`` bytes of the machine's
    64 GiB, ``available`` of it left at the lowest (``host``: other ``memory.host`` fields)."""
    batches = 30
    return with_host_memory(
        workers=4,
        containers=(),
        loader={"pin_memory": True, "prefetch_factor": prefetch},
        run={
            "stages": {**HEALTHY, "h2d": h2d_s},
            "counters": {
                "h2d_copies": batches,
                "h2d_bytes": batches * 2 * GiB,
                "h2d_pinned_bytes": batches * 2 * GiB,
            },
            "host": {**HOST_SUMMARY, "mem_available_min_bytes": available},
        },
        pinned_bytes=pinned,
        **host,
    )


def with_host_table(a: Analysis, forward_s: float, table: int = 10 * GiB, **memory: Any) -> Analysis:
    """``a`` with :func:`with_memory`'s section (``memory``) and a host embedding table ``emb`` of ``table``
    bytes whose lookups took ``forward_s`` on the sampled forward."""
    a = with_memory(a, **memory)
    assert a.memory is not None
    host: Any = {
        "start_method": None,
        "dataset_name": None,
        "containers": [],
        "workers": [],
        "worker_growth_bytes": None,
        "pinned_bytes": None,
        "swap_start_bytes": None,
        "swap_growth_bytes": None,
        "embeddings": [{"path": "emb", "bytes": table, "parameter_share": 0.8, "forward_s": forward_s}],
    }
    return dataclasses.replace(a, memory={**a.memory, "host": host})
