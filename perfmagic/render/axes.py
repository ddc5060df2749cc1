"""Round axes for the still charts: fitted to the data, ticked at 1, 2 or 5 times a power of ten.

A value axis starts at zero and ends on the first round tick at or above the largest value, with
the tick step chosen so that this end is at most :data:`FIT` times that value (a 965 ms step gets
"0, 200, ... 1000 ms", never an axis to 2000 ms). A time axis is ticked in round seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FIT = 1.25
"""A value axis ends at most this many times the largest value it shows."""

TARGET_TICKS = 5
"""About this many intervals between ticks: fewer crowd nothing, more read as a ruler."""


@dataclass(frozen=True)
class Axis:
    """An axis from ``lo`` to ``hi`` in seconds, its ticks (in seconds too) and their labels."""

    lo: float
    hi: float
    ticks: tuple[float, ...]
    labels: tuple[str, ...]
    unit: str
    """What the labels count in: ``"ms"`` or ``"s"``."""
    scale: float = 1.0
    """Labels' unit per second: 1000 for ms."""

    def at(self, value: float, start: float, end: float) -> float:
        """Where ``value`` falls between the pixels ``start`` (at ``lo``) and ``end`` (at ``hi``)."""
        return start + (end - start) * (value - self.lo) / ((self.hi - self.lo) or 1.0)


def round_steps(below: float) -> list[float]:
    """Round steps (1, 2, 5 times a power of ten) from the smallest at or above ``below``, downwards."""
    power = 10.0 ** math.floor(math.log10(below))
    first = next(m for m in (1.0, 2.0, 5.0, 10.0) if m * power >= below * (1 - 1e-9))
    out = [first * power]
    while len(out) < 6:  # each further step is under half the last: a few always reach a fit
        last = out[-1]
        mantissa = round(last / 10.0 ** math.floor(math.log10(last) + 1e-9), 6)
        out.append(last / 2.5 if mantissa == 5.0 else last / 2.0)
    return out


def seconds_axis(largest: float) -> Axis:
    """A duration axis from 0, in ms under a second and in s above, fitted to ``largest`` seconds."""
    scale, unit = (1.0, "s") if largest >= 1 else (1e3, "ms")
    return _value_axis(largest * scale, scale, unit)


def time_axis(t0: float, t1: float) -> Axis:
    """Seconds from ``t0`` to ``t1``: the axis starts at the round tick at or before ``t0`` and
    ends at ``t1``; ticks every round number of seconds ("0 s, 2 s, 4 s", "0.5 s, 1 s")."""
    span = max(t1 - t0, 1e-9)
    step = round_steps(span / TARGET_TICKS)[0]
    lo = math.floor(t0 / step + 1e-9) * step
    count = math.floor((t1 - lo) / step + 1e-9) + 1
    ticks = tuple(round(lo + k * step, 9) for k in range(count))
    return Axis(lo, max(t1, lo + step / 2), ticks, tuple(_number(t, step) for t in ticks), "s")


def _value_axis(largest: float, scale: float, unit: str) -> Axis:
    """An axis from 0 over values in the labels' unit (``largest`` in it), back in data units."""
    if not largest > 0:
        return Axis(0.0, 1.0 / scale, (0.0, 1.0 / scale), ("0", "1"), unit, scale)
    step = next(s for s in round_steps(largest / TARGET_TICKS) if _top(largest, s) <= FIT * largest)
    count = round(_top(largest, step) / step)
    ticks = tuple(round(k * step, 9) for k in range(count + 1))
    labels = tuple(_number(t, step) for t in ticks)
    return Axis(0.0, ticks[-1] / scale, tuple(t / scale for t in ticks), labels, unit, scale)


def _top(largest: float, step: float) -> float:
    """The first multiple of ``step`` at or above ``largest``."""
    return math.ceil(largest / step - 1e-9) * step


def _number(value: float, step: float) -> str:
    """``value`` with as many decimals as ``step`` needs, none trailing: "0", "0.2", "1000"."""
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text
