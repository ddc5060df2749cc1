"""What in a trace's steps cannot be trusted: warnings that say what the trace holds and what it means.

A trace is checked, not repaired: its ``ProfilerStep#N`` ranges stay as recorded and the report says
where they mislead (all at one timestamp, gaps between them, overlapping or out of order), as it says
which events were left out and why (:data:`perfmagic.traces.events.KinetoTrace.dropped`).
"""

from __future__ import annotations

import numpy as np

from perfmagic.traces.events import KinetoTrace

GAP_SHARE = 0.05
"""A gap between two step ranges is worth a warning from this share of the median step on: ``prof.step()``
itself leaves a few microseconds between them."""


def step_warnings(
    trace: KinetoTrace, numbers: np.ndarray, starts: np.ndarray, ends: np.ndarray, label: str
) -> list[str]:
    """Warnings about the trace's step ranges (``numbers``, ``starts``, ``ends``: in time order, µs;
    ``label``: what marks them, ``ProfilerStep#`` or a JAX/TensorFlow ``step`` annotation)."""
    name, n = trace.path.name, len(starts)
    if n < 2:
        return []
    if np.all(starts == starts[0]):
        return [
            f"{name}: the trace's {n} {label} ranges all start at the same time ({starts[0]:.0f} µs), "
            "so its steps cannot be told apart in time: the step times and stages of this report are not "
            "the trace's (was the trace merged or its timestamps rewritten?)"
        ]
    out = []
    if np.any(np.diff(numbers) <= 0):
        out.append(
            f"{name}: the trace's {label} numbers do not rise with time (steps "
            f"{', '.join(map(str, numbers[:6].tolist()))}{'…' if n > 6 else ''} in time order): the steps are "
            "taken in time order, their numbers as recorded"
        )
    gap = starts[1:] - ends[:-1]
    median = float(np.median(ends - starts))
    if np.any(gap < 0):
        out.append(
            f"{name}: {int((gap < 0).sum())} of the trace's {label} ranges overlap the one before them "
            f"(by up to {-gap.min():.0f} µs): each step is cut where the next one begins"
        )
    wide = gap > GAP_SHARE * median
    if wide.any():
        k = int(np.argmax(gap))
        out.append(
            f"{name}: the trace's {label} ranges leave {int(wide.sum())} gaps between them, "
            f"{gap[wide].sum():.0f} µs in all (the longest {gap[k]:.0f} µs, after step {numbers[k]}): what ran "
            "in a gap is in no step, as recorded"
        )
    return out


def dropped_warning(trace: KinetoTrace) -> str | None:
    """The events left out of the trace and why, or None where none were."""
    if not trace.dropped:
        return None
    reasons = ", ".join(f"{why}: {n}" for why, n in trace.dropped.items())
    return (
        f"{trace.path.name}: {sum(trace.dropped.values())} events left out, their fields unreadable or their "
        f"spans negative ({reasons}): the trace's figures are of the rest"
    )
