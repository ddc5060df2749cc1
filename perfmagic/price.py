"""The price of a GPU-hour the user gives, for the report's cost figures (never a guessed one)."""

from __future__ import annotations

import os

PRICE_ENV = "PERFMAGIC_PRICE_PER_GPU_HOUR"
"""The price of one GPU for an hour, for the report's cost figures (``price_per_gpu_hour``)."""


def gpu_hour_price(option: float | None) -> float | None:
    """The price of one GPU for an hour: the option, else ``$PERFMAGIC_PRICE_PER_GPU_HOUR``, else none."""
    if option is None:
        text = os.environ.get(PRICE_ENV, "").strip()
        if not text:
            return None
        try:
            option = float(text)
        except ValueError:
            raise ValueError(f"{PRICE_ENV} must be a number (a price per GPU-hour), got {text!r}") from None
    if isinstance(option, bool) or not isinstance(option, (int, float)) or not 0 < option < float("inf"):
        raise ValueError(f"price_per_gpu_hour must be a positive number, got {option!r}")
    return float(option)
