"""The report's ``memory`` section: where each device's memory went on the sampled step.

The bar of a device is its parameters, gradients, optimizer state and activations (counted exactly
by storage), the rest of the peak (``other``: temporaries; on the CPU the whole process's own memory
too: interpreter, libraries, data) and, on CUDA, what the caching allocator had reserved but not
handed out at the peak (fragmentation). Where the four categories exceed the peak (gradients freed
before activations were made, say), ``other`` is 0.
"""

from __future__ import annotations

from perfmagic.contract import Device, KnobResult
from perfmagic.contract.loader import LoaderConfig
from perfmagic.contract.memory import (
    BatchCheck,
    Category,
    HostMemory,
    MemoryDevice,
    MemoryDeviceMeta,
    MemoryMeta,
    MemorySection,
    WorkerMemory,
    WorkerMemoryMeta,
)
from perfmagic.schema import PINNED_BYTES, SWAP_USED
from perfmagic.timeline import Timeline

CATEGORIES: tuple[Category, ...] = (
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "other",
    "fragmentation",
)
"""The parts of a device's bar, bottom first (``MemoryDevice.largest`` names one)."""

CHECK_TOLERANCE = 0.10
"""How far tuning's measured doubled peak may fall from the estimate's before the largest batch is
estimated from the measured growth instead of the activations."""


def memory_section(
    meta: MemoryMeta | None,
    devices: list[Device],
    host: HostMemory | None = None,
    tuning: list[KnobResult] | None = None,
) -> MemorySection | None:
    """The ``memory`` section of the probe's record and the host's figures; None where neither was
    measured (without a sampled step its per-device fields are empty). ``tuning``: its results, whose
    ``batch_size`` peaks check the largest-batch estimate."""
    if not meta or not meta.get("devices"):
        if host is None:
            return None
        return {
            "step": None,
            "model": None,
            "model_name": None,
            "hf_checkpointing": False,
            "param_dtype": None,
            "alloc_conf": None,
            "optimizer": None,
            "optimizer_name": None,
            "batch_size": None,
            "blocks_path": None,
            "blocks": [],
            "devices": [],
            "host": host,
        }
    totals = {f"cuda:{d.get('index')}": d.get("mem_total_bytes") for d in devices}
    batch_size = next((t for t in tuning or [] if t["knob"] == "batch_size"), None)
    return {
        "step": meta["step"],
        "model": meta["model"],
        "model_name": meta["model_name"],
        "hf_checkpointing": meta["hf_checkpointing"],
        "param_dtype": meta["param_dtype"],
        "alloc_conf": meta["alloc_conf"],
        "optimizer": meta["optimizer"],
        "optimizer_name": meta["optimizer_name"],
        "batch_size": meta["batch_size"],
        "blocks_path": meta["blocks_path"],
        "blocks": meta["blocks"],
        "devices": [
            _device(d, meta["batch_size"], totals.get(d["device"]), batch_size) for d in meta["devices"]
        ],
        "host": host,
    }


def host_memory(tl: Timeline, sampled: Timeline, loader: LoaderConfig | None) -> HostMemory | None:
    """The host side: the DataLoader workers' own memory and what their dataset holds, the pinned memory
    held and the swap's growth; None where none of it was read."""
    workers = [_worker(w) for w in tl.meta.get("worker_memory") or []]
    _, pinned = sampled.series(PINNED_BYTES)
    _, swap = sampled.series(SWAP_USED)
    probe = tl.meta.get("memory")
    embeddings = (probe.get("host_embeddings") or []) if probe else []
    if not (workers or len(pinned) or len(swap) or embeddings or (loader is not None and loader.containers)):
        return None
    return {
        "start_method": loader.start_method if loader else None,
        "dataset_name": loader.dataset_name if loader else None,
        "containers": list(loader.containers) if loader else [],
        "workers": workers,
        "worker_growth_bytes": sum(w["growth_bytes"] for w in workers) // len(workers) if workers else None,
        "pinned_bytes": int(pinned.max()) if len(pinned) else None,
        "swap_start_bytes": int(swap[0]) if len(swap) else None,
        "swap_growth_bytes": max(0, int(swap.max() - swap[0])) if len(swap) else None,
        "embeddings": embeddings,
    }


