"""Two GPU traces compared kernel by kernel, as HolisticTraceAnalysis's TraceDiff compares operators:
each GPU event name's count and total time over each trace's GPU window."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfmagic.contract import GpuSection
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


def kernel_changes(before: GpuSection, after: GpuSection) -> list[KernelChange]:
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


def gpu_lines(gpu: dict[str, tuple[Any, Any]], kernels: list[KernelChange]) -> list[str]:
    """The GPU figures before → after, and the kernels whose total time changed most, as text."""
    if not gpu:
        return []
    figures = ", ".join(
        f"{k.removesuffix('_fraction').replace('_', '-')} {fmt_fraction(a)} → {fmt_fraction(b)}"
        for k, (a, b) in gpu.items()
        if k.endswith("_fraction") and k not in ("idle_fraction", "memory_fraction")
    )
    lines = ["", f"GPU (trace): {figures}"]
    changed = [k for k in kernels if k.delta_s is not None and abs(k.delta_s) >= 5e-7]
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
