"""Memory rules: which part of a device's memory to cut, and what each change frees (report key ``memory``).

They fire only where memory limits the training: the sampled step's peak at ``PRESSED`` of the device
or more, an allocator retry or out-of-memory error seen, or a batch-size estimate asked for (tuning
tried the batch size). The largest part of the device's bar (``LARGEST`` or more of it) picks the
card: activations, optimizer state, parameters and gradients, or the allocator's fragmentation. Each
card says the bytes its fix frees (an estimate, with what it rests on) and what it costs.
"""

from __future__ import annotations

from typing import Literal

from perfmagic.advise.card import Card, make_card
from perfmagic.advise.fixes import model_name
from perfmagic.analyze import Analysis
from perfmagic.analyze.memory import CHECK_TOLERANCE, parts
from perfmagic.contract.memory import MemoryDevice, MemorySection
from perfmagic.units import fmt_bytes, fmt_fraction, fmt_seconds

PRESSED = 0.85
"""Peak share of a device's memory from which memory limits the batch (torch-tb-profiler warns at 90%)."""
LARGEST = 0.40
"""Share of the bar the largest part needs to pick the card: below it no one part is worth cutting first."""
CHECKPOINT_MIN = 0.30
"""Share of the activations checkpointing must free to be the fix; below it, a smaller batch with accumulation."""
EIGHT_BIT_KEEPS = 0.25
"""What an 8-bit optimizer keeps of 32-bit moments (bitsandbytes: one byte per value, plus block scales)."""
Part = Literal["activations", "optimizer_state", "weights", "fragmentation", "other"]
"""The parts a memory card is picked by."""
EIGHT_BIT = ("Adam", "AdamW")
"""torch optimizers whose update bitsandbytes has in 8 bits, by the same name and settings."""


def pressed_device(a: Analysis) -> tuple[MemorySection, MemoryDevice, Part] | None:
    """The device whose memory limits the training, with the largest part of its bar (parameters and
    gradients together: ``weights``); None where nothing limits it, or no part reaches ``LARGEST`` of
    the bar (on the CPU, of the bar less ``other``: the process's own memory), or the largest is ``other``."""
    memory = a.memory
    if memory is None:
        return None
    asked = a.tuned("batch_size") is not None
    pressed = [
        d
        for d in memory["devices"]
        if asked or (d["peak_fraction"] or 0.0) >= PRESSED or (d["alloc_retries"] or 0) or (d["ooms"] or 0)
    ]
    for d in sorted(pressed, key=lambda d: -(d["peak_fraction"] or 0.0)):
        bar = parts(d)
        if (
            d["peak_source"] == "process_uss"
        ):  # the process's own memory (interpreter, libraries) is no part to cut
            bar["other"] = 0
        whole = sum(bar.values())
        # parameters and their gradients are one part here: one fix (16 bits, sharding) halves both
        groups: dict[Part, int] = {
            "activations": bar["activations"],
            "optimizer_state": bar["optimizer_state"],
            "weights": bar["parameters"] + bar["gradients"],
            "fragmentation": bar["fragmentation"],
            "other": bar["other"],
        }
        largest = max(groups, key=lambda g: groups[g])
        if whole and largest != "other" and groups[largest] >= LARGEST * whole:
            return memory, d, largest
    return None


def activation_memory(a: Analysis) -> Card | None:
    """Activations are the largest part: checkpoint the blocks that hold most, else a smaller batch with
    gradient accumulation that keeps the effective batch."""
    found = pressed_device(a)
    if found is None or found[2] != "activations":
        return None
    memory, d, _ = found
    acts = d["activations_bytes"]
    blocks = [b for b in memory["blocks"] if b["activations_bytes"] > b["input_bytes"]]
    freed = sum(b["activations_bytes"] - b["input_bytes"] for b in blocks)
    cost = sum(b["forward_s"] for b in blocks)
    model = model_name(a)
    batch = memory["batch_size"]
    accumulation = _accumulation_lines(batch)
    if memory["hf_checkpointing"]:
        freed, cost = (
            acts - sum(b["input_bytes"] for b in memory["blocks"]),
            sum(b["forward_s"] for b in memory["blocks"]),
        )
        fix = [f"{model}.gradient_checkpointing_enable()  # recompute activations in backward", *accumulation]
        how = "checkpointing"
    elif blocks and freed >= CHECKPOINT_MIN * acts:
        fix = [*_checkpoint_lines(model, memory["blocks_path"], [b["path"] for b in blocks]), *accumulation]
        how = "checkpointing"
    else:
        freed, cost, how = acts // 2, 0.0, "accumulation"
        fix = _accumulation_lines(batch, alone=True)
    evidence = _breakdown_words(memory, d) + (
        f" Checkpointing {len(blocks)} block(s) frees about {fmt_bytes(freed)} (their saved activations "
        f"less the inputs checkpointing keeps) and costs about {fmt_seconds(cost)} per step: their forward, "
        "run again in backward (measured on the sampled step)."
        if how == "checkpointing"
        else f" Half the batch with 2 accumulation steps frees about {fmt_bytes(freed)} (activations grow with "
        "the batch) and keeps the effective batch; each step does half the work, so small kernels use the GPU less."
    )
    return _card(
        "activation_memory",
        f"Activations fill {_where(d)}: {how} frees them",
        evidence,
        fix,
        a,
        d,
        freed,
        cost,
    )


