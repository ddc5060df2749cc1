"""Notebook outputs: MIME bundles with rich HTML and a ``text/plain`` fallback.

Bundles are plain dictionaries (``{mime type: data}``): the magic displays them
and ``Report._repr_mimebundle_`` returns them, so nothing here imports IPython.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from typing import Any

from perfmagic.advise.headline import headline
from perfmagic.compare import SECTIONS, speed_words
from perfmagic.contract import ReportData
from perfmagic.render.html import CSS, SEVERITY_COLORS, charts_html, report_fragment
from perfmagic.render.text import render_text
from perfmagic.units import fmt_seconds

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
        text = f"perfmagic: profiled {fmt_seconds(report.get('wall_s'))}"
        if steps.get("count"):
            text += f", {steps['count']} steps, median step {fmt_seconds(steps.get('median_s'))}"
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
    comparison: dict[str, Any], text: str, labels: tuple[str, str] = ("before", "after")
) -> Bundle:
    """Two runs side by side (``Comparison.to_dict()``): the headline, stage times, speed-up, and the
    problems resolved, still open and new, each in the words the text says (``said``)."""
    from perfmagic.render.waterfall import comparison_figure

    stages = comparison.get("stages") or []
    before = {s["name"]: float(s.get("before_s") or 0.0) for s in stages}
    after = {s["name"]: float(s.get("after_s") or 0.0) for s in stages}
    step = comparison.get("step") or {}
    speedup = step.get("speedup")
    a, b = (html.escape(x) for x in labels)
    kpis = (
        (f"mean step, {labels[0]}", fmt_seconds(step.get("before_s"))),
        (f"mean step, {labels[1]}", fmt_seconds(step.get("after_s"))),
        ("change", speed_words(speedup) or "n/a"),
    )
    boxes = "".join(
        f'<div class="pm-kpi"><span>{html.escape(k)}</span><b>{html.escape(v)}</b></div>' for k, v in kpis
    )
    rows = "".join(
        f"<tr><td>{html.escape(s['name'])}</td><td>{fmt_seconds(s.get('before_s'))}</td>"
        f"<td>{fmt_seconds(s.get('after_s'))}</td><td>{_change(s.get('before_s'), s.get('after_s'))}</td></tr>"
        for s in sorted(stages, key=lambda s: -max(s.get("before_s") or 0.0, s.get("after_s") or 0.0))
    )
    table = (
        f'<table class="pm-cmp"><tr><th>stage (mean per step)</th><th>{a}</th><th>{b}</th><th>change</th></tr>'
        f"{rows}</table>"
    )
    problems = comparison.get("problems") or {}
    sections = "".join(
        _problems_html(title, problems.get(status) or []) for status, title in SECTIONS.items()
    )
    body = (
        f'<style>{CSS}</style><div class="pm-report"><h3>perfmagic comparison: {a} → {b}</h3>'
        f'<div class="pm-bottleneck">{html.escape(comparison.get("headline") or "")}</div>'
        f'<div class="pm-kpis">{boxes}</div>{charts_html(comparison_figure(before, after, labels))}'
        f"{table}{sections}</div>"
    )
    return {"text/plain": text, "text/html": body}


def _problems_html(title: str, matches: list[dict[str, Any]]) -> str:
    """One status's problems: each the line the text says, colored by its severity."""
    items = "".join(
        f'<li class="pm-problem" style="border-left-color:{SEVERITY_COLORS.get(m.get("severity") or "", "#bab0ac")}">'
        f"{html.escape(str(m.get('said')))}</li>"
        for m in matches
    )
    return f"<h4>{title} ({len(matches)})</h4>" + (f'<ul class="pm-problems">{items}</ul>' if items else "")


def _change(before: float | None, after: float | None) -> str:
    if not before:
        return "new" if after else ""
    return f"{(after or 0.0) / before - 1:+.0%}"
