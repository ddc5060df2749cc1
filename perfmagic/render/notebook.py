"""Notebook outputs: MIME bundles with rich HTML and a ``text/plain`` fallback.

Bundles are plain dictionaries (``{mime type: data}``): the magic displays them
and ``Report._repr_mimebundle_`` returns them, so nothing here imports IPython.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence

from perfmagic.advise.headline import headline
from perfmagic.analyze.monitoring import GpuFigures, MonitorSummary
from perfmagic.compare import SECTIONS, speed_words
from perfmagic.contract import ComparisonData, ProblemData, ReportData
from perfmagic.render.colors import SEVERITY_COLORS
from perfmagic.render.embed import charts_html
from perfmagic.render.html import CSS, report_fragment
from perfmagic.render.text import render_text
from perfmagic.units import fmt_bytes, fmt_fraction, fmt_seconds

Bundle = dict[str, str]


def report_bundle(report: ReportData, links: Sequence[tuple[str, str]] = ()) -> Bundle:
    """The report: header, stage waterfall, utilization, advice cards, export links.

    The charts also come as ``image/png``, for what reads no HTML (``nbconvert --to pdf``, some viewers).
    """
    from perfmagic.render.png import charts_png

    png = charts_png(report)
    bundle = {"text/plain": render_text(report), "text/html": report_fragment(report, links, png)}
    if png:
        bundle["image/png"] = base64.b64encode(png).decode()
    return bundle


def finished_bundle(report: ReportData | None, error: str | None = None) -> Bundle:
    """What the live panel turns into when the cell ends: one line, the report follows."""
    if report is None:
        text = f"perfmagic: profiling failed ({error})" if error else "perfmagic: no report"
    else:
        steps = report["steps"]
        text = f"perfmagic: profiled {fmt_seconds(report['wall_s'])}"
        if steps["count"]:
            text += f", {steps['count']} steps, median step {fmt_seconds(steps['median_s'])}"
        text += f" — {headline(report)}"
        if error:
            text += f" (the cell ended with {error})"
    return note_bundle(text)


def unprofiled_bundle(error: str, outdir: str) -> Bundle:
    """What a cell that failed before its first training step shows of perfmagic: one line, no report."""
    return note_bundle(
        f"perfmagic: no report, the cell ended with {error} before its first training step "
        f"(what ran: perfmagic.load({outdir!r}))"
    )


def note_bundle(text: str) -> Bundle:
    """One line of perfmagic's among the cell's outputs, quieter than they are."""
    return {
        "text/plain": text,
        "text/html": f'<div style="font-size:12px;opacity:.75">{html.escape(text)}</div>',
    }


def comparison_bundle(
    comparison: ComparisonData, text: str, labels: tuple[str, str] = ("before", "after")
) -> Bundle:
    """Two runs side by side (``Comparison.to_dict()``): the headline, stage times, speed-up, and the
    problems resolved, still open and new, each in the words the text says (``said``)."""
    from perfmagic.render.png import comparison_png
    from perfmagic.render.waterfall import comparison_figure

    stages = comparison["stages"]
    before = {s["name"]: s["before_s"] for s in stages}
    after = {s["name"]: s["after_s"] for s in stages}
    step = comparison["step"]
    speedup = step["speedup"]
    a, b = (html.escape(x) for x in labels)
    kpis = (
        (f"mean step, {labels[0]}", fmt_seconds(step["before_s"])),
        (f"mean step, {labels[1]}", fmt_seconds(step["after_s"])),
        ("change", speed_words(speedup) or "n/a"),
    )
    boxes = "".join(
        f'<div class="pm-kpi"><span>{html.escape(k)}</span><b>{html.escape(v)}</b></div>' for k, v in kpis
    )
    rows = "".join(
        f"<tr><td>{html.escape(s['name'])}</td><td>{fmt_seconds(s['before_s'])}</td>"
        f"<td>{fmt_seconds(s['after_s'])}</td><td>{_change(s['before_s'], s['after_s'])}</td></tr>"
        for s in sorted(stages, key=lambda s: -max(s["before_s"], s["after_s"]))
    )
    table = (
        f'<table class="pm-cmp"><tr><th>stage (mean per step)</th><th>{a}</th><th>{b}</th><th>change</th></tr>'
        f"{rows}</table>"
    )
    problems = comparison["problems"]
    sections = "".join(_problems_html(title, problems[status]) for status, title in SECTIONS.items())
    png = comparison_png(before, after, labels)  # what shows where no script runs, as for a report
    charts = charts_html(comparison_figure(before, after, labels), png)
    body = (
        f'<style>{CSS}</style><div class="pm-report"><h3>perfmagic comparison: {a} → {b}</h3>'
        f'<div class="pm-bottleneck">{html.escape(comparison["headline"])}</div>'
        f'<div class="pm-kpis">{boxes}</div>{charts}{table}{sections}</div>'
    )
    bundle = {"text/plain": text, "text/html": body}
    if png:
        bundle["image/png"] = base64.b64encode(png).decode()
    return bundle


def _problems_html(title: str, matches: list[ProblemData]) -> str:
    """One status's problems: each the line the text says, colored by its severity."""
    items = "".join(
        f'<li class="pm-problem" style="border-left-color:{SEVERITY_COLORS.get(m["severity"] or "", "#bab0ac")}">'
        f"{html.escape(m['said'])}</li>"
        for m in matches
    )
    return f"<h4>{title} ({len(matches)})</h4>" + (f'<ul class="pm-problems">{items}</ul>' if items else "")


