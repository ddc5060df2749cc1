"""The report's HTML read where no script runs (an untrusted notebook, an export): all of it is there
as markup, and nothing in it needs a script to work; and it names what it measured as the text does."""

from __future__ import annotations

import re
from typing import Any

import pytest
from analysis_builder import GiB, whole_report

from perfmagic.advise.card import make_card
from perfmagic.render.html import cards_html, report_fragment
from perfmagic.render.live import memory_now
from perfmagic.render.text import render_text
from perfmagic.render.waterfall import utilization_figures
from perfmagic.schema import memory_kind
from perfmagic.timeline import Timeline

FIX = "loader = DataLoader(ds, num_workers=4)  # was 0"


def test_a_fix_is_text_to_select_and_its_copy_button_is_made_only_by_a_script() -> None:
    card = make_card("dataloader_workers", "t", "e", FIX, {}, saving_s=0.5, step_s=1.0, model=None)
    page = cards_html([card.to_dict()])
    assert "<pre><code>loader = DataLoader(ds, num_workers=4)  # was 0</code></pre>" in page
    markup = re.sub(r"<script>.*?</script>", "", page, flags=re.S)  # what a page without scripts has
    assert "<button" not in markup and "onclick" not in markup and "Copy" not in markup
    # where scripts run, the script gives this report's fixes their button (tests/e2e clicks it)
    (script,) = re.findall(r"<script>(.*?)</script>", page, flags=re.S)
    (cards_id,) = re.findall(r'class="pm-cards" id="(pm-[0-9a-f]{32})"', page)
    assert f"getElementById('{cards_id}')" in script and "'pm-copy'" in script


def test_cards_without_a_fix_carry_no_script() -> None:
    card = make_card("x", "t", "e", "", {}, saving_s=None, step_s=None, model=None)
    page = cards_html([card.to_dict()])
    assert "<script" not in page and "pm-fix" not in page


def one_report(pss: bool, steps: bool = True) -> dict[str, Any]:
    """A report whose process tree peaked at 2 GiB RSS, and 1.5 GiB PSS where ``pss``."""
    report = whole_report()
    host = {**report["host"], "rss_peak_bytes": 2 * GiB, "pss_peak_bytes": int(1.5 * GiB) if pss else None}
    series = {"t": [0.0, 1.0, 2.0], "v": [GiB, 1.5 * GiB, 1.4 * GiB]}
    metrics = {"host.cpu_util": {"t": [0.0, 1.0, 2.0], "v": [0.3, 0.4, 0.3]}, "host.rss_bytes": series}
    if pss:
        metrics["host.pss_bytes"] = series
    report.update(host=host, timeseries={"epoch": 0.0, "metrics": metrics})
    if not steps:  # the header then shows the memory peak among its figures
        report["steps"] = {**report["steps"], "count": 0}
    return report


@pytest.mark.parametrize("steps", [True, False], ids=["steps", "no-steps"])
@pytest.mark.parametrize(("pss", "kind", "other"), [(True, "PSS", "RSS"), (False, "RSS", "PSS")])
def test_text_html_and_chart_name_one_memory_measure_the_same(
    pss: bool, kind: str, other: str, steps: bool
) -> None:
    report = one_report(pss, steps)
    peak = "1.5 GiB" if pss else "2.0 GiB"
    text, page = render_text(report), report_fragment(report)
    assert f"process memory peak {peak} ({kind})" in text
    legends = [
        item.label["value"]
        for fig in utilization_figures(
            report["timeseries"], None, memory_kind(report["host"]["pss_peak_bytes"])
        )
        for item in fig.legend[0].items
    ]
    assert f"process memory ({kind})" in legends and f"process memory ({kind})" in page  # the chart's
    if not steps:
        assert f"<span>process memory peak ({kind})</span><b>{peak}</b>" in page
    for said in (text, page, " ".join(legends)):
        assert other not in said  # one measure: the other is never named beside it


def test_the_live_panel_names_the_memory_as_the_report_will() -> None:
    timeline = Timeline()
    timeline.add_sample("host.rss_bytes", 0.0, 2.0 * GiB)
    assert memory_now(timeline) == "process memory 2.0 GiB (RSS)"  # before (or without) a PSS reading
    timeline.add_sample("host.pss_bytes", 0.0, 1.5 * GiB)
    assert memory_now(timeline) == "process memory 1.5 GiB (PSS)"
