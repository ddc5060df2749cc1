"""Still pictures of a report's charts and of a comparison's, for where BokehJS cannot run.

A saved notebook opened untrusted, a notebook exported to PDF or HTML, a viewer that strips
scripts: there the report shows this PNG instead of the interactive charts. It draws the stage
waterfall (each step a stacked bar of its stages, along time, with a legend of the stages drawn)
and each stage's share of step time, with a strip of the memory bars below where the report has
them (``perfmagic.render.memory``); a comparison, each stage's time per step before and after.
Axes fit the data with round ticks (``perfmagic.render.axes``) and stages have the colours of the
live panel and the interactive charts. Pillow only (Bokeh's own PNG export needs a browser), in a
small palette so a picture stays a few KB.

What is drawn is built first as plain data (:func:`waterfall_chart`, :func:`comparison_chart`):
the drawing only places it, and tests read the charts' axes and legends from that data.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfmagic.contract import ReportData, Stage, StepTable
from perfmagic.render.axes import Axis, seconds_axis, time_axis
from perfmagic.render.colors import stage_color
from perfmagic.render.memory import draw_strip, memory_bars, strip_height

WIDTH, HEIGHT = 900, 290
_PLOT = (64, 28, 620, 226)  # left, top, right, bottom of the waterfall
_SIDE = 650  # where the share bars start
_INK, _GRID = "#444444", "#e4e4e4"
_BEFORE_ALPHA = 0.35  # the comparison's "before" bars: their stage's colour, faded as in the Bokeh chart
_SWATCH = "#777777"  # the before/after legend: grey, since every stage has its own colour
_ROW = 15  # px per legend row


@dataclass(frozen=True)
class Waterfall:
    """The still waterfall: each step's seconds per stage drawn (only stages with any time, in the
    step table's order), its time and step-time axes and its legend of ``(stage, colour)``."""

    start: np.ndarray
    end: np.ndarray
    stages: list[str]
    seconds: np.ndarray
    x: Axis
    y: Axis
    legend: list[tuple[str, str]]


@dataclass(frozen=True)
class ComparisonChart:
    """Seconds per step of each stage before and after, the largest stage first; one axis for both,
    stage colours on the bars, and a legend that tells before (faded) from after (solid)."""

    stages: list[str]
    before: list[float]
    after: list[float]
    x: Axis
    legend: list[tuple[str, str]]


def waterfall_chart(table: StepTable) -> Waterfall | None:
    """The waterfall to draw for a step table; None when it has no step."""
    if not table["start"]:
        return None
    start = np.asarray(table["start"], dtype=float)
    end = np.asarray(table["end"], dtype=float)
    columns = {
        n: np.nan_to_num(np.array([_num(x) for x in v], dtype=float)) for n, v in table["stages"].items()
    }
    stages = [
        n for n, column in columns.items() if (column > 0).any()
    ]  # a stage never drawn is no legend entry
    seconds = np.array([columns[n] for n in stages]).T.reshape(len(start), len(stages))
    longest = float(seconds.sum(axis=1).max()) if seconds.size else 0.0
    return Waterfall(
        start,
        end,
        stages,
        seconds,
        time_axis(float(start.min()), float(end.max())),
        seconds_axis(longest),
        [(n, stage_color(n)) for n in stages],
    )


def comparison_chart(
    before: dict[str, float], after: dict[str, float], labels: tuple[str, str]
) -> ComparisonChart | None:
    """The comparison to draw; None when neither run has a stage."""
    names = list(dict.fromkeys([*before, *after]))
    if not names:
        return None
    order = sorted(names, key=lambda n: -max(before.get(n, 0.0), after.get(n, 0.0)))
    b, a = [before.get(n, 0.0) for n in order], [after.get(n, 0.0) for n in order]
    legend = [(labels[0], _faded(_SWATCH, _BEFORE_ALPHA)), (labels[1], _SWATCH)]
    return ComparisonChart(order, b, a, seconds_axis(max(b + a)), legend)


def charts_png(report: ReportData) -> bytes | None:
    """The waterfall and the stage shares as PNG bytes; None when the report has no steps to draw."""
    chart = waterfall_chart(report["step_table"])
    stages = report["stages"]
    if chart is None or not stages:
        return None
    bars = memory_bars(report)
    image, draw, font, title = _canvas(WIDTH, HEIGHT + strip_height(bars))
    _draw_waterfall(draw, chart, font, title)
    _draw_shares(draw, stages, font, title)
    draw_strip(draw, bars, font, HEIGHT, _PLOT[0], WIDTH - 44)
    return _png(image)


def comparison_png(
    before: dict[str, float], after: dict[str, float], labels: tuple[str, str]
) -> bytes | None:
    """The comparison's stage times as PNG bytes; None when neither run has a stage."""
    chart = comparison_chart(before, after, labels)
    if chart is None:
        return None
    left, right, top, row = 120, WIDTH - 90, 50, 34
    bottom = top + row * len(chart.stages)
    image, draw, font, title = _canvas(WIDTH, bottom + 28)
    draw.text((left, 6), f"Time per step by stage: {labels[0]} vs {labels[1]}", fill=_INK, font=title)
    _legend(draw, chart.legend, font, left, right, 26)
    _x_ticks(draw, chart.x, font, left, right, top, bottom)
    for k, name in enumerate(chart.stages):
        y = top + k * row
        draw.text((left - 8, y + row / 2), name, fill=_INK, font=font, anchor="rm")
        color = stage_color(name)
        for j, (value, fill) in enumerate(
            ((chart.before[k], _faded(color, _BEFORE_ALPHA)), (chart.after[k], color))
        ):
            y0 = y + 4 + j * (row - 8) / 2
            x1 = chart.x.at(value, left, right)
            draw.rectangle(
                [(left, y0), (max(left + 1, x1), y0 + (row - 8) / 2 - 1)], fill=fill, outline=color
            )
            label = f"{value * chart.x.scale:.3g} {chart.x.unit}"  # in the axis' unit: the font has no µ
            draw.text((x1 + 4, y0 + (row - 8) / 4), label, fill=_INK, font=font, anchor="lm")
    draw.line([(left, top), (left, bottom)], fill=_INK)
    return _png(image)