def optimizer_memory(a: Analysis) -> Card | None:
    """Optimizer state is the largest part: an 8-bit optimizer (Adam's family), else sharding it."""
    found = pressed_device(a)
    if found is None or found[2] != "optimizer_state":
        return None
    memory, d, _ = found
    state, cls = d["optimizer_state_bytes"], memory["optimizer"] or "the optimizer"
    name = memory["optimizer_name"] or "optimizer"
    if cls in EIGHT_BIT:
        freed = int(state * (1 - EIGHT_BIT_KEEPS))
        fix = [
            "# $ pip install bitsandbytes  (in a shell)",
            "import bitsandbytes as bnb",
            "# its moments in 8 bits, over the same parameter groups: their lr, betas, eps and weight_decay kept",
            f"{name} = bnb.optim.{cls}8bit({name}.param_groups)  # before any LR scheduler is built on it",
            "# or shard the state over N GPUs: torch.distributed.optim.ZeroRedundancyOptimizer (each keeps 1/N)",
        ]
        says = f"an 8-bit {cls} keeps about a quarter of it: frees about {fmt_bytes(freed)}"
    else:
        freed = state // 2
        fix = [
            "# shard the state over the job's GPUs (each keeps 1/N of it), once init_process_group has run:",
            "import torch",
            "from torch.distributed.optim import ZeroRedundancyOptimizer",
            f"{name} = ZeroRedundancyOptimizer({name}.param_groups, optimizer_class=torch.optim.{cls})",
        ]
        says = f"sharded over 2 GPUs it frees about {fmt_bytes(freed)} on each"
    evidence = _breakdown_words(memory, d) + f" {cls}'s state is {fmt_bytes(state)}; {says} (an estimate)."
    return _card("optimizer_memory", f"Optimizer state fills {_where(d)}", evidence, fix, a, d, freed, 0.0)


def weight_memory(a: Analysis) -> Card | None:
    """Parameters or gradients are the largest part: 16-bit weights, else sharding them (FSDP)."""
    found = pressed_device(a)
    if found is None or found[2] != "weights":
        return None
    memory, d, _ = found
    weights = d["parameters_bytes"] + d["gradients_bytes"]
    model = model_name(a)
    freed = weights // 2  # either way: 16 bits of 32, or one of 2 GPUs' shares
    if memory["param_dtype"] == "float32":
        fix = [
            "import torch",
            f"{model} = {model}.to(torch.bfloat16)  # weights and their gradients in 16 bits: half the bytes",
            "# and the batch's float inputs the same way, in the loop: x = x.to(torch.bfloat16)",
            "# keep a float32 copy for the update where precision matters (mixed precision);",
            "# or shard them over N GPUs: torch.distributed.fsdp.FullyShardedDataParallel (each keeps 1/N)",
        ]
        says = f"in bfloat16 they take half: frees about {fmt_bytes(freed)}"
    else:
        fix = [
            "# shard the weights and gradients over the GPUs (each keeps 1/N):",
            "from torch.distributed.fsdp import FullyShardedDataParallel",
            f"{model} = FullyShardedDataParallel({model})",
        ]
        says = f"sharded over 2 GPUs they take half on each: frees about {fmt_bytes(freed)}"
    evidence = (
        _breakdown_words(memory, d)
        + f" Parameters and gradients are {fmt_bytes(weights)}; {says} (an estimate)."
    )
    return _card("weight_memory", f"Weights and gradients fill {_where(d)}", evidence, fix, a, d, freed, 0.0)


def allocator_fragmentation(a: Analysis) -> Card | None:
    """Reserved-but-unused bytes are the largest part: expandable segments let the allocator reuse them."""
    found = pressed_device(a)
    if found is None or found[2] != "fragmentation":
        return None
    memory, d, _ = found
    if "expandable_segments:True" in (memory["alloc_conf"] or ""):
        return None  # already set: nothing to change
    freed = d["fragmentation_bytes"] or 0
    fix = [
        "import os",
        "# before the first CUDA call (the top of the script, or the notebook's first cell):",
        "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'",
    ]
    evidence = _breakdown_words(memory, d) + (
        f" The caching allocator held {fmt_bytes(freed)} reserved but unused at the peak: segments it cannot "
        "merge; expandable segments grow one segment instead, freeing up to that (an upper bound)."
    )
    return _card(
        "allocator_fragmentation", f"Fragmentation fills {_where(d)}", evidence, fix, a, d, freed, 0.0
    )


