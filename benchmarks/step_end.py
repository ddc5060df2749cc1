"""What a step end outside the windows costs a real training step in place, and nothing else.

``overhead.py`` times whole profiles against unprofiled chunks: the sampler, the windows and a fresh
profile's start all come with the step ends, and its chunks of 100 steps move by more than the effect.
This isolates the step end. One profile stays open throughout, with no windows, so every step pays
the same for everything but its end. ``overhead.py``'s 2 ms loop runs in short blocks, in turn:

- ``torch``: the step ends through torch's own hooked ``optimizer.step`` (perfmagic's wrapper skipped);
- ``perfmagic``: through the wrapper, which notes the step's end (``collect.quick_ends``), the thread
  clock never due;
- ``read``: the same, the thread clock read at every step end (``THREAD_CLOCK_EVERY_S`` 0): against
  ``perfmagic``, what a reading costs in place;
- ``written``: the same, the ends noted written at every reading too (as before
  ``WRITTEN_WITHIN_S``): against ``read``, what writing them costs;
- ``marked``: through the wrapper, the end marked at once (``StageRecorder.boundary``), as before
  the quick path;
- ``append``: torch's, then the time appended to a list: what a step end that does nothing else costs;
- ``control``: torch's, then a spin of ``--spin`` µs: the method must read that as what it added.

Each block's first step is left out (it pays for the block before it); a block's figure is the mean
of the rest. Blocks are paired within a round (order rotating), the median of their differences from
``torch`` with its standard error. Where the control does not read its spin within two standard
errors, the machine moved too much for the run to say anything.

A block is too short for a step end's periodic work to come at its own rate (a reading every 10 ms,
a write every 0.1 s): ``perfmagic`` times the note alone, ``read`` and ``written`` a reading and a
write at every step. The script adds them up at this loop's rates: a step end's cost here (an
estimate from three measures).

    python benchmarks/step_end.py [--rounds 2000] [--block 6] [--spin 20] [--no-sample]
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import perfmagic
from perfmagic.collect import quick_ends, thread_series

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import training_parts, windows_after

READ_EVERY_S = thread_series.THREAD_CLOCK_EVERY_S
READ_EVERY_S_BY_MODE = {"perfmagic": math.inf, "read": 0.0, "written": 0.0}
"""The thread clock's interval in the modes that time the note alone or a reading at every step end."""


def paired(
    rounds: int,
    block: int,
    ends: dict[str, Callable[[], object]],
    batches: list[tuple[torch.Tensor, ...]],
    forward_backward: Callable[[torch.Tensor, torch.Tensor], None],
    before: Callable[[str], object],
) -> dict[str, list[float]]:
    """Per way of ending the step, its blocks' mean step seconds, one per round (``before(name)`` is
    called before each block)."""
    names = list(ends)
    per: dict[str, list[float]] = {n: [] for n in names}
    now = time.perf_counter
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            before(name)
            end, times = ends[name], []
            for i in range(block):
                x, y = batches[(r * 7 + i) % len(batches)]
                began = now()
                forward_backward(x, y)
                end()
                times.append(now() - began)
            per[name].append(statistics.fmean(times[1:]))
    return per


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--block", type=int, default=6, help="steps a block (the first left out)")
    parser.add_argument("--spin", type=float, default=20.0, help="the control's spin, µs")
    parser.add_argument("--no-sample", action="store_true", help="profile without the sampler thread")
    args = parser.parse_args()
    torch.set_num_threads(1)
    loader, model, optimizer, loss_fn = training_parts(64)
    batches = list(loader)
    spin_s = args.spin * 1e-6

    def forward_backward(x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()

    with windows_after(0), perfmagic.profile(sample=not args.no_sample) as session:
        wrapped: Any = type(optimizer).step  # perfmagic's wrapper around torch's hooked step
        torch_step = wrapped.__wrapped__

        def control() -> None:
            torch_step(optimizer)
            until = time.perf_counter() + spin_s
            while time.perf_counter() < until:
                pass

        times: list[float] = []
        recorder = session.recorder
        assert recorder is not None
        quick = recorder.quick

        def before(name: str) -> None:
            """The thread clock's interval for the block, read now to begin it (the first step is left out)."""
            thread_series.THREAD_CLOCK_EVERY_S = READ_EVERY_S_BY_MODE.get(name, READ_EVERY_S)
            recorder.read_thread_clock_now()
            recorder.allow_quick_ends(optimizer)

        def marked() -> None:
            quick.owner = None  # the wrapper allows it again after each step it marks
            optimizer.step()

        def written() -> None:
            quick.write_at = -math.inf  # the noted ends are due to be written at the reading
            optimizer.step()

        def append() -> None:
            torch_step(optimizer)
            times.append(time.perf_counter())

        ends: dict[str, Callable[[], object]] = {
            "torch": lambda: torch_step(optimizer),
            "perfmagic": optimizer.step,
            "read": optimizer.step,
            "written": written,
            "marked": marked,
            "append": append,
            "control": control,
        }
        for x, y in batches[:30]:  # warm-up
            forward_backward(x, y)
            optimizer.step()
        gc.collect()
        try:
            per = paired(args.rounds, args.block, ends, batches, forward_backward, before)
        finally:  # the profile's last reading at the usual interval
            thread_series.THREAD_CLOCK_EVERY_S = READ_EVERY_S
    assert session.report.steps["count"] >= 30, "the profile saw no steps"
    base = per["torch"]
    print(
        f"{args.rounds} rounds of {args.block}-step blocks; torch's step {statistics.median(base) * 1e6:.1f} µs"
    )
    added = {}
    for name in ("perfmagic", "read", "written", "marked", "append", "control"):
        differences = [a - b for a, b in zip(per[name], base, strict=True)]
        error = 1.2533 * statistics.stdev(differences) / math.sqrt(len(differences))
        added[name] = statistics.median(differences)
        print(f"{name:9s} {added[name] * 1e6:+7.2f} ± {error * 1e6:.2f} µs a step")
    print(f"the control spun {args.spin:.0f} µs and read {added['control'] * 1e6:+.2f}")
    step_s = statistics.median(base)
    reading, write = added["read"] - added["perfmagic"], added["written"] - added["read"]
    at_rates = (
        added["perfmagic"]
        + reading * min(1.0, step_s / READ_EVERY_S)
        + write * min(1.0, step_s / quick_ends.WRITTEN_WITHIN_S)
    )
    print(
        f"a reading {reading * 1e6:+.2f} µs, a write {write * 1e6:+.2f} µs in place; at this loop's rates "
        f"(a reading every {READ_EVERY_S * 1e3:.0f} ms, a write every {quick_ends.WRITTEN_WITHIN_S:.1f} s) "
        f"a step end costs {at_rates * 1e6:+.2f} µs a step"
    )


if __name__ == "__main__":
    main()
