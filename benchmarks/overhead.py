"""What perfmagic's default mode costs a training loop, next to torch.profiler's.

The same small CPU training loop (1–3 ms steps: DataLoader, forward, backward,
optimizer) runs unprofiled, under ``perfmagic.profile()`` (a run this short has every step
recorded fully), under it past its full start (``perfmagic windowed``: stage hooks in 5 steps of
every 50, as after a profile's first 200 steps and 30 s), under it with a device
clock on a simulated CUDA device (``tests/sim_cuda.py``: every stage marks events, as
on a GPU) and under ``torch.profiler.profile()``. Each run lasts ``--seconds`` (10 s:
longer than the 1 s spool period and the device-mark drains, so periodic costs count)
and is timed whole, as seconds per step. Modes are interleaved in rotating order over
``--rounds`` rounds, so drift and other processes hit all of them alike; each round
gives each mode's ratio to the unprofiled run of the same round, and the median ratio
is reported with its spread.

    python benchmarks/overhead.py [--rounds 15] [--seconds 10] [--modes perfmagic,...] [--json FILE]

``--json`` writes each profiled mode's median overhead, its middle half and the medians per step
(``make gpu-check`` reads it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import perfmagic
from perfmagic.collect import schedule

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.sim_cuda import SimCuda, installed


def training_parts(
    batches: int,
) -> tuple[DataLoader[Any], torch.nn.Module, torch.optim.Optimizer, torch.nn.Module]:
    """The loop's loader (``batches`` batches of 64), MLP, SGD optimizer and loss, seeded the same each time."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(batches * 64, 256), torch.randint(0, 10, (batches * 64,)))
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return DataLoader(data, batch_size=64), model, optimizer, torch.nn.CrossEntropyLoss()


def make_loop(seconds: float) -> Callable[[], float]:
    """A training loop that runs whole passes over its data for at least ``seconds``; returns its
    seconds per step, everything included."""
    loader, model, optimizer, loss_fn = training_parts(300)

    def loop() -> float:
        steps, begin = 0, time.perf_counter()
        while time.perf_counter() - begin < seconds:
            for x, y in loader:
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()
                steps += 1
        return (time.perf_counter() - begin) / steps

    return loop


@contextlib.contextmanager
def with_perfmagic() -> Iterator[None]:
    with perfmagic.profile():
        yield


@contextlib.contextmanager
def windows_from_start(window: int | None = None) -> Iterator[None]:
    """Profiles with no full start (``collect.schedule``): their steps are recorded in windows from the
    first one, ``window`` steps in every period (None: the default)."""
    saved = schedule.FULL_STEPS, schedule.FULL_SECONDS, schedule.WINDOW
    schedule.FULL_STEPS, schedule.FULL_SECONDS = 0, 0.0
    schedule.WINDOW = saved[2] if window is None else window
    try:
        yield
    finally:
        schedule.FULL_STEPS, schedule.FULL_SECONDS, schedule.WINDOW = saved


@contextlib.contextmanager
def with_perfmagic_windowed() -> Iterator[None]:
    with windows_from_start(), perfmagic.profile():
        yield


@contextlib.contextmanager
def with_torch_profiler() -> Iterator[None]:
    with torch.profiler.profile():
        yield


@contextlib.contextmanager
def with_perfmagic_device_clock() -> Iterator[None]:
    with installed(SimCuda()), perfmagic.profile():
        yield


MODES: dict[str, Callable[[], contextlib.AbstractContextManager[Any]]] = {
    "unprofiled": contextlib.nullcontext,
    "perfmagic": with_perfmagic,
    "perfmagic windowed": with_perfmagic_windowed,
    "perfmagic+device clock": with_perfmagic_device_clock,
    "torch.profiler": with_torch_profiler,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each run")
    parser.add_argument("--modes", default=",".join(list(MODES)[1:]), help="profiled modes, comma-separated")
    parser.add_argument("--json", metavar="FILE", help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = ["unprofiled", *(m for m in args.modes.split(",") if m)]
    unknown = [n for n in names if n not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; known: {list(MODES)}")
    loop = make_loop(args.seconds)
    make_loop(1.0)()  # warm-up: allocator, first-call costs

    per_step: dict[str, list[float]] = {n: [] for n in names}
    ratios: dict[str, list[float]] = {n: [] for n in names[1:]}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        this_round: dict[str, float] = {}
        for name in order:
            with MODES[name]():
                this_round[name] = loop()
            per_step[name].append(this_round[name])
        for name in names[1:]:
            ratios[name].append(this_round[name] / this_round["unprofiled"])
        # each round as it ends: a run cut short (a device's time limit) still says what it measured
        print(
            f"round {r + 1}: "
            + ", ".join(
                f"{n} {100 * (this_round[n] / this_round['unprofiled'] - 1):+.2f}%" for n in names[1:]
            ),
            flush=True,
        )

    print(f"{args.rounds} rounds x {args.seconds:g} s per mode, torch {torch.__version__}, 1 intra-op thread")
    for name in names:
        print(f"  {name:<24} {statistics.median(per_step[name]) * 1e3:7.3f} ms per step (median)")
    results = {name: summary(ratios[name], per_step[name]) for name in names[1:]}
    for name, result in results.items():
        print(
            f"  {name:<24} overhead {100 * result['overhead']:+6.2f}%  (middle half of rounds "
            f"{100 * result['q1']:+.2f}% .. {100 * result['q3']:+.2f}%)"
        )
    if args.json:
        unprofiled_s = statistics.median(per_step["unprofiled"])
        Path(args.json).write_text(
            json.dumps({"unprofiled_step_s": unprofiled_s, "modes": results}, indent=1)
        )


def summary(ratios: list[float], per_step: list[float]) -> dict[str, float]:
    """A mode's median overhead over the rounds, the middle half of them, and its median step."""
    ranked = sorted(ratios)
    q1, q3 = ranked[len(ranked) // 4], ranked[(3 * len(ranked)) // 4]
    return {
        "overhead": statistics.median(ranked) - 1,
        "q1": q1 - 1,
        "q3": q3 - 1,
        "step_s": statistics.median(per_step),
    }


if __name__ == "__main__":
    main()
