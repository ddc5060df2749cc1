"""Two loader settings timed in alternating slices, so that a change in the machine's pace falls on both.

Timing settings one after another lets a busy neighbour that starts or stops between them decide
the winner, and picking the fastest of several noisy timings favours the one timed luckiest. The
setting chosen is therefore timed again beside the baseline: both loaders are kept live, their
slices alternate (A B, B A, …), and each adjacent pair gives one ratio. The median ratio is the
promise; its 10th and 90th percentiles say how far the pairs spread.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from perfmagic.contract import Confirmation, KnobResult

SLICE_S = 0.2
"""Seconds each slice times, at least: long beside a step, short beside a neighbour's bursts."""

MIN_SLICE_BATCHES = 4

MIN_PAIRS = 3
"""Fewer pairs than this say nothing of their spread: no confirmation."""


class _Stream:
    """One loader's batches, its pass kept open between slices (its workers wait, they do not work)."""

    def __init__(self, loader: Any, now: Callable[[], float]) -> None:
        self.loader, self.now = loader, now
        self.ahead = loader.num_workers * (loader.prefetch_factor or 0) if loader.num_workers else 0
        self._it: Iterator[Any] | None = None

    def slice(self, seconds: float, work: Callable[[Any], None] | None) -> float | None:
        """Seconds per batch (and ``work`` on it) over one slice; None where the pass ended in it.

        The batches the workers had ready when the slice began are taken untimed: they were made
        while the other setting ran. So is the next round of one batch per worker: the workers,
        idle until then, all begin together, and their first batches arrive a whole batch's making
        late, not at the rate they keep up.
        """
        try:
            if self._it is None:
                self._it = iter(self.loader)
                next(self._it)  # the workers' start: not a rate
            for _ in range(self.ahead):
                next(self._it)
            for _ in range(self.loader.num_workers):
                batch = next(self._it)
                if work is not None:
                    work(batch)
            start = self.now()
            for timed, batch in enumerate(self._it, 1):
                if work is not None:
                    work(batch)
                elapsed = self.now() - start
                if elapsed >= seconds and timed >= MIN_SLICE_BATCHES:
                    return elapsed / timed
        except StopIteration:
            pass
        self._it = None  # the pass ended: the next slice starts a new one
        return None

    def close(self) -> None:
        self._it = None  # ends the pass's worker processes now


def confirmed_ratio(
    baseline: Any,
    candidate: Any,
    budget_s: float,
    work: Callable[[Any], None] | None = None,
    now: Callable[[], float] = time.perf_counter,
) -> Confirmation | None:
    """``candidate``'s seconds per batch over ``baseline``'s, from alternating slices within ``budget_s``.

    None where fewer than :data:`MIN_PAIRS` pairs could be timed.
    """
    streams = (_Stream(baseline, now), _Stream(candidate, now))
    end = now() + budget_s
    ratios: list[float] = []
    try:
        with warnings.catch_warnings():  # torch's advice on worker counts: these loaders are ours
            warnings.simplefilter("ignore", UserWarning)
            k = 0
            while now() + 2 * SLICE_S <= end:
                first, second = streams if k % 2 == 0 else streams[::-1]
                a, b = first.slice(SLICE_S, work), second.slice(SLICE_S, work)
                if a is not None and b is not None:
                    base_s, cand_s = (a, b) if k % 2 == 0 else (b, a)
                    ratios.append(cand_s / base_s)
                k += 1
    finally:
        for stream in streams:
            stream.close()
    if len(ratios) < MIN_PAIRS:
        return None
    low, mid, high = np.percentile(ratios, [10, 50, 90])
    return {"pairs": len(ratios), "ratio": float(mid), "low": float(low), "high": float(high)}


def described(confirmed: Confirmation, candidate: object, baseline: object) -> str:
    """The confirmation in words: "4 workers against 0 in 9 alternating pairs: 0.62 of the time …"."""
    return (
        f"{candidate} workers against {baseline} in {confirmed['pairs']} alternating pairs:"
        f" {confirmed['ratio']:.2f} of the time (p10–p90 {confirmed['low']:.2f}–{confirmed['high']:.2f})"
    )


def saving_interval(observed_s: float, step: KnobResult) -> list[float] | None:
    """The p10–p90 of what the predicted ``step`` saves on the observed step, where tuning gave one."""
    if "interval_s" not in step:
        return None
    low, high = step["interval_s"]
    return [observed_s - high, observed_s - low]
