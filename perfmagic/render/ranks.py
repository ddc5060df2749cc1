"""The ranks of a multi-rank report side by side: a per-rank waterfall and a rank × stage heat table.

The waterfall has one row per rank on one time axis (the ranks' clocks as the report aligned
them), each step laid out as its stages one after another; the heat table holds each rank's
mean seconds per steady step of each stage, shaded by how far above the median rank it is.
Both mark the straggler. Drawn from the report's dictionary (``ranks[i].step_table``), so a
report read back from JSON draws the same.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import numpy as np

from perfmagic.contract import Rank, ReportData, StepTable, Straggler
from perfmagic.render.colors import stage_color
from perfmagic.render.embed import charts_html
from perfmagic.render.waterfall import binned_steps, finish_stage_bars
from perfmagic.render.wording import rank_stages
from perfmagic.units import fmt_seconds

if TYPE_CHECKING:
    from bokeh.plotting import figure as Figure

WATERFALL_NAME = "perfmagic-rank-waterfall"
"""The per-rank waterfall's Bokeh model name (what a page's script or a test looks it up by)."""
RANK_BARS = 2400
"""Step bars the per-rank waterfall draws at most, shared by the ranks (bins of steps beyond)."""
SHADE_FULL = 0.25
"""A cell this share of the median rank's step above the median rank is shaded fully."""

CSS = """
.pm-ranks{margin:10px 0}
.pm-rank-heat{border-collapse:collapse;font-size:12px;margin:6px 0}
.pm-rank-heat td,.pm-rank-heat th{padding:2px 10px;text-align:right;border:1px solid var(--jp-border-color2,#d0d7de)}
.pm-rank-heat th:first-child{text-align:left}
.pm-rank-heat tr.pm-straggler th{font-weight:700}
.pm-rank-heat td.pm-straggler-stage{outline:2px solid #d62728;outline-offset:-2px}
.pm-straggler-tag{color:#d62728;font-size:10px;font-weight:700;text-transform:uppercase;margin-left:6px}
"""


def ranks_html(report: ReportData, *, inline_bokehjs: bool = False) -> str:
    """The per-rank waterfall and heat table; empty for a report of fewer than two ranks.

    ``inline_bokehjs``: as :func:`perfmagic.render.embed.charts_html`.
    """
    ranks = sorted(report["ranks"], key=lambda r: r["rank"])
    if len(ranks) < 2:
        return ""
    straggler = report["straggler"]
    return (
        f'<style>{CSS}</style><div class="pm-ranks"><b>Ranks</b>{_straggler_line(straggler)}'
        f"{charts_html(rank_waterfall_figure(ranks, straggler), inline_bokehjs=inline_bokehjs)}"
        f"{heat_table(ranks, straggler)}</div>"
    )


def _straggler_line(straggler: Straggler | None) -> str:
    if straggler is None:
        return '<p class="pm-straggler-line">No straggler: the ranks keep pace with each other.</p>'
    text = (
        f"Rank {straggler['rank']} is the straggler: its {straggler['stage']} takes "
        f"{fmt_seconds(straggler['stage_excess_s'][straggler['stage']])} more per step than the other ranks' "
        f"median, and they wait for it in comm ({fmt_seconds(straggler['others_comm_s'])} per step)."
    )
    return f'<p class="pm-straggler-line">{html.escape(text)}</p>'


def _label(rank: Rank, straggler: Straggler | None) -> str:
    mark = " (straggler)" if straggler is not None and rank["rank"] == straggler["rank"] else ""
    return f"rank {rank['rank']}{mark}"


def _mean(rank: Rank, stage: str) -> float | None:
    s = rank["stages"].get(stage)
    return None if s is None else float(s["mean_s"])


def heat_table(ranks: list[Rank], straggler: Straggler | None) -> str:
    """Rank × stage, mean seconds per steady step; a cell is redder the further above the median rank."""
    stages = rank_stages(ranks)
    steps = [sum(_mean(r, n) or 0.0 for n in r["stages"]) for r in ranks]
    full = SHADE_FULL * float(np.median(steps))
    medians = {n: float(np.median([_mean(r, n) or 0.0 for r in ranks])) for n in stages}
    head = "".join(f"<th>{html.escape(n)}</th>" for n in ["rank", "node", "step", *stages])
    rows = []
    for rank, step in zip(ranks, steps, strict=True):
        slow = straggler is not None and rank["rank"] == straggler["rank"]
        cells = []
        for n in stages:
            mean = _mean(rank, n)
            if mean is None:
                cells.append(f'<td data-stage="{html.escape(n)}">-</td>')
                continue
            above = mean - medians[n]
            shade = min(1.0, max(0.0, above / full)) if full > 0 else 0.0
            mark = " pm-straggler-stage" if slow and straggler is not None and n == straggler["stage"] else ""
            cells.append(
                f'<td class="pm-heat{mark}" data-stage="{html.escape(n)}" data-seconds="{mean!r}" '
                f'data-above-s="{above!r}" style="background:rgba(214,39,40,{0.65 * shade:.3f})" '
                f'title="{html.escape(f"{fmt_seconds(above)} above the median rank" if above > 0 else "")}">'
                f"{fmt_seconds(mean)}</td>"
            )
        tag = '<span class="pm-straggler-tag">straggler</span>' if slow else ""
        rows.append(
            f'<tr class="pm-rank{" pm-straggler" if slow else ""}" data-rank="{rank["rank"]}">'
            f"<th>{rank['rank']}{tag}</th><td>{html.escape(str(rank['node'] or '-'))}</td>"
            f"<td>{fmt_seconds(step)}</td>{''.join(cells)}</tr>"
        )
    return (
        '<table class="pm-rank-heat"><caption style="text-align:left">Mean per step after warm-up, '
        f"by rank; red: above the median rank</caption><tr>{head}</tr>{''.join(rows)}</table>"
    )


