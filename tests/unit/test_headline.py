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

COMPLETE = {
    "ops": ["batch", "cache", "prefetch"],
    "serial_maps": 0,
    "parallel_maps": 0,
    "cache": True,
    "prefetch": True,
}
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


def test_logging_without_a_device_names_no_host_device_syncs() -> None:
    cpu = report(stages={**HEALTHY, "logging": 0.02})  # print() on the CPU: nothing to sync with
    assert headline(cpu).startswith("Logging-bound: logging and printing take 60%")
    card = cpu["advice"][0]
    assert card["id"] == "sync_logging" and "sync" not in card["evidence"]
    synced = report(stages={**HEALTHY, "logging": 0.02}, counters={"syncs": 60})  # loss.item() each step
    assert headline(synced).startswith("Sync-bound: logging and host-device syncs take 60%")
    assert "host-device syncs per step" in synced["advice"][0]["evidence"]
