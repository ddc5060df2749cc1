"""How long ``perfmagic report`` takes per trace: read, build the timeline, analyze.

For each trace (default: the shared real GPU traces next to the repository) prints the
best of ``--repeat`` runs of each phase, in milliseconds:

- ``read``: decompress, parse the JSON, build the columns (``read_trace``);
- ``gpu``: the ``gpu`` section over HTA's window (``trace_gpu``);
- ``timeline``: steps and stages as a perfmagic timeline (``trace_timeline``);
- ``report``: the whole ``report_from_traces`` (all of the above, analysis and advice).

Usage: ``python benchmarks/trace_read.py [--repeat 5] [TRACE ...]``. Target: the 1.7 MB
A100 trace (~110k events) read in well under a second.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from perfmagic.analyze.gpu import trace_gpu
from perfmagic.trace_report import report_from_traces
from perfmagic.traces import read_trace
from perfmagic.traces.stages import trace_timeline

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


def best_ms(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("traces", nargs="*", type=Path)
    args = parser.parse_args()
    paths = args.traces or sorted(SHARED.glob("*.json*"))
    if not paths:
        raise SystemExit(f"no traces given and none in {SHARED}")
    print(
        f"{'trace':<30} {'MB':>5} {'X events':>8} {'read':>7} {'gpu':>6} {'timeline':>8} {'report':>7}  (ms)"
    )
    for path in paths:
        trace = read_trace(path)
        row = [
            best_ms(partial(read_trace, path), args.repeat),
            best_ms(partial(trace_gpu, trace), args.repeat),
            best_ms(partial(trace_timeline, trace, 0), args.repeat),
            best_ms(partial(report_from_traces, [path]), args.repeat),
        ]
        events = len(trace.cpu) + len(trace.gpu)
        mb = path.stat().st_size / 1e6
        print(
            f"{path.name:<30} {mb:>5.2f} {events:>8} {row[0]:>7.0f} {row[1]:>6.1f} {row[2]:>8.1f} {row[3]:>7.0f}"
        )


if __name__ == "__main__":
    main()
