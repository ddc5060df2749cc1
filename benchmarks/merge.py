"""``perfmagic merge`` on synthetic records of many ranks: time and peak memory, by rank count.

Each rank's record has ``--steps`` DDP-like steps (data, forward, backward with its ``comm`` wait
inside, optimizer), 8 ranks per node, each node's clock off by a few milliseconds; every size is
merged in a fresh process, so its peak RSS is its own.

    python benchmarks/merge.py [--ranks 8 64 512] [--steps 200] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from perfmagic.merge import SAMPLER_DIR, merge_records
from perfmagic.schema import STEP_BOUNDARY_PREFIX
from perfmagic.timeline import Timeline
from perfmagic.timeline.file import SPOOL_NAME, write_timeline

PER_NODE = 8
STAGES = (("data", 0.002), ("forward", 0.01), ("backward", 0.02), ("optimizer", 0.003))


def rank_record(rank: int, steps: int, skew_s: float, rng: np.random.Generator) -> Timeline:
    """One rank's timeline: its steps on its node's clock; rank 1 is a straggler in data."""
    timeline = Timeline(
        {"epoch": 1_700_000_000.0 + skew_s, "rank": rank, "local_rank": rank % PER_NODE, "wall_s": 0.0,
         "hostname": f"node{rank // PER_NODE}", "node_rank": rank // PER_NODE, "source": "run"}
    )  # fmt: skip
    ids = {name: timeline.name_id(name) for name, _ in STAGES}
    comm, boundary = timeline.name_id("comm"), timeline.name_id(STEP_BOUNDARY_PREFIX + "optimizer")
    slow = 0.02  # rank 1 waits this much longer for each batch
    computed = sum(s for _, s in STAGES[:3])
    t = 0.5
    for _ in range(steps):
        start = t
        reduced = start + computed + slow + 0.001  # every rank leaves the all-reduce once the straggler is in
        for name, seconds in STAGES:
            seconds += slow if name == "data" and rank == 1 else 0.0
            if name == "backward":
                wait = reduced + 0.0001 * rng.random() - (t + seconds)
                timeline.add_span(comm, t + seconds, t + seconds + wait, 1)
                seconds += wait
            timeline.add_span(ids[name], t, t + seconds)
            t += seconds
        t = start + computed + slow + 0.0012 + STAGES[3][1]  # the job's pace, shared by every rank
        timeline.add_span(boundary, t, t, -1)
    timeline.meta["wall_s"] = t + 0.1
    return timeline


def write_records(root: Path, ranks: int, steps: int) -> list[Path]:
    rng = np.random.default_rng(0)
    nodes = []
    for node in range((ranks + PER_NODE - 1) // PER_NODE):
        directory = root / f"node{node}"
        skew = 0.003 * node
        for rank in range(node * PER_NODE, min(ranks, (node + 1) * PER_NODE)):
            (directory / f"proc-{rank}").mkdir(parents=True)
            write_timeline(rank_record(rank, steps, skew, rng), directory / f"proc-{rank}" / SPOOL_NAME)
        (directory / SAMPLER_DIR).mkdir()
        sampler = Timeline({"epoch": 1_700_000_000.0 + skew, "source": "run", "wall_s": 1.0})
        write_timeline(sampler, directory / SAMPLER_DIR / SPOOL_NAME)
        nodes.append(directory)
    return nodes


def one(ranks: int, steps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        nodes = write_records(Path(tmp), ranks, steps)
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        begin = time.perf_counter()
        report = merge_records(nodes).to_dict()
        seconds = time.perf_counter() - begin
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    straggler, clocks = report["straggler"], report["nodes"]
    assert len(report["ranks"]) == ranks and straggler is not None and straggler["rank"] == 1
    assert clocks is not None
    offsets = [n["offset_s"] + 0.003 * i for i, n in enumerate(clocks)]
    return {
        "ranks": ranks,
        "steps": steps,
        "merge_s": seconds,
        "per_rank_ms": seconds / ranks * 1e3,
        "peak_rss_mb": peak / 1024,
        "rss_growth_mb": (peak - base) / 1024,
        "worst_offset_error_s": max(abs(o) for o in offsets),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 512])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.steps)))
        return
    rows = []
    for ranks in args.ranks:
        out = subprocess.run(
            [sys.executable, __file__, "--one", str(ranks), "--steps", str(args.steps)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        rows.append(json.loads(out.stdout))
        r = rows[-1]
        print(
            f"{ranks:4d} ranks x {args.steps} steps: merge {r['merge_s']:.2f} s ({r['per_rank_ms']:.1f} ms/rank), "
            f"peak RSS {r['peak_rss_mb']:.0f} MB (+{r['rss_growth_mb']:.0f} MB in the merge), "
            f"worst clock offset error {r['worst_offset_error_s'] * 1e3:.3f} ms"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
