"""GPU rules: how busy the GPU was, its memory, and the precision and compilation levers."""

from __future__ import annotations

from typing import Any

import numpy as np

from perfmagic.advise.card import Card, make_card
from perfmagic.advise.fixes import FUSED_OPTIMIZERS, fused_optimizer_code, model_name
from perfmagic.advise.memory import pressed_device
from perfmagic.advise.trainer_fixes import (
    FABRIC,
    HF,
    LIGHTNING,
    mixed_precision_code,
    trainer_fix_site,
    trainer_name,
)
from perfmagic.analyze import Analysis
from perfmagic.analyze.steady import Steady
from perfmagic.contract import Device
from perfmagic.schema import COMPUTE_STAGES
from perfmagic.tuning.result import seconds_saved
from perfmagic.units import fmt_bytes, fmt_fraction, fmt_seconds

MEMORY_FULL = 0.95
"""Peak GPU memory share at which the caching allocator starts freeing and retrying."""
MEMORY_CRITICAL = 0.98
LOW_UTIL = 0.50
"""GPU utilization under which the GPU mostly waits (torch-tb-profiler's "low utilization": < 50%)."""
TARGET_UTIL = 0.90
"""What a well-fed GPU reaches: the saving model's target."""
KERNEL_WAIT = 0.10
"""Share of the traced time the GPU idles between back-to-back kernels (HTA "kernel wait")."""
COMPILE_SPIKE = 0.1
"""Extra seconds in a steady step's forward+backward that only a (re)compilation explains…"""
COMPILE_SPIKE_RATIO = 4.0
"""…when also this many times the median forward+backward."""
COMPILE_SHARE = 0.05
"""Recompilation time, as a share of steady step time, worth a card."""
PRECISION_COMPUTE_SHARE = 0.20
"""Forward+backward share of the step below which faster math cannot save much."""
AMP_SPEEDUP = 2.0
"""Conservative forward+backward speed-up of fp16/bf16 on tensor cores over fp32 (NVIDIA: up to 3x)."""
TF32_SPEEDUP = 1.5
"""Conservative forward+backward speed-up of TF32 matmuls over fp32 on Ampere and newer."""


def _used_gpus(a: Analysis) -> list[tuple[Device, float]]:
    """GPUs with utilization samples that did any work, with their steady-state utilization."""
    return [(d, u) for d, u in a.gpu_utils() if u > 0.01 or (d["tree_mem_used_bytes"] or 0) > 0]


def gpu_memory_pressure(a: Analysis) -> Card | None:
    """GPU memory at the edge of an out-of-memory error: nearly full, or the caching allocator had to
    free its cache and retry (``num_alloc_retries``: each retry synchronizes the device and is slow).

    Silent where the sampled step's breakdown picks the part to cut (``advise.memory``): its card is this
    one's, with the bytes its fix frees."""
    if pressed_device(a) is not None:
        return None
    candidates = []
    for d in a.devices:
        alloc = d["allocator"]
        share = d["mem_used_peak_fraction"]
        retries, ooms = (alloc["alloc_retries"], alloc["ooms"]) if alloc else (0, 0)
        if (share is not None and share >= MEMORY_FULL) or retries or ooms:
            candidates.append((ooms, retries, share or 0.0, d))
    if not candidates:
        return None
    ooms, retries, share, d = max(candidates, key=lambda c: c[:3])
    alloc = d["allocator"]
    name = f"GPU {d['index']} ({d['name'] or 'GPU'})"
    facts = []
    if d["mem_used_peak_bytes"] is not None and d["mem_total_bytes"]:
        facts.append(
            f"memory peaked at {fmt_bytes(d['mem_used_peak_bytes'])} of {fmt_bytes(d['mem_total_bytes'])}"
        )
    if retries or ooms:
        facts.append(
            f"PyTorch's caching allocator ran out {retries} time(s) in the window and freed its cache to retry"
            + (f", and {ooms} allocation(s) failed with out-of-memory" if ooms else "")
        )
    reserved, allocated = (
        (alloc["reserved_peak_bytes"], alloc["allocated_peak_bytes"]) if alloc else (None, None)
    )
    fragmented = bool(reserved and allocated is not None and (reserved - allocated) >= 0.25 * reserved)
    if reserved and allocated is not None:
        facts.append(f"tensors peaked at {fmt_bytes(allocated)} in {fmt_bytes(reserved)} reserved")
    fix = "\n".join(
        [
            "print(torch.cuda.memory_stats()['num_alloc_retries'])  # > 0: the allocator frees and retries",
            "# less fragmentation (set before the first CUDA call):"
            + (" reserved is well above what tensors use" if fragmented else ""),
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'",
            "# less memory per step: bf16 autocast halves activations; torch.utils.checkpoint recomputes them;",
            "# or halve the batch and accumulate gradients over 2 steps.",
        ]
    )
    s = a.steady
    title = (
        f"GPU {d['index']} memory is {fmt_fraction(share)} full"
        if share >= MEMORY_FULL
        else f"GPU {d['index']} memory ran out: the allocator retried {retries} time(s)"
    )
    return make_card(
        "gpu_memory_pressure",
        title,
        f"{name}: " + "; ".join(facts) + ". Near the limit every retry synchronizes the device (slow), "
        "and a larger batch or sequence will not fit.",
        fix,
        {
            "gpu": d["index"],
            "mem_used_peak_bytes": d["mem_used_peak_bytes"],
            "mem_total_bytes": d["mem_total_bytes"],
            "mem_share": share if d["mem_used_peak_fraction"] is not None else None,
            "alloc_retries": retries,
            "ooms": ooms,
            "allocated_peak_bytes": allocated,
            "reserved_peak_bytes": reserved,
        },
        saving_s=None,
        step_s=s.step_s if s else None,
        model=None,
        severity="high" if ooms or share >= MEMORY_CRITICAL else "medium",
    )


