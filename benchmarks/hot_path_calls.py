"""What perfmagic adds to each training step, counted rather than timed.

Timing a hook's cost on a 2 ms step needs many long interleaved runs and still moves by a
point or two with the machine (``overhead.py``). Two figures that do not move:

- **Python calls per step**: the function calls (Python frames, not C calls) a step makes
  unprofiled and under ``perfmagic.profile()``, counted with ``sys.setprofile`` over the same
  batches, and the functions that make the difference: for a fully recorded step (a profile's
  first 200 steps and 30 s, and its windows), for a step outside the windows, and on average once
  the windows have begun (5 steps in every 53: ``collect.schedule``). In place each such call costs a fast loop
  a microsecond or two (the step's tensors have pushed the interpreter out of the caches), so the
  count is what the hot path's cost follows.
- **Background milliseconds per second**: the CPU time the sampler thread spends in its tick (spool
  upkeep, the exporter's status file) and in polling its sources, and every thread but the loop's
  together, while the loop runs (after a warm-up: the first tick's imports are a one-off); once
  with no reader of the session registry, once with an exporter's. While that thread runs Python
  it holds the GIL the training thread needs for its own.
- **Window switches**: the median time of putting the windowed hooks in and taking them out (the
  report's ``recording.window_cost_s`` measures them in the run, with what they do to the steps).
- **A step end, warm**: the thread's CPU time of ``optimizer.step()`` on one parameter (so little
  of torch's own work that perfmagic's part shows), unprofiled and in a profile with no windows,
  medians of interleaved chunks: what the step end outside the windows costs with everything in the
  caches, a lower bound for its cost in a real step.

    python benchmarks/hot_path_calls.py [--steps 200] [--seconds 5]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import torch

import perfmagic
from perfmagic.collect import schedule
from perfmagic.collect.sampler import Sampler
from perfmagic.collect.torch_hooks import TorchStages
from perfmagic.registry import REGISTRY_ENV, SessionStatus, mark_read
from perfmagic.session import Session
from perfmagic.upkeep import RecordUpkeep

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import Loop, training_parts, windows_after, with_perfmagic_step_ends


def make_loop(seconds: float) -> Callable[[], None]:
    """``overhead.py``'s training loop, running whole passes over its data for at least ``seconds``."""
    training = Loop()

    def loop() -> None:
        begin = time.perf_counter()
        while time.perf_counter() - begin < seconds:
            for x, y in training.loader:
                training.train(x, y)

    return loop


def python_calls(steps: int) -> collections.Counter[tuple[str, str]]:
    """Python calls made by ``steps`` steps of the benchmark loop, by (file, function)."""
    loader, model, optimizer, loss_fn = training_parts(steps)
    calls: collections.Counter[tuple[str, str]] = collections.Counter()

    def count(frame: FrameType, event: str, _: Any) -> None:
        if event == "call":
            calls[(Path(frame.f_code.co_filename).name, frame.f_code.co_name)] += 1

    sys.setprofile(count)
    try:
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
    finally:
        sys.setprofile(None)
    return calls


def timed(owner: type, name: str, spent: list[float]) -> Callable[[], None]:
    """Add the CPU seconds each call of ``owner.name`` takes on its thread to ``spent[0]``; returns what
    puts it back."""
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        begin = time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            spent[0] += time.thread_time() - begin

    setattr(owner, name, wrapper)
    return lambda: setattr(owner, name, original)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=200, help="steps counted in each mode")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the background run")
    args = parser.parse_args()
    torch.set_num_threads(1)

    python_calls(8)  # first calls: imports, caches
    plain = python_calls(args.steps)
    print(f"Python calls per step: {sum(plain.values()) / args.steps:.1f} unprofiled")
    for label, window in (
        ("a fully recorded step", None),
        ("a step outside the windows", 0),
        (f"on average, {schedule.WINDOW} steps in {schedule.PERIOD} recorded fully", schedule.WINDOW),
    ):
        with contextlib.ExitStack() as stack:
            if window is not None:
                stack.enter_context(windows_after(window))
            with perfmagic.profile():
                profiled = python_calls(args.steps)
        extra = profiled.copy()
        extra.subtract(plain)
        added = (sum(profiled.values()) - sum(plain.values())) / args.steps
        print(f"  +{added:.1f} under perfmagic.profile(): {label}")
        for (file, function), n in extra.most_common():
            if n / args.steps >= 0.05 and window != schedule.WINDOW:
                print(f"      {n / args.steps:6.2f}  {file}:{function}")

    print(switch_times(args.seconds))
    print(step_end_time())
    with tempfile.TemporaryDirectory() as registry:
        os.environ[REGISTRY_ENV] = registry
        print(background(args.seconds, "no reader of the registry"))
        mark_read(Path(registry))
        print(background(args.seconds, "an exporter reading the registry"))


