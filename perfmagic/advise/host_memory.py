"""Host memory rules (report key ``memory.host``): DataLoader workers that copy the dataset they read,
pinned memory that takes a large share of the machine, swap that grows while the training runs, and
embedding tables left in host memory.

Each card says the bytes its fix frees and the step time it costs, as the device memory cards do
(:mod:`perfmagic.advise.memory`).
"""

from __future__ import annotations

from perfmagic.advise.card import Card, make_card
from perfmagic.advise.data import PIN_H2D_SHARE
from perfmagic.advise.host import LOW_AVAILABLE
from perfmagic.advise.storage import io_bound
from perfmagic.advise.trainer_fixes import loader_code, loader_fix_site
from perfmagic.analyze import Analysis
from perfmagic.contract.memory import DatasetContainer, HostMemory
from perfmagic.schema import MAJOR_FAULTS, memory_kind, memory_name
from perfmagic.units import fmt_bytes, fmt_fraction, fmt_seconds

MiB = 2**20
COPY_MIN_BYTES = 8 * MiB
"""A forked worker's USS growth worth a card: a worker reading numpy arrays grows well under it (its own
buffers), one reading a list of dicts by a page per few dozen samples."""
PICKLED_MIN_BYTES = 64 * MiB
"""A dataset's Python objects worth a card where each spawned worker unpickles its own copy of them."""
MACHINE_SHARE = 0.05
"""All workers' copies at this share of the machine's memory or more: a medium card; else a low one."""
SWAP_MIN_BYTES = 256 * MiB
"""Swap growth during the run worth a card: the kernel moved that much out of memory while training ran."""
FAULT_S = 1e-4
"""Assumed seconds per major fault (a 4 KiB page read back from SSD-backed swap): the saving model."""
EMBEDDING_SHARE = 0.05
"""Share of the step a host embedding table's lookups take (measured on the sampled forward) worth a card."""
ROOM = 0.85
"""The device's memory the table may bring it to, with its gradient: the device memory cards' ``PRESSED``."""
PINNED_SHARE = 0.25
"""Pinned memory held at this share of the machine's memory or more is worth a card: the kernel can neither
swap it out nor reclaim it for the page cache."""
PINNED_PRESSED_SHARE = 0.10
"""The share that is worth a card where the machine ran short: available memory under ``LOW_AVAILABLE``
of it, or swap grown by ``SWAP_MIN_BYTES``."""
NUMPY_ITEMS = ("tuple", "list", "int", "float", "str", "bool")
"""Items ``np.array`` turns into one array (a list of tuples of numbers: a 2-D array)."""


def _host(a: Analysis) -> HostMemory | None:
    return a.memory["host"] if a.memory is not None else None


def dataloader_copy_on_read(a: Analysis) -> Card | None:
    """Forked workers copy the dataset's Python objects as they read them; spawned ones each unpickle a copy."""
    host, ld = _host(a), a.config.loader
    if host is None or ld is None or not ld.num_workers or not host["containers"]:
        return None
    c = host["containers"][0]
    target = f"{host['dataset_name'] or 'dataset'}.{c['attribute']}"
    held = f"{target} is a {c['kind']} of {c['length']:,} items (about {fmt_bytes(c['bytes'])})"
    pickled = host["start_method"] in ("spawn", "forkserver")
    if pickled:
        if c["bytes"] < PICKLED_MIN_BYTES:
            return None
        each = c["bytes"]
        evidence = (
            f"The DataLoader's {ld.num_workers} workers start by {host['start_method']}: each holds a pickled "
            f"copy of the dataset. {held}, so each worker holds about {fmt_bytes(each)} of it (an estimate from its "
            "first items), in Python objects it then reads one by one."
        )
    else:
        growth = host["worker_growth_bytes"]
        if growth is None or growth < COPY_MIN_BYTES:
            return None
        each = growth
        samples = sum(w["samples"] for w in host["workers"]) // max(1, len(host["workers"]))
        evidence = (
            f"The {len(host['workers'])} forked DataLoader workers' unique memory (USS) grew by "
            f"{fmt_bytes(growth)} each on average while each read {samples:,} samples (measured). {held}: "
            "reading an item writes its reference count, which copies the page it lies on into the worker "
            f"(copy-on-read). A worker that reads all of it copies up to {fmt_bytes(c['bytes'])}; numpy arrays "
            "or tensors are one object over one buffer, read without a write."
        )
    freed = each * ld.num_workers
    evidence += f" All {ld.num_workers} workers: {fmt_bytes(freed)}{_fraction_of_machine(a, freed)}."
    total = a.host["mem_total_bytes"]
    return make_card(
        "dataloader_copy_on_read",
        f"Each DataLoader worker {'holds a copy of' if pickled else 'copies'} {target} ({c['kind']})",
        evidence,
        "\n".join(_columns_fix(target, c, pickled, ld.num_workers)),
        {
            "attribute": c["attribute"],
            "kind": c["kind"],
            "items": c["length"],
            "dataset_bytes": c["bytes"],
            "start_method": host["start_method"],
            "workers": ld.num_workers,
            "growth_per_worker_bytes": None if pickled else each,
            "freed_bytes": int(freed),
            "step_cost_s": 0.0,  # the conversion runs once, before training
        },
        saving_s=None,  # it frees memory: no step time saved
        step_s=a.steady.step_s if a.steady else None,
        model=None,
        severity="medium" if total and freed >= MACHINE_SHARE * total else "low",
    )


