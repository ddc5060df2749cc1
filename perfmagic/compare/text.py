"""A comparison as plain text, for terminals, ``print(comparison)`` and a notebook's text fallback."""

from __future__ import annotations

from typing import TYPE_CHECKING

from perfmagic.compare.kernels import gpu_lines
from perfmagic.compare.words import SECTIONS, said, speed_words
from perfmagic.units import fmt_seconds

if TYPE_CHECKING:
    from perfmagic.compare.comparison import Comparison, StageChange


def comparison_text(c: Comparison) -> str:
    head = "perfmagic comparison: before → after"
    lines = [head, "=" * len(head), c.headline, ""]
    words = speed_words(c.speedup)
    verdict = f"  ({words})" if words else ""
    lines.append(
        f"step (mean after warm-up): {fmt_seconds(c.step_before_s)} → {fmt_seconds(c.step_after_s)}{verdict}"
    )
    if c.step_before_s is not None and c.step_after_s is not None:
        saved = c.step_before_s - c.step_after_s
        lines.append(
            f"measured saving: {fmt_seconds(saved)}/step"
            if saved >= 0
            else f"measured cost: {fmt_seconds(-saved)}/step more"
        )
    lines += _stage_table(c.stages)
    lines += gpu_lines(c.gpu, c.kernels)
    for status, title in SECTIONS.items():
        matches = [m for m in c.problems if m.status == status]
        lines += ["", f"{title} ({len(matches)})" + (":" if matches else "")]
        lines += [f"  {said(m)}" for m in matches]
    return "\n".join(lines)


def _stage_table(stages: list[StageChange]) -> list[str]:
    """Each stage's mean per step before and after, the largest first; stages of no time left out."""
    if not stages:
        return []
    width = max(len(c.name) for c in stages)
    lines = ["", f"  {'stage':<{width}}  {'before':>9}  {'after':>9}  {'change':>10}"]
    shown = [c for c in stages if max(c.before_s, c.after_s) >= 5e-7]
    for c in sorted(shown, key=lambda c: -max(c.before_s, c.after_s)):
        small = abs(c.delta_s) < 5e-7  # below what the table can show
        sign = " " if small else "+" if c.delta_s > 0 else "−"
        lines.append(
            f"  {c.name:<{width}}  {fmt_seconds(c.before_s):>9}  {fmt_seconds(c.after_s):>9}  "
            f"{sign + fmt_seconds(abs(c.delta_s)):>10}"
        )
    return lines
