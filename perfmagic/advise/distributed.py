"""Multi-GPU and multi-rank rules: communication, stragglers, balance, DataParallel."""

from __future__ import annotations

from typing import Any

import numpy as np

from perfmagic.advise.card import Card, make_card
from perfmagic.analyze import Analysis
from perfmagic.contract import Device
from perfmagic.units import fmt_bytes, fmt_fraction, fmt_seconds

COMM_SHARE = 0.10
"""Exposed communication wait worth a card, as a share of step time."""
ACCUMULATION = 4
"""Micro-batches per all-reduce in the gradient-accumulation fix."""
IMBALANCE_SPREAD = 0.30
"""Spread of mean utilization between the busiest and the idlest GPU."""
IDLE_GPU = 0.05
"""A GPU below this utilization is idle."""
MEMORY_RATIO = 1.5
"""Peak memory of the fullest working GPU against the emptiest's, worth a card when utilization is even…"""
MEMORY_GAP = 1024**3
"""…and at least this many bytes apart (a small model's few hundred MiB of difference bounds nothing)."""

_DDP_FIX = "\n".join(
    [
        "# torchrun --nproc-per-node=NUM_GPUS train.py",
        "import torch.distributed as dist",
        "dist.init_process_group('nccl')",
        "local_rank = int(os.environ['LOCAL_RANK'])",
        "torch.cuda.set_device(local_rank)",
        "model = torch.nn.parallel.DistributedDataParallel(model.to(local_rank), device_ids=[local_rank])",
        "sampler = torch.utils.data.distributed.DistributedSampler(dataset, drop_last=True)",
        "loader = DataLoader(dataset, batch_size=per_gpu_batch, sampler=sampler)  # your other arguments as before",
    ]
)


def comm_bound(a: Analysis) -> Card | None:
    """Collective communication the step waits for.

    With several ranks, the communication is the ``comm`` of the rank that waits least: the rest of
    another rank's ``comm`` is waiting for slower ranks (``rank_straggler``), which no change to the
    communication removes.
    """
    views = [r.steady for r in a.ranks if r.steady is not None] or ([a.steady] if a.steady else [])
    if not views:
        return None
    s = min(views, key=lambda v: v.share("comm"))
    # in a GPU trace, NCCL kernels run beside the host: the GPU time they are not hidden under compute
    traced = a.gpu["comm"] if a.gpu else None
    exposed = traced["exposed_fraction"] if traced else None
    share = max(s.share("comm"), exposed or 0.0)
    if share < COMM_SHARE:
        return None
    step = s.step_s
    comm = share * step
    ddp = any(m["ddp"] for m in a.config.models)
    if ddp:
        saving = comm * (1 - 1 / ACCUMULATION)
        model_txt = f"gradients all-reduced once every {ACCUMULATION} micro-batches"
        fix = "\n".join(
            [
                f"# all-reduce once per {ACCUMULATION} micro-batches (same effective batch, scale the lr if needed)",
                f"ACCUMULATE = {ACCUMULATION}",
                "sync = (step + 1) % ACCUMULATE == 0",
                "with contextlib.nullcontext() if sync else model.no_sync():",
                "    loss = loss_fn(model(x), y) / ACCUMULATE",
                "    loss.backward()",
                "if sync:",
                "    optimizer.step()",
                "    optimizer.zero_grad()",
                "# and drop per-step collectives of metrics: reduce them every few hundred steps",
            ]
        )
    else:
        saving = min(comm, s.stage_s("backward"))
        model_txt = (
            "communication overlapped with backward, as DistributedDataParallel's bucketed all-reduce does"
        )
        fix = "# gradients synchronised by hand after backward: let DDP overlap them with it\n" + _DDP_FIX
    ranks = sum(1 for r in a.ranks if r.steps.count)
    gpu_txt = (
        f" In the GPU trace, communication kernels ran {fmt_seconds(traced['total_s'])}, "
        f"{fmt_fraction(traced['overlap_fraction'])} of it overlapped by compute kernels: "
        f"{fmt_fraction(exposed)} of the GPU's time is exposed communication."
        if traced
        else ""
    )
    return make_card(
        "comm_bound",
        f"Communication wait takes {fmt_fraction(share)} of each step",
        f"The step waits {fmt_seconds(comm)} for collectives ({fmt_fraction(share)} of a "
        f"{fmt_seconds(step)} step, {ranks} rank{'s' if ranks != 1 else ''}; model "
        f"{'is' if ddp else 'is not'} DistributedDataParallel).{gpu_txt}",
        fix,
        {
            "comm_s": comm,
            "comm_share": share,
            "ranks": ranks,
            "ddp": ddp,
            "gpu_comm_exposed_share": exposed,
            "gpu_comm_overlap_share": traced["overlap_fraction"] if traced else None,
        },
        saving_s=saving,
        step_s=step,
        model=model_txt,
    )