STAGE_FIX = {
    "data": "# the GPU waits for batches: see input_bound / dataloader_workers",
    "h2d": "# the GPU waits for copies: see pin_memory",
    "logging": "# the GPU waits for logging and syncs: see sync_logging",
    "checkpoint": "# the GPU waits for checkpoints: see checkpoint_frequency",
    "comm": "# the GPU waits for communication: see comm_bound",
}


def low_gpu_util(a: Analysis) -> Card | None:
    """The GPU is idle much of the time."""
    s = a.steady
    if s is None:
        return None
    traced = a.gpu["busy_fraction"] if a.gpu else None
    used = _used_gpus(a)
    if traced is not None:
        util, source = float(traced), "busy in the GPU trace"
    elif used:
        util, source = float(np.mean([u for _, u in used])), "NVML utilization during the steady steps"
    else:
        return None
    if util >= LOW_UTIL:
        return None
    step = s.step_s
    host = {n: s.stage_s(n) for n in s.stages if n not in COMPUTE_STAGES}
    worst = max(host, key=lambda n: host[n]) if host else None
    lead = (
        f"; the largest non-compute stage is {worst} ({fmt_fraction(host[worst] / step)} of the step)"
        if worst and host[worst] > 0
        else ""
    )
    model = model_name(a)
    fix = STAGE_FIX.get(
        worst or "",
        "# the host cannot issue work fast enough: fewer, larger kernels\n"
        f"{model} = torch.compile({model})  # fuses kernels and cuts Python overhead\n"
        "# and/or a larger batch per step",
    )
    gpus = ", ".join(f"GPU {d['index']} {fmt_fraction(u)}" for d, u in used) if used else ""
    gaps = a.gpu["gaps"] if a.gpu else None
    if gaps and gaps["count"]:  # Nsight's GPU starvation gaps: gpu_gaps leaves them to this card here
        lead += (
            f"; {gaps['count']} gaps of {fmt_seconds(gaps['min_s'])} or more without GPU work (longest "
            f"{fmt_seconds(gaps['longest_s'])}) are {fmt_fraction(gaps['fraction'] or 0.0)} of the traced time"
        )
    return make_card(
        "low_gpu_util",
        f"The GPU is busy only {fmt_fraction(util)} of the time",
        f"GPU {source}: {fmt_fraction(util)}{f' ({gpus})' if gpus else ''}{lead}.",
        fix,
        {"gpu_util": util, "source": "trace" if traced is not None else "nvml", "top_host_stage": worst},
        saving_s=step * max(0.0, 1 - util / TARGET_UTIL),
        step_s=step,
        model=f"the same GPU work done at {fmt_fraction(TARGET_UTIL)} utilization: step x (1 - util / 0.9)",
    )


