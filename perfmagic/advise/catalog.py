"""The rule catalog; cards come out most valuable first."""

from __future__ import annotations

from collections.abc import Callable

from perfmagic.advise.card import Card
from perfmagic.analyze import Analysis

Rule = Callable[[Analysis], "Card | None"]

RULES: list[Rule] = []


def advise(analysis: Analysis) -> list[Card]:
    cards = [card for rule in RULES if (card := rule(analysis)) is not None]
    return sorted(cards, key=lambda c: -(c.saving_s or 0.0))
