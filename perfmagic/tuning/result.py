"""One knob's result, as the report's ``tuning`` key holds it."""

from __future__ import annotations

import math
from typing import Any


def knob_result(
    knob: str,
    unit: str | None,
    tried: list[dict[str, Any]],
    baseline: dict[str, Any] | None,
    best: dict[str, Any] | None,
    notes: list[str],
) -> dict[str, Any]:
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
