"""HTML rendering of a report: the fragment the notebook shows and the standalone file.

A fragment carries its styles, the Bokeh charts and a still PNG of them (embedded as
:mod:`perfmagic.render.embed` says); the standalone file carries BokehJS too, so it opens offline.
"""

from __future__ import annotations

import html
import os
import uuid
from collections.abc import Sequence
from pathlib import Path

from perfmagic.advise.headline import headline
from perfmagic.contract import Card, ReportData
from perfmagic.render.colors import SEVERITY_COLORS, stage_color
from perfmagic.render.embed import charts_html
from perfmagic.render.energy import energy_kpi, energy_lines
from perfmagic.render.kernels import gpu_html
from perfmagic.render.memory import memory_html
from perfmagic.render.ranks import ranks_html
from perfmagic.render.wording import (
    evaluation_line,
    hotspot_lines,
    memory_peak,
    minor_line,
    most_to_gain,
    origin_words,
    plan_line,
    recording_line,
    saving_words,
)
from perfmagic.schema import MEMORY_NAME
from perfmagic.units import fmt_bytes, fmt_fraction, fmt_rate, fmt_seconds

CSS = """
.pm-report{font-family:var(--jp-ui-font-family,system-ui,-apple-system,Segoe UI,sans-serif);
 color:var(--jp-ui-font-color1,#1f2328);max-width:1200px;font-size:13px;line-height:1.45}
.pm-report h3{font-size:15px;margin:4px 0 8px}
.pm-report .pm-sub{color:var(--jp-ui-font-color2,#57606a);font-weight:normal;font-size:12px}
.pm-kpis{display:flex;flex-wrap:wrap;gap:8px;margin:6px 0 10px}
.pm-kpi{border:1px solid var(--jp-border-color2,#d0d7de);border-radius:6px;padding:6px 12px;min-width:110px}
.pm-kpi b{display:block;font-size:18px;font-weight:600}
.pm-kpi span{color:var(--jp-ui-font-color2,#57606a);font-size:11px;text-transform:uppercase;letter-spacing:.04em}
.pm-bottleneck{border-left:4px solid #f28e2b;padding:6px 10px;margin:6px 0 10px;
 background:var(--jp-layout-color2,#f6f8fa)}
.pm-cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(340px,1fr));gap:10px;margin:10px 0}
.pm-card{border:1px solid var(--jp-border-color2,#d0d7de);border-left-width:6px;border-radius:6px;padding:8px 12px}
.pm-card .pm-sev{font-size:10px;font-weight:700;text-transform:uppercase;letter-spacing:.06em}
.pm-card .pm-title{font-weight:600;font-size:14px;margin:2px 0 4px}
.pm-card .pm-saving{font-weight:600;margin:4px 0}
.pm-tuning{margin:10px 0}
.pm-knob{margin:6px 0 10px}
.pm-knob-row{display:grid;grid-template-columns:160px 1fr 90px;gap:8px;align-items:center;font-size:12px}
.pm-knob-row span:first-child{text-align:right;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.pm-knob-bar{height:12px;border-radius:2px;min-width:2px}
.pm-report .pm-fix{margin-top:6px;background:var(--jp-layout-color2,#f6f8fa);border-radius:4px}
.pm-report .pm-fix-head{display:flex;justify-content:space-between;align-items:center;padding:3px 8px 0;
 font-size:10px;text-transform:uppercase;letter-spacing:.06em;color:var(--jp-ui-font-color2,#57606a)}
.pm-report .pm-fix pre{background:transparent;padding:4px 8px 8px;margin:0;font-size:12px;
 white-space:pre-wrap;overflow-wrap:anywhere;word-break:normal}
.pm-report .pm-fix pre code{white-space:inherit;overflow-wrap:inherit;background:transparent}
.pm-report .pm-copy{font-size:11px;padding:1px 8px;cursor:pointer;text-transform:none;letter-spacing:0;
 border:1px solid var(--jp-border-color2,#d0d7de);border-radius:4px;background:var(--jp-layout-color1,#fff);
 color:inherit}
.pm-warn{color:var(--jp-ui-font-color2,#57606a);font-size:12px}
.pm-links a{margin-right:14px}
.pm-cmp td,.pm-cmp th{padding:2px 10px;text-align:right}
.pm-cmp td:first-child,.pm-cmp th:first-child{text-align:left}
.pm-problems{list-style:none;padding:0;margin:4px 0 10px}
.pm-problem{border-left:4px solid;padding:2px 8px;margin:4px 0}
"""

