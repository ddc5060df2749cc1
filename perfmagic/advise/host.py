"""Host rules: CPU, memory and NUMA placement of the training's processes."""

from __future__ import annotations

from dataclasses import dataclass

from perfmagic.advise.card import Card, make_card
from perfmagic.advise.loading import loading_kind
from perfmagic.analyze import Analysis
from perfmagic.schema import memory_kind, memory_name
from perfmagic.units import fmt_bytes, fmt_fraction, fmt_seconds

MACHINE_BUSY = 0.90
"""Machine CPU utilization above which runnable threads queue (SageMaker CPUBottleneck: 90%)."""
OTHERS_MIN_CORES = 0.5
"""CPU other processes must take, in cores, to count as contention…"""
OTHERS_MIN_SHARE = 0.10
"""…and as a share of the machine."""
LOW_AVAILABLE = 0.10
"""Available memory below this share of RAM: the kernel reclaims page cache and may swap."""
CRITICAL_AVAILABLE = 0.05
NUMA_LOCAL = 0.9
"""Share of the allowed CPUs that must be local to the GPU's NUMA node."""
NUMA_HOST_SPEEDUP = 1.25
"""Assumed speed-up of the host-side stages (data, h2d) once CPU and memory are node-local."""


WAIT_SHARE = 0.05
"""Time the training thread waited for a CPU, as a share of the step, worth a card."""


@dataclass(frozen=True)
class Contention:
    """The training waits for CPUs: how much, and who takes them.

    ``wait_s`` is measured (the thread's run-queue wait per steady step) where the OS
    says; else the sampled model below estimates the loss.
    """

    wait_s: float | None  # per steady step; None where the OS does not say
    util: float | None  # the machine's CPU utilization over the steady steps
    ours: float | None  # cores the training's processes used
    others: float | None  # cores other processes used
    threads: int | None  # torch intra-op threads
    workers: int  # DataLoader workers
    usable: int | None  # CPUs the training may run on
    worker_cores: float | None = None  # cores the workers ran on or queued for (None: unmeasured)
    loaders_blocked: bool = False  # the workers mostly wait on storage: fewer of them frees no CPU

    @property
    def busy_workers(self) -> int:
        """The workers that keep a CPU busy: those that run or wait for a CPU, not those that sleep
        (storage, network); all of them where the samples do not say."""
        return self.workers if self.worker_cores is None else min(self.workers, round(self.worker_cores))

    @property
    def demand(self) -> int | None:
        """Threads the training keeps busy: torch's threads and the busy DataLoader workers."""
        return self.threads + self.busy_workers if self.threads else None

    @property
    def free(self) -> int | None:
        """Usable CPUs that other processes left to the training (whole CPUs, at least one)."""
        return _free(self.usable, self.others)

    @property
    def oversubscribed(self) -> bool:
        """More busy threads than the CPUs left to them: they take turns."""
        return self.demand is not None and self.free is not None and self.demand > self.free

    @property
    def crowded(self) -> bool:
        """Other processes take a real share of a busy machine."""
        if self.others is None or self.util is None or self.util < MACHINE_BUSY or not self.usable:
            return False
        return self.others >= max(OTHERS_MIN_CORES, OTHERS_MIN_SHARE * self.usable)


def _cpu_load(a: Analysis) -> tuple[int | None, float | None, float | None, float | None]:
    """(usable CPUs, machine CPU utilization, cores the training used, cores others used) over the steady steps."""
    n = a.host["cpu_count"]
    affinity = a.host["affinity"]
    usable = len(affinity) if affinity else (int(n) if n else None)
    util, ours = a.steady_mean("host.cpu_util"), a.steady_mean("host.proc_cpu_cores")
    others = max(0.0, util * n - ours) if util is not None and ours is not None and n else None
    return usable, util, ours, others


def contention(a: Analysis) -> Contention | None:
    """The training waited for CPUs during the steady steps; None when it did not, or nothing says."""
    s = a.steady
    if s is None:
        return None
    usable, util, ours, others = _cpu_load(a)
    ld = a.config.loader
    threads = a.config.torch["num_threads"] if "num_threads" in a.config.torch else None
    ran, queued = a.steady_mean("host.children_cpu_cores"), a.steady_mean("host.children_wait_cores")
    found = Contention(
        wait_s=float(s.wait_s.mean()) if s.wait_s is not None else None,
        util=util,
        ours=ours,
        others=others,
        threads=int(threads) if threads else None,
        workers=ld.num_workers if ld else 0,
        usable=usable,
        worker_cores=ran + (queued or 0.0) if ran is not None else None,
        loaders_blocked=loading_kind(a) == "io",
    )
    if found.wait_s is not None:
        return found if found.wait_s >= WAIT_SHARE * s.step_s else None
    return found if found.crowded else None