def _worker(m: WorkerMemoryMeta) -> WorkerMemory:
    return {**m, "growth_bytes": max(0, m["last_uss_bytes"] - m["first_uss_bytes"])}


def parts(d: MemoryDevice) -> dict[Category, int]:
    """The bar of a device, by category (:data:`CATEGORIES`), in bytes; unmeasured parts 0."""
    return {
        "parameters": d["parameters_bytes"],
        "gradients": d["gradients_bytes"],
        "optimizer_state": d["optimizer_state_bytes"],
        "activations": d["activations_bytes"],
        "other": d["other_bytes"] or 0,
        "fragmentation": d["fragmentation_bytes"] or 0,
    }


def _device(
    m: MemoryDeviceMeta, batch: int | None, nvml_total: int | None, tried: KnobResult | None
) -> MemoryDevice:
    known = m["parameters_bytes"] + m["gradients_bytes"] + m["optimizer_state_bytes"] + m["activations_bytes"]
    peak, reserved = m["peak_bytes"], m["reserved_at_peak_bytes"]
    fragmentation = max(0, reserved - peak) if reserved is not None and peak is not None else None
    total = m["total_bytes"] or nvml_total
    in_use = (reserved if reserved is not None else peak) if peak is not None else None
    per_sample = m["activations_bytes"] / batch if batch and m["activations_bytes"] else None
    d: MemoryDevice = {
        "device": m["device"],
        "parameters_bytes": m["parameters_bytes"],
        "gradients_bytes": m["gradients_bytes"],
        "optimizer_state_bytes": m["optimizer_state_bytes"],
        "activations_bytes": m["activations_bytes"],
        "other_bytes": max(0, peak - known) if peak is not None else None,
        "fragmentation_bytes": fragmentation,
        "peak_bytes": peak,
        "peak_stage": m["peak_stage"],
        "peak_source": m["peak_source"],
        "peak_fraction": in_use / total if in_use is not None and total else None,
        "total_bytes": total,
        "activation_bytes_per_sample": per_sample,
        "largest": None,
        "largest_fraction": None,
        "alloc_retries": m["alloc_retries"],
        "ooms": m["ooms"],
        "largest_batch": None,
        "batch_check": None,
    }
    bar = parts(d)
    whole = sum(bar.values())
    if whole:
        largest = max(CATEGORIES, key=lambda c: bar[c])
        d["largest"] = largest
        d["largest_fraction"] = bar[largest] / whole
    check = d["batch_check"] = batch_check(d, tried)
    rate = per_sample
    if check is not None and not check["agrees"]:  # the doubled batch measured another growth: it stands
        rate = (check["doubled_peak_bytes"] - check["single_peak_bytes"]) / check["batch"]
    if batch and rate and rate > 0 and total and in_use is not None:
        # what grows with the batch grows at ``rate`` per sample, the rest stays: an estimate, no batch
        # of that size was run
        d["largest_batch"] = max(0, batch + int((total - max(in_use, whole)) // rate))
    return d


def batch_check(d: MemoryDevice, tried: KnobResult | None) -> BatchCheck | None:
    """Tuning's doubled batch against the estimate for ``d``: the sampled peak plus what the doubled
    step rose above the single one, beside the peak plus the activations of that many more samples;
    None where tuning did not read both peaks on this device or activations were not measured."""
    per_sample, peak = d["activation_bytes_per_sample"], d["peak_bytes"]
    if tried is None or tried.get("device") != d["device"] or tried["baseline"] is None:
        return None
    batch = tried["baseline"]["value"]
    peaks = {t["value"]: t.get("peak_bytes") for t in tried["tried"]}
    single, doubled = peaks.get(batch), peaks.get(2 * batch)
    if single is None or doubled is None or peak is None or not per_sample or not batch:
        return None
    measured = peak + doubled - single
    predicted = peak + int(per_sample * batch)
    return {
        "batch": batch,
        "single_peak_bytes": single,
        "doubled_peak_bytes": doubled,
        "measured_peak_bytes": measured,
        "predicted_peak_bytes": predicted,
        "agrees": abs(measured - predicted) <= CHECK_TOLERANCE * predicted,
    }
