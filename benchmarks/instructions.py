"""What perfmagic adds to each training step, in machine instructions: a figure no load moves.

``overhead.py`` times the hot path against unprofiled steps; on a VM whose speed moves by 10%
between half-seconds its figures move by more than their standard errors from run to run.
Instructions executed do not move with the machine. This runs ``overhead.py``'s loop under
valgrind's callgrind, counting only inside the steps (a ``functools.reduce`` over them: callgrind
starts and stops at that C function), unprofiled and under each mode, for ``--steps`` and for three
times as many steps. The difference between the two lengths leaves out what happens once (imports,
the profile's start, code warming up); what a mode adds per step is its difference less the
unprofiled one's, shown beside the unprofiled step's own instructions. Every run begins and ends a
profile before its counted steps, unprofiled ones too: the allocator's instructions depend on what the
heap held before (unprofiled steps after a profile took 11.7 k more a step than steps that never
followed one, all of it in ``malloc``), and this way that history is the same for every mode.

Instructions are not time: callgrind counts none of the kernel's (a system call is one
instruction here), and a cache miss costs no more than a hit. The figure is the hooks' own work;
``overhead.py`` is what it costs in place. Each mode takes about 13 minutes on two CPUs (valgrind
runs 50 to 100 times slower, torch's import included; the two lengths run side by side).

    python benchmarks/instructions.py [--steps 100] [--modes "perfmagic,perfmagic windowed,..."]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

import perfmagic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import training_parts, windows_after


@contextlib.contextmanager
def profiled(full: bool, window: int | None = None) -> Iterator[None]:
    schedule = windows_after(window) if not full else contextlib.nullcontext()
    with schedule, perfmagic.profile(full=full, sample=False):
        yield


MODES: dict[str, Callable[[], contextlib.AbstractContextManager[Any]]] = {
    "plain": contextlib.nullcontext,
    "perfmagic": lambda: profiled(full=True),
    "perfmagic windowed": lambda: profiled(full=False),
    "perfmagic step ends": lambda: profiled(full=False, window=0),
}
"""``perfmagic``: every step recorded fully; ``windowed``: 5 steps in every 53 from the start;
``step ends``: no windows (what each step outside them does). No sampler thread: its work is
another thread's, counted by ``hot_path_calls.py``."""

WARM_UP = 10
"""Steps before the counted ones: unprofiled, in the profile every run begins and ends, and inside the mode."""


def run_steps(mode: str, steps: int) -> None:
    """The child's part, run under callgrind: the loop's steps inside ``functools.reduce``."""
    torch.set_num_threads(1)
    loader, model, optimizer, loss_fn = training_parts(steps + 3 * WARM_UP)
    batches = iter(loader)

    def step(_: object = None, __: object = None) -> None:
        x, y = next(batches)
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()

    for _ in range(WARM_UP):
        step()
    # every mode's steps follow one profile begun and ended: its imports and one-off objects shape the
    # heap, and what glibc's malloc executes a step depends on what the heap held before
    with profiled(full=False, window=0):
        for _ in range(WARM_UP):
            step()
    with MODES[mode]():
        for _ in range(WARM_UP):
            step()
        functools.reduce(step, range(steps), None)


def counted(mode: str, steps: int) -> int:
    """Instructions inside the steps of one run of ``mode`` under callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            "valgrind",
            "--tool=callgrind",
            "--collect-atstart=no",
            "--toggle-collect=functools_reduce",
            f"--callgrind-out-file={tmp}/callgrind.out",
            sys.executable,
            __file__,
            "--child",
            mode,
            str(steps),
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"{mode}, {steps} steps: valgrind failed ({done.returncode})\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=100, help="counted steps of the shorter run (2 periods)")
    parser.add_argument("--modes", default=",".join(m for m in MODES if m != "plain"))
    parser.add_argument("--child", nargs=2, metavar=("MODE", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_steps(args.child[0], int(args.child[1]))
        return
    if shutil.which("valgrind") is None:
        parser.error("needs valgrind (apt install valgrind)")
    names = [m for m in args.modes.split(",") if m]
    unknown = [n for n in names if n not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; known: {list(MODES)}")
    short, long = args.steps, 3 * args.steps
    per_step: dict[str, float] = {}
    for name in ["plain", *names]:
        with ThreadPoolExecutor(2) as pool:  # counts do not depend on what else runs
            a, b = pool.map(functools.partial(counted, name), (short, long))
        per_step[name] = (b - a) / (long - short)
        print(f"{name}: {a:,} instructions in {short} steps, {b:,} in {long}", flush=True)
    plain = per_step["plain"]
    print(f"unprofiled: {plain:,.0f} instructions a step")
    for name in names:
        added = per_step[name] - plain
        print(f"  {name:22s} {added:+10,.0f} a step ({100 * added / plain:+.2f}% of the step's)")


if __name__ == "__main__":
    main()
