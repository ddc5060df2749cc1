"""The advice card: what a rule says about one bottleneck, and how its severity follows from its saving.

Savings are seconds per steady-state step (the steps after the first, which
carries the warm-up). ``speedup = step / (step - saving)``. Each card states the
model behind its saving in ``metrics["saving_model"]``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from perfmagic.contract import Card as CardData
from perfmagic.contract import Severity
from perfmagic.contract.code import FixSite

SEVERITIES: tuple[Severity, ...] = ("high", "medium", "low", "info")
SERIOUS: frozenset[Severity] = frozenset({"high", "medium"})
"""Severities of a problem worth fixing first: where a card of one fires, ``compute_bound`` is not shown."""

HIGH_SAVING = 0.25
"""A card is ``high`` when fixing it saves at least this share of the step…"""
MEDIUM_SAVING = 0.10
"""…``medium`` from this share, ``low`` below."""


@dataclass(frozen=True)
class Card:
    """One piece of advice, with the measured evidence that fired it.

    ``saving_s`` is the estimated seconds saved per step; ``speedup`` the
    estimated step-time ratio before/after the fix (both ``None`` when the
    rule cannot estimate them). ``replaces`` is the user's statement the fix takes the place of,
    where it is their own call rewritten.
    """

    id: str
    severity: Severity
    title: str
    evidence: str
    fix: str
    metrics: dict[str, Any] = field(default_factory=dict)
    saving_s: float | None = None
    speedup: float | None = None
    replaces: FixSite | None = None

    def to_dict(self) -> CardData:
        return {
            "id": self.id,
            "severity": self.severity,
            "title": self.title,
            "evidence": self.evidence,
            "fix": self.fix,
            "metrics": copy.deepcopy(self.metrics),
            "saving_s": self.saving_s,
            "speedup": self.speedup,
            "replaces": FixSite(**self.replaces) if self.replaces else None,
        }


def severity_for(saving_s: float, step_s: float) -> Severity:
    share = saving_s / step_s if step_s > 0 else 0.0
    if share >= HIGH_SAVING:
        return "high"
    if share >= MEDIUM_SAVING:
        return "medium"
    return "low"


def make_card(
    id: str,
    title: str,
    evidence: str,
    fix: str,
    metrics: dict[str, Any],
    *,
    saving_s: float | None,
    step_s: float | None,
    model: str | None,
    severity: Severity | None = None,
    replaces: FixSite | None = None,
) -> Card:
    """A card whose severity (unless given) and speedup follow from its saving."""
    speedup = None
    if saving_s is not None and step_s and step_s > saving_s:
        speedup = step_s / (step_s - saving_s)
    if severity is None:
        severity = severity_for(saving_s or 0.0, step_s or 0.0)
    full = dict(metrics)
    if step_s is not None:
        full["step_s"] = step_s
    if model is not None:
        full["saving_model"] = model
    return Card(id, severity, title, evidence, fix, full, saving_s, speedup, replaces)
