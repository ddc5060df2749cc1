"""What each card's change saves in energy, and money where the user gave a price."""

from __future__ import annotations

import dataclasses

from perfmagic.advise.card import Card
from perfmagic.analyze.steady import Steady
from perfmagic.contract import Energy


def with_energy_savings(cards: list[Card], energy: Energy | None, steady: Steady | None) -> list[Card]:
    """Each time-saving card with its saving per hour of training in joules (``saving_j_per_hour``)
    and, priced, in money (``saving_cost_per_hour``): the same work in the shorter step at the
    measured power. An estimate: power is taken as it was measured."""
    if energy is None or steady is None or steady.step_s <= 0:
        return cards
    out = []
    for card in cards:
        if card.saving_s and card.saving_s > 0:
            share = min(card.saving_s / steady.step_s, 1.0)
            metrics = {**card.metrics, "saving_j_per_hour": energy["watts_mean"] * 3600.0 * share}
            if energy["cost_per_hour"] is not None:
                metrics["saving_cost_per_hour"] = energy["cost_per_hour"] * share
            card = dataclasses.replace(card, metrics=metrics)
        out.append(card)
    return out