def _columns_fix(target: str, c: DatasetContainer, pickled: bool, workers: int) -> list[str]:
    """The container as arrays, under the user's name: workers then read buffers, not objects."""
    item = c["kind"].partition(" of ")[2]
    # spawned workers unpickle arrays too; a tensor in shared memory is passed by handle instead
    wrap = "torch.from_numpy({}).share_memory_()" if pickled else "{}"
    imports = ["import numpy as np", *(["import torch"] if pickled else [])]
    if c["kind"].startswith("dict"):
        return [
            f"# {target} is keyed: keep its values in arrays and its keys' positions in a dict of ints,",
            "# or read it in fewer workers (each copies what it reads):",
            f"# DataLoader(..., num_workers={max(1, workers // 2)})  # was {workers}",
        ]
    if item == "dict":
        return [
            *imports,
            "",
            "",
            "class Columns:",
            '    """Rows as one array per key: no Python object per sample for the workers to copy."""',
            "",
            "    def __init__(self, rows):",
            "        self.keys = list(rows[0])",
            f"        self.columns = {{k: {wrap.format('np.array([row[k] for row in rows])')} for k in self.keys}}",
            "",
            "    def __len__(self):",
            "        return len(self.columns[self.keys[0]])",
            "",
            "    def __getitem__(self, i):",
            "        return {k: self.columns[k][i] for k in self.keys}",
            "",
            "",
            f"{target} = Columns({target})  # before the DataLoader's workers start",
        ]
    if item in NUMPY_ITEMS:
        return [*imports, f"{target} = {wrap.format(f'np.array({target})')}  # one array, no object per item"]
    if item in ("Tensor", "ndarray"):
        stack = "torch.stack" if item == "Tensor" else "np.stack"
        lines = [*imports, *(["import torch"] if item == "Tensor" and not pickled else [])]
        share = ".share_memory_()" if pickled and item == "Tensor" else ""
        return [*lines, f"{target} = {stack}({target}){share}  # one buffer: items are views into it"]
    return [
        f"# {target} holds {item} objects: store their fields in numpy arrays (or an Arrow table,",
        "# datasets.Dataset), or read them in fewer workers (each copies what it reads):",
        f"# DataLoader(..., num_workers={max(1, workers // 2)})  # was {workers}",
    ]


