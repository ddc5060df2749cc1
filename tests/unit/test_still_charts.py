"""The still charts (PNG) that show where no script runs: fitted axes, round ticks, a stage legend.

Read from the charts the PNG renderer builds (``waterfall_chart``, ``comparison_chart``) and from
the Bokeh comparison figure, not from pixels; the PNG itself is only checked to hold those colours.
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np
import pytest
from analysis_builder import whole_report
from PIL import Image

from perfmagic.render.axes import FIT, Axis, seconds_axis, time_axis
from perfmagic.render.colors import STAGE_COLORS, stage_color
from perfmagic.render.png import charts_png, comparison_chart, comparison_png, waterfall_chart
from perfmagic.render.waterfall import comparison_figure

LONGEST = 0.965
"""The largest step of the report below, in seconds: the one a new user saw drawn to 2000 ms."""


def report() -> dict[str, Any]:
    """40 steps from t = 0.0763 s, one of them LONGEST; ``logging`` never takes any time."""
    rng = np.random.default_rng(0)
    n = 40
    stages = {
        "data": rng.uniform(0.1, 0.4, n),
        "h2d": np.full(n, 0.01),
        "forward": rng.uniform(0.05, 0.2, n),
        "backward": rng.uniform(0.05, 0.2, n),
        "optimizer": np.full(n, 0.02),
        "logging": np.zeros(n),
    }
    stages["data"][7] = LONGEST - 0.01 - 0.2 - 0.2 - 0.02
    stages["forward"][7] = stages["backward"][7] = 0.2
    total = np.sum(list(stages.values()), axis=0)
    start = 0.0763 + np.concatenate([[0.0], np.cumsum(total)[:-1]])
    whole = whole_report()  # every other section as the report builder writes it
    whole["step_table"] = {
        "boundary": None,
        "steps_per_row": 1,
        "start": start.tolist(),
        "end": (start + total).tolist(),
        "stages": {k: v.tolist() for k, v in stages.items()},
    }
    whole["stages"] = {
        k: {
            "total_s": float(v.sum()),
            "fraction": float(v.sum() / total.sum()),
            "median_s": float(np.median(v)),
            "mean_s": float(v.mean()),
        }
        for k, v in stages.items()
    }
    return whole


def is_round(step: float) -> bool:
    """1, 2 or 5 times a power of ten."""
    mantissa = step / 10 ** math.floor(math.log10(step) + 1e-9)
    return any(math.isclose(mantissa, m, rel_tol=1e-6) for m in (1, 2, 5))


def assert_round(axis: Axis) -> None:
    steps = np.diff(axis.ticks) * axis.scale
    assert len(steps) >= 2 and np.allclose(steps, steps[0]) and is_round(float(steps[0])), axis
    for value, label in zip(axis.ticks, axis.labels, strict=True):
        assert float(label) == pytest.approx(value * axis.scale), axis  # a label says its tick's value
        assert len(label.replace(".", "").lstrip("0")) <= 4, axis  # "200", "0.5": never "0.0763"


def test_the_waterfall_axis_ends_within_a_quarter_above_the_largest_step_on_round_ticks() -> None:
    chart = waterfall_chart(report()["step_table"])
    assert chart is not None
    assert LONGEST <= chart.y.hi <= FIT * LONGEST
    assert chart.y.unit == "ms" and chart.y.labels == ("0", "200", "400", "600", "800", "1000")
    assert_round(chart.y)
    # time in round seconds, from a round second at or before the first step to the last step's end
    assert chart.x.unit == "s" and chart.x.labels[:3] == ("0", "5", "10")
    assert chart.x.lo <= chart.start.min() and chart.x.hi == pytest.approx(chart.end.max())
    assert_round(chart.x)


def test_the_waterfall_legend_lists_every_stage_drawn_in_the_live_panels_colours() -> None:
    chart = waterfall_chart(report()["step_table"])
    assert chart is not None
    drawn = [name for j, name in enumerate(chart.stages) if (chart.seconds[:, j] > 0).any()]
    assert drawn == chart.stages == ["data", "h2d", "forward", "backward", "optimizer"]  # no logging
    assert chart.legend == [(name, STAGE_COLORS[name]) for name in drawn]
    png = charts_png(report())
    assert png is not None
    image = Image.open(io.BytesIO(png)).convert("RGB")
    colours = {"#{:02x}{:02x}{:02x}".format(*c) for _, c in image.getcolors(maxcolors=4096) or []}
    assert {colour for _, colour in chart.legend} <= colours


@pytest.mark.parametrize(
    "largest", [*np.geomspace(1.3e-4, 4e3, 29), 0.001, 0.2, 1.0, 1.01, 3.1, 5.3, 9.99, 15.3, 100.0]
)
def test_a_duration_axis_is_fitted_and_round_for_any_largest_value(largest: float) -> None:
    axis = seconds_axis(float(largest))
    assert largest <= axis.hi * (1 + 1e-9) and axis.hi <= FIT * largest * (1 + 1e-9)
    assert 3 <= len(axis.ticks) <= 9  # 16 s: every 2 s to 16, as every 5 s would end at 20 (over 1.25×)
    assert axis.unit == ("s" if largest >= 1 else "ms")
    assert_round(axis)


@pytest.mark.parametrize(("t0", "t1"), [(0.0763, 6.64), (0.0, 0.3), (12.5, 13.1), (3.0, 1800.0)])
def test_a_time_axis_ticks_round_seconds_inside_the_run(t0: float, t1: float) -> None:
    axis = time_axis(t0, t1)
    assert axis.lo <= t0 and axis.hi == pytest.approx(t1)
    assert all(axis.lo - 1e-9 <= t <= t1 + 1e-9 for t in axis.ticks) and 3 <= len(axis.ticks) <= 8
    assert_round(axis)


def test_the_comparison_colours_bars_by_stage_and_its_legend_by_before_and_after() -> None:
    before, after = (
        {"data": 0.5, "forward": 0.1, "backward": 0.12},
        {"data": 0.05, "forward": 0.1, "h2d": 0.004},
    )
    chart = comparison_chart(before, after, ("slow", "fast"))
    assert chart is not None
    assert chart.stages == ["data", "backward", "forward", "h2d"]  # the largest first
    assert 0.5 <= chart.x.hi <= FIT * 0.5 and chart.x.unit == "ms"
    assert_round(chart.x)
    # the legend tells before from after in grey: no stage's colour, which would read as that stage's
    assert [label for label, _ in chart.legend] == ["slow", "fast"]
    assert not {colour for _, colour in chart.legend} & {stage_color(n) for n in chart.stages}
    assert comparison_png(before, after, ("slow", "fast"))

    fig = comparison_figure(before, after, ("slow", "fast"))
    items = {item.label["value"]: item.renderers[0].glyph for item in fig.legend[0].items}
    assert list(items) == ["slow", "fast"]
    assert {glyph.fill_color for glyph in items.values()} == {"#777777"}
    assert [glyph.fill_alpha for glyph in items.values()] == [0.35, 1.0]  # as the bars of each run
    bars = [r for r in fig.renderers if r.glyph not in items.values()]
    assert len(bars) == 2 and all(r.glyph.fill_color == "color" for r in bars)  # the stage's, per row
    assert bars[0].data_source.data["color"] == [stage_color(n) for n in bars[0].data_source.data["stage"]]