# Fix code wraps rather than scrolls: cards are narrow, and a horizontal scrollbar is invisible
# where scrollbars overlay (macOS, headless screenshots), so long lines looked cut off.
# The fix is text to select wherever the report is read. Its Copy button is made by a script, so
# it exists only where scripts run (a trusted notebook, the HTML file): an untrusted notebook or an
# export that strips scripts showed a button that did nothing. The button takes textContent, the
# source as written (soft wraps never reach the clipboard): the Clipboard API where allowed (secure
# contexts), else the selection fallback. A second run of the script (an output drawn again) adds none.
_COPY_JS = (
    "(function(){var root=document.getElementById('TARGET');if(!root)return;"
    "function copy(b){var t=b.closest('.pm-fix').querySelector('pre').textContent;"
    "function done(){b.textContent='Copied';setTimeout(function(){b.textContent='Copy'},1200)}"
    "function legacy(){var a=document.createElement('textarea');a.value=t;document.body.appendChild(a);"
    "a.select();try{document.execCommand('copy');done()}finally{document.body.removeChild(a)}}"
    "if(navigator.clipboard&&window.isSecureContext){navigator.clipboard.writeText(t).then(done,legacy)}"
    "else{legacy()}}"
    "root.querySelectorAll('.pm-fix-head').forEach(function(h){if(h.querySelector('.pm-copy'))return;"
    "var b=document.createElement('button');b.type='button';b.className='pm-copy';b.textContent='Copy';"
    "b.onclick=function(){copy(b)};h.appendChild(b)})})();"
)


def report_fragment(
    report: ReportData,
    links: Sequence[tuple[str, str]] = (),
    png: bytes | None = None,
    *,
    inline_bokehjs: bool = False,
) -> str:
    """The whole report as one HTML fragment; ``inline_bokehjs``: one that needs no server either."""
    from perfmagic.render.waterfall import report_layout

    parts = [f"<style>{CSS}</style>", '<div class="pm-report">', _header(report)]
    charts = charts_html(report_layout(report), png, inline_bokehjs=inline_bokehjs)
    parts.append(charts)
    parts.append(memory_html(report))
    parts.append(gpu_html(report))
    # BokehJS once per file: the ranks' charts carry it only where the report's charts did not
    parts.append(ranks_html(report, inline_bokehjs=inline_bokehjs and not charts))
    for line in hotspot_lines(report):
        parts.append(f'<p class="pm-hotspot">{html.escape(line[0].upper() + line[1:])}</p>')
    no_steps = "No advice: most rules weigh stages within steps, and no step was seen."
    parts.append(cards_html(report["advice"], note="" if report["steps"]["count"] else no_steps))
    for said in (plan_line(report), minor_line(report)):
        if said:
            parts.append(f'<p class="pm-minor">{html.escape(said[0].upper() + said[1:])}.</p>')
    parts.append(tuning_html(report))
    energy = energy_lines(report)
    if energy:
        details = "".join(f"<li>{html.escape(line.strip())}</li>" for line in energy[1:])
        parts.append(
            f'<div class="pm-energy"><p>{html.escape(energy[0])}</p>'
            + (f"<ul>{details}</ul>" if details else "")
            + "</div>"
        )
    if report["warnings"]:
        items = "".join(f"<li>{html.escape(w)}</li>" for w in report["warnings"])
        parts.append(
            f'<details class="pm-warn"><summary>Not measured ({len(report["warnings"])})</summary><ul>{items}</ul></details>'
        )
    recording = recording_line(report)
    if recording:
        parts.append(
            f'<p class="pm-minor pm-recording">{html.escape(recording[0].upper() + recording[1:])}.</p>'
        )
    if links:
        parts.append(f'<p class="pm-links">Files: {"".join(_link(label, href) for label, href in links)}</p>')
    parts.append("</div>")
    return "".join(parts)