def launch_bound(a: Analysis) -> Card | None:
    """Kernels too small and too many: the GPU idles between launches."""
    s = a.steady
    gpu = a.gpu
    idle_share = gpu["idle_breakdown"]["kernel_wait"] if gpu else None
    idle = gpu["idle_fraction"] if gpu else None
    # kernel_wait is a share of idle time; the rule's signal is its share of all traced time
    wait = idle_share * idle if idle_share is not None and idle is not None else None
    launches = gpu["launches"] if gpu else None
    # or the time kernels shorter than their launch call leave the GPU waiting for the host
    short = launches["launch_bound_fraction"] if launches else None
    signal = max((v for v in (wait, short) if v is not None), default=None)
    if s is None or signal is None or signal < KERNEL_WAIT:
        return None
    step = s.step_s
    opt = a.config.optimizers[0] if a.config.optimizers else None
    model = model_name(a)
    lines = [f"{model} = torch.compile({model}, mode='reduce-overhead')  # CUDA graphs: one launch per step"]
    if opt and not opt["fused"] and opt["cls"] in FUSED_OPTIMIZERS:
        lines.append(fused_optimizer_code(opt))
    lines.append("# and/or a larger batch: fewer, bigger kernels")
    said = []
    if wait is not None:
        said.append(
            f"the GPU sat idle between back-to-back kernels {fmt_fraction(wait)} of the time (kernel wait)"
        )
    if launches:
        said.append(
            f"{fmt_fraction(launches['shorter_than_launch_fraction'])} of {launches['count']} kernels ran for less "
            f"time than their launch call took ({fmt_seconds(launches['call_median_s'])} median), leaving the GPU "
            f"{fmt_fraction(short)} of the time to wait for launches; a kernel started "
            f"{fmt_seconds(launches['delay_median_s'])} after its launch call ended (median, p90 "
            f"{fmt_seconds(launches['delay_p90_s'])})"
        )
    return make_card(
        "launch_bound",
        "Launch-bound: the GPU idles between many small kernels",
        f"In the GPU trace, {'; '.join(said)}: it runs kernels faster than the host launches them.",
        "\n".join(lines),
        {
            "kernel_wait_share": wait,
            "launch_bound_share": short,
            "short_kernel_share": launches["shorter_than_launch_fraction"] if launches else None,
            "launch_delay_median_s": launches["delay_median_s"] if launches else None,
            "launch_delay_p90_s": launches["delay_p90_s"] if launches else None,
        },
        saving_s=step * signal,
        step_s=step,
        model="the kernel-wait or launch-bound time, whichever is larger, which CUDA graphs remove",
    )


def jit_compile(a: Analysis) -> Card | None:
    """torch.compile compiles again after warm-up (new shapes, failed guards)."""
    s = a.steady
    if s is None or not any(m["compiled"] for m in a.config.models):
        return None
    work = s.seconds[:, [s.stages.index(n) for n in ("forward", "backward") if n in s.stages]].sum(axis=1)
    if not len(work):
        return None
    median = float(np.median(work))
    extra = work - median
    spikes = (extra >= COMPILE_SPIKE) & (work >= COMPILE_SPIKE_RATIO * median)
    step = s.step_s
    lost = float(extra[spikes].sum()) / s.count
    if lost < COMPILE_SHARE * step:
        return None
    ld = a.config.loader
    last = (
        ld.dataset_len % ld.batch_size if ld and not ld.drop_last and ld.dataset_len and ld.batch_size else 0
    )
    reason = (
        f" The DataLoader's last batch has {last} samples, not {ld.batch_size}: "
        "a new shape at each epoch's end."
        if ld and last
        else ""
    )
    lines = [
        "# see what triggers each recompilation:",
        "# $ TORCH_LOGS=recompiles python train.py  (in a shell)",
    ]
    if last:
        lines.append("loader = DataLoader(dataset, ..., drop_last=True)  # every batch the same shape")
    model = model_name(a)
    lines.append(f"{model} = torch.compile({model}, dynamic=True)  # or: compile once for varying shapes")
    return make_card(
        "jit_compile",
        f"torch.compile recompiled {int(spikes.sum())} times after warm-up",
        f"{int(spikes.sum())} of {s.count} steps after warm-up spent up to {fmt_seconds(float(work[spikes].max()))} in "
        f"forward+backward against a median of {fmt_seconds(median)}: compilation, in a compiled model.{reason}",
        "\n".join(lines),
        {
            "recompiles": int(spikes.sum()),
            "compile_s": float(extra[spikes].sum()),
            "median_compute_s": median,
        },
        saving_s=lost,
        step_s=step,
        model="the extra forward+backward time of the recompiling steps, spread over all steps",
    )


def _capability(a: Analysis) -> float | None:
    """Compute capability of the model's GPU (GPU 0 when unknown)."""
    index = a.config.gpu_index
    d = next((d for d in a.devices if d["index"] == index), None)
    cc = d["compute_capability"] if d else None
    return float(cc) if cc else None