def others_cores(a: Analysis) -> float | None:
    """Cores other processes kept busy during the steady steps (None: unmeasured)."""
    return _cpu_load(a)[3]


def free_cpus(a: Analysis) -> int | None:
    """CPUs the training may use that other processes left free during the steady steps."""
    usable, _, _, others = _cpu_load(a)
    return _free(usable, others)


def _free(usable: int | None, others: float | None) -> int | None:
    if usable is None:
        return None
    return max(1, usable - (round(others) if others is not None else 0))


def cpu_contention(a: Analysis) -> Card | None:
    """The training thread waits for a CPU: other processes, or more threads than CPUs."""
    s, c = a.steady, contention(a)
    if s is None or c is None:
        return None
    step = s.step_s
    if c.wait_s is not None:
        saving: float | None = c.wait_s
        model = (
            "the time the training thread was ready to run but waited for a CPU (measured, Linux run delay); "
            + (
                "at least that: threads beyond the CPUs also stall each other at every parallel region"
                if c.oversubscribed
                else "an upper bound: the fix gives back at most that"
            )
        )
    elif c.demand and c.others is not None and c.ours is not None:
        lost = min(c.others, c.demand - c.ours)
        if lost <= 0:
            return None
        saving = step * lost / c.demand
        model = (
            "an estimate, assuming every step is CPU-bound: step x (cores others took that the training "
            "could use) / (cores it can use); the OS did not say how long the thread waited"
        )
    else:
        return None
    causes: list[str] = []
    if c.oversubscribed:
        left = (
            f"the {c.free} CPU{'s' if c.free != 1 else ''} other processes left"
            if c.free != c.usable
            else (f"{c.usable} usable CPUs")
        )
        idle = f", {c.workers - c.busy_workers} more mostly asleep" if c.busy_workers < c.workers else ""
        causes.append(
            f"the training keeps {c.demand} threads busy ({c.threads} torch thread{'s' if c.threads != 1 else ''}"
            f" and {c.busy_workers} busy DataLoader worker{'s' if c.busy_workers != 1 else ''}{idle}) on {left}"
        )
    if c.crowded and c.others is not None:
        causes.append(f"other processes used {c.others:.1f} of {a.host['cpu_count']} CPUs")
    if not causes:
        causes.append("neither too many threads nor other processes' load was seen in the samples")
    waited = (
        f"The training thread waited {fmt_seconds(c.wait_s)} per {fmt_seconds(step)} step for a CPU "
        f"({fmt_fraction(c.wait_s / step)} of the step, runnable but not running)"
        if c.wait_s is not None
        else f"The machine's CPUs were {fmt_fraction(c.util)} busy during the steady steps"
    )
    evidence = f"{waited}: {'; '.join(causes)}."
    if c.wait_s is not None and c.util is not None:
        evidence += f" The machine's CPUs were {fmt_fraction(c.util)} busy."
    fix = contention_fix(c)
    title = (
        f"{c.demand} busy threads on {c.free} free CPU{'s' if c.free != 1 else ''}: the training waits for a CPU"
        if c.oversubscribed
        else f"Other processes took {c.others:.1f} of {a.host['cpu_count']} CPUs while training ran"
        if c.crowded and c.others is not None
        else "The training thread waits for a CPU"
    )
    return make_card(
        "cpu_contention",
        title,
        evidence,
        fix,
        {
            "wait_s": c.wait_s,
            "wait_share": c.wait_s / step if c.wait_s is not None else None,
            "cpu_util": c.util,
            "training_cores": c.ours,
            "other_cores": c.others,
            "torch_threads": c.threads,
            "dataloader_workers": c.workers,
            "usable_cpus": c.usable,
            "oversubscribed": c.oversubscribed,
        },
        saving_s=saving,
        step_s=step,
        model=model,
    )


def contention_fix(c: Contention) -> str:
    """Fewer busy threads than free CPUs where that is the cause; else how to find who takes them."""
    lines: list[str] = []
    if c.oversubscribed and c.free is not None:
        threads = max(1, c.free - c.busy_workers)
        if threads != c.threads:  # a fix never sets what already is
            lines += [
                "# One busy thread per free CPU: fewer torch threads (first thing in the script, or OMP_NUM_THREADS)",
                f"torch.set_num_threads({threads})  # was {c.threads}",
            ]
        workers = max(0, c.free - 1)
        if c.busy_workers >= c.free and workers != c.workers and not c.loaders_blocked:
            lines.append(f"# and fewer DataLoader workers: num_workers={workers}  # was {c.workers}")
    if c.crowded or not lines:
        lines += [
            "# Find the processes that compete with the training while it runs:",
            "# $ ps -eo pid,pcpu,etime,comm --sort=-pcpu | head  (in a shell)",
            "# then stop them, lower their priority (renice -n 19 -p PID), or train on an idle machine.",
        ]
    return "\n".join(lines)