def pinned_memory_held(a: Analysis) -> Card | None:
    """The DataLoader's pinned batches hold a large share of the machine's memory, or a part of it while
    memory ran short: fewer batches in flight, or pageable batches where their copies take little of the step."""
    host, ld, s = _host(a), a.config.loader, a.steady
    pinned, total = (host["pinned_bytes"] if host else None), a.host["mem_total_bytes"]
    if host is None or pinned is None or not total or ld is None or not ld.pin_memory:
        return None  # no pinned memory read, or none of it the DataLoader's to change
    available, grown = a.host["mem_available_min_bytes"], host["swap_growth_bytes"] or 0
    short = (available is not None and available < LOW_AVAILABLE * total) or grown >= SWAP_MIN_BYTES
    if pinned < (PINNED_PRESSED_SHARE if short else PINNED_SHARE) * total:
        return None
    per_batch = _pinned_per_batch(a)
    prefetch = ld.prefetch_factor or 2  # the DataLoader's default with workers
    in_flight = ld.num_workers * prefetch + 1 if ld.num_workers else 1
    # the loader's part of what was held: its batches in flight, at most all of it
    by_loader = min(pinned, per_batch * in_flight) if per_batch else pinned
    change: dict[str, object]
    if s is not None and s.share("h2d") < PIN_H2D_SHARE:
        # pinning pays where copies take a share of the step (the pin_memory card's); here they take little
        change, freed, cost = {"pin_memory": False}, by_loader, s.stage_s("h2d")
        says = (
            f"Host-to-device copies take {fmt_fraction(s.share('h2d'))} of the step: from pageable memory they "
            f"run about half as fast, about {fmt_seconds(cost)} more per step, and the loader's pinned batches, "
            f"about {fmt_bytes(freed)}, are freed (estimates)."
        )
    elif ld.num_workers and prefetch > 1 and io_bound(a) is None:  # io_bound queues more reads instead
        kept = ld.num_workers + 1
        change, freed, cost = {"prefetch_factor": 1}, by_loader * (in_flight - kept) // in_flight, 0.0
        says = (
            f"With prefetch_factor=1, {kept} batches are in flight instead of {in_flight}: about "
            f"{fmt_bytes(freed)} freed (an estimate, in proportion), at no step time while the workers keep a "
            f"batch ready (the data wait is {fmt_fraction(s.share('data')) if s else 'unmeasured'} of the step now)."
        )
    else:
        return None  # pinning pays and no fewer batches can be queued: the memory buys the copies' speed
    queued = (
        f"{ld.num_workers} workers × prefetch_factor {prefetch}, and the one in use" if ld.num_workers else ""
    )
    evidence = (
        f"PyTorch's CUDA host allocator held up to {fmt_bytes(pinned)} of page-locked (pinned) memory, "
        f"{fmt_fraction(pinned / total)} of the machine's {fmt_bytes(total)}, which the kernel can neither swap "
        "out nor reclaim for cached files"
        + (f"; available memory fell to {fmt_bytes(available)}" if short and available is not None else "")
        + (f"; swap grew by {fmt_bytes(grown)} during the run" if grown >= SWAP_MIN_BYTES else "")
        + ". The DataLoader pins each batch"
        + (f" (about {fmt_bytes(per_batch)}, from its copies)" if per_batch else "")
        + (f" and keeps up to {in_flight} in flight ({queued}). " if queued else " in the training thread. ")
        + says
    )
    return make_card(
        "pinned_memory_held",
        f"Pinned batches hold {fmt_fraction(pinned / total)} of the machine's memory",
        evidence,
        loader_code(a, ld, **change),
        {
            "pinned_bytes": pinned,
            "mem_total_bytes": total,
            "pinned_share": pinned / total,
            "batches_in_flight": in_flight,
            "pinned_batch_bytes": per_batch,
            "freed_bytes": int(freed),
            "step_cost_s": cost,
        },
        saving_s=None,  # it frees memory; the copies' time it may cost is step_cost_s
        step_s=s.step_s if s else None,
        model=None,
        severity="medium" if short else "low",
        replaces=loader_fix_site(a, ld),
    )


def _pinned_per_batch(a: Analysis) -> int | None:
    """Bytes copied to the device from pinned memory per DataLoader batch (None: not counted)."""
    c = a.config.counters
    return c["h2d_pinned_bytes"] // c["batches"] if c["h2d_pinned_bytes"] and c["batches"] else None


