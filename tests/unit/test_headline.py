"""The report's headline: the bottleneck in words that fit what was measured and agree with the cards."""

from __future__ import annotations

import dataclasses
from typing import Any

from analysis_builder import HEALTHY, STEADY_MEANS, plain

from perfmagic.advise.headline import headline
from perfmagic.contract import ReportData
from perfmagic.render.html import report_fragment
from perfmagic.render.text import render_text
from perfmagic.report import build_report

COMPLETE = {"ops": ["batch", "cache", "prefetch"], "serial_maps": 0, "cache": True, "prefetch": True}
"""A tf.data pipeline with nothing left to add: its wait on a crowded machine is left to cpu_contention."""


def report(**options: Any) -> ReportData:
    return build_report(plain(**options)).to_dict()


def tf_data(cpu_util: float) -> ReportData:
    a = plain(
        stages={**HEALTHY, "data": 0.01},
        loader=None,
        steady_means={**STEADY_MEANS, "host.cpu_util": cpu_util},
    )
    return build_report(
        dataclasses.replace(a, config=dataclasses.replace(a.config, pipelines=[COMPLETE]))
    ).to_dict()


def test_an_input_wait_whose_card_another_names_says_its_cause() -> None:
    crowded = tf_data(0.98)
    assert crowded["bottleneck"] == "data" and [c["id"] for c in crowded["advice"]] == ["cpu_contention"]
    cause = crowded["advice"][0]["title"]
    said = headline(crowded)
    assert said == f"Input-bound: waiting for the next batch takes 43% of each step; cause: {cause}"
    text = render_text(crowded)
    assert f"bottleneck: data (43% of step time); cause: {cause}" in text.splitlines()
    assert "most to gain elsewhere" not in text  # the cause is said once
    assert said in report_fragment(crowded).replace("&#x27;", "'")
    # on a quiet machine the input card is there: no cause to borrow
    quiet = tf_data(0.3)
    assert [c["id"] for c in quiet["advice"]] == ["input_bound"]
    assert headline(quiet) == "Input-bound: waiting for the next batch takes 43% of each step"
