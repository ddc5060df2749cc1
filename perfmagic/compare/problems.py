"""Problems across two reports: what a change resolved, what is still open, what is new.

A problem is a stage (or group of stages) and a cause (:mod:`perfmagic.advise.about`): the cards a
report has about it, or its headline where no card is. Two reports' problems match by stage and
cause, whichever card says them (``input_bound`` before, ``dataloader_workers`` after). A problem
whose cause is gone but whose stage still takes more than the rule's threshold is still open: the
wait remains, with another cause or none named. An open problem is told in the after report's words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from perfmagic.advise.about import About, about, stage_problem, stages_of
from perfmagic.advise.card import SEVERITIES
from perfmagic.advise.catalog import MINOR_SAVING
from perfmagic.advise.headline import caused, stage_words
from perfmagic.contract import Card, MinorCard, ReportData, Severity
from perfmagic.units import fmt_fraction

Status = Literal["resolved", "open", "new"]
STATUSES: tuple[Status, ...] = ("resolved", "open", "new")

Key = tuple[tuple[str, ...], str]
"""A problem's stages and cause."""


@dataclass(frozen=True)
class Problem:
    """One problem of one report, in that report's words and numbers."""

    stages: tuple[str, ...]  # () : the machine or the whole step
    about: About
    share: float | None  # the stages' share of this report's step (None: no stages, or none measured)
    seconds: float | None  # their mean seconds per steady step
    title: str  # the most valuable card's title, else the stages' time in words
    cards: tuple[Card, ...] = ()  # most valuable first; () where only the headline or a share names it
    minor: tuple[MinorCard, ...] = ()

    @property
    def key(self) -> Key:
        return self.stages, self.about.cause

    @property
    def ids(self) -> list[str]:
        return [c["id"] for c in self.cards] + [m["id"] for m in self.minor]

    @property
    def severity(self) -> Severity | None:
        """The most severe of its cards (None: no card)."""
        return min((c["severity"] for c in self.cards), key=SEVERITIES.index, default=None)

    @property
    def one_time_s(self) -> float | None:
        """A one-time cost its top card names (start-up, compilation) rather than a saving per step."""
        once = self.cards[0]["metrics"].get("one_time_s") if self.cards else None
        return float(once) if once else None

    @property
    def saving_s(self) -> float | None:
        """Its cards' savings per step, added: the plan's marginal savings, each counted once."""
        savings = [c["saving_s"] for c in self.cards if c["saving_s"]]
        savings = savings or [m["saving_s"] for m in self.minor if m["saving_s"]]
        return sum(savings) if savings else None


@dataclass(frozen=True)
class ProblemMatch:
    """A problem of either report and what became of it; its stages' figures in both reports."""

    status: Status
    before: Problem | None  # None: new
    after: Problem | None  # None: resolved
    share_before: float | None
    share_after: float | None
    seconds_before: float | None
    seconds_after: float | None

    @property
    def now(self) -> Problem:
        """The problem as the after report tells it; a resolved one as the before report did."""
        told = self.after or self.before
        assert told is not None
        return told

    @property
    def stages(self) -> tuple[str, ...]:
        return self.now.stages


def stage_figures(report: ReportData, stages: Sequence[str]) -> tuple[float | None, float | None]:
    """The stages' share of the step and mean seconds per step: 0 for a stage the steps never entered,
    None for no stages, or a report without steps."""
    table = report.get("stages") or {}
    if not stages or not table:
        return None, None
    present = [table[n] for n in stages if n in table]
    seconds = sum(s["mean_s"] if s.get("mean_s") is not None else s["median_s"] for s in present)
    return sum(s["fraction"] for s in present), seconds


