"""Whether a long windowed profile leaves the process's ``nn.Module`` attribute reads as fast as before.

Each change of a class makes CPython drop what it specialized for the class and its subclasses, and
Python 3.13 stops specializing a class for good after 1,000 changes (``collect.windowed_hooks``). This
runs ``overhead.py``'s loop under one windowed profile (windows from the first step, 5 in every 53)
for ``--steps`` steps and times a plain attribute read of one of its layers (``layer.training``,
``layer.in_features``: the median of 7 runs of 20,000) before, every ``--every`` steps, and after the
profile. A read that grows several times over and stays so is a class that lost its specialization.
Run it with the Python to check (3.13 shows it, 3.11 does not); it needs torch and perfmagic there.

    python benchmarks/module_attribute_reads.py [--steps 30000] [--every 5000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import perfmagic
from perfmagic.collect import schedule

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import Loop, period_pinned, windows_after


def read_ns(layer: torch.nn.Linear) -> float:
    """Nanoseconds for one read of ``layer.training`` and ``layer.in_features``: the median of 7 runs."""
    runs = []
    for _ in range(7):
        begin = time.perf_counter()
        for _ in range(20_000):
            layer.training, layer.in_features  # noqa: B018  # the reads are what is timed
        runs.append((time.perf_counter() - begin) / 20_000 * 1e9)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=30_000, help="steps of the profiled run")
    parser.add_argument("--every", type=int, default=5_000, help="steps between two timings")
    args = parser.parse_args()
    torch.set_num_threads(1)
    loop = Loop()
    layer = next(m for m in loop.model.modules() if isinstance(m, torch.nn.Linear))
    loop.steps(100)
    print(
        f"Python {sys.version.split()[0]}, torch {torch.__version__}: before, {read_ns(layer):.0f} ns a read"
    )
    begin = time.perf_counter()
    with period_pinned(schedule.PERIOD), windows_after(), perfmagic.profile(sample=False):
        done = 0
        while done < args.steps:
            loop.steps(min(args.every, args.steps - done))
            done = min(done + args.every, args.steps)
            print(
                f"  {done} steps ({time.perf_counter() - begin:.0f} s): {read_ns(layer):.0f} ns a read",
                flush=True,
            )
    print(f"after the profile: {read_ns(layer):.0f} ns a read")


if __name__ == "__main__":
    main()