def host_memory_pressure(a: Analysis) -> Card | None:
    """The machine ran low on available memory."""
    available, total = a.host["mem_available_min_bytes"], a.host["mem_total_bytes"]
    if available is None or not total or available >= LOW_AVAILABLE * total:
        return None
    share = available / total
    rss, pss = a.host["rss_peak_bytes"], a.host["pss_peak_bytes"]
    # PSS where measured: RSS summed over workers counts the pages they share once per worker
    kind = memory_kind(pss)
    held = f"{fmt_bytes(pss if kind == 'PSS' else rss)} of {memory_name(kind)}"
    ld = a.config.loader
    lines = ["# Each DataLoader worker holds its own copy of what the Dataset references; keep it small:"]
    if ld and ld.num_workers > 1:
        # no prefetch_factor here: the batches a pinning loader queues are pinned_memory_held's to change
        lines.append(
            f"loader = DataLoader(dataset, num_workers={max(1, ld.num_workers // 2)})"
            f"  # half of {ld.num_workers}: each worker holds its copy and its prefetched batches"
        )
    lines += [
        "# store samples in numpy arrays or a memmap, not Python lists of objects (copy-on-read refcounts):",
        "self.samples = np.load('samples.npy', mmap_mode='r')",
    ]
    s = a.steady
    return make_card(
        "host_memory_pressure",
        f"Host memory ran low: {fmt_bytes(available)} available at the lowest",
        f"Available memory fell to {fmt_bytes(available)} of {fmt_bytes(total)} ({fmt_fraction(share)}); the "
        f"training's processes peaked at {held}. Below {fmt_fraction(LOW_AVAILABLE)} the kernel "
        "evicts cached files and may swap or kill the job.",
        "\n".join(lines),
        {
            "mem_available_min_bytes": available,
            "mem_total_bytes": total,
            "available_share": share,
            "rss_peak_bytes": rss,
            "pss_peak_bytes": pss,
        },
        saving_s=None,
        step_s=s.step_s if s else None,
        model=None,
        severity="high" if share < CRITICAL_AVAILABLE else "medium",
    )


def _cpu_list(cpus: list[int]) -> str:
    """``[0, 1, 2, 5]`` → ``"0-2,5"``."""
    parts: list[str] = []
    for c in sorted(cpus):
        if parts and c == int(parts[-1].rsplit("-", 1)[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{c}"
        else:
            parts.append(str(c))
    return ",".join(parts)


def numa_affinity(a: Analysis) -> Card | None:
    """On a multi-socket host, the training may run on CPUs far from its GPU."""
    nodes = a.host["numa_nodes"] or {}
    if len(nodes) < 2:
        return None
    gpu = a.config.gpu_index
    entry = next((g for g in a.host["gpu_affinity"] if g["gpu"] == gpu), None)
    local = entry["allowed_local_fraction"] if entry is not None else None
    if entry is None or local is None or local >= NUMA_LOCAL:
        return None
    node = entry["numa_node"]
    device = next((d for d in a.devices if d["index"] == gpu), None)
    local_cpus = (device["numa_cpus"] if device else None) or nodes.get(str(node), [])
    s = a.steady
    host_side = s.stage_s("data", "h2d") if s else 0.0
    cpus = _cpu_list(local_cpus) if local_cpus else "<cpus of node>"
    fix = "\n".join(
        line
        for line in [
            f"# Run on GPU {gpu}'s NUMA node {node}, memory included:",
            f"# $ numactl --cpunodebind={node} --membind={node} python train.py  (in a shell)",
            "# or, at the top of the script (DataLoader workers inherit it):",
            f"os.sched_setaffinity(0, {{{', '.join(map(str, local_cpus))}}})" if local_cpus else "",
        ]
        if line
    )
    return make_card(
        "numa_affinity",
        f"Bind the training to GPU {gpu}'s NUMA node ({node})",
        f"This host has {len(nodes)} NUMA nodes; the training may run on {entry['allowed_cpus']} CPUs, of which "
        f"only {fmt_fraction(local)} are on GPU {gpu}'s node {node} (CPUs {cpus}): batches are built and copied "
        "through remote memory.",
        fix,
        {
            "numa_nodes": len(nodes),
            "gpu": gpu,
            "gpu_numa_node": node,
            "allowed_local_fraction": local,
            "host_side_s": host_side,
        },
        saving_s=host_side * (1 - 1 / NUMA_HOST_SPEEDUP),
        step_s=s.step_s if s else None,
        model=f"the host-side stages (data, h2d) run {NUMA_HOST_SPEEDUP}x faster with node-local CPUs and memory",
    )