def _card(
    id: str,
    title: str,
    evidence: str,
    fix: list[str],
    a: Analysis,
    d: MemoryDevice,
    freed: int,
    cost_s: float,
) -> Card:
    s = a.steady
    retries, ooms = d["alloc_retries"] or 0, d["ooms"] or 0
    return make_card(
        id,
        title,
        evidence,
        "\n".join(fix),
        {
            "device": d["device"],
            "freed_bytes": int(freed),
            "step_cost_s": cost_s,
            "peak_bytes": d["peak_bytes"],
            "peak_fraction": d["peak_fraction"],
            "largest_batch": d["largest_batch"],
            "batch_check": d["batch_check"],
            "alloc_retries": retries,
            "ooms": ooms,
        },
        saving_s=None,  # it frees memory; its time is a cost (step_cost_s), not a saving
        step_s=s.step_s if s else None,
        model=None,
        severity="high" if ooms or retries or (d["peak_fraction"] or 0.0) >= 0.95 else "medium",
    )


def _where(d: MemoryDevice) -> str:
    share = d["largest_fraction"]
    return f"{fmt_fraction(share)} of {d['device']}'s memory" if share is not None else d["device"]


def _breakdown_words(memory: MemorySection, d: MemoryDevice) -> str:
    bar = parts(d)
    said = ", ".join(f"{k.replace('_', ' ')} {fmt_bytes(v)}" for k, v in bar.items() if v)
    peak = (
        f" peak {fmt_bytes(d['peak_bytes'])} in {d['peak_stage'] or 'no stage'}"
        + (f", {fmt_fraction(d['peak_fraction'])} of the device" if d["peak_fraction"] is not None else "")
        if d["peak_bytes"] is not None
        else ""
    )
    failures = (
        f"; the allocator retried {d['alloc_retries']} time(s), {d['ooms'] or 0} out-of-memory error(s)"
        if d["alloc_retries"] or d["ooms"]
        else ""
    )
    return f"{d['device']} on step {memory['step']}: {said};{peak}{failures}.{_batch_words(d)}"


def _batch_words(d: MemoryDevice) -> str:
    """The largest batch that fits, said as an estimate, and how tuning's doubled batch checked it."""
    per_sample, check, largest = d["activation_bytes_per_sample"], d["batch_check"], d["largest_batch"]
    if largest is None or not per_sample:
        return ""
    grows = f"activations grow with the batch at {fmt_bytes(per_sample)} per sample, the rest stays"
    if check is None:
        return f" A batch of about {largest} would fit (an estimate: {grows})."
    b = check["batch"]
    checked = (
        f"checked: the doubled batch ({2 * b}) peaked at {fmt_bytes(check['measured_peak_bytes'])}, the estimate "
        f"said {fmt_bytes(check['predicted_peak_bytes'])} (tuning ran it on copies of the model: the sampled "
        f"peak plus its measured rise over a batch of {b})"
    )
    if check["agrees"]:
        return f" A batch of about {largest} would fit (an estimate: {grows}; {checked})."
    measured = (check["doubled_peak_bytes"] - check["single_peak_bytes"]) / b
    return (
        f" A batch of about {largest} would fit (an estimate at the measured growth of {fmt_bytes(measured)} per "
        f"sample: {checked}, more than {fmt_fraction(CHECK_TOLERANCE)} apart, so the estimate takes the "
        f"measured growth, not the activations' {fmt_bytes(per_sample)} per sample)."
    )


def _checkpoint_lines(model: str, list_path: str | None, paths: list[str]) -> list[str]:
    """Checkpointing the blocks, by attribute path: a module list's items in a loop, else each child."""
    if list_path is not None:
        target = f"{model}.{list_path}" if list_path else model
        head = f"for block in {target}:  # recompute each block's activations in backward"
    else:
        head = f"for block in ({', '.join(f'{model}.{p}' for p in paths)},):  # recomputed in backward"
    return [
        "import functools",
        "import torch.utils.checkpoint",
        head,
        "    block.forward = functools.partial(torch.utils.checkpoint.checkpoint, block.forward, use_reentrant=False)",
    ]


def _accumulation_lines(batch: int | None, alone: bool = False) -> list[str]:
    """A smaller batch with gradient accumulation, in words: the loop around the step is the user's."""
    half = f"batch_size={batch // 2}" if batch and batch >= 2 else "half the batch"
    keeps = f"the effective batch stays {batch}" if batch else "the effective batch stays as it is"
    return [
        "# half the activations, the same samples per update:" if alone else "# or, without recomputing:",
        f"#   {half} in the DataLoader, and 2 accumulation steps ({keeps}):",
        "#   loss = loss_fn(...) / 2; loss.backward(); optimizer.step() and zero_grad() every 2nd batch",
    ]
