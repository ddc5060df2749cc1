"""Host rules: CPU, memory and NUMA placement of the training's processes."""

from __future__ import annotations

from typing import Any

from perfmagic.advise.card import Card, make_card
from perfmagic.analyze import Analysis
from perfmagic.units import fmt_bytes, fmt_fraction

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


def contention(a: Analysis) -> tuple[float, float, float] | None:
    """(machine CPU utilization, training's cores, other processes' cores) when others crowd a busy machine."""
    s = a.steady
    n = a.host.get("cpu_count")
    util = a.steady_mean("host.cpu_util")
    ours = a.steady_mean("host.proc_cpu_cores")
    if s is None or not n or util is None or ours is None or util < MACHINE_BUSY:
        return None
    others = max(0.0, util * n - ours)
    if others < max(OTHERS_MIN_CORES, OTHERS_MIN_SHARE * n):
        return None
    return util, ours, others


def cpu_contention(a: Analysis) -> Card | None:
    """Other processes take CPU the training could use."""
    s, found, n = a.steady, contention(a), a.host.get("cpu_count")
    if s is None or found is None or not n:
        return None
    util, ours, others = found
    threads = a.config.torch.get("num_threads")
    ld = a.config.loader
    workers = int(ld.get("num_workers") or 0) if ld else 0
    demand = min(float(n), float(threads + workers)) if threads else float(n)
    lost = min(others, demand - ours)
    if lost <= 0:
        return None
    step = s.step_s
    fix = "\n".join(
        [
            "# Find the processes that compete with the training while it runs:",
            "ps -eo pid,pcpu,etime,comm --sort=-pcpu | head",
            "# then stop them, lower their priority (renice -n 19 -p PID), or train on an idle machine.",
        ]
    )
    return make_card(
        "cpu_contention",
        f"Other processes took {others:.1f} of {n} CPUs while training ran",
        f"The machine's CPUs were {fmt_fraction(util)} busy during the steady steps; the training's processes "
        f"used {ours:.1f} cores of the {demand:.0f} they can use (torch threads {threads}, DataLoader "
        f"workers {workers}); other processes used {others:.1f} cores.",
        fix,
        {"cpu_util": util, "training_cores": ours, "other_cores": others, "training_demand_cores": demand},
        saving_s=step * lost / demand,
        step_s=step,
        model="CPU-bound time shrinks in proportion to the CPU the training gets: "
        "saving = step x (cores taken by others that the training could use) / (cores it can use)",
    )


def host_memory_pressure(a: Analysis) -> Card | None:
    """The machine ran low on available memory."""
    available, total = a.host.get("mem_available_min_bytes"), a.host.get("mem_total_bytes")
    if available is None or not total or available >= LOW_AVAILABLE * total:
        return None
    share = available / total
    rss = a.host.get("rss_peak_bytes")
    ld = a.config.loader
    lines = ["# Each DataLoader worker holds its own copy of what the Dataset references; keep it small:"]
    if ld and (ld.get("num_workers") or 0) > 1:
        lines.append(
            f"loader = DataLoader(dataset, num_workers={max(1, int(ld['num_workers']) // 2)}, prefetch_factor=2)"
            f"  # was num_workers={ld['num_workers']}"
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
        f"training's processes peaked at {fmt_bytes(rss)} RSS. Below {fmt_fraction(LOW_AVAILABLE)} the kernel "
        "evicts cached files and may swap or kill the job.",
        "\n".join(lines),
        {
            "mem_available_min_bytes": available,
            "mem_total_bytes": total,
            "available_share": share,
            "rss_peak_bytes": rss,
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
    nodes: dict[Any, list[int]] = a.host.get("numa_nodes") or {}
    if len(nodes) < 2:
        return None
    gpu = a.config.gpu_index
    entry = next((g for g in a.host.get("gpu_affinity") or [] if g.get("gpu") == gpu), None)
    if entry is None or entry.get("allowed_local_fraction") is None:
        return None
    local = entry["allowed_local_fraction"]
    if local >= NUMA_LOCAL:
        return None
    node = entry.get("numa_node")
    device = next((d for d in a.devices if d.get("index") == gpu), {})
    local_cpus = device.get("numa_cpus") or nodes.get(node, nodes.get(str(node), []))
    s = a.steady
    host_side = s.stage_s("data", "h2d") if s else 0.0
    cpus = _cpu_list(local_cpus) if local_cpus else "<cpus of node>"
    fix = "\n".join(
        line
        for line in [
            f"# Run on GPU {gpu}'s NUMA node {node}, memory included:",
            f"numactl --cpunodebind={node} --membind={node} python train.py",
            "# or, at the top of the script (DataLoader workers inherit it):",
            f"os.sched_setaffinity(0, {{{', '.join(map(str, local_cpus))}}})" if local_cpus else "",
        ]
        if line
    )
    return make_card(
        "numa_affinity",
        f"Bind the training to GPU {gpu}'s NUMA node ({node})",
        f"This host has {len(nodes)} NUMA nodes; the training may run on {entry.get('allowed_cpus')} CPUs, of which "
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