def _link(label: str, path: str) -> str:
    """A link where the page can follow it (a relative path), else the path to copy."""
    if os.path.isabs(path):
        return f"<span>{html.escape(label)}: <code>{html.escape(path)}</code></span> "
    return f'<a href="{html.escape(path)}" target="_blank">{html.escape(label)}</a> '


def document(title: str, body: str) -> str:
    """A standalone page around a fragment."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title></head>"
        f'<body style="margin:16px">{body}</body></html>\n'
    )


def write_html(report: ReportData, path: str | os.PathLike[str]) -> Path:
    """Write the report as one HTML file that opens offline."""
    p = Path(path)
    p.write_text(
        document(f"perfmagic report — {headline(report)}", report_fragment(report, inline_bokehjs=True)),
        encoding="utf-8",
    )
    return p


def gpu_busy(report: ReportData) -> float | None:
    """GPU busy fraction: from a GPU trace when there is one, else mean NVML utilization."""
    trace = report["gpu"]
    if trace and trace["busy_fraction"] is not None:
        return float(trace["busy_fraction"])
    utils = [u for d in report["devices"] if (u := d["util_mean"]) is not None]
    return sum(utils) / len(utils) if utils else None


_NO_STEPS = (
    "perfmagic splits time into training steps at each <code>perfmagic.step()</code>, optimizer step, "
    "DataLoader batch or backward pass, and none happened here, so there is no stage breakdown. If this "
    "cell trains in a loop perfmagic cannot see (another framework), {hint}. "
    "Below: what the hardware did while the cell ran."
)


def _header(report: ReportData) -> str:
    steps = report["steps"]
    busy = gpu_busy(report)
    gpu_note = fmt_fraction(busy) if busy is not None else ("n/a" if report["devices"] else "no GPU")
    if steps["count"]:
        kpis = [
            ("step time (median)", fmt_seconds(steps["median_s"])),
            ("p90 step", fmt_seconds(steps["p90_s"])),
            ("steps/s", fmt_rate(steps["per_s"] or None)),
            *([("samples/s", fmt_rate(steps["samples_per_s"]))] if steps["samples_per_s"] else []),
            *([("tokens/s", fmt_rate(steps["tokens_per_s"]))] if steps["tokens_per_s"] else []),
            ("steps", str(steps["count"])),
            ("GPU busy", gpu_note),
            *([kpi] if (kpi := energy_kpi(report)) else []),
        ]
    else:  # step figures would all read n/a: show what was measured instead
        host = report["host"]
        kind, peak = memory_peak(host)
        kpis = [
            ("steps", "0"),
            ("profiled", fmt_seconds(report["wall_s"])),
            ("host CPU (mean)", fmt_fraction(host["cpu_util_mean"])),
            (f"{MEMORY_NAME} peak ({kind})", fmt_bytes(peak)),
            ("GPU busy", gpu_note),
        ]
    sub = f"{origin_words({'source': 'live', **report})}, {fmt_seconds(report['wall_s'])} profiled"
    evaluation = evaluation_line(report)
    if evaluation:
        sub += f"; {evaluation}"
    boxes = "".join(f'<div class="pm-kpi"><span>{k}</span><b>{html.escape(v)}</b></div>' for k, v in kpis)
    color = _bottleneck_color(report)
    if steps["count"]:
        verdict = f"<b>Bottleneck:</b> {html.escape(headline(report))}"
        gain = most_to_gain(report)
        if gain:
            verdict += f'<br><span class="pm-gain">{html.escape(gain[0].upper() + gain[1:])}</span>'

    else:
        hint = html.escape(steps["hint"] or "call perfmagic.step() at the end of each step")
        verdict = "<b>No training steps were seen.</b> " + _NO_STEPS.format(
            hint=hint.replace("perfmagic.step()", "<code>perfmagic.step()</code>")
        )
    return (
        f'<h3>perfmagic report <span class="pm-sub">({html.escape(sub)})</span></h3>'
        f'<div class="pm-kpis">{boxes}</div>'
        f'<div class="pm-bottleneck" style="border-left-color:{color}">{verdict}</div>'
    )


def _bottleneck_color(report: ReportData) -> str:
    return stage_color(report["bottleneck"] or "other")


_TRIED, _BASELINE, _BEST = "#9ecae9", "#bab0ac", "#59a14f"


def tuning_html(report: ReportData) -> str:
    """Each knob tuning compared as bars, one per setting tried (the baseline grey, the best green),
    the predicted step against the observed one; a knob not compared says why. Empty without tuning."""
    blocks = []
    for knob in report["tuning"]:
        base, best = knob["baseline"], knob["best"]
        if not (base and best):
            why = "; ".join(knob["notes"])
            blocks.append(f"<p>{html.escape(knob['knob'])}: not compared ({html.escape(why)})</p>")
            continue
        if knob["knob"] == "step":
            settings = ", ".join(f"{k}={v}" for k, v in best["value"].items())
            title = f"predicted step with {settings} (~{knob['speedup']:.2g}× faster)"
            rows = [("observed", base["seconds"], _BASELINE), ("predicted", best["seconds"], _BEST)]
        else:
            title = (
                f"{knob['knob']} ({knob['unit']}, measured): best {best['value']}, "
                f"~{knob['speedup']:.2g}× against {base['value']}"
            )
            rows = [
                (str(t["value"]), t["seconds"], _BEST if t == best else _BASELINE if t == base else _TRIED)
                for t in knob["tried"]
            ]
        longest = max(seconds for _, seconds, _ in rows) or 1.0
        bars = "".join(
            f'<div class="pm-knob-row"><span>{html.escape(label)}</span>'
            f'<div class="pm-knob-bar" style="width:{100 * seconds / longest:.1f}%;background:{color}"></div>'
            f"<span>{html.escape(fmt_seconds(seconds))}</span></div>"
            for label, seconds, color in rows
        )
        blocks.append(f'<div class="pm-knob"><div>{html.escape(title)}</div>{bars}</div>')
    if not blocks:
        return ""
    return (
        '<div class="pm-tuning"><b>Tuning</b> (tried after the window, on copies of the loader and model)'
        f"{''.join(blocks)}</div>"
    )


def cards_html(cards: Sequence[Card], note: str = "") -> str:
    """Advice cards: severity color, title, evidence, estimated saving, fix code as text to select,
    and the script that gives each fix a Copy button where scripts run."""
    if not cards:
        return f'<p class="pm-warn">{html.escape(note or "No advice: no rule found a bottleneck it knows how to fix.")}</p>'
    target = f"pm-{uuid.uuid4().hex}"
    out = [f'<div class="pm-cards" id="{target}">']
    for card in cards:
        color = SEVERITY_COLORS.get(card["severity"], "#4e79a7")
        saving = saving_words(card)
        fix = card["fix"]
        out.append(
            f'<div class="pm-card" style="border-left-color:{color}" data-advice-id="{html.escape(card["id"])}">'
            f'<div class="pm-sev" style="color:{color}">{html.escape(card["severity"])}</div>'
            f'<div class="pm-title">{html.escape(card["title"])}</div>'
            f"<div>{html.escape(card['evidence'])}</div>"
            + (f'<div class="pm-saving">{html.escape(saving)}</div>' if saving else "")
            + (
                '<div class="pm-fix"><div class="pm-fix-head"><span>fix</span></div>'
                f"<pre><code>{html.escape(fix)}</code></pre></div>"
                if fix
                else ""
            )
            + "</div>"
        )
    out.append("</div>")
    if any(card["fix"] for card in cards):
        out.append(f"<script>{_COPY_JS.replace('TARGET', target, 1)}</script>")
    return "".join(out)