def _change(before: float | None, after: float | None) -> str:
    if not before:
        return "new" if after else ""
    return f"{(after or 0.0) / before - 1:+.0%}"


def monitor_bundle(summary: MonitorSummary, warnings: Sequence[str] = ()) -> Bundle:
    """What a stopped ``%gpumonitor`` leaves in place of its panel: how long it ran, each GPU's
    utilization (mean and peak), memory peak and mean power, and the host's CPU; without a GPU, one
    line that says so and gives the host's CPU."""
    head = f"perfmagic monitor stopped after {fmt_seconds(summary.seconds)}"
    cpu = f"host CPU mean {fmt_fraction(summary.cpu_mean)}, peak {fmt_fraction(summary.cpu_peak)}"
    # NVML's reason is said once, in the line, not again among the sampler's warnings
    notes = [w for w in warnings if summary.no_gpu is None or summary.no_gpu not in w]
    note = f"({'; '.join(notes)})" if notes else ""
    if summary.no_gpu is not None:
        line = f"{head}: no GPU ({summary.no_gpu}); {cpu}"
        return {
            "text/plain": "\n".join([line, *([f"  {note}"] if note else [])]),
            "text/html": f'<div class="pm-monitor" style="font-size:12px">{html.escape(line)}'
            + (f'<br><span class="pm-warn">{html.escape(note)}</span>' if note else "")
            + "</div>",
        }
    lines = [f"{head}:", *(f"  {_gpu_words(g)}" for g in summary.gpus), f"  {cpu}"]
    rows = "".join(
        f"<tr><td>GPU {g.index} <small>{html.escape(g.name or '')}</small></td><td>{fmt_fraction(g.util_mean)}</td>"
        f"<td>{fmt_fraction(g.util_peak)}</td><td>{_memory(g)}</td><td>{_watts(g.power_mean_w)}</td></tr>"
        for g in summary.gpus
    )
    table = (
        '<table class="pm-cmp"><tr><th>GPU</th><th>utilization, mean</th><th>peak</th><th>memory peak</th>'
        f"<th>power, mean</th></tr>{rows}</table>"
    )
    body = (
        f'<style>{CSS}</style><div class="pm-report pm-monitor"><b>{html.escape(head)}</b>{table}'
        f"<div>{html.escape(cpu[0].upper() + cpu[1:])}</div>"
        + (f'<div class="pm-warn">{html.escape(note)}</div>' if note else "")
        + "</div>"
    )
    return {"text/plain": "\n".join([*lines, *([f"  {note}"] if note else [])]), "text/html": body}


def _gpu_words(g: GpuFigures) -> str:
    """ "GPU 0 (NVIDIA H100): utilization mean 87%, peak 95%; memory peak 20.0 GiB / 80.0 GiB; power mean 250 W"."""
    name = f" ({g.name})" if g.name else ""
    return (
        f"GPU {g.index}{name}: utilization mean {fmt_fraction(g.util_mean)}, peak {fmt_fraction(g.util_peak)}; "
        f"memory peak {_memory(g)}; power mean {_watts(g.power_mean_w)}"
    )


def _memory(g: GpuFigures) -> str:
    return fmt_bytes(g.mem_peak_bytes) + (f" / {fmt_bytes(g.mem_total_bytes)}" if g.mem_total_bytes else "")


def _watts(w: float | None) -> str:
    return "n/a" if w is None else f"{w:.0f} W"