def rank_straggler(a: Analysis) -> Card | None:
    """One rank works longer per step and the others wait for it in the collectives."""
    st = a.straggler
    if st is None:
        return None
    where, extra = st.stage, st.stage_excess_s[st.stage]
    if where == "data":
        fix = (
            f"# rank {st.rank} waits {fmt_seconds(extra)} more per step for its batches than the others:\n"
            "# check its host (disk, network storage, CPU share) and give its loader more workers\n"
            "loader = DataLoader(dataset, batch_size=per_rank_batch, num_workers=4, pin_memory=True,\n"
            "                    sampler=torch.utils.data.distributed.DistributedSampler(dataset, drop_last=True))"
        )
    elif where in ("forward", "backward", "optimizer", "h2d"):
        fix = (
            f"# rank {st.rank} computes slower: check its GPU's clocks and throttling on that host\n"
            "# $ nvidia-smi -q -d PERFORMANCE,CLOCK  (in a shell, on that host)\n"
            "# and that every rank gets the same batch size and sequence lengths (DistributedSampler, drop_last=True)"
        )
    else:
        fix = (
            f"# rank {st.rank} spends {fmt_seconds(extra)} more per step in {where} than the others:\n"
            f"# do it on every rank alike, or less often (e.g. only `if dist.get_rank() == 0` every N steps,\n"
            "# outside the step)"
        )
    return make_card(
        "rank_straggler",
        f"Rank {st.rank} is a straggler: its {where} makes the other ranks wait",
        f"Rank {st.rank} works {fmt_seconds(st.work_s)} per step outside communication against a median of "
        f"{fmt_seconds(st.others_work_s)} on the other {f'{st.ranks - 1} ranks' if st.ranks > 2 else 'rank'} "
        f"({st.work_s / st.others_work_s:.2f}x); {fmt_seconds(extra)} of the difference is in {where}. "
        f"Meanwhile the other ranks wait {fmt_seconds(st.others_comm_s)} per step in comm "
        f"(rank {st.rank}: {fmt_seconds(st.comm_s)}).",
        fix,
        {
            "rank": st.rank,
            "stage": where,
            "work_s": st.work_s,
            "median_work_s": st.others_work_s,
            "stage_excess_s": extra,
            "others_comm_s": st.others_comm_s,
            "ranks": st.ranks,
        },
        saving_s=st.excess_s,
        step_s=st.work_s + st.comm_s,
        model="every rank waits for the slowest in each collective: its extra work per step",
    )


