"""Does the advice hold still, and do its promises come true? Five loops, profiled again and again.

Each case is a small real torch loop with one known problem. It is profiled ``--runs`` times on the
machine as it is and ``--runs`` times beside one busy core (another process spinning), and the
benchmark checks three things:

- **stability**: the same top card, recommending the same values, in every run of a condition, and
  the same card in both conditions (a thread count follows the CPUs other processes leave: 2 on the
  quiet machine, 1 beside the busy core, each right where it is given);
- **promise**: the top card's fix applied, the loop as profiled and the fixed loop timed under the
  profiler in interleaved A/B pairs (``--pairs``, median) in the same run: the measured speed-up
  within 25% of the card's ``speedup``, or, where the card's model says its saving is a lower bound
  ("at least"), no more than 25% under it;
- **tuning**: where the case loads data, ``tune=True`` predicts a step; the tuned setting's step,
  timed in pairs against the loop as profiled, is within 20% of it.

    python benchmarks/advice_matrix.py [--runs 5] [--pairs 5] [--cases sleeping_loading,...]

Exit status 0 when every check holds, 1 otherwise. ``tests/e2e/test_advice_matrix.py`` runs it
(marked ``matrix``; ``make advice-matrix``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

import perfmagic
from perfmagic.advise.plan import knob_changes

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from busy import spinners


class CpuLoading(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Computes each sample (an FFT) on the CPU."""

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = np.fft.irfft(np.fft.rfft(np.random.default_rng(i).standard_normal(1 << 14)))
        return torch.from_numpy(x[:256].astype(np.float32)), torch.tensor(i % 10)


class SleepingLoading(CpuLoading):
    """Waits on "storage" for each sample."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.002)
        return torch.full((256,), float(i % 7)), torch.tensor(i % 10)


class InMemory(CpuLoading):
    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full((256,), float(i % 7)), torch.tensor(i % 10)


@dataclass(frozen=True)
class Setting:
    """One way to run a case's loop: its loader's workers, torch's threads, a checkpoint interval."""

    workers: int = 0
    threads: int = 1
    checkpoint_every: int = 0  # 0: never


@dataclass(frozen=True)
class Case:
    name: str
    dataset: Callable[[], Dataset[Any]]
    setting: Setting
    expected: str  # the top card's id
    hidden: int = 512  # the model's width
    deep: bool = False  # a second hidden layer: forward and backward are the step


CASES = [
    Case("cpu_loading", CpuLoading, Setting(), "dataloader_workers"),
    Case("sleeping_loading", SleepingLoading, Setting(), "dataloader_workers"),
    Case("oversubscribed_threads", InMemory, Setting(threads=8), "cpu_contention", hidden=4096),
    Case("frequent_checkpoints", InMemory, Setting(checkpoint_every=1), "checkpoint_frequency"),
    Case("compute_bound", InMemory, Setting(), "compute_bound", hidden=2048, deep=True),
]


