"""Synthetic analyses for rule tests: timelines laid out from per-step stage times, then ``analyze``.

Each step is laid out in the order a training loop runs: ``data``, the unattributed
``pre`` gap (host work between batch and forward), ``h2d``, ``forward``, ``backward``,
``optimizer``, ``logging``, ``checkpoint``, ``comm``, and the ``other`` tail; a
``step:optimizer`` boundary closes it. A stage's time is a number (every step) or a
sequence (one per step). Samples are constant series over the window.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from perfmagic.analyze import Analysis, analyze
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
    "parameters": 1_000_000,
    "param_dtype": "float32",
    "device": "cpu",
    "data_parallel": False,
    "ddp": False,
    "compiled": False,
    "training": True,
}
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


def _at(value: float | Sequence[float], k: int) -> float:
    return float(value) if isinstance(value, (int, float)) else float(value[k])


def timeline(
    *,
    steps: int = 30,
    stages: dict[str, float | Sequence[float]] | None = None,
    first_extra: dict[str, float] | None = None,
    before_s: float = 0.0,
    after_s: float = 0.01,
    loader: dict[str, Any] | None = LOADER,
    model: dict[str, Any] | None = MODEL,
    optimizer: dict[str, Any] | None = None,
    torch: dict[str, Any] | None = TORCH,
    counters: dict[str, Any] | None = None,
    checkpoint_bytes: int | None = 40 * 1024**2,
    host: dict[str, Any] | None = HOST,
    samples: dict[str, float] | None = None,
    devices: list[dict[str, Any]] | None = None,
    rank: int | None = None,
    pid: int = 1000,
) -> Timeline:
    """One process's timeline."""
    stages = dict(HEALTHY if stages is None else stages)
    first_extra = first_extra or {}
    tl = Timeline({"pid": pid, "rank": rank, "epoch": 1000.0, "framework": "torch"})
    if torch is not None:
        tl.meta["torch"] = dict(torch)
    if host is not None:
        tl.meta["host"] = dict(host)
    if devices is not None:
        tl.meta["devices"] = devices
    t = before_s
    if loader is not None:
        tl.add_mark(t, "dataloader", **loader)
    if model is not None:
        tl.add_mark(t, "model", **model)
    if optimizer is not None:
        tl.add_mark(t, "optimizer", **optimizer)
    for k in range(steps):
        for name in LAYOUT:
            seconds = _at(stages.get(name, 0.0), k) + (first_extra.get(name, 0.0) if k == 0 else 0.0)
            if seconds <= 0:
                continue
            if name not in ("pre", "other"):
                tl.add_span(tl.name_id(name), t, t + seconds, 0)
                if name == "checkpoint":
                    tl.add_mark(t, "checkpoint", fn="torch.save", seconds=seconds, bytes=checkpoint_bytes)
            t += seconds
        tl.add_span(tl.name_id("step:optimizer"), t, t, -1)
    end = t + after_s
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
    tl.add_mark(end, "torch_stats", **{**stats, **(counters or {})})
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
    return analyze([main, *others], gpu=gpu)
