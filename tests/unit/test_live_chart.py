"""The live panel's utilization chart: the last minute, drawn as SVG in the kernel (nothing comes back)."""

from __future__ import annotations

import math
import re

from perfmagic.render.live_chart import UtilizationChart


def lines(chart: UtilizationChart) -> dict[str, list[list[tuple[float, float]]]]:
    """Per series, its polylines' points as drawn (x, y in the SVG's units)."""
    out: dict[str, list[list[tuple[float, float]]]] = {}
    for series, points in re.findall(r'data-series="(\w+)" points="([^"]*)"', chart.html()):
        pairs = [tuple(float(v) for v in p.split(",")) for p in points.split()]
        out.setdefault(series, []).append([(x, y) for x, y in pairs])
    return out


def test_nothing_before_the_first_point() -> None:
    assert UtilizationChart().html() == ""


def test_the_window_follows_the_last_point() -> None:
    chart = UtilizationChart(window_s=10.0)
    for i in range(31):  # 15 s at 2 Hz
        chart.add(i * 0.5, gpu=50.0, cpu=float(i % 2) * 100)
    drawn = lines(chart)
    (gpu,) = drawn["gpu"]
    assert len(gpu) == 21  # 10 s at 2 Hz, both ends in
    assert gpu[0][0] < gpu[-1][0] and len({y for _, y in gpu}) == 1  # left to right, flat at 50%
    (cpu,) = drawn["cpu"]
    assert min(y for _, y in cpu) < max(y for _, y in cpu)  # 100% above 0%
    assert ">5 s<" in chart.html() and ">15 s<" in chart.html()  # the axis says which seconds


def test_a_missing_value_is_a_gap_and_a_series_without_values_is_left_out() -> None:
    chart = UtilizationChart()
    for i, cpu in enumerate([10.0, 20.0, math.nan, 30.0, 40.0]):
        chart.add(float(i), gpu=math.nan, cpu=cpu)
    drawn = lines(chart)
    assert [len(run) for run in drawn["cpu"]] == [2, 2]  # no drop to zero where the value is unknown
    assert "gpu" not in drawn and 'data-series="gpu"' not in chart.html()  # nor a legend entry for it
    assert "host CPU" in chart.html()


def test_values_past_the_scale_stay_on_it() -> None:
    chart = UtilizationChart()
    chart.add(0.0, cpu=-5.0)
    chart.add(1.0, cpu=250.0)
    ((low, high),) = lines(chart)["cpu"]
    assert 0 <= high[1] < low[1] <= 130
