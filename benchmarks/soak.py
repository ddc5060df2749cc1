"""A long run: many steps under ``perfmagic.profile()``, and what they cost in memory, disk and stop time.

Each step is one ``perfmagic.step()`` inside one user stage, as small as a step can be, so the
figures are perfmagic's own per-step costs. The run stops after ``--steps`` steps or
``--seconds`` seconds, whichever comes first.

    python benchmarks/soak.py [--steps 1000000] [--seconds 120] [--json FILE]

Targets (issue "never break, hang or lose"): RSS growth <= 64 MB, report.json <= 5 MB, stop <= 3 s
at a million steps.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

import perfmagic


def soak(steps: int, seconds: float, outdir: Path) -> dict[str, Any]:
    proc = psutil.Process()
    rss_before = proc.memory_info().rss
    session = perfmagic.profile(outdir=outdir)
    session.start()
    begin = time.perf_counter()
    deadline = begin + seconds
    done = 0
    while done < steps and (done % 1000 or time.perf_counter() < deadline):
        with perfmagic.stage("work"):
            pass
        perfmagic.step()
        done += 1
    ran = time.perf_counter() - begin
    rss_run = proc.memory_info().rss
    stop_begin = time.perf_counter()
    report = session.stop()
    stop_s = time.perf_counter() - stop_begin
    return {
        "steps": done,
        "steps_counted": report.steps["count"],
        "run_s": ran,
        "per_step_us": ran / done * 1e6,
        "rss_growth_mb": (rss_run - rss_before) / 2**20,
        "rss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "spans": session.timeline.span_count,
        "stop_s": stop_s,
        "report_json_mb": os.path.getsize(outdir / "report.json") / 2**20,
        "spool_mb": os.path.getsize(outdir / "timeline.jsonl") / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="perfmagic-soak-") as tmp:
        result = soak(args.steps, args.seconds, Path(tmp))
    for key, value in result.items():
        print(f"{key:>16}  {value:.3f}" if isinstance(value, float) else f"{key:>16}  {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
