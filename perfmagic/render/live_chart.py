"""The live panel's chart: GPU and host CPU utilization over the last minute, drawn as SVG in the kernel.

Drawn here rather than by BokehJS through jupyter_bokeh: its widget view sends every change of the
browser's document back to the kernel, echoes of the kernel's own updates included. While the
profiled cell runs the kernel reads none of them; it reads them after the cell, once the panel's
comm is closed, each one a "No such comm" warning in JupyterLab's log console. An SVG in an
ipywidgets ``HTML`` only ever travels from the kernel to the browser.
"""

from __future__ import annotations

import html
import math
from collections import deque
from collections.abc import Callable

# (key, legend, colour): the colours the report's utilization chart gives them
SERIES = (("gpu", "GPU util (mean)", "#59a14f"), ("cpu", "host CPU", "#e15759"))
_W, _H = 640, 130  # the drawing's units (the SVG scales to the output's width, up to _W px)
_LEFT, _RIGHT, _TOP, _BOTTOM = 34, 8, 6, 18  # room for the axes' labels
_Y_MAX = 105.0  # per cent at the top edge: a line at 100% stays visible


class UtilizationChart:
    """The last ``window_s`` seconds of utilization in per cent (NaN where unknown), as SVG."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._points: deque[tuple[float, dict[str, float]]] = deque()

    def add(self, t: float, **values: float) -> None:
        """Add the values (per cent, by series key) at ``t`` seconds; points older than the window go."""
        self._points.append((t, values))
        while self._points and self._points[0][0] < t - self.window_s:
            self._points.popleft()

    def html(self) -> str:
        """The legend (series with at least one value) and the SVG; empty before the first point."""
        if not self._points:
            return ""
        t1 = self._points[-1][0]
        t0 = min(self._points[0][0], max(0.0, t1 - self.window_s))
        span = max(t1 - t0, 1e-9)

        def x(t: float) -> float:
            return _LEFT + (t - t0) / span * (_W - _LEFT - _RIGHT)

        def y(v: float) -> float:
            return _TOP + (1 - min(max(v, 0.0), _Y_MAX) / _Y_MAX) * (_H - _TOP - _BOTTOM)

        parts = [_grid(y), _x_labels(x, t0, t1)]
        shown = []
        for key, label, color in SERIES:
            runs = _runs([(t, v.get(key, math.nan)) for t, v in self._points])
            if not runs:
                continue  # no GPU (or none read yet): no line, and no legend entry promising one
            shown.append((key, label, color))
            for run in runs:
                coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in run)
                parts.append(
                    f'<polyline class="pm-live-line" data-series="{key}" points="{coords}" fill="none" '
                    f'stroke="{color}" stroke-width="2" stroke-linejoin="round"/>'
                )
        legend = " ".join(
            f'<span class="pm-live-legend" data-series="{key}"><span style="color:{color}">■</span> '
            f"{html.escape(label)}</span>"
            for key, label, color in shown
        )
        return (
            f'<div style="font-size:11px;margin-top:4px">{legend}</div>'
            f'<svg class="pm-live-chart" viewBox="0 0 {_W} {_H}" width="100%" style="max-width:{_W}px" '
            f'font-size="10" font-family="sans-serif">{"".join(parts)}</svg>'
        )


def _runs(points: list[tuple[float, float]]) -> list[list[tuple[float, float]]]:
    """The points split where a value is missing: a gap in the line, not a drop to zero."""
    runs: list[list[tuple[float, float]]] = [[]]
    for t, v in points:
        if math.isnan(v):
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append((t, v))
    return [r for r in runs if r]


def _grid(y: Callable[[float], float]) -> str:
    lines = []
    for pct in (0, 50, 100):
        at = y(float(pct))
        lines.append(
            f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{at:.1f}" y2="{at:.1f}" stroke="#d0d7de" '
            f'stroke-width="1"/><text x="{_LEFT - 4}" y="{at + 3:.1f}" text-anchor="end" '
            f'fill="#57606a">{pct}%</text>'
        )
    return "".join(lines)


def _x_labels(x: Callable[[float], float], t0: float, t1: float) -> str:
    base = _H - 4
    return (
        f'<text x="{x(t0):.1f}" y="{base}" fill="#57606a">{t0:.0f} s</text>'
        f'<text x="{x(t1):.1f}" y="{base}" text-anchor="end" fill="#57606a">{t1:.0f} s</text>'
    )
