"""Before/after comparison of two reports: did the fix work?

Works from report dictionaries alone (reports read back from JSON). Step and stage
times are the reports' own means over their steady steps (after the warm-up), the
window every figure of a report uses; that is what throughput follows, periodic
checkpoints included. Reports with GPU trace figures (``perfmagic report``, ``--trace``
runs) are also compared kernel by kernel, as HolisticTraceAnalysis's TraceDiff compares
operators: each GPU event name's count and total time over each trace's GPU window.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perfmagic.contract import Card, GpuSection, ReportData
from perfmagic.contract.gpu import KernelRow
from perfmagic.units import fmt_fraction, fmt_seconds

GPU_FIGURES = (
    "busy_fraction",
    "idle_fraction",
    "compute_fraction",
    "non_compute_fraction",
    "comm_fraction",
    "memory_fraction",
    "window_s",
)
"""The ``gpu`` figures a comparison shows before and after."""
KERNELS_SHOWN = 10


@dataclass(frozen=True)
class KernelChange:
    """One GPU event name in two traces; None where that report's table left it out (too short to keep)."""

    name: str
    kind: str
    count_before: int | None
    count_after: int | None
    before_s: float | None
    after_s: float | None

    @property
    def delta_s(self) -> float | None:
        return None if self.before_s is None or self.after_s is None else self.after_s - self.before_s


@dataclass(frozen=True)
class StageChange:
    name: str
    before_s: float  # mean seconds per step
    after_s: float

    @property
    def delta_s(self) -> float:
        return self.after_s - self.before_s


class Comparison:
    """Per-stage times, speed-up and advice before and after a change."""

    def __init__(self, before: ReportData, after: ReportData) -> None:
        self.before, self.after = before, after
        self.step_before_s, stages_before = _per_step(before)
        self.step_after_s, stages_after = _per_step(after)
        names = [*stages_before, *(n for n in stages_after if n not in stages_before)]
        self.stages = [StageChange(n, stages_before.get(n, 0.0), stages_after.get(n, 0.0)) for n in names]
        cards_before = {c["id"]: c for c in before.get("advice", [])}
        cards_after = {c["id"]: c for c in after.get("advice", [])}
        self.resolved = [c for i, c in cards_before.items() if i not in cards_after]
        self.remaining = [(c, cards_after[i]) for i, c in cards_before.items() if i in cards_after]
        self.new = [c for i, c in cards_after.items() if i not in cards_before]
        # GPU figures and kernels where both reports have a GPU trace's
        self.gpu: dict[str, tuple[Any, Any]] = {}
        self.kernels: list[KernelChange] = []
        gpu_before, gpu_after = before.get("gpu"), after.get("gpu")
        if gpu_before and gpu_after:
            self.gpu = {k: (gpu_before.get(k), gpu_after.get(k)) for k in GPU_FIGURES}
            self.kernels = _kernel_changes(gpu_before, gpu_after)

    @property
    def speedup(self) -> float | None:
        """Mean step time before over after (> 1: faster)."""
        if self.step_before_s is None or not self.step_after_s:
            return None
        return self.step_before_s / self.step_after_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": {"before_s": self.step_before_s, "after_s": self.step_after_s, "speedup": self.speedup},
            "stages": [
                {"name": c.name, "before_s": c.before_s, "after_s": c.after_s, "delta_s": c.delta_s}
                for c in self.stages
            ],
            "gpu": {
                k: {"before": a, "after": b, "delta": None if a is None or b is None else b - a}
                for k, (a, b) in self.gpu.items()
            }
            or None,
            "kernels": [{**vars(k), "delta_s": k.delta_s} for k in self.kernels],
            "advice": {
                "resolved": [_brief(c) for c in self.resolved],
                "remaining": [{**_brief(a), "saving_after_s": b.get("saving_s")} for a, b in self.remaining],
                "new": [_brief(c) for c in self.new],
            },
        }

    def __str__(self) -> str:
        head = "perfmagic comparison: before → after"
        lines = [head, "=" * len(head)]
        words = speed_words(self.speedup)
        verdict = f"  ({words})" if words else ""
        lines.append(
            f"step (mean after warm-up): {fmt_seconds(self.step_before_s)} → {fmt_seconds(self.step_after_s)}{verdict}"
        )
        if self.step_before_s is not None and self.step_after_s is not None:
            saved = self.step_before_s - self.step_after_s
            lines.append(
                f"measured saving: {fmt_seconds(saved)}/step"
                if saved >= 0
                else f"measured cost: {fmt_seconds(-saved)}/step more"
            )
        if self.stages:
            width = max(len(c.name) for c in self.stages)
            lines += ["", f"  {'stage':<{width}}  {'before':>9}  {'after':>9}  {'change':>10}"]
            shown = [c for c in self.stages if max(c.before_s, c.after_s) >= 5e-7]  # not stages of no time
            for c in sorted(shown, key=lambda c: -max(c.before_s, c.after_s)):
                small = abs(c.delta_s) < 5e-7  # below what the table can show
                sign = " " if small else "+" if c.delta_s > 0 else "−"
                lines.append(
                    f"  {c.name:<{width}}  {fmt_seconds(c.before_s):>9}  {fmt_seconds(c.after_s):>9}  "
                    f"{sign + fmt_seconds(abs(c.delta_s)):>10}"
                )
        lines += self._gpu_lines()
        lines.append("")
        for label, cards in (("resolved", self.resolved), ("new", self.new)):
            for card in cards:
                once = card["metrics"].get("one_time_s")
                predicted = (
                    f" (one-time cost {fmt_seconds(once)})"
                    if once
                    else f" (predicted saving {fmt_seconds(card['saving_s'])}/step)"
                    if card["saving_s"]
                    else ""
                )
                lines.append(f"advice {label}: [{card['severity']}] {card['id']}{predicted}")
        for card, now in self.remaining:
            severity = (
                card["severity"]
                if card["severity"] == now["severity"]
                else f"{card['severity']} → {now['severity']}"
            )
            savings = saving_change(card, now)
            lines.append(f"advice remaining: [{severity}] {card['id']}{f' ({savings})' if savings else ''}")
        if not (self.resolved or self.new or self.remaining):
            lines.append("advice: none before or after")
        return "\n".join(lines)

    def _gpu_lines(self) -> list[str]:
        if not self.gpu:
            return []
        figures = ", ".join(
            f"{k.removesuffix('_fraction').replace('_', '-')} {fmt_fraction(a)} → {fmt_fraction(b)}"
            for k, (a, b) in self.gpu.items()
            if k.endswith("_fraction") and k not in ("idle_fraction", "memory_fraction")
        )
        lines = ["", f"GPU (trace): {figures}"]
        changed = [k for k in self.kernels if k.delta_s is not None and abs(k.delta_s) >= 5e-7]
        if changed:
            lines += [
                "",
                f"  {'kernel (largest changes in total time)':<60}  {'count':>13}  {'before':>9}  {'after':>9}  {'change':>10}",
            ]
            for k in changed[:KERNELS_SHOWN]:
                assert k.before_s is not None and k.after_s is not None and k.delta_s is not None
                name = k.name if len(k.name) <= 60 else k.name[:57] + "..."
                sign = "+" if k.delta_s > 0 else "−"
                lines.append(
                    f"  {name:<60}  {f'{k.count_before} → {k.count_after}':>13}  {fmt_seconds(k.before_s):>9}  "
                    f"{fmt_seconds(k.after_s):>9}  {sign + fmt_seconds(abs(k.delta_s)):>10}"
                )
        return lines