def loop(case: Case, setting: Setting, steps: int, outdir: Path) -> float:
    """``steps`` training steps of the case's loop with ``setting``; seconds per step after a head start."""
    torch.manual_seed(0)
    torch.set_num_threads(setting.threads)
    middle = [torch.nn.Linear(case.hidden, case.hidden), torch.nn.ReLU()] if case.deep else []
    model = torch.nn.Sequential(
        torch.nn.Linear(256, case.hidden), torch.nn.ReLU(), *middle, torch.nn.Linear(case.hidden, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(case.dataset(), batch_size=16, num_workers=setting.workers)
    head = 3 + 2 * setting.workers
    begin = 0.0
    for k, (x, y) in enumerate(loader):
        if k == head:
            begin = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        opt.step()
        if setting.checkpoint_every and k % setting.checkpoint_every == 0:
            torch.save(model.state_dict(), outdir / "ckpt.pt")
        if k + 1 == head + steps:
            return (time.perf_counter() - begin) / steps
    raise AssertionError("the loader ended early")


def profiled(case: Case, outdir: Path, tune: bool = False) -> perfmagic.Report:
    with perfmagic.profile(outdir=outdir, tune=tune, tune_budget=10) as session:
        loop(case, case.setting, 40, outdir)
    return session.report


def applied(case: Case, card: dict[str, Any]) -> Setting:
    """The case's setting with the top card's fix made, as its code says."""
    changes = {knob.split(".")[-1]: new for knob, (new, _) in knob_changes(card["fix"]).items()}
    s = case.setting
    if "num_workers" in changes:
        s = Setting(int(changes["num_workers"]), s.threads, s.checkpoint_every)
    if "set_num_threads" in changes:
        s = Setting(s.workers, int(changes["set_num_threads"]), s.checkpoint_every)
    if card["id"] == "checkpoint_frequency":
        every = int(card["metrics"].get("recommended_interval_steps") or 0)
        s = Setting(s.workers, s.threads, every)
    return s


def paired_speedup(case: Case, fixed: Setting, pairs: int, outdir: Path) -> float:
    """The loop as profiled over the fixed one, timed in interleaved pairs: the median ratio.

    Both are timed under the profiler, as the report's step was: what it spends a step stays in
    both, and the ratio is the one the report's promise makes.
    """
    ratios = []
    steps = max(30, 2 * fixed.checkpoint_every)  # each timing holds the fixed loop's checkpoints

    def timed(setting: Setting, k: int) -> float:
        with perfmagic.profile(outdir=outdir / f"pair-{k}-{id(setting)}"):
            return loop(case, setting, steps, outdir)

    for k in range(pairs):
        order = [case.setting, fixed] if k % 2 == 0 else [fixed, case.setting]
        times = {id(s): timed(s, k) for s in order}
        ratios.append(times[id(case.setting)] / times[id(fixed)])
    return statistics.median(ratios)


FOLLOWS_FREE_CPUS = {"torch.set_num_threads"}
"""Knobs whose right value is the CPUs other processes leave free: compared within a condition only."""


def _unfollowed(top: tuple[str, dict[str, str]] | None) -> tuple[str, dict[str, str]] | None:
    if top is None:
        return None
    return top[0], {k: v for k, v in top[1].items() if k not in FOLLOWS_FREE_CPUS}


def top(report: perfmagic.Report) -> tuple[str, dict[str, str]] | None:
    cards = report.advice
    if not cards:
        return None
    return cards[0]["id"], {k: v for k, (v, _) in knob_changes(cards[0]["fix"]).items()}


def run_case(case: Case, runs: int, pairs: int) -> list[str]:
    """The case's checks; returns what failed."""
    failed: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        seen: dict[str, list[Any]] = {}
        last: dict[str, Any] = {}
        for condition in ("as is", "one busy core"):
            for k in range(runs):
                if condition == "as is":
                    report = profiled(case, out / f"{condition}-{k}")
                else:
                    with spinners(1):
                        report = profiled(case, out / f"{condition}-{k}")
                seen.setdefault(condition, []).append(top(report))
                if report.advice:
                    last[condition] = report.advice[0]
            print(f"  {case.name} [{condition}]: {seen[condition]}", flush=True)
        for condition, tops in seen.items():
            if len({repr(t) for t in tops}) != 1:
                failed.append(
                    f"{case.name}: the top card moved [{condition}]: {sorted({repr(t) for t in tops})}"
                )
        between = {repr(_unfollowed(t)) for ts in seen.values() for t in ts}
        if len(between) != 1:
            failed.append(f"{case.name}: the top card differs between conditions: {sorted(between)}")
        card = last.get("as is")
        if card is None or card["id"] != case.expected:
            failed.append(f"{case.name}: top card {card and card['id']}, expected {case.expected}")
        elif card["speedup"]:
            fixed = applied(case, card)
            measured = paired_speedup(case, fixed, pairs, out)
            ratio = measured / card["speedup"]
            at_least = "at least" in card["metrics"].get("saving_model", "")
            ok = ratio >= 0.75 if at_least else abs(ratio - 1) <= 0.25
            print(f"  {case.name}: promised {card['speedup']:.2f}x, measured {measured:.2f}x ({fixed})")
            if not ok:
                failed.append(f"{case.name}: promised {card['speedup']:.2f}x, measured {measured:.2f}x")
        if case.name.endswith("loading"):
            failed += _tuning_holds(case, pairs, out)
    return failed


def _tuning_holds(case: Case, pairs: int, out: Path) -> list[str]:
    report = profiled(case, out / "tuned", tune=True)
    tuning = {t["knob"]: t for t in report.to_dict()["tuning"]}
    step, workers = tuning.get("step"), tuning.get("num_workers")
    if not step or not step["best"] or not step["baseline"] or not workers or not workers["best"]:
        return [f"{case.name}: tuning predicted no step"]
    fixed = Setting(int(workers["best"]["value"]), case.setting.threads, case.setting.checkpoint_every)
    promised = step["baseline"]["seconds"] / step["best"]["seconds"]
    measured = paired_speedup(case, fixed, pairs, out)
    print(
        f"  {case.name}: tuning promised {promised:.2f}x with {fixed.workers} workers, measured {measured:.2f}x"
    )
    if abs(measured / promised - 1) > 0.2:
        return [f"{case.name}: tuning promised {promised:.2f}x, measured {measured:.2f}x"]
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--cases", default=",".join(c.name for c in CASES))
    args = parser.parse_args(argv)
    chosen = [c for c in CASES if c.name in args.cases.split(",")]
    failed: list[str] = []
    for case in chosen:
        print(f"{case.name} (expected top card: {case.expected})", flush=True)
        failed += run_case(case, args.runs, args.pairs)
    print("\n".join(["", "FAILED:", *failed]) if failed else "\nall checks hold")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
