"""The cards as one plan: changes in order, each saving what the ones before it left to save.

Every rule estimates its saving as if its fix were the only change. Two fixes of the same stage
(more workers, and a loop that prefetches) cannot both take the whole data wait, and three cards
that each claim half the step do not make it six times faster. The plan applies the fixes in order
of their own savings against one account of the step, its mean seconds per stage: a fix takes at
most what its stages still hold (the whole step, for a fix of the machine or a saving larger than
its stages, measured on the device), and the cards' savings
become those marginal ones, so they add up to the observed step less the plan's predicted step.

A card that frees memory instead (``metrics["freed_bytes"]``: the memory cards) is a change too: it
saves no time and costs its ``metrics["step_cost_s"]`` (checkpointing's forward run again), so its
saving is that cost, negative, and the predicted step grows by it; it keeps the bytes it frees.

A saving's interval is the spread of the steps: the marginal saving as a share of its stages,
times their 10th and 90th percentile per step (a tuning measurement brings its own interval).
A saving is uncertain where that interval is wider than ±25% of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

from perfmagic.advise.card import SEVERITIES, Card, severity_for
from perfmagic.analyze.steady import Steady

UNCERTAIN = 0.25
"""A saving whose p10–p90 half-width exceeds this share of it is called uncertain."""

RESIDUE = 0.005
"""A symptom left less than this share of the step by the fixes before it is no change of the plan:
half a point is within what the step's own estimates move by between runs and recordings."""

CHANGE = re.compile(r"([A-Za-z_][\w.]*)\s*[=(]\s*([^\s,()#]+)\)?,?\s*#\s*was\s+([^\s,;)]+)")
"""A fix line that changes a setting, with the value it had: ``num_workers=2,  # was 0``,
``torch.set_num_threads(1)  # was 2`` (the knob, the new value, the old one)."""


def knob_changes(fix: str) -> dict[str, tuple[str, str]]:
    """The settings a fix changes: knob -> (new value, the value it was)."""
    found = (CHANGE.search(line) for line in fix.splitlines())
    return {m.group(1): (m.group(2), m.group(3)) for m in found if m}


@dataclass(frozen=True)
class Change:
    """One card's place in the plan."""

    id: str
    saving_s: float  # marginal: what it saves after the changes before it
    alone_s: float  # what it would save as the only change
    low_s: float  # p10 of the marginal saving
    high_s: float  # p90
    step_s: float  # the step predicted once it and every change before it are made
    uncertain: bool
    freed_bytes: int | None = None  # a memory card's: the memory it frees (its saving: minus its step cost)


@dataclass(frozen=True)
class SetAside:
    """A card left out of the plan, and why."""

    id: str
    reason: str


@dataclass(frozen=True)
class Plan:
    step_s: float  # the observed steady step (mean)
    predicted_step_s: float  # with every change made
    changes: list[Change]
    set_aside: list[SetAside]


