"""What perfmagic's default mode costs a training loop, next to torch.profiler's.

The same small CPU training loop (2–3 ms steps: DataLoader, forward, backward, optimizer) runs in
chunks of ``--steps`` steps, timed step by step: unprofiled chunks, and between each two of them a
chunk under one mode, the modes in rotating order. Modes: ``perfmagic`` (a run this short has every
step recorded fully), ``perfmagic windowed`` (stage hooks in 5 steps of every period, the period a
long run of this loop gets past its first 200 steps and 30 s: ``collect.schedule.period_after_start``),
``perfmagic step ends`` (no windows: what each step outside them pays; ``... unsampled``: the same
with no metric source polled; ``... 100 Hz``: the sources polled ten times as often), ``perfmagic+device clock`` (a
simulated CUDA device: every stage marks events, as on a GPU), ``torch.profiler``, and ``control
+1%``: no profiler, but a spin of 1% of the step on every step, the method's check of itself in the
same run. Profiles record their first 20 steps fully, as a long run does its start (a profile's
one-offs fall there), then windows. Each chunk's first ``--skip`` steps (the start and the 3 steps
its hooks' removal slows) are left out; the rest, one period by default, is its span: one window
and the 3 steps after it. Garbage is collected before each chunk, so one chunk's garbage is
not collected in the next one's steps.

A VM's CPU speed moves by 10% or more between half-seconds, far more than 1%. So each step is
timed twice, in wall time and in the thread's CPU time, and before each step the loop times a
probe, the step's two big matrix products on tensors of the step's shapes, in CPU time: the probe
slows with the CPU as the step does (correlation 0.97 on the dev VM). A chunk's **overhead**
against the unprofiled chunks on either side of it has two parts: its CPU seconds over its probes'
(the hooks' own work), and its waits, wall time less CPU time (the GIL, which the profiler's
threads take, and being preempted), as a share of the unprofiled step. The figure is the median
chunk, with its standard error. **raw** is the wall time alone.

    python benchmarks/overhead.py [--rounds 150] [--seconds S] [--steps N] [--skip N] [--modes perfmagic,...]
                                  [--json FILE]

``--json`` writes each mode's figures, the period and the median unprofiled step (``make gpu-check``
reads it).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
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


@dataclass
class Chunk:
    """Consecutive steps: each one's wall and CPU seconds, and its probe's CPU seconds."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    probe: list[float] = field(default_factory=list)
    spin: list[float] = field(default_factory=list)  # the control's spins, CPU seconds

    def after(self, skip: int) -> Chunk:
        return Chunk(self.wall[skip:], self.cpu[skip:], self.probe[skip:], self.spin[skip:])

    @property
    def cpu_per_probe(self) -> float:
        return sum(self.cpu) / sum(self.probe)

    @property
    def wall_s(self) -> float:
        return statistics.fmean(self.wall)

    @property
    def wait_s(self) -> float:
        return statistics.fmean(w - c for w, c in zip(self.wall, self.cpu, strict=True))