def _canvas(width: int, height: int) -> tuple[Any, Any, Any, Any]:
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", (width, height), "white")
    return image, ImageDraw.Draw(image), ImageFont.load_default(size=11), ImageFont.load_default(size=13)


def _png(image: Any) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    # few colors: the stage colors, grey ink and the text's antialiasing; no dithering keeps it small
    image.quantize(colors=48, dither=Image.Dither.NONE).save(out, format="PNG", optimize=True)
    return out.getvalue()


def _draw_waterfall(draw: Any, chart: Waterfall, font: Any, title: Any) -> None:
    left, top, right, bottom = _PLOT
    draw.text((left, 6), "Stage waterfall: each step split into its stages", fill=_INK, font=title)
    for value, label in zip(chart.y.ticks, chart.y.labels, strict=True):  # y grid: step time
        y = chart.y.at(value, bottom, top)
        draw.line([(left, y), (right, y)], fill=_GRID)
        draw.text((left - 6, y), f"{label} {chart.y.unit}", fill=_INK, font=font, anchor="rm")
    for value, label in zip(chart.x.ticks, chart.x.labels, strict=True):  # x: time since the start
        x = chart.x.at(value, left, right)
        draw.line([(x, bottom), (x, bottom + 3)], fill=_INK)
        draw.text((x, bottom + 5), f"{label} {chart.x.unit}", fill=_INK, font=font, anchor="ma")
    for i in range(len(chart.start)):
        pad = 0.06 * (chart.end[i] - chart.start[i])  # a gap between steps, as in the interactive waterfall
        x0 = chart.x.at(chart.start[i] + pad, left, right)
        x1 = max(x0 + 1, chart.x.at(chart.end[i] - pad, left, right))
        base = 0.0
        for j, name in enumerate(chart.stages):
            if chart.seconds[i, j] > 0:
                y0, y1 = chart.y.at(base, bottom, top), chart.y.at(base + chart.seconds[i, j], bottom, top)
                draw.rectangle([(x0, y1), (x1, y0)], fill=stage_color(name))
                base += chart.seconds[i, j]
    draw.line([(left, bottom), (right, bottom)], fill=_INK)
    _legend(draw, chart.legend, font, left, right, bottom + 24)


def _x_ticks(draw: Any, axis: Axis, font: Any, left: float, right: float, top: float, bottom: float) -> None:
    """A horizontal value axis below ``bottom``, with its grid up to ``top``."""
    for value, label in zip(axis.ticks, axis.labels, strict=True):
        x = axis.at(value, left, right)
        draw.line([(x, top), (x, bottom)], fill=_GRID)
        draw.text((x, bottom + 4), f"{label} {axis.unit}", fill=_INK, font=font, anchor="ma")


def _legend(
    draw: Any, entries: list[tuple[str, str]], font: Any, left: float, right: float, top: float
) -> None:
    """A swatch and a name per entry, in rows from ``left`` to ``right``."""
    x, y = left, top
    for name, color in entries:
        width = 14 + draw.textlength(name, font=font)
        if x > left and x + width > right:
            x, y = left, y + _ROW
        draw.rectangle([(x, y + 1), (x + 9, y + 10)], fill=color)
        draw.text((x + 13, y + 6), name, fill=_INK, font=font, anchor="lm")
        x += width + 14


def _draw_shares(draw: Any, stages: dict[str, Stage], font: Any, title: Any) -> None:
    draw.text((_SIDE, 6), "Share of step time", fill=_INK, font=title)
    order = sorted(stages, key=lambda n: -(stages[n]["fraction"] or 0.0))
    row = min(24, (HEIGHT - 40) // max(1, len(order)))
    bar_left, bar_right = _SIDE + 80, WIDTH - 44
    for k, name in enumerate(order):
        share = float(stages[name]["fraction"] or 0.0)
        y = 34 + k * row
        draw.text((bar_left - 6, y + row / 2), name, fill=_INK, font=font, anchor="rm")
        x1 = bar_left + (bar_right - bar_left) * share
        draw.rectangle([(bar_left, y + 3), (max(bar_left + 1, x1), y + row - 3)], fill=stage_color(name))
        draw.text((x1 + 4, y + row / 2), f"{share:.0%}", fill=_INK, font=font, anchor="lm")


def _faded(color: str, alpha: float) -> str:
    """``color`` at ``alpha`` over white, as an opaque colour (the PNG has no transparency)."""
    rgb = [int(color[k : k + 2], 16) for k in (1, 3, 5)]
    return "#" + "".join(f"{round(255 - alpha * (255 - c)):02x}" for c in rgb)


def _num(x: float | None) -> float:
    return 0.0 if x is None else float(x)