def plan_of(
    cards: list[Card],
    steady: Steady | None,
    stages_of: dict[str, str],
    symptoms: frozenset[str] = frozenset(),
) -> tuple[Plan | None, list[Card]]:
    """The plan of ``cards`` (most saving first) and the cards in its order, their savings made marginal.

    ``stages_of`` maps an advice id to the stages its fix acts on (space-separated); the others act
    on the whole step. ``symptoms`` are ids that measure what the step lacks (an idle GPU) rather
    than fix a cause: they come after the fixes and take what those leave. A card that sets a knob
    an earlier card set to another value is set aside. Cards without a per-step saving keep their
    place and take no part.
    """
    if steady is None or steady.count == 0 or steady.step_s <= 0:
        return None, cards
    cards = sorted(cards, key=lambda c: c.id in symptoms)  # stable: by saving within each group
    left = {name: steady.stage_s(name) for name in steady.stages}
    chosen: dict[str, tuple[str, str]] = {}
    changes: list[Change] = []
    taken: dict[str, float] = {}
    set_aside: list[SetAside] = []
    out: list[Card] = []
    step = steady.step_s
    for card in cards:
        if card.saving_s is None and card.metrics.get("freed_bytes") is not None:
            cost = float(card.metrics.get("step_cost_s") or 0.0)
            step += cost
            saving = 0.0 - cost  # 0.0 where it costs nothing, not -0.0
            freed = int(card.metrics["freed_bytes"])
            changes.append(Change(card.id, saving, saving, saving, saving, step, False, freed))
            out.append(card)
            continue
        if card.saving_s is None or "one_time_s" in card.metrics:
            out.append(card)
            continue
        conflict = _conflict(card, chosen)
        if conflict:
            set_aside.append(SetAside(card.id, conflict))
            continue
        names = [n for n in stages_of.get(card.id, "").split() if n in left]
        if not names or card.saving_s > sum(steady.stage_s(n) for n in names) * (1 + 1e-9):
            names = list(left)  # a saving measured elsewhere (a trace's exposed NCCL time): the whole step
        # a card whose saving is another card's fix (input_bound's, where workers would remove the wait)
        # saves only what that card did not
        already = taken.get(card.metrics.get("saving_of") or "", 0.0)
        saving = max(0.0, min(card.saving_s - already, sum(left[n] for n in names)))
        if card.id in symptoms and saving <= RESIDUE * steady.step_s:
            # all of it saved by the fixes before, but for a sliver no estimate can tell from none:
            # what remains, no change
            metrics = {**card.metrics, "saving_alone_s": card.saving_s}
            out.append(replace(card, saving_s=None, speedup=None, metrics=metrics))
            continue
        _take(left, names, saving)
        taken[card.id] = saving
        step -= saving
        low, high = _interval(card, saving, steady, names)
        uncertain = saving <= 0 or (high - low) / 2 > UNCERTAIN * saving
        changes.append(Change(card.id, saving, card.saving_s, low, high, step, uncertain))
        out.append(_marginal(card, saving, low, high, uncertain, card.id in symptoms))
    return Plan(steady.step_s, step, changes, set_aside), out


def _conflict(card: Card, chosen: dict[str, tuple[str, str]]) -> str | None:
    """Why ``card`` cannot join the plan (a knob an earlier card set otherwise), recording its knobs."""
    mine = knob_changes(card.fix)
    for knob, (value, _) in mine.items():
        if knob in chosen and chosen[knob][0] != value:
            other_value, other = chosen[knob]
            return f"it sets {knob}={value}; {other}, which saves more, sets {knob}={other_value}"
    for knob, (value, _) in mine.items():
        chosen.setdefault(knob, (value, card.id))
    return None


def _take(left: dict[str, float], names: list[str], seconds: float) -> None:
    """Take ``seconds`` from the stages, in proportion to what each still holds."""
    held = sum(left[n] for n in names)
    if held <= 0:
        return
    for n in names:
        left[n] -= seconds * left[n] / held


def _interval(card: Card, saving: float, steady: Steady, names: list[str]) -> tuple[float, float]:
    """p10 and p90 of the marginal saving: the card's own interval where it measured one, else the steps'."""
    own = card.metrics.get("saving_interval_s")
    if own and card.saving_s:
        scale = saving / card.saving_s
        return own[0] * scale, own[1] * scale
    idx = [steady.stages.index(n) for n in names]
    per_step = steady.seconds[:, idx].sum(axis=1) if len(idx) < len(steady.stages) else steady.durations
    mean = float(per_step.mean())
    if mean <= 0:
        return saving, saving
    low, high = np.percentile(per_step, [10, 90])
    return saving * float(low) / mean, saving * float(high) / mean


def _marginal(card: Card, saving: float, low: float, high: float, uncertain: bool, symptom: bool) -> Card:
    step = card.metrics.get("step_s") or 0.0
    metrics = {
        **card.metrics,
        "saving_alone_s": card.saving_s,
        "saving_interval_s": [low, high],
        "uncertain": uncertain,
    }
    speedup = step / (step - saving) if step > saving else None
    # a saving made smaller lowers a fix's severity (one its rule set lower stays there); a symptom's
    # is the size of what it measured, whatever the fixes before it take
    severity = (
        card.severity if symptom else max(card.severity, severity_for(saving, step), key=SEVERITIES.index)
    )
    return replace(card, saving_s=saving, speedup=speedup, metrics=metrics, severity=severity)
