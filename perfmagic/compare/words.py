"""What a comparison says of each problem, in one line that the text and the HTML both show."""

from __future__ import annotations

from perfmagic.compare.problems import ProblemMatch, Status
from perfmagic.units import fmt_fraction, fmt_seconds

SECTIONS: dict[Status, str] = {"resolved": "Resolved", "open": "Still open", "new": "New"}
"""Each status's heading, in the order the comparison lists them."""


def speed_words(speedup: float | None) -> str:
    """``1.35x faster`` or ``1.25x slower`` (never ``0.80x``), the same in text and HTML."""
    if speedup is None:
        return ""
    return f"{speedup:.2f}x faster" if speedup >= 1 else f"{1 / speedup:.2f}x slower"


def said(m: ProblemMatch) -> str:
    """``[medium] Use 4 DataLoader workers instead of 3 — data 87% → 40% of the step (…); saves ~8.0 ms
    per step``: the after report's words for an open or new problem, the before's for a resolved one,
    its stages before → after, and what fixing it saves (or was to save)."""
    now = m.now
    line = f"[{now.severity}] {now.title}" if now.severity else now.title
    change = stage_change(m)
    if change:
        line += f" — {change}"
    if now.one_time_s:
        line += f"; one-time cost ~{fmt_seconds(now.one_time_s)}"
    elif now.saving_s:
        verb = "was predicted to save" if m.status == "resolved" else "saves"
        line += f"; {verb} ~{fmt_seconds(now.saving_s)} per step"
    return line


def stage_change(m: ProblemMatch) -> str:
    """``data 87% → 40% of the step (34.8 ms → 6.0 ms per step)``; empty for a problem of no stage."""
    if m.share_before is None and m.share_after is None:
        return ""
    return (
        f"{'+'.join(m.stages)} {fmt_fraction(m.share_before)} → {fmt_fraction(m.share_after)} of the step "
        f"({fmt_seconds(m.seconds_before)} → {fmt_seconds(m.seconds_after)} per step)"
    )
