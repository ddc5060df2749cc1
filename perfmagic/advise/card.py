"""The advice card: what a rule says about one bottleneck."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Severity = Literal["high", "medium", "low", "info"]
SEVERITIES: tuple[Severity, ...] = ("high", "medium", "low", "info")


@dataclass(frozen=True)
class Card:
    """One piece of advice, with the measured evidence that fired it.

    ``saving_s`` is the estimated seconds saved per step; ``speedup`` the
    estimated step-time ratio before/after the fix (both ``None`` when the
    rule cannot estimate them).
    """

    id: str
    severity: Severity
    title: str
    evidence: str
    fix: str
    metrics: dict[str, Any] = field(default_factory=dict)
    saving_s: float | None = None
    speedup: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