class Loop:
    """The training loop, timed step by step, each step after its probe."""

    def __init__(self) -> None:
        self.loader, self.model, self.optimizer, self.loss_fn = training_parts(300)
        self.probe_input = torch.randn(64, 256)
        self.probe_weights = torch.randn(512, 256), torch.randn(512, 512)

    def train(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One training step on the batch ``x``, ``y``."""
        self.optimizer.zero_grad()
        self.loss_fn(self.model(x), y).backward()
        self.optimizer.step()

    def probe(self) -> float:
        """The thread's CPU seconds for the step's two big matrix products (no module, so no hook)."""
        begin = time.thread_time()
        first, second = self.probe_weights
        torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(self.probe_input, first)), second)
        return time.thread_time() - begin

    def steps(self, n: int, spin: int = 0) -> Chunk:
        """Runs ``n`` steps from a new pass over the data (a pass begun inside a profile is seen
        whole by it), each with ``spin`` empty loop turns after the optimizer."""
        gc.collect()
        chunk = Chunk()
        batches = iter(self.loader)
        for _ in range(n):
            chunk.probe.append(self.probe())
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                x, y = next(batches)
            except StopIteration:
                batches = iter(self.loader)
                x, y = next(batches)
            self.train(x, y)
            if spin:
                spun = time.thread_time()
                for _ in range(spin):
                    pass
                chunk.spin.append(time.thread_time() - spun)
            chunk.cpu.append(time.thread_time() - cpu)
            chunk.wall.append(time.perf_counter() - wall)
        return chunk


def steady_step_s(loop: Loop) -> float:
    """The loop's step, unprofiled: the median of 2,000 steps after 300 of warm-up (a VM's speed moves by
    20% from one second to the next; a long run sets its period from its first 30 s)."""
    loop.steps(300)
    return statistics.median(loop.steps(2000).wall)


def spin_turns(seconds: float) -> int:
    """How many empty loop turns take ``seconds`` (the median of 5 timings)."""
    turns, timings = 100_000, []
    for _ in range(5):
        begin = time.perf_counter()
        for _ in range(turns):
            pass
        timings.append(time.perf_counter() - begin)
    return round(seconds * turns / statistics.median(timings))


@contextlib.contextmanager
def with_perfmagic() -> Iterator[None]:
    with perfmagic.profile():
        yield


START_STEPS = 20
"""Steps a profiled chunk records fully before its windows: a long run's start, in which a profile's one-offs
fall (the memory of one sampled step, read on the training thread: 5 to 9 ms)."""


@contextlib.contextmanager
def windows_after(window: int | None = None, full_steps: int = 0) -> Iterator[None]:
    """Profiles whose steps are recorded in windows after their first ``full_steps`` (not after 200 steps
    and 30 s: ``collect.schedule``), ``window`` steps in every period (None: the default; 0: no window
    ever, by a period no run reaches, so the analysis still reads the windows' usual size)."""
    saved = (
        schedule.FULL_STEPS,
        schedule.FULL_SECONDS,
        schedule.WINDOW,
        schedule.PERIOD,
        schedule.LONGEST_PERIOD,
    )
    schedule.FULL_STEPS, schedule.FULL_SECONDS = full_steps, 0.0
    if window == 0:
        schedule.PERIOD = schedule.LONGEST_PERIOD = sys.maxsize
    elif window is not None:
        schedule.WINDOW = window
    try:
        yield
    finally:
        (
            schedule.FULL_STEPS,
            schedule.FULL_SECONDS,
            schedule.WINDOW,
            schedule.PERIOD,
            schedule.LONGEST_PERIOD,
        ) = saved


@contextlib.contextmanager
def period_pinned(period: int) -> Iterator[None]:
    """Windows every ``period`` steps however long the steps are: the schedule neither picks the period
    from a profile's first steps (a short profile's are its start's) nor lengthens it."""
    saved = schedule.PERIOD, schedule.LONGEST_PERIOD
    schedule.PERIOD = schedule.LONGEST_PERIOD = period
    try:
        yield
    finally:
        schedule.PERIOD, schedule.LONGEST_PERIOD = saved


@contextlib.contextmanager
def with_perfmagic_windowed() -> Iterator[None]:
    with windows_after(full_steps=START_STEPS), perfmagic.profile():
        yield


@contextlib.contextmanager
def with_perfmagic_step_ends(**options: Any) -> Iterator[None]:
    """Only what is on every step outside the windows: windows of no step (the windowed mode's cost
    less this one's is what its windows add). ``options`` go to the profile: ``sample=False`` (no metric
    source polled: what the sampler's polls add), ``interval=0.01`` (polled ten times as often: the
    sampler's cost per tick, amplified above what this VM's noise hides)."""
    with windows_after(window=0, full_steps=START_STEPS), perfmagic.profile(**options):
        yield


@contextlib.contextmanager
def with_torch_profiler() -> Iterator[None]:
    with torch.profiler.profile():
        yield


@contextlib.contextmanager
def with_perfmagic_device_clock() -> Iterator[None]:
    with installed(SimCuda()), perfmagic.profile():
        yield


TARGET_STEP_S = 0.002
"""The step the hot path's goal is set for (≤ 1% of it): the added µs a step are shown as its share too,
an estimate where the loop's own step is longer."""

CONTROL = "control +1%"
MODES: dict[str, Callable[[], contextlib.AbstractContextManager[Any]]] = {
    "perfmagic": with_perfmagic,
    "perfmagic windowed": with_perfmagic_windowed,
    "perfmagic step ends": with_perfmagic_step_ends,
    "perfmagic step ends unsampled": functools.partial(with_perfmagic_step_ends, sample=False),
    "perfmagic step ends 100 Hz": functools.partial(with_perfmagic_step_ends, interval=0.01),
    "perfmagic+device clock": with_perfmagic_device_clock,
    "torch.profiler": with_torch_profiler,
    CONTROL: contextlib.nullcontext,
}


@dataclass
class Timings:
    """One mode's chunks, each against the unprofiled chunks on either side of it."""

    overhead: list[float] = field(default_factory=list)  # the CPU part plus the waits' share
    wait: list[float] = field(default_factory=list)  # the waits' share alone
    raw: list[float] = field(default_factory=list)  # wall time alone
    spun: list[float] = field(default_factory=list)  # the control's spins, as a share of the rest
    seconds: list[float] = field(default_factory=list)  # every step of the spans

    def add(self, chunk: Chunk, unprofiled: tuple[Chunk, Chunk]) -> float:
        """Adds one chunk; returns its overhead."""
        wall_s = statistics.fmean(u.wall_s for u in unprofiled)
        cpu = chunk.cpu_per_probe / statistics.fmean(u.cpu_per_probe for u in unprofiled) - 1
        self.wait.append((chunk.wait_s - statistics.fmean(u.wait_s for u in unprofiled)) / wall_s)
        self.overhead.append(cpu + self.wait[-1])
        self.raw.append(chunk.wall_s / wall_s - 1)
        self.seconds.extend(chunk.wall)
        if chunk.spin:
            self.spun.append(sum(chunk.spin) / (sum(chunk.cpu) - sum(chunk.spin)))
        return self.overhead[-1]

    def summary(self) -> dict[str, float]:
        """The median chunk's overhead, its standard error and the middle half of chunks; the
        median waits' share and raw overhead; the median step; for the control, what its spins
        took, the truth its overhead should read."""
        ranked = sorted(self.overhead)
        q1, q3 = ranked[len(ranked) // 4], ranked[(3 * len(ranked)) // 4]
        # the median's standard error, from a spread that a few wild chunks do not inflate
        error = 1.2533 * (q3 - q1) / 1.349 / math.sqrt(len(ranked))
        return {
            "overhead": statistics.median(ranked),
            "error": error,
            "q1": q1,
            "q3": q3,
            "wait": statistics.median(self.wait),
            "raw": statistics.median(self.raw),
            "step_s": statistics.median(self.seconds),
            **({"spun": statistics.median(self.spun)} if self.spun else {}),
        }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--seconds", type=float, help="stop after the round that passes this many seconds")
    parser.add_argument("--steps", type=int, help="steps in each chunk (default: --skip and a period)")
    parser.add_argument("--skip", type=int, help="each chunk's first steps, left out (default: 23)")
    parser.add_argument("--modes", default=",".join(MODES), help="profiled modes, comma-separated")
    parser.add_argument("--json", metavar="FILE", help="also write the results here")
    args = parser.parse_args()
    names = [m for m in args.modes.split(",") if m]
    unknown = [n for n in names if n not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; known: {list(MODES)}")
    if args.rounds < 1:
        parser.error("needs --rounds >= 1")
    torch.set_num_threads(1)
    loop = Loop()
    step_s = steady_step_s(loop)
    spin, period = spin_turns(0.01 * step_s), schedule.period_after_start(step_s)
    # the start and the steps its hooks' removal slows are left out; the first window and the steps after
    # it are the last period's
    args.skip = START_STEPS + schedule.SETTLING_STEPS if args.skip is None else args.skip
    args.steps = args.skip + period if args.steps is None else args.steps
    if not 0 <= args.skip < args.steps:
        parser.error(f"needs 0 <= --skip < --steps (here {args.skip} and {args.steps})")
    with period_pinned(period):
        timings, unprofiled = timed_rounds(args, loop, names, spin)
    report(args, timings, unprofiled, period)


def timed_rounds(
    args: argparse.Namespace, loop: Loop, names: list[str], spin: int
) -> tuple[dict[str, Timings], float]:
    """Each mode's chunks, round by round, and the median unprofiled step."""
    timings = {name: Timings() for name in names}
    before = loop.steps(args.steps).after(args.skip)
    unprofiled = list(before.wall)
    begin = time.perf_counter()
    for r in range(args.rounds):
        overhead: dict[str, float] = {}
        for name in names[r % len(names) :] + names[: r % len(names)]:
            with MODES[name]():
                chunk = loop.steps(args.steps, spin if name == CONTROL else 0).after(args.skip)
            after = loop.steps(args.steps).after(args.skip)
            overhead[name] = timings[name].add(chunk, (before, after))
            unprofiled.extend(after.wall)
            before = after
        # each round as it ends: a run cut short (a device's time limit) still says what it measured
        print(f"round {r + 1}: " + ", ".join(f"{n} {100 * overhead[n]:+.2f}%" for n in names), flush=True)
        if args.seconds is not None and time.perf_counter() - begin > args.seconds:
            break
    return timings, statistics.median(unprofiled)


def report(args: argparse.Namespace, timings: dict[str, Timings], unprofiled_s: float, period: int) -> None:
    """Prints each mode's figures and writes them to ``--json``."""
    results = {name: t.summary() for name, t in timings.items()}
    print(
        f"{len(next(iter(timings.values())).overhead)} rounds, steps {args.skip + 1}-{args.steps} of each chunk; torch "
        f"{torch.__version__}, 1 intra-op thread; unprofiled {unprofiled_s * 1e3:.3f} ms per step (median); "
        f"windows of {schedule.WINDOW} in every {period} steps"
    )
    for name, result in results.items():
        print(
            f"  {name:<24} overhead {100 * result['overhead']:+6.2f}% ± {100 * result['error']:.2f} (waits "
            f"{100 * result['wait']:+.2f}%; middle half of chunks {100 * result['q1']:+.2f}% .. "
            f"{100 * result['q3']:+.2f}%; raw {100 * result['raw']:+.2f}%)   {result['step_s'] * 1e3:.3f} ms per step"
            + (f"; its spins took {100 * result['spun']:+.2f}%" if "spun" in result else "")
        )
        added_s = result["overhead"] * unprofiled_s
        print(
            f"  {'':<24} {added_s * 1e6:+.1f} µs a step ± {result['error'] * unprofiled_s * 1e6:.1f}: "
            f"about {100 * added_s / TARGET_STEP_S:+.2f}% of a {TARGET_STEP_S * 1e3:.0f} ms step, an estimate "
            "(a smaller batch makes the same calls; that they cost the same µs is assumed)"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"unprofiled_step_s": unprofiled_s, "period": period, "modes": results}, indent=1)
        )


if __name__ == "__main__":
    main()
