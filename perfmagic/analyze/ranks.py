"""Across ranks: who reaches the collectives last, and how much later than the first.

A collective kernel (NCCL) starts on every rank of its group; the ranks that arrive
early wait in it for the last one. Instances are matched across ranks by order: the
k-th launch of a kernel name on one rank is the k-th of that name on every other
(collectives of one group run in the same order on every rank). A rank's lateness in
an instance is its start minus the earliest rank's; the instance's skew is the last
rank's lateness. Start times are wall-clock (the trace's ``ts`` plus its base time),
so the ranks' clocks must agree (NTP does to well under a millisecond on one cluster).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from perfmagic.traces.kineto import COMMUNICATION, KinetoTrace


def collective_starts(trace: KinetoTrace) -> dict[str, np.ndarray]:
    """Per collective kernel name, the wall-clock starts (µs) of its launches on this rank, in order."""
    gpu = trace.gpu
    comm = np.flatnonzero(gpu.kind == COMMUNICATION)
    comm = comm[np.argsort(gpu.start[comm], kind="stable")]
    base_us = trace.base_time_ns / 1e3
    return {
        gpu.names[i]: gpu.start[comm[gpu.name_id[comm] == i]] + base_us for i in np.unique(gpu.name_id[comm])
    }


def collective_skew(starts: dict[int, dict[str, np.ndarray]]) -> dict[str, Any] | None:
    """The report's ``collective_skew``; None with fewer than two ranks or no collective they share.

    ``starts``: per rank, :func:`collective_starts`. Kernel names that some rank never
    launched are left out (another process group), and each name's instances stop at the
    rank with fewest.
    """
    ranks = sorted(r for r, s in starts.items() if s)
    if len(ranks) < 2:
        return None
    shared = sorted(set.intersection(*(set(starts[r]) for r in ranks)))
    columns = []
    for name in shared:
        n = min(len(starts[r][name]) for r in ranks)
        columns.append(np.stack([starts[r][name][:n] for r in ranks]))
    if not columns or not sum(c.shape[1] for c in columns):
        return None
    at = np.concatenate(columns, axis=1)  # (ranks, instances), µs
    late = (at - at.min(axis=0)) / 1e6
    last = np.bincount(late.argmax(axis=0), minlength=len(ranks))
    skew = late.max(axis=0)
    instances = at.shape[1]
    return {
        "instances": instances,
        "kernels": len(shared),
        "skew_mean_s": float(skew.mean()),
        "skew_p90_s": float(np.percentile(skew, 90)),
        "last_rank": ranks[int(last.argmax())],
        "ranks": [
            {
                "rank": rank,
                "late_mean_s": float(late[i].mean()),
                "late_p90_s": float(np.percentile(late[i], 90)),
                "last_count": int(last[i]),
                "last_fraction": float(last[i]) / instances,
            }
            for i, rank in enumerate(ranks)
        ],
    }