def _fp32_on_gpu(a: Analysis) -> tuple[Steady, float] | None:
    """The steady view and capability when a float32 model trains on a CUDA GPU without autocast."""
    s, md = a.steady, a.config.model
    c = a.config.counters
    if s is None or md is None or not (md["device"] or "").startswith("cuda"):
        return None
    if md["param_dtype"] != "float32" or c["autocast_forwards"] >= 0.5 * (c["forwards"] or 1):
        return None
    cc = _capability(a)
    if cc is None or s.share("forward", "backward") < PRECISION_COMPUTE_SHARE:
        return None
    return s, cc


def amp(a: Analysis) -> Card | None:
    """float32 training on a GPU with tensor cores."""
    found = _fp32_on_gpu(a)
    if found is None or found[1] < 7.0:  # tensor cores from Volta (7.0)
        return None
    s, cc = found
    compute = s.stage_s("forward", "backward")
    bf16 = cc >= 8.0
    dtype = "bfloat16" if bf16 else "float16"
    measured = _measured_saving(a, "autocast")
    if measured is not None:
        if measured[0] is None:
            return None  # tried on copies of the model: autocast was no faster here
        dtype, bf16 = measured[0], measured[0] == "bfloat16"
    framework_fix = mixed_precision_code(a, bf16)
    if framework_fix is not None:
        fix = framework_fix
    elif bf16:
        fix = "\n".join(
            [
                "with torch.autocast('cuda', dtype=torch.bfloat16):  # bf16 needs no loss scaling",
                "    loss = loss_fn(model(x), y)",
                "loss.backward()",
                "optimizer.step()",
            ]
        )
    else:
        fix = "\n".join(
            [
                "scaler = torch.amp.GradScaler('cuda')  # once, before the loop",
                "with torch.autocast('cuda', dtype=torch.float16):",
                "    loss = loss_fn(model(x), y)",
                "scaler.scale(loss).backward()",
                "scaler.step(optimizer)",
                "scaler.update()",
            ]
        )
    return make_card(
        "amp",
        f"Train in mixed precision ({dtype} autocast)",
        f"The model trains in float32 without autocast on a GPU with tensor cores (compute capability {cc:.1f}); "
        f"forward+backward take {fmt_fraction(s.share('forward', 'backward'))} of the step ({fmt_seconds(compute)}).",
        fix,
        {"compute_s": compute, "compute_capability": cc, "dtype": dtype},
        saving_s=measured[1] if measured else compute * (1 - 1 / AMP_SPEEDUP),
        step_s=s.step_s,
        model="measured" if measured else f"forward+backward {AMP_SPEEDUP:.0f}x faster on tensor cores",
        replaces=trainer_fix_site(a)
        if framework_fix is not None and trainer_name(a) in (HF, LIGHTNING, FABRIC)
        else None,
    )


def tf32(a: Analysis) -> Card | None:
    """float32 matmuls on Ampere or newer without TF32."""
    found = _fp32_on_gpu(a)
    t = a.config.torch
    if found is None or found[1] < 8.0:
        return None
    if ("matmul_allow_tf32" in t and t["matmul_allow_tf32"]) or (
        "float32_matmul_precision" in t and t["float32_matmul_precision"] != "highest"
    ):
        return None
    s, cc = found
    compute = s.stage_s("forward", "backward")
    measured = _measured_saving(a, "tf32")
    if measured is not None and measured[0] is not True:
        return None  # tried on copies of the model: TF32 was no faster here
    fix = "torch.set_float32_matmul_precision('high')  # TF32 tensor cores for float32 matmuls"
    if "cudnn_allow_tf32" in t and t["cudnn_allow_tf32"] is False:
        fix += "\ntorch.backends.cudnn.allow_tf32 = True  # and for convolutions"
    return make_card(
        "tf32",
        "Let float32 matmuls use TF32 tensor cores",
        f"float32 matmuls run at full precision (float32_matmul_precision='highest') on a GPU with TF32 tensor "
        f"cores (compute capability {cc:.1f}); forward+backward take {fmt_fraction(s.share('forward', 'backward'))} "
        "of the step.",
        fix,
        {"compute_s": compute, "compute_capability": cc},
        saving_s=measured[1] if measured else compute * (1 - 1 / TF32_SPEEDUP),
        step_s=s.step_s,
        model="measured" if measured else f"forward+backward {TF32_SPEEDUP}x faster with TF32 matmuls",
    )


def _measured_saving(a: Analysis, knob: str) -> tuple[Any, float] | None:
    """(the best setting tuning measured, seconds it saved per training step on copies of the model);
    None where the knob was not tried."""
    tried = a.tuned(knob)
    if tried is None:
        return None
    best, saved = tried["best"], seconds_saved(tried)
    if best is None or saved is None:
        return None
    return best["value"], saved