def problems_of(report: ReportData) -> list[Problem]:
    """The report's problems, most valuable first: its cards and minor cards grouped by stage and cause,
    then its headline's stage where no card is about it."""
    cards: dict[Key, list[Card]] = {}
    minor: dict[Key, list[MinorCard]] = {}
    found: dict[Key, About] = {}
    for card in report.get("advice") or []:
        key = stages_of(card["id"]), about(card["id"]).cause
        found.setdefault(key, about(card["id"]))
        cards.setdefault(key, []).append(card)
    for entry in report.get("advice_minor") or []:
        key = stages_of(entry["id"]), about(entry["id"]).cause
        found.setdefault(key, about(entry["id"]))
        minor.setdefault(key, []).append(entry)
    name = report.get("bottleneck")
    if name and report["steps"].get("count") and not any(name in stages for stages, _ in found):
        stages, said = stage_problem(name)
        found.setdefault((stages, said.cause), said)
    return [_problem(report, key[0], found[key], cards.get(key, []), minor.get(key, [])) for key in found]


def _problem(
    report: ReportData, stages: tuple[str, ...], said: About, cards: list[Card], minor: list[MinorCard]
) -> Problem:
    share, seconds = stage_figures(report, stages)
    if cards:
        title = cards[0]["title"]
    elif stages:
        title = _words(report, stages, share)
    else:  # a rule of the machine that fired with too little to gain for a card
        title = f"{', '.join(m['id'] for m in minor)}: under {fmt_fraction(MINOR_SAVING)} of a step to gain"
    return Problem(stages, said, share, seconds, title, tuple(cards), tuple(minor))


def _words(report: ReportData, stages: tuple[str, ...], share: float | None) -> str:
    """The stages' time in words, with the card naming its cause where the headline names one."""
    name = report.get("bottleneck")
    return caused(stage_words(stages, share, report), report, name if name in stages else None)


def match_problems(before: ReportData, after: ReportData) -> list[ProblemMatch]:
    """Every problem of either report, matched: resolved first, then still open, then new.

    A problem of the before report is still open where the after report has one of the same stages
    and cause; else one of the same stages (another cause: the wait remains); else where its stages
    still take at least its rule's threshold (no cause named). Otherwise it is resolved, unless it
    was a state, not a fault (compute-bound). The after report's problems left over are new.
    """
    left = problems_of(after)
    pairs: list[tuple[Problem, Problem | None]] = []
    pending: list[Problem] = []
    for p in problems_of(before):
        twin = next((q for q in left if q.key == p.key), None)
        if twin is None:
            pending.append(p)
            continue
        left.remove(twin)
        pairs.append((p, twin))
    for p in pending:
        twin = next((q for q in left if _same_stages(p, q)), None)
        if twin is not None:
            left.remove(twin)
        pairs.append((p, twin or _still_long(p, after)))
    resolved = [_match(before, after, p, None) for p, q in pairs if q is None and p.about.fault]
    still = [_match(before, after, p, q) for p, q in pairs if q is not None]
    return resolved + still + [_match(before, after, None, q) for q in left]


def _same_stages(p: Problem, q: Problem) -> bool:
    """Two problems of a stage's share (a wait) about the same stages, with different causes."""
    return (
        p.about.threshold is not None
        and q.about.threshold is not None
        and bool(set(p.stages) & set(q.stages))
    )


def _still_long(p: Problem, after: ReportData) -> Problem | None:
    """``p``'s stages in the after report where they still take at least its rule's threshold."""
    share, seconds = stage_figures(after, p.stages)
    if p.about.threshold is None or share is None or share < p.about.threshold:
        return None
    return Problem(p.stages, p.about, share, seconds, _words(after, p.stages, share))


def _match(before: ReportData, after: ReportData, old: Problem | None, new: Problem | None) -> ProblemMatch:
    status: Status = "new" if old is None else "resolved" if new is None else "open"
    told = new or old
    assert told is not None
    share_before, seconds_before = stage_figures(before, told.stages)
    share_after, seconds_after = stage_figures(after, told.stages)
    return ProblemMatch(status, old, new, share_before, share_after, seconds_before, seconds_after)
