"""The report's headline: the bottleneck in words that fit what was measured and agree with the cards.

Read from the report dictionary alone (render and compare both say it). Where no card is about the
stage the headline names, the headline says why with the card that names its cause (a crowded machine
starving the loaders), rather than leave "input-bound" standing beside no input card.
"""

from __future__ import annotations

from collections.abc import Sequence

from perfmagic.advise.about import addresses, explains
from perfmagic.contract import ReportData
from perfmagic.units import fmt_fraction

BOUND = {
    "data": "Input-bound",
    "h2d": "Copy-bound",
    "forward": "Compute-bound",
    "backward": "Compute-bound",
    "optimizer": "Optimizer-bound",
    "checkpoint": "Checkpoint-bound",
    "logging": "Logging-bound",
    "comm": "Communication-bound",
}
"""What a run is when the stage takes the largest share (``other`` is no kind of bound: it is unknown)."""

DOING = {
    "data": "waiting for the next batch takes",
    "h2d": "host-to-device copies take",
    "forward": "the forward pass takes",
    "backward": "the backward pass takes",
    "optimizer": "the optimizer takes",
    "checkpoint": "saving checkpoints takes",
    "logging": "logging and printing take",
    "comm": "waiting for collectives takes",
    "other": "untracked work (outside the known stages) takes",
}
"""Each built-in stage's time, in words, up to its share."""

SYNCS = ("Sync-bound", "logging and host-device syncs take")
"""``logging`` where host-device syncs were counted in it: there is a device to sync with."""


def headline(report: ReportData) -> str:
    """The bottleneck in words (or why there is none), with its cause where no card of its own says it."""
    name = report["bottleneck"]
    if not name:
        return "no training steps were seen" if not report["steps"]["count"] else "no bottleneck found"
    stage = report["stages"].get(name)
    bound = SYNCS[0] if name == "logging" and syncs_seen(report) else BOUND.get(name)
    words = stage_words((name,), stage["fraction"] if stage else None, report)
    return caused(f"{bound}: {words[0].lower()}{words[1:]}" if bound else words, report, name)


def stage_words(stages: Sequence[str], share: float | None, report: ReportData | None = None) -> str:
    """``Waiting for the next batch takes 40% of each step``: stages' time as the headline words it."""
    if len(stages) > 1:
        doing = f"{', '.join(stages[:-1])} and {stages[-1]} take"
    elif stages[0] == "logging" and report is not None and syncs_seen(report):
        doing = SYNCS[1]
    else:
        doing = DOING.get(stages[0], f"your stage “{stages[0]}” takes")
    return f"{doing[0].upper()}{doing[1:]} {fmt_fraction(share)} of each step"


def syncs_seen(report: ReportData) -> bool:
    """Host-device syncs counted in the logging stage (the logging card says), else a device seen at all."""
    for card in report["advice"]:
        if card["id"] == "sync_logging" and "syncs_per_step" in card["metrics"]:
            return bool(card["metrics"]["syncs_per_step"])
    return bool(report["devices"] or report["gpu"] or any("gpu" in r for r in report["ranks"]))


def caused(words: str, report: ReportData, stage: str | None) -> str:
    """``words`` about ``stage``, and the card naming its cause where no card is about the stage itself."""
    cause = cause_card_title(report, stage) if stage else None
    return f"{words}; cause: {cause}" if cause else words


def cause_card_title(report: ReportData, stage: str) -> str | None:
    """The title of the card naming what lengthens ``stage``, where no card or minor card is about it."""
    cards, minor = report["advice"], report["advice_minor"]
    if any(addresses(c, stage) for c in cards) or any(addresses(m, stage) for m in minor):
        return None
    return next((c["title"] for c in cards if explains(c, stage)), None)
