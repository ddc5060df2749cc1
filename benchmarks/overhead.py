"""Step-time overhead of perfmagic's default mode, next to torch.profiler's.

The same small CPU training loop (1–3 ms steps: DataLoader, forward,
backward, optimizer) runs unprofiled, under ``perfmagic.profile()`` and under
``torch.profiler.profile()`` with default settings. Modes are interleaved in
rotating order over several rounds, so drift and noise from other processes
hit all of them alike; each round yields a step-time ratio to the unprofiled
run of the same round, and the median ratio is reported.

    python benchmarks/overhead.py [--rounds 7] [--steps 300]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import perfmagic


def make_loop(steps: int) -> Callable[[], float]:
    """A training loop; returns its median step time in seconds."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(steps * 64, 256), torch.randint(0, 10, (steps * 64,)))
    loader = DataLoader(data, batch_size=64)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()

    def loop() -> float:
        times = []
        last = time.perf_counter()
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
            now = time.perf_counter()
            times.append(now - last)
            last = now
        return statistics.median(times[5:])

    return loop


@contextlib.contextmanager
def with_perfmagic() -> Iterator[None]:
    with perfmagic.profile():
        yield


@contextlib.contextmanager
def with_torch_profiler() -> Iterator[None]:
    with torch.profiler.profile():
        yield


MODES: dict[str, Callable[[], contextlib.AbstractContextManager[Any]]] = {
    "unprofiled": contextlib.nullcontext,
    "perfmagic": with_perfmagic,
    "torch.profiler": with_torch_profiler,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)
    loop = make_loop(args.steps)
    loop()  # warm-up: allocator, first-call costs

    names = list(MODES)
    medians: dict[str, list[float]] = {n: [] for n in names}
    ratios: dict[str, list[float]] = {n: [] for n in names[1:]}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        this_round: dict[str, float] = {}
        for name in order:
            with MODES[name]():
                this_round[name] = loop()
            medians[name].append(this_round[name])
        for name in names[1:]:
            ratios[name].append(this_round[name] / this_round["unprofiled"])

    print(f"{args.rounds} rounds x {args.steps} steps, torch {torch.__version__}, 1 intra-op thread")
    for name in names:
        print(f"  {name:<15} median step {statistics.median(medians[name]) * 1e3:7.3f} ms")
    for name in names[1:]:
        ratio = statistics.median(ratios[name])
        print(f"  {name:<15} overhead {100 * (ratio - 1):+6.2f}%  (median of per-round ratios {ratio:.4f})")


if __name__ == "__main__":
    main()
