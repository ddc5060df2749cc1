"""A still picture of a report's charts, for where BokehJS cannot run.

A saved notebook opened untrusted, a notebook exported to PDF or read in a viewer that strips
scripts: there the report shows this PNG instead of the interactive charts. It draws the stage
waterfall (each step a stacked bar of its stages, along time) and each stage's share of step time,
with Pillow only (Bokeh's own PNG export needs a browser), in a small palette so it stays a few KB.
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np

from perfmagic.contract import ReportData, Stage, StepTable
from perfmagic.render.waterfall import stage_color

WIDTH, HEIGHT = 900, 260
_PLOT = (52, 28, 620, 226)  # left, top, right, bottom of the waterfall
_SIDE = 650  # where the share bars start
_INK, _GRID = "#444444", "#e4e4e4"


def charts_png(report: ReportData) -> bytes | None:
    """The waterfall and the stage shares as PNG bytes; None when the report has no steps to draw."""
    table = report.get("step_table") or {}
    stages = report.get("stages") or {}
    if not table.get("start") or not stages:
        return None
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=11)
    title = ImageFont.load_default(size=13)
    _waterfall(draw, table, font, title)
    _shares(draw, stages, font, title)
    out = io.BytesIO()
    # few colors: the stage colors, grey ink and the text's antialiasing; no dithering keeps it small
    image.quantize(colors=48, dither=Image.Dither.NONE).save(out, format="PNG", optimize=True)
    return out.getvalue()


def _waterfall(draw: Any, table: StepTable, font: Any, title: Any) -> None:
    left, top, right, bottom = _PLOT
    start = np.asarray(table["start"], dtype=float)
    end = np.asarray(table["end"], dtype=float)
    names = list(table["stages"])
    seconds = np.nan_to_num(
        np.array([[x if x is not None else 0.0 for x in table["stages"][n]] for n in names], dtype=float).T
    )
    t0, t1 = float(start.min()), float(end.max())
    span = max(t1 - t0, 1e-9)
    longest = float(seconds.sum(axis=1).max())
    scale, unit = (1.0, "s") if longest >= 1 else (1e3, "ms")  # the font has no µ: ms at the finest
    tick = _nice_step(longest * scale / 4)
    peak = tick * 4 / scale or 1.0  # the y axis ends on the fourth round tick above the longest step
    draw.text((left, 6), "Stage waterfall: each step split into its stages", fill=_INK, font=title)
    for k in range(5):  # y grid: step time
        y = bottom - (bottom - top) * k / 4
        draw.line([(left, y), (right, y)], fill=_GRID)
        draw.text((left - 6, y), f"{tick * k:g} {unit}", fill=_INK, font=font, anchor="rm")
    for k in range(5):  # x ticks: time since the start (s)
        x = left + (right - left) * k / 4
        draw.text((x, bottom + 4), f"{t0 + span * k / 4:.3g} s", fill=_INK, font=font, anchor="ma")
    px = (right - left) / span
    for i in range(len(start)):
        pad = 0.06 * (end[i] - start[i]) * px  # a gap between steps, as in the interactive waterfall
        x0 = left + (start[i] - t0) * px + pad
        x1 = max(x0 + 1, left + (end[i] - t0) * px - pad)
        y = float(bottom)
        for j, name in enumerate(names):
            h = seconds[i, j] / peak * (bottom - top)
            if h > 0:
                draw.rectangle([(x0, y - h), (x1, y)], fill=stage_color(name))
                y -= h
    draw.line([(left, bottom), (right, bottom)], fill=_INK)


def _shares(draw: Any, stages: dict[str, Stage], font: Any, title: Any) -> None:
    draw.text((_SIDE, 6), "Share of step time", fill=_INK, font=title)
    order = sorted(stages, key=lambda n: -(stages[n].get("fraction") or 0.0))
    row = min(24, (HEIGHT - 40) // max(1, len(order)))
    bar_left, bar_right = _SIDE + 80, WIDTH - 44
    for k, name in enumerate(order):
        share = float(stages[name].get("fraction") or 0.0)
        y = 34 + k * row
        draw.text((bar_left - 6, y + row / 2), name, fill=_INK, font=font, anchor="rm")
        x1 = bar_left + (bar_right - bar_left) * share
        draw.rectangle([(bar_left, y + 3), (max(bar_left + 1, x1), y + row - 3)], fill=stage_color(name))
        draw.text((x1 + 4, y + row / 2), f"{share:.0%}", fill=_INK, font=font, anchor="lm")


def _nice_step(x: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above ``x``."""
    if x <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(x))
    return next(m * power for m in (1.0, 2.0, 5.0, 10.0) if m * power >= x * (1 - 1e-9))
