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