def swap_growth(a: Analysis) -> Card | None:
    """Swap grew while the training ran and its processes read pages back through the steady steps."""
    host, s = _host(a), a.steady
    grown = host["swap_growth_bytes"] if host is not None else None
    if host is None or s is None or grown is None or grown < SWAP_MIN_BYTES:
        return None
    faults = a.steady_mean(MAJOR_FAULTS)
    if not faults:
        return None  # what was swapped out was not read back by the training: no step paid for it
    per_step = faults * s.step_s
    saving = min(per_step * FAULT_S, 0.5 * s.step_s)
    rss, pss = a.host["rss_peak_bytes"], a.host["pss_peak_bytes"]
    kind = memory_kind(pss)
    held = pss if kind == "PSS" else rss
    evidence = (
        f"The machine's swap grew by {fmt_bytes(grown)} while the training ran (from "
        f"{fmt_bytes(host['swap_start_bytes'] or 0)}), and its processes took {per_step:,.0f} major page faults "
        f"per {fmt_seconds(s.step_s)} step (measured: pages read back from swap or from files); at "
        f"{fmt_seconds(FAULT_S)} each they cost about {fmt_seconds(saving)} per step (an estimate)."
        + (f" The training's processes peaked at {fmt_bytes(held)} of {memory_name(kind)}." if held else "")
    )
    fix = [
        "import psutil",
        "",
        "# what holds the memory: the 5 largest processes (the training's workers among them)",
        "print(psutil.swap_memory())",
        "for p in sorted(psutil.process_iter(['pid', 'name', 'memory_info']),",
        "                key=lambda p: -(p.info['memory_info'].rss if p.info['memory_info'] else 0))[:5]:",
        "    print(p.info['pid'], p.info['name'], (p.info['memory_info'].rss if p.info['memory_info'] else 0) >> 20, 'MiB')",
        "# then hold less: fewer DataLoader workers or a smaller prefetch_factor (each holds batches),",
        "# datasets in numpy arrays (workers copy Python objects they read), or stop what else runs",
    ]
    return make_card(
        "swap_growth",
        f"Swap grew {fmt_bytes(grown)} and the training read pages back every step",
        evidence,
        "\n".join(fix),
        {
            "swap_growth_bytes": grown,
            "swap_start_bytes": host["swap_start_bytes"],
            "major_faults_per_step": per_step,
            "fault_s": FAULT_S,
        },
        saving_s=saving,
        step_s=s.step_s,
        model=f"each major fault a {fmt_seconds(FAULT_S)} read, all of them gone once nothing swaps",
    )


def host_embedding(a: Analysis) -> Card | None:
    """An embedding table held in host memory costs the step its CPU lookups, where the GPU has room for it."""
    host, s, memory = _host(a), a.steady, a.memory
    if host is None or s is None or memory is None or not host["embeddings"]:
        return None
    e = max(host["embeddings"], key=lambda e: e["forward_s"])
    gpu = next((d for d in memory["devices"] if d["device"].startswith("cuda")), None)
    if e["forward_s"] < EMBEDDING_SHARE * s.step_s or gpu is None or not gpu["total_bytes"]:
        return None
    held = (gpu["peak_bytes"] or 0) + (gpu["fragmentation_bytes"] or 0)  # reserved at the peak
    needs = 2 * e["bytes"]  # the table and its gradient (an optimizer's state on top of that)
    if held + needs > ROOM * gpu["total_bytes"]:
        return None  # no room: on the host is the trade that keeps the model on the device
    model = memory["model_name"] or "model"
    table = f"{model}.{e['path']}"
    device = gpu["device"]
    evidence = (
        f"{table} ({fmt_bytes(e['bytes'])}, {fmt_fraction(e['parameter_share'])} of the parameters) is in host "
        f"memory while the model trains on {device}: its lookups took {fmt_seconds(e['forward_s'])} of the "
        f"{fmt_seconds(s.step_s)} step on the CPU (measured on the sampled forward; its backward and update run "
        f"there too). {device} peaked at {fmt_bytes(held)} of {fmt_bytes(gpu['total_bytes'])}: the table and its "
        f"gradient ({fmt_bytes(needs)}) fit under {fmt_fraction(ROOM)}."
    )
    fix = [
        f"{table}.to('{device}')  # its lookups, backward and update on the GPU",
        f"# the indices passed to {table} must then be on {device} too",
    ]
    return make_card(
        "host_embedding",
        f"{table} in host memory costs {fmt_seconds(e['forward_s'])} a step",
        evidence,
        "\n".join(fix),
        {
            "path": e["path"],
            "table_bytes": e["bytes"],
            "parameter_share": e["parameter_share"],
            "device": device,
            "device_bytes_needed": needs,
        },
        saving_s=e["forward_s"],
        step_s=s.step_s,
        model="the lookups' measured CPU time on the sampled forward, gone on the GPU (its backward and update "
        "on the CPU are not counted: at least that)",
    )


def _fraction_of_machine(a: Analysis, n: int) -> str:
    total = a.host["mem_total_bytes"]
    return f" ({fmt_fraction(n / total)} of the machine)" if total else ""