def gpu_imbalance(a: Analysis) -> Card | None:
    """Some GPUs work much more than others, sit idle, or hold much more memory than the others.

    Utilization first: a spread of :data:`IMBALANCE_SPREAD` costs time. Otherwise memory: among the
    GPUs that work, one holding :data:`MEMORY_RATIO` times the memory of the emptiest (nn.DataParallel
    gathers outputs and keeps the master weights on GPU 0) bounds the batch of all by its own headroom.
    """
    s = a.steady
    gpus = a.gpu_utils()
    if len(gpus) < 2 or s is None:
        return None
    utils = [(d["index"], u) for d, u in gpus]
    values = np.array([u for _, u in utils])
    busiest, idlest = float(values.max()), float(values.min())
    listing = ", ".join(
        f"GPU {d['index']} {fmt_fraction(u)}"
        + (f" ({fmt_bytes(d['mem_used_peak_bytes'])} peak)" if d["mem_used_peak_bytes"] is not None else "")
        for d, u in gpus
    )
    metrics: dict[str, Any] = {
        "gpu_util": {str(i): u for i, u in utils},
        "gpu_mem_peak_bytes": {str(d["index"]): d["mem_used_peak_bytes"] for d, _ in gpus},
    }
    step = s.step_s
    if busiest - idlest < IMBALANCE_SPREAD:
        return _memory_imbalance(gpus, listing, metrics, step)
    idle = [i for i, u in utils if u < IDLE_GPU]
    if idle:
        used = len(utils) - len(idle)
        saving = step * (1 - used / len(utils))
        model_txt = (
            f"the same work spread over all {len(utils)} GPUs instead of {used} (ideal data parallelism)"
        )
        fix = f"# GPUs {', '.join(map(str, idle))} sat idle: train on all of them\n" + _DDP_FIX
    else:
        saving = step * (1 - float(values.mean()) / busiest)
        model_txt = "every GPU as busy as the busiest one"
        fix = "# uneven work per GPU: one process per GPU with equal shards\n" + _DDP_FIX
    return make_card(
        "gpu_imbalance",
        f"GPU load is uneven: {fmt_fraction(idlest)} to {fmt_fraction(busiest)} busy",
        f"Utilization during the steady steps: {listing}"
        + (f"; {len(idle)} GPU{'s' if len(idle) > 1 else ''} idle." if idle else "."),
        fix,
        {**metrics, "idle_gpus": idle, "signal": "utilization"},
        saving_s=saving,
        step_s=step,
        model=model_txt,
    )


def _memory_imbalance(
    gpus: list[tuple[Device, float]], listing: str, metrics: dict[str, Any], step: float
) -> Card | None:
    """The memory arm of :func:`gpu_imbalance`: no time is lost, the batch is bounded (no saving)."""
    peaks = [
        (d["index"], peak)
        for d, u in gpus
        if u >= IDLE_GPU and (peak := d["mem_used_peak_bytes"]) is not None
    ]
    if len(peaks) < 2:
        return None
    (full, most), (empty, least) = max(peaks, key=lambda p: p[1]), min(peaks, key=lambda p: p[1])
    if most < MEMORY_RATIO * least or most - least < MEMORY_GAP:
        return None
    return make_card(
        "gpu_imbalance",
        f"GPU {full} holds {most / least:.1f}x the memory of GPU {empty}",
        f"Peak memory used by the working GPUs differs {most / least:.1f}x: {listing}. The fullest GPU's "
        "headroom bounds the batch size of all of them.",
        "# one process per GPU holds one model copy and its own outputs: equal memory on every GPU\n"
        + _DDP_FIX,
        {**metrics, "idle_gpus": [], "signal": "memory", "mem_ratio": most / least},
        saving_s=None,
        step_s=step,
        model=None,
    )


def data_parallel(a: Analysis) -> Card | None:
    """nn.DataParallel, which PyTorch recommends replacing with DistributedDataParallel."""
    if not any(m["data_parallel"] for m in a.config.models):
        return None
    s = a.steady
    utils = [(d["index"], u) for d, u in a.gpu_utils()]
    listing = (
        f" GPU utilization: {', '.join(f'GPU {i} {fmt_fraction(u)}' for i, u in utils)}." if utils else ""
    )
    return make_card(
        "data_parallel",
        "Replace nn.DataParallel with DistributedDataParallel",
        "The model is wrapped in nn.DataParallel: one process drives every GPU from threads under the GIL, "
        "copies the model to each GPU in every forward and gathers outputs on GPU 0." + listing,
        _DDP_FIX,
        {"data_parallel": True, "gpus": len(utils)},
        saving_s=None,
        step_s=s.step_s if s else None,
        model=None,
        severity="medium",
    )
