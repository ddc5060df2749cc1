"""Where the memory goes, drawn: a stacked bar per device (parameters, gradients, optimizer state,
activations, other, fragmentation), in the text report, the HTML/notebook report and the still PNG.

The bars are built first as plain data (:func:`memory_bars`): the HTML and the PNG only place them,
and tests read them from that data.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from perfmagic.analyze.memory import CATEGORIES, parts
from perfmagic.contract import ReportData
from perfmagic.contract.memory import Category, HostMemory, MemoryDevice
from perfmagic.units import fmt_bytes, fmt_fraction

COLORS: dict[Category, str] = {  # apart from the stages' colours: the bars sit beside the waterfall
    "parameters": "#2f4b7c",
    "gradients": "#3f9f9f",
    "optimizer_state": "#a05195",
    "activations": "#d45087",
    "other": "#d9d9d9",
    "fragmentation": "#ffa600",
}
NAMES: dict[Category, str] = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "activations": "activations",
    "other": "other",
    "fragmentation": "fragmentation",
}
BAR_HEIGHT = 16  # px of a device's bar in the PNG strip
STRIP_TOP = 12  # px from the strip's top to its first bar


@dataclass(frozen=True)
class MemoryBar:
    """One device's bar: its parts in drawing order (only parts with bytes), and what it says."""

    device: str
    parts: list[tuple[Category, int]]
    total: int  # the bar's bytes
    said: str  # the line under it


def memory_bars(report: ReportData) -> list[MemoryBar]:
    """The bars to draw, one per device with bytes; [] without a ``memory`` section."""
    memory = report["memory"]
    bars = []
    for d in memory["devices"] if memory else []:
        bar = parts(d)
        drawn = [(c, bar[c]) for c in CATEGORIES if bar[c] > 0]
        if drawn:
            bars.append(MemoryBar(d["device"], drawn, sum(n for _, n in drawn), device_words(d)))
    return bars


def device_words(d: MemoryDevice) -> str:
    """What a device's bar says in words: its peak, where, and from what it was read."""
    parts = [
        f"parameters {fmt_bytes(d['parameters_bytes'])}",
        f"gradients {fmt_bytes(d['gradients_bytes'])}",
        f"optimizer state {fmt_bytes(d['optimizer_state_bytes'])}",
        f"activations {fmt_bytes(d['activations_bytes'])}",
    ]
    if d["fragmentation_bytes"]:
        parts.append(f"fragmentation {fmt_bytes(d['fragmentation_bytes'])}")
    peak = ""
    if d["peak_bytes"] is not None:
        source = "allocated" if d["peak_source"] == "cuda_allocator" else "process USS, sampled"
        whole = "the machine's memory" if d["device"] == "cpu" else "the device"
        share = f", {fmt_fraction(d['peak_fraction'])} of {whole}" if d["peak_fraction"] is not None else ""
        peak = f"; peak {fmt_bytes(d['peak_bytes'])} ({source}{share}) in {d['peak_stage'] or 'no stage'}"
    per_sample = d["activation_bytes_per_sample"]
    sample = f"; activations {fmt_bytes(per_sample)} per sample" if per_sample else ""
    return f"{d['device']}: " + ", ".join(parts) + peak + sample


def memory_lines(report: ReportData) -> list[str]:
    """The text report's memory section."""
    memory = report["memory"]
    if not memory:
        return []
    lines = [f"  {device_words(d)}" for d in memory["devices"]]
    if lines:
        lines.insert(0, f"Memory on step {memory['step']} (sampled)")
    host = host_words(memory["host"]) if memory["host"] is not None else []
    return lines + (["Host memory", *(f"  {line}" for line in host)] if host else [])


def host_words(host: HostMemory) -> list[str]:
    """The host side in words: each measured figure, one line each."""
    out: list[str] = []
    if host["worker_growth_bytes"] is not None:
        out.append(
            f"DataLoader workers ({host['start_method']}): unique memory grew {fmt_bytes(host['worker_growth_bytes'])}"
            f" each on average ({len(host['workers'])} measured)"
        )
    out += [
        f"dataset {host['dataset_name'] or 'dataset'}.{c['attribute']}: {c['kind']}, {c['length']:,} items, "
        f"about {fmt_bytes(c['bytes'])}"
        for c in host["containers"][:1]
    ]
    if host["pinned_bytes"]:
        out.append(f"pinned (page-locked) memory held: {fmt_bytes(host['pinned_bytes'])} at most")
    if host["swap_growth_bytes"]:
        out.append(f"swap grew {fmt_bytes(host['swap_growth_bytes'])} during the run")
    out += [
        f"embedding {e['path']} in host memory: {fmt_bytes(e['bytes'])}, {fmt_fraction(e['parameter_share'])} "
        "of the parameters"
        for e in host["embeddings"]
    ]
    return out


def memory_html(report: ReportData) -> str:
    """The stacked bars as HTML (no script: it shows wherever the report is read), and the host's figures."""
    bars = memory_bars(report)
    memory = report["memory"]
    host = host_words(memory["host"]) if memory and memory["host"] is not None else []
    said = "".join(f'<div class="pm-sub">{html.escape(line)}</div>' for line in host)
    host_html = f'<div class="pm-memory"><h3>Host memory</h3>{said}</div>' if host else ""
    if not bars:
        return host_html
    rows = []
    for bar in bars:
        spans = "".join(
            f'<span title="{html.escape(NAMES[c])} {fmt_bytes(n)}" '
            f'style="flex:{n / bar.total:.6f};background:{COLORS[c]}"></span>'
            for c, n in bar.parts
        )
        rows.append(
            f'<div class="pm-mem-bar" style="display:flex;height:14px;border-radius:2px;overflow:hidden;'
            f'margin:4px 0 2px">{spans}</div><div class="pm-sub">{html.escape(bar.said)}</div>'
        )
    legend = " ".join(
        f'<span style="white-space:nowrap"><span style="display:inline-block;width:10px;height:10px;'
        f'background:{COLORS[c]}"></span> {NAMES[c]}</span>'
        for c in COLORS
    )
    step = memory["step"] if memory else ""
    return (
        f'<div class="pm-memory"><h3>Where the memory goes <span class="pm-sub">step {step}, '
        f'sampled</span></h3>{"".join(rows)}<div class="pm-sub">{legend}</div></div>' + host_html
    )


def strip_height(bars: list[MemoryBar]) -> int:
    """The PNG strip's height for ``bars``: 0 without any."""
    return STRIP_TOP + 10 + len(bars) * (BAR_HEIGHT + 31) if bars else 0


def draw_strip(draw: Any, bars: list[MemoryBar], font: Any, top: int, left: int, right: int) -> None:
    """The bars in the PNG, from ``top``: one row per device, the bar scaled to the largest."""
    if not bars:
        return
    draw.text((left, top), "Where the memory goes (one sampled step)", fill="#444444", font=font)
    widest = max(b.total for b in bars)
    y = top + STRIP_TOP + 6
    for bar in bars:
        x = float(left)
        for c, n in bar.parts:
            x1 = x + (right - left) * n / widest
            draw.rectangle([(x, y), (max(x + 1, x1), y + BAR_HEIGHT)], fill=COLORS[c])
            x = x1
        for k, line in enumerate(bar.said.split("; ", 1)):  # the parts, then the peak
            draw.text((left, y + BAR_HEIGHT + 3 + 13 * k), line, fill="#444444", font=font)
        y += BAR_HEIGHT + 31
