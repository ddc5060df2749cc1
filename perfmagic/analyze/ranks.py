"""Across ranks: the straggler that the others wait for, and who reaches the collectives last.

A straggler (:func:`find_straggler`) is read from the ranks' stage tables: in synchronous
training every rank runs at the slowest one's pace, the others waiting for it in ``comm``.


A collective kernel (NCCL) starts on every rank of its group; the ranks that arrive
early wait in it for the last one. Instances are matched across ranks by order: the
k-th launch of a kernel name on one rank is the k-th of that name on every other
(collectives of one group run in the same order on every rank). A rank's lateness in
an instance is its start minus the earliest rank's; the instance's skew is the last
rank's lateness. Start times are wall-clock (the trace's ``ts`` plus its base time),
so the ranks' clocks must agree (NTP does to well under a millisecond on one cluster).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmagic.analyze.steady import Steady
from perfmagic.contract import CollectiveSkew
from perfmagic.traces.events import COMMUNICATION, KinetoTrace


def collective_starts(trace: KinetoTrace) -> dict[str, np.ndarray]:
    """Per collective kernel name, the wall-clock starts (µs) of its launches on this rank, in order."""
    gpu = trace.gpu
    comm = np.flatnonzero(gpu.kind == COMMUNICATION)
    comm = comm[np.argsort(gpu.start[comm], kind="stable")]
    base_us = trace.base_time_ns / 1e3
    return {
        gpu.names[i]: gpu.start[comm[gpu.name_id[comm] == i]] + base_us for i in np.unique(gpu.name_id[comm])
    }


def collective_skew(starts: dict[int, dict[str, np.ndarray]]) -> CollectiveSkew | None:
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
        # the rank last most often; among ranks last equally often, the one that was later on average
        "last_rank": ranks[int(np.lexsort((late.mean(axis=1), last))[-1])],
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


STRAGGLER_RATIO = 1.2
"""The slowest rank's work per step against the other ranks' median that makes it a straggler…"""
STRAGGLER_SHARE = 0.05
"""…when the difference is also this share of the step…"""
STRAGGLER_WAITED = 0.5
"""…and the other ranks waited in comm at least this share of the difference longer than it did."""


@dataclass(frozen=True)
class Straggler:
    """The rank the others wait for, and the stage that makes it slow (means per steady step)."""

    rank: int
    stage: str  # the stage with most of its extra time against the other ranks' median
    work_s: float  # its step outside comm
    others_work_s: float  # the other ranks' median step outside comm
    excess_s: float  # work_s − others_work_s: what every rank waits for it, per step
    stage_excess_s: dict[str, float]  # per stage, its time less the other ranks' median
    others_comm_s: float  # the other ranks' median comm: their wait, the evidence
    comm_s: float  # its own comm
    ranks: int


def _queued(v: Steady) -> float:
    """A rank's mean seconds per steady step ready to run but without a CPU (0 where unmeasured)."""
    return float(v.wait_s.mean()) if v.wait_s is not None and len(v.wait_s) else 0.0


def _typical_work(v: Steady) -> float:
    """A rank's median steady step less its comm."""
    comm = v.seconds[:, v.stages.index("comm")] if "comm" in v.stages else 0.0
    return float(np.median(v.durations - comm))


def find_straggler(views: list[tuple[int, Steady]]) -> Straggler | None:
    """The straggler among ranks ``(rank, steady steps)``; None when balanced or fewer than two.

    A rank's work is its step less its ``comm``, where fast ranks wait; the slowest rank is a
    straggler when its work exceeds the other ranks' median by :data:`STRAGGLER_RATIO` and by
    :data:`STRAGGLER_SHARE` of the step, and the others were seen waiting for it (their median
    ``comm`` above its own by :data:`STRAGGLER_WAITED` of the difference), and its median step
    too exceeds theirs by the ratio. Against the others (not all ranks), so that with two ranks the
    difference is the whole of it. What the rank waited for a CPU beyond the others (its run delay) is
    left out first: a rank a busy machine starved is contention (``cpu_contention``), not slow work.
    """
    if len(views) < 2:
        return None
    work = np.array([v.step_s - v.stage_s("comm") for _, v in views])
    k = int(np.argmax(work))
    rank, slow = views[k]
    others = [v for i, (_, v) in enumerate(views) if i != k]
    base = float(np.median(np.delete(work, k)))
    queued = max(0.0, _queued(slow) - float(np.median([_queued(v) for v in others])))
    excess = float(work[k]) - base
    own = excess - queued  # the extra work that is not the rank waiting for a CPU the others had
    step = float(np.mean([v.step_s for _, v in views]))
    others_comm = float(np.median([v.stage_s("comm") for v in others]))
    waited = others_comm - slow.stage_s("comm")
    # the same test on each rank's typical (median) step: a straggler is slow step after step, while a
    # few steps a busy machine held up on one rank move its mean, not its median
    typical = [_typical_work(v) for _, v in views]
    if (
        work[k] - queued < STRAGGLER_RATIO * base
        or own < STRAGGLER_SHARE * step
        or waited < STRAGGLER_WAITED * excess
        or typical[k] < STRAGGLER_RATIO * float(np.median(typical[:k] + typical[k + 1 :]))
    ):
        return None
    names = dict.fromkeys(n for _, v in views for n in v.stages if n != "comm")
    by_stage = {n: slow.stage_s(n) - float(np.median([v.stage_s(n) for v in others])) for n in names}
    return Straggler(
        rank=rank,
        stage=max(by_stage, key=lambda n: by_stage[n]),
        work_s=float(work[k]),
        others_work_s=base,
        excess_s=excess,
        stage_excess_s=by_stage,
        others_comm_s=others_comm,
        comm_s=slow.stage_s("comm"),
        ranks=len(views),
    )