def compare(before: ReportData, after: ReportData) -> Comparison:
    return Comparison(before, after)


def _per_step(report: ReportData) -> tuple[float | None, dict[str, float]]:
    """Mean step time and mean seconds per stage over the steady steps: the report's own figures."""
    steps = report.get("steps") or {}
    steady = (steps.get("count") or 0) - (steps.get("warmup") or 0)
    if steady <= 0:
        return None, {}
    per_s = steps.get("per_s")
    stages = report.get("stages") or {}
    return (1 / per_s if per_s else None), {
        name: s["mean_s"] if s.get("mean_s") is not None else s["total_s"] / steady
        for name, s in stages.items()
    }


def speed_words(speedup: float | None) -> str:
    """``1.35x faster`` or ``1.25x slower`` (never ``0.80x``), the same in text and HTML."""
    if speedup is None:
        return ""
    return f"{speedup:.2f}x faster" if speedup >= 1 else f"{1 / speedup:.2f}x slower"


def saving_change(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """A still-open card's saving before and after the change."""
    if not before.get("saving_s") or not after.get("saving_s"):
        return ""
    return f"saving {fmt_seconds(before['saving_s'])} → {fmt_seconds(after['saving_s'])}/step"


def _kernel_changes(before: GpuSection, after: GpuSection) -> list[KernelChange]:
    """Every GPU event name of either trace, the largest change in total time first.

    A name missing from one table is 0 there, unless that table left names out
    (``kernels_omitted``): then it is unknown (None), short enough to be among them.
    """
    tables: list[tuple[dict[str, KernelRow], bool]] = []
    for gpu in (before, after):
        rows = {k["name"]: k for k in gpu.get("kernels") or []}
        tables.append((rows, gpu.get("kernels_omitted") is None))
    (rows_a, whole_a), (rows_b, whole_b) = tables
    names = [*rows_a, *(n for n in rows_b if n not in rows_a)]

    def side(rows: dict[str, Any], whole: bool, name: str, key: str, zero: float) -> Any:
        if name in rows:
            return rows[name][key]
        return zero if whole else None

    changes = [
        KernelChange(
            name,
            (rows_a.get(name) or rows_b[name])["kind"],
            side(rows_a, whole_a, name, "count", 0),
            side(rows_b, whole_b, name, "count", 0),
            side(rows_a, whole_a, name, "total_s", 0.0),
            side(rows_b, whole_b, name, "total_s", 0.0),
        )
        for name in names
    ]
    return sorted(changes, key=lambda k: -abs(k.delta_s) if k.delta_s is not None else 0.0)


def _brief(card: Card) -> dict[str, Any]:
    return {k: card.get(k) for k in ("id", "severity", "title", "saving_s", "metrics")}