def rank_waterfall_figure(ranks: list[Rank], straggler: Straggler | None) -> Figure | None:
    """One row per rank on one time axis, each step's stages laid out in it (hover: the durations);
    None when no rank has a step table."""
    from bokeh.models import ColumnDataSource, FactorRange
    from bokeh.models.renderers import DataRenderer
    from bokeh.plotting import figure

    tables = [(r, r["step_table"]) for r in ranks if "step_table" in r and r["step_table"]["start"]]
    if not tables:
        return None
    per_rank = max(1, RANK_BARS // len(tables))
    columns: dict[str, dict[str, list[Any]]] = {}
    for rank, table in tables:
        for name, bars in _bars(table, _label(rank, straggler), per_rank).items():
            col = columns.setdefault(name, {k: [] for k in bars})
            for k, values in bars.items():
                col[k] += values
    factors = [_label(r, straggler) for r, _ in reversed(tables)]  # rank 0 on top
    fig = figure(
        title="Ranks over time: each step split into its stages",
        name=WATERFALL_NAME,
        y_range=FactorRange(factors=factors),
        height=int(min(900, max(160, 90 + 26 * len(factors)))),
        sizing_mode="stretch_width",
        tools="xpan,xwheel_zoom,box_zoom,reset,save",
        x_axis_label="time since start (s)",
        output_backend="canvas",
    )
    renderers: list[DataRenderer] = []
    for name in rank_stages(ranks):  # one renderer per stage: legend in pipeline order, click to hide
        source = columns.get(name)
        if source is None:
            continue
        renderers.append(
            fig.hbar(
                y="y",
                left="left",
                right="right",
                height=0.7,
                fill_color=stage_color(name),
                line_color=None,
                legend_label=name,
                name=name,
                source=ColumnDataSource(source),
            )
        )
    finish_stage_bars(fig, renderers, row_label="@y")
    fig.ygrid.grid_line_color = None
    return fig


def _bars(table: StepTable, label: str, max_bars: int) -> dict[str, dict[str, list[Any]]]:
    """One rank's step table as bars per stage, each stage drawn after the ones before it in its step
    (at most ``max_bars`` steps or bins of steps); stages of no time left out."""
    names = list(table["stages"])
    seconds = np.array([table["stages"][n] for n in names], dtype=float).T
    start, end = np.asarray(table["start"], dtype=float), np.asarray(table["end"], dtype=float)
    _, first, last, start, end, seconds = binned_steps(start, end, seconds, max_bars)
    totals = seconds.sum(axis=1)
    # the stages fill the step's time in proportion: the step table holds how long, not when
    scale = np.divide(end - start, totals, out=np.zeros_like(totals), where=totals > 0)
    left = start[:, None] + (np.cumsum(seconds, axis=1) - seconds) * scale[:, None]
    per = int(table["steps_per_row"] or 1)
    labels = [
        f"{f * per + 1}" if f == g and per == 1 else f"{f * per + 1}–{(g + 1) * per} (mean)"
        for f, g in zip(first, last, strict=True)
    ]
    out: dict[str, dict[str, list[Any]]] = {}
    for j, name in enumerate(names):
        rows = seconds[:, j] > 0
        if not rows.any():
            continue
        s = seconds[rows, j]
        out[name] = {
            "y": [label] * len(s),
            "left": left[rows, j].tolist(),
            "right": (left[rows, j] + s * scale[rows]).tolist(),
            "steps": [x for x, r in zip(labels, rows, strict=True) if r],
            "dur": [fmt_seconds(x) for x in s],
            "share": [f"{x / t:.0%}" for x, t in zip(s, totals[rows], strict=True)],
            "total": [fmt_seconds(t) for t in totals[rows]],
        }
    return out
