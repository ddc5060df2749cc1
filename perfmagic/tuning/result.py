"""One knob's result, as the report's ``tuning`` key holds it (its type: :class:`perfmagic.contract.KnobResult`)."""

from __future__ import annotations

import math

from perfmagic.contract import KnobResult, Trial


def knob_result(
    knob: str,
    unit: str | None,
    tried: list[Trial],
    baseline: Trial | None,
    best: Trial | None,
    notes: list[str],
) -> KnobResult:
    """``{knob, unit, baseline, tried, best, speedup, notes}``; ``best`` None where nothing could be compared."""
    speedup = None
    if baseline is not None and best is not None:
        speedup = baseline["seconds"] / best["seconds"] if best["seconds"] > 0 else math.inf
    return {
        "knob": knob,
        "unit": unit,
        "baseline": baseline,
        "tried": tried,
        "best": best,
        "speedup": speedup,
        "notes": notes,
    }


def seconds_saved(result: KnobResult) -> float | None:
    """What the best setting saves on the baseline's seconds, by the knob's ``speedup`` (turn by turn
    where the settings took turns); None where nothing was compared."""
    baseline, speedup = result["baseline"], result["speedup"]
    if baseline is None or speedup is None or result["best"] is None:
        return None
    return max(0.0, baseline["seconds"] * (1 - 1 / speedup))