def switch_times(seconds: float) -> str:
    """The median time of putting the windowed hooks in and of taking them out, over ``seconds`` of the
    loop recorded in windows from the start: each change sets class attributes (``nn.Module.__call__``
    among them, whose call slot CPython updates in every subclass)."""
    spent: dict[bool, list[float]] = {True: [], False: []}
    original = TorchStages._record_fully

    def timed_switch(self: TorchStages, full: bool) -> list[str]:
        begin = time.perf_counter()
        try:
            return original(self, full)
        finally:
            spent[full].append(time.perf_counter() - begin)

    TorchStages._record_fully = timed_switch  # type: ignore[method-assign]
    try:
        with windows_after(), perfmagic.profile():
            make_loop(seconds)()
    finally:
        TorchStages._record_fully = original  # type: ignore[method-assign]
    put_in, taken_out = (statistics.median(spent[k]) if spent[k] else float("nan") for k in (True, False))
    return (
        f"Window switches over {seconds:g} s: {len(spent[True])} in, median {1e3 * put_in:.3f} ms; "
        f"{len(spent[False])} out, median {1e3 * taken_out:.3f} ms"
    )


def step_end_time(rounds: int = 15, steps: int = 2000) -> str:
    """The CPU µs ``optimizer.step()`` of one parameter takes on its thread unprofiled and in
    ``overhead.py``'s step-ends mode (what is left is the step end's own work), medians of ``rounds``
    interleaved chunks."""
    weight = torch.nn.Parameter(torch.zeros(1))
    weight.grad = torch.ones(1)
    optimizer = torch.optim.SGD([weight], lr=0.1)

    def chunk() -> float:
        begin = time.thread_time()
        for _ in range(steps):
            optimizer.step()
        return (time.thread_time() - begin) / steps

    plain, profiled = [], []
    for _ in range(rounds):
        plain.append(chunk())
        with with_perfmagic_step_ends():  # overhead.py's mode: the default profile, no windows
            chunk()  # the profile's first steps: one-offs
            profiled.append(chunk())
    unprofiled, ends = statistics.median(plain), statistics.median(profiled)
    return (
        f"A step end outside the windows, warm: optimizer.step() of one parameter {1e6 * unprofiled:.2f} µs "
        f"unprofiled, {1e6 * ends:.2f} µs profiled: +{1e6 * (ends - unprofiled):.2f} µs (medians of {rounds})"
    )


def background(seconds: float, label: str) -> str:
    """The CPU milliseconds per second of the sampler's parts and of every thread but the loop's,
    over ``seconds`` of the loop after a 3 s warm-up."""
    parts = {"tick": (Session, "_on_tick"), "upkeep": (RecordUpkeep, "tick")}
    parts |= {"status": (SessionStatus, "tick"), "source polls": (Sampler, "poll_once")}
    spent = {name: [0.0] for name in parts}
    restore = [timed(owner, method, spent[name]) for name, (owner, method) in parts.items()]
    warm_up, loop = make_loop(3.0), make_loop(seconds)
    try:
        with perfmagic.profile():
            warm_up()
            for total in spent.values():
                total[0] = 0.0
            begin, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
            loop()
            wall = time.perf_counter() - begin
            others = time.process_time() - cpu - (time.thread_time() - own)
    finally:
        for undo in restore:
            undo()
    return (
        f"Background with {label}, CPU ms per second of a {wall:.1f} s run after a 3 s warm-up: "
        + ", ".join(f"{name} {1e3 * total[0] / wall:.2f}" for name, total in spent.items())
        + f" (tick = upkeep + status + listeners); every thread but the loop's {1e3 * others / wall:.1f}"
    )


if __name__ == "__main__":
    main()
