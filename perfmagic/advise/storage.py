"""Storage rules: the loaders wait on disk reads, or on reads too small to be efficient."""

from __future__ import annotations

from perfmagic.advise.card import Card, make_card
from perfmagic.advise.loading import blocked_says
from perfmagic.advise.trainer_fixes import loader_code, loader_fix_site
from perfmagic.analyze import Analysis
from perfmagic.analyze.steady import Steady
from perfmagic.units import KiB, MiB, fmt_bytes, fmt_fraction

IO_DATA_SHARE = 0.10
"""Data wait under which storage cannot matter much."""
IO_BLOCKED = 0.25
"""Share of the loaders' time blocked on storage that makes a run I/O-bound."""
MIN_PROC_READ = 1 * MiB
"""The training's own storage reads below which I/O wait belongs to someone else."""
SMALL_READ = 64 * KiB
"""Average read size under which per-request latency dominates storage throughput."""
MIN_READ_OPS_PER_S = 100.0


def _blocked_on_storage(a: Analysis, s: Steady) -> float | None:
    """Share of the loaders' time blocked on storage: their sampled disk waits, else the machine's I/O wait."""
    iowait, cpus, own = a.steady_mean("host.iowait"), a.host["cpu_count"], a.host["proc_read_bytes"]
    if own is None or own < MIN_PROC_READ:
        return None
    if a.loading is not None and a.loading.disk is not None:
        return a.loading.disk
    if iowait is None or not cpus:
        return None
    ld = a.config.loader
    loaders = max(1, ld.num_workers if ld else 1)
    return min(1.0, iowait * float(cpus) / loaders)


def io_bound(a: Analysis) -> Card | None:
    """The data wait is storage wait."""
    s = a.steady
    if s is None or s.share("data") < IO_DATA_SHARE:
        return None
    blocked = _blocked_on_storage(a, s)
    if blocked is None or blocked < IO_BLOCKED:
        return None
    wait = s.stage_s("data")
    cpus = a.host["cpu_count"] or 1
    ld = a.config.loader
    workers = min(2 * cpus, 32)
    fix = "# Storage latency, not CPU, limits loading: keep more reads in flight than there are CPUs\n"
    if ld:
        fix += loader_code(a, ld, num_workers=workers, prefetch_factor=4, persistent_workers=True) + "\n"
    fix += "# and/or copy the dataset to local NVMe or RAM (/dev/shm) before training."
    return make_card(
        "io_bound",
        "The data wait is storage wait",
        f"{fmt_fraction(s.share('data'))} of step time waits for data, and the loading processes were blocked on "
        f"storage {fmt_fraction(blocked)} of the time ("
        + (
            f"in disk reads, sampled; {blocked_says(a.loading)}"
            if a.loading is not None and a.loading.disk is not None
            else f"I/O wait {fmt_fraction(a.steady_mean('host.iowait'))} of {cpus} CPUs"
        )
        + f"; the training read {fmt_bytes(a.host['proc_read_bytes'])} from storage).",
        fix,
        {"data_s": wait, "blocked_share": blocked, "proc_read_bytes": a.host["proc_read_bytes"]},
        saving_s=wait * blocked,
        step_s=s.step_s,
        model="the share of the data wait that the loaders spent blocked on storage",
        replaces=loader_fix_site(a, ld) if ld else None,
    )


def small_files(a: Analysis) -> Card | None:
    """Storage reads too small to be efficient."""
    s = a.steady
    if s is None or s.share("data") < IO_DATA_SHARE:
        return None
    size, ops = a.host["avg_read_size_bytes"], a.host["read_ops"]
    blocked = _blocked_on_storage(a, s)
    if size is None or not ops or blocked is None or a.wall_s <= 0:
        return None
    rate = ops / a.wall_s
    if size >= SMALL_READ or rate < MIN_READ_OPS_PER_S or blocked < IO_BLOCKED / 2:
        return None
    wait = s.stage_s("data")
    fix = "\n".join(
        [
            "# Pack the samples into large shards once (e.g. WebDataset tar shards of 100 MB-1 GB):",
            "import webdataset as wds",
            "with wds.ShardWriter('shards/train-%06d.tar', maxsize=500_000_000) as sink:",
            "    for i, (x, y) in enumerate(dataset):",
            "        sink.write({'__key__': f'{i:09d}', 'pt': x, 'cls': y})",
            "# then train from the shards: reads become large and sequential",
            "dataset = wds.WebDataset('shards/train-{000000..000099}.tar').decode().to_tuple('pt', 'cls')",
        ]
    )
    return make_card(
        "small_files",
        f"Storage reads average {fmt_bytes(size)}: pack small files into shards",
        f"Reads averaged {fmt_bytes(size)} ({rate:.0f} reads/s) while {fmt_fraction(s.share('data'))} of step "
        f"time waited for data and the loaders were blocked on storage {fmt_fraction(blocked)} of the time.",
        fix,
        {"avg_read_size_bytes": size, "read_ops_per_s": rate, "blocked_share": blocked, "data_s": wait},
        saving_s=wait * blocked,
        step_s=s.step_s,
        model="the share of the data wait spent blocked on storage, which per-request latency dominates",
    )
