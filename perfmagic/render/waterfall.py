"""Bokeh figures of a report, shared by the notebook report and the HTML file.

Everything is drawn from the report's dictionary, so a report read back from JSON
draws the same; each stage in its colour (:mod:`perfmagic.render.colors`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from perfmagic.contract import ReportData, Series, Stage, StepTable, Timeseries
from perfmagic.render.colors import stage_color
from perfmagic.schema import MEMORY_METRICS, gpu_metric, memory_kind, memory_name
from perfmagic.units import fmt_seconds

if TYPE_CHECKING:
    from bokeh.models import LayoutDOM, Range
    from bokeh.plotting import figure as Figure

_SERIES_COLORS = ("#4e79a7", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f")
_HOST_COLOR = "#e15759"
_SWATCH = "#777777"
"""Legend swatches that stand for no one stage (before and after in a comparison)."""
MAX_BARS = 600
"""More steps than this are drawn in bins of consecutive steps (per-step means)."""

_TOOLS = "xpan,xwheel_zoom,box_zoom,reset,save"
_TIME_BORDER = 64
"""Pixels left of every chart on the time axis: their y tick labels differ in width ("5" on a short
run's waterfall, "100" on utilization), and a frame per width put the same instant at different x."""
_MIB = 1024**2
_GIB = 1024**3


def report_layout(report: ReportData) -> LayoutDOM | None:
    """Stage waterfall, aggregate breakdown and utilization over time; None when there is nothing to draw."""
    from bokeh.layouts import column, row

    table = report["step_table"]
    time_figs: list[Figure] = []
    waterfall = waterfall_figure(table) if table["start"] else None
    if waterfall is not None:
        time_figs.append(waterfall)
    x_range = waterfall.x_range if waterfall is not None else None
    memory = memory_kind(report["host"]["pss_peak_bytes"])
    time_figs += utilization_figures(report["timeseries"], x_range, memory)
    side = breakdown_figure(report["stages"])
    if not time_figs and side is None:
        return None
    left = column(*time_figs, sizing_mode="stretch_width") if time_figs else None
    parts = [p for p in (left, side) if p is not None]
    return row(*parts, sizing_mode="stretch_width") if len(parts) > 1 else parts[0]


def waterfall_figure(table: StepTable) -> Figure:
    """Steps along time, each a stacked bar of its stages (hover: the durations)."""
    from bokeh.models import ColumnDataSource, DataRange1d
    from bokeh.models.renderers import DataRenderer
    from bokeh.plotting import figure

    start = np.asarray(table["start"], dtype=float)
    end = np.asarray(table["end"], dtype=float)
    names = list(table["stages"])
    seconds = np.array([[_num(x) for x in table["stages"][n]] for n in names], dtype=float).T
    k, first, last, start, end, seconds = binned_steps(start, end, seconds, MAX_BARS)
    totals = seconds.sum(axis=1)
    scale, unit = (1.0, "s") if len(totals) and np.median(totals) >= 1 else (1e3, "ms")
    pad = (end - start) * 0.06

    stacked = np.cumsum(seconds, axis=1) - seconds  # each stage's bottom: the stages before it
    labels = [f"{f + 1}" if f == g else f"{f + 1}–{g + 1} (mean)" for f, g in zip(first, last, strict=True)]
    title = "Stage waterfall: each step split into its stages" + (f" (bins of {k} steps)" if k > 1 else "")
    fig = figure(
        title=title,
        y_range=DataRange1d(start=0),
        height=300,
        sizing_mode="stretch_width",
        tools=_TOOLS,
        x_axis_label="time since start (s)",
        y_axis_label=f"step time ({unit})",
        output_backend="canvas",
        min_border_left=_TIME_BORDER,
    )
    renderers: list[DataRenderer] = []
    for j, name in enumerate(names):  # one renderer per stage: legend in pipeline order, click to hide
        rows = seconds[:, j] > 0
        if not rows.any():
            continue
        s = seconds[rows, j]
        src = ColumnDataSource(
            {
                "left": (start + pad)[rows],
                "right": (end - pad)[rows],
                "bottom": stacked[rows, j] * scale,
                "top": (stacked[rows, j] + s) * scale,
                "steps": [lab for lab, r in zip(labels, rows, strict=True) if r],
                "dur": [fmt_seconds(x) for x in s],
                "share": [f"{x / t:.0%}" if t > 0 else "" for x, t in zip(s, totals[rows], strict=True)],
                "total": [fmt_seconds(t) for t in totals[rows]],
            }
        )
        color = stage_color(name)
        renderers.append(
            fig.quad(
                left="left",
                right="right",
                bottom="bottom",
                top="top",
                fill_color=color,
                line_color=None,
                legend_label=name,
                name=name,
                source=src,
            )
        )
    finish_stage_bars(fig, renderers)
    return fig


def finish_stage_bars(fig: Any, renderers: list[Any], row_label: str | None = None) -> None:
    """A waterfall's hover (step, stage, its time and share, the step's time; ``row_label`` first where
    rows are named) and its legend below, a click hiding a stage."""
    from bokeh.models import HoverTool

    tooltips = [("step", "@steps"), ("stage", "$name"), ("time", "@dur (@share)"), ("step time", "@total")]
    fig.add_tools(
        HoverTool(renderers=renderers, tooltips=[("", row_label), *tooltips] if row_label else tooltips)
    )
    if renderers:
        fig.legend.orientation = "horizontal"
        fig.legend.label_text_font_size = "8pt"
        fig.legend.click_policy = "hide"
        fig.add_layout(fig.legend[0], "below")
    fig.toolbar.logo = None


def binned_steps(
    start: np.ndarray, end: np.ndarray, seconds: np.ndarray, max_bars: int
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """At most ``max_bars`` rows of a step table: bins of ``k`` consecutive rows, each from its first
    row's start to its last row's end with the mean seconds per row of each stage.

    Returns ``(k, first, last, start, end, seconds)``: ``first``/``last`` index each bin's rows.
    """
    k = max(1, -(-len(start) // max_bars))
    first = np.arange(0, len(start), k)
    if k == 1:
        return k, first, first, start, end, seconds
    last = np.minimum(first + k - 1, len(start) - 1)
    means = np.add.reduceat(seconds, first, axis=0) / (last - first + 1)[:, None]
    return k, first, last, start[first], end[last], means


def breakdown_figure(stages: dict[str, Stage]) -> Figure | None:
    """Share of step time per stage over the steady steps (hover: total and mean per step)."""
    if not stages:
        return None
    from bokeh.models import ColumnDataSource, FactorRange, HoverTool, Range1d
    from bokeh.plotting import figure

    order = sorted(stages, key=lambda n: _num(stages[n]["fraction"]))
    frac = [_num(stages[n]["fraction"]) for n in order]
    src = ColumnDataSource(
        {
            "stage": order,
            "pct": [f * 100 for f in frac],
            "label": [f"{f:.0%}" for f in frac],
            "color": [stage_color(n) for n in order],
            "total": [fmt_seconds(stages[n]["total_s"]) for n in order],
            "mean": [fmt_seconds(stages[n]["mean_s"]) for n in order],
        }
    )
    fig = figure(
        title="Share of step time",
        y_range=FactorRange(factors=order),
        x_range=Range1d(start=0, end=max(100.0, max(frac) * 100 if frac else 0) * 1.15),
        width=300,
        height=max(160, 60 + 28 * len(order)),
        tools="save",
        x_axis_label="% of step time",
        output_backend="canvas",
    )
    fig.hbar(y="stage", right="pct", height=0.7, fill_color="color", line_color=None, source=src)
    fig.text(
        x="pct", y="stage", text="label", x_offset=4, text_baseline="middle", text_font_size="8pt", source=src
    )
    fig.add_tools(
        HoverTool(
            tooltips=[
                ("stage", "@stage"),
                ("share", "@label"),
                ("total", "@total"),
                ("mean/step", "@mean"),
            ]
        )
    )
    fig.ygrid.grid_line_color = None
    fig.toolbar.logo = None
    return fig


def utilization_figures(
    ts: Timeseries, x_range: Range | None = None, memory: str | None = None
) -> list[Figure]:
    """Utilization (%) and memory (MiB or GiB) over time, on the waterfall's time axis.

    The process tree's memory is drawn in the measure ``memory`` (``"PSS"`` or ``"RSS"``: the one
    its report names); without it, PSS where sampled. A metric with fewer than two samples is left
    out (a single point draws nothing), and so is a chart left with no line.
    """
    metrics: dict[str, Series] = {
        m: s for m, s in ts["metrics"].items() if sum(v is not None for v in s["v"]) >= 2
    }
    gpus = [(m, g) for m in sorted(metrics) if (g := gpu_metric(m)) is not None]
    util = [(f"GPU {i}", m, 100.0) for m, (i, quantity) in gpus if quantity == "util"]
    util += [("host CPU", "host.cpu_util", 100.0)] if "host.cpu_util" in metrics else []
    mem_metrics = [(f"GPU {i} memory", m) for m, (i, quantity) in gpus if quantity == "mem_used_bytes"]
    # The tree's PSS where sampled (RSS summed over workers counts the pages they share once each),
    # and never the other measure in its place: the chart names what the report's text names.
    kind = memory or ("PSS" if MEMORY_METRICS["PSS"] in metrics else "RSS")
    if MEMORY_METRICS[kind] in metrics:
        mem_metrics.append((memory_name(kind), MEMORY_METRICS[kind]))
    figs = []
    if util:
        figs.append(_series_figure("Utilization", "%", util, metrics, x_range, (0, 105)))
    if mem_metrics:
        peak = max(_num(v) for _, m in mem_metrics for v in metrics[m]["v"])
        unit, factor = ("GiB", 1 / _GIB) if peak >= _GIB else ("MiB", 1 / _MIB)
        mem = [(label, m, factor) for label, m in mem_metrics]
        # From zero: an auto-ranged axis turned a 1% drift in RSS into a cliff, with "0.342" ticks.
        figs.append(_series_figure("Memory", unit, mem, metrics, x_range, (0, None)))
    return figs


def _series_figure(
    title: str,
    unit: str,
    lines: list[tuple[str, str, float]],
    metrics: dict[str, Series],
    x_range: Range | None,
    y_range: tuple[float, float | None] | None,
) -> Figure:
    from bokeh.models import ColumnDataSource, DataRange1d, HoverTool, NumeralTickFormatter, Range1d
    from bokeh.models.renderers import DataRenderer
    from bokeh.plotting import figure

    kwargs: dict[str, Any] = {"x_range": x_range} if x_range is not None else {}
    if y_range is not None:
        start, end = y_range
        kwargs["y_range"] = (
            Range1d(start=start, end=end) if end is not None else DataRange1d(start=start, range_padding=0.15)
        )
    fig = figure(
        title=title,
        height=170,
        sizing_mode="stretch_width",
        tools=_TOOLS,
        y_axis_label=unit,
        output_backend="canvas",
        min_border_left=_TIME_BORDER,
        **kwargs,
    )
    gpu_colors = iter(_SERIES_COLORS)
    renderers: list[DataRenderer] = []
    for label, metric, factor in lines:
        series = metrics[metric]
        v = np.array([_num(x, np.nan) for x in series["v"]], dtype=float) * factor
        src = ColumnDataSource({"t": np.asarray(series["t"], dtype=float), "v": v})
        color = _HOST_COLOR if metric.startswith("host") else next(gpu_colors, "#333333")
        renderers.append(fig.line("t", "v", source=src, line_width=1.6, color=color, legend_label=label))
    fig.add_tools(
        HoverTool(renderers=renderers, tooltips=[("t", "@t{0.00} s"), (unit, "@v{0.0}")], mode="vline")
    )
    fig.yaxis.formatter = NumeralTickFormatter(format="0[.][0]")  # 512, 1.5: never "0.342"
    fig.legend.location = "top_left"
    fig.legend.orientation = "horizontal"  # one thin strip: covers less of the lines than a box
    fig.legend.label_text_font_size = "8pt"
    fig.legend.background_fill_alpha = 0.6
    fig.toolbar.logo = None
    return fig


def comparison_figure(
    before: dict[str, float], after: dict[str, float], labels: tuple[str, str]
) -> Figure | None:
    """Seconds per step of each stage, before and after, side by side."""
    names = list(dict.fromkeys([*before, *after]))
    if not names:
        return None
    from bokeh.models import ColumnDataSource, DataRange1d, FactorRange, HoverTool
    from bokeh.plotting import figure
    from bokeh.transform import dodge

    order = sorted(names, key=lambda n: max(before.get(n, 0.0), after.get(n, 0.0)))
    b = [before.get(n, 0.0) for n in order]
    a = [after.get(n, 0.0) for n in order]
    scale, unit = (1.0, "s") if max(b + a) >= 1 else (1e3, "ms")
    src = ColumnDataSource(
        {
            "stage": order,
            "before": [x * scale for x in b],
            "after": [x * scale for x in a],
            "before_txt": [fmt_seconds(x) for x in b],
            "after_txt": [fmt_seconds(x) for x in a],
            "color": [stage_color(n) for n in order],
        }
    )
    fig = figure(
        title=f"Time per step by stage: {labels[0]} vs {labels[1]}",
        y_range=FactorRange(factors=order),
        x_range=DataRange1d(start=0),
        height=max(220, 110 + 40 * len(order)),  # the legend above takes 40 px
        sizing_mode="stretch_width",
        tools="save",
        x_axis_label=f"per step ({unit})",
        output_backend="canvas",
    )
    for key, offset, alpha, label in (("before", 0.18, 0.35, labels[0]), ("after", -0.18, 1.0, labels[1])):
        fig.hbar(
            y=dodge("stage", offset, range=fig.y_range),
            right=key,
            height=0.34,
            fill_color="color",
            fill_alpha=alpha,
            line_color="color",
            source=src,
        )
        # The bars take their stage's colour, so a legend drawn from them showed the first stage's (a
        # red "before" over orange bars): its swatches are grey bars of no width, faded as "before" is.
        fig.hbar(
            y=[order[0]], left=[0.0], right=[0.0], height=0.34, fill_color=_SWATCH, fill_alpha=alpha,
            line_color=None, legend_label=label,
        )  # fmt: skip
    fig.add_tools(
        HoverTool(tooltips=[("stage", "@stage"), (labels[0], "@before_txt"), (labels[1], "@after_txt")])
    )
    fig.ygrid.grid_line_color = None
    fig.legend.orientation = "horizontal"
    fig.add_layout(fig.legend[0], "above")  # over no bar: the longest ran under it at the right
    fig.toolbar.logo = None
    return fig


def _num(x: Any, default: float = 0.0) -> float:
    return default if x is None else float(x)
