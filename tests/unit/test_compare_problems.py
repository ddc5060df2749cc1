"""Comparison by problem: what a change resolved, left open or brought, told in the after report's words.

Reports are built through the pipeline from plain analyses (``analysis_builder.plain``) and read back
from JSON, as a user comparing saved reports has them.
"""

from __future__ import annotations

import dataclasses
import html
import re
from typing import Any

import pytest
from analysis_builder import HEALTHY, LOADER, STEADY_MEANS, plain

from perfmagic.advise.about import ABOUT, stages_of
from perfmagic.advise.catalog import RULES
from perfmagic.advise.headline import headline
from perfmagic.compare import Comparison, ProblemMatch, compare
from perfmagic.contract import ReportData
from perfmagic.render.notebook import comparison_bundle
from perfmagic.report import Report, build_report
from perfmagic.units import fmt_fraction, fmt_seconds

REST = sum(s for name, s in HEALTHY.items() if name != "data")
"""Seconds of a healthy step outside the data wait."""


def report(**options: Any) -> ReportData:
    return Report.from_json(build_report(plain(**options)).to_json()).to_dict()


def waiting(share: float, workers: int = 0) -> ReportData:
    """A step that waits ``share`` of its time for data, loaded by ``workers`` DataLoader workers."""
    data = REST * share / (1 - share)
    return report(stages={**HEALTHY, "data": data}, loader={**LOADER, "num_workers": workers})


def only(matches: list[ProblemMatch]) -> ProblemMatch:
    assert len(matches) == 1, matches
    return matches[0]


def test_a_speed_up_with_a_new_top_cause_resolves_the_input_wait_and_names_the_new_one() -> None:
    before, after = waiting(0.60), report()  # workers added: the step is now the model's own work
    cmp = compare(before, after)
    assert cmp.speedup is not None and cmp.speedup > 2
    gone = only(cmp.resolved)
    assert gone.stages == ("data",) and not cmp.still_open
    assert gone.before is not None and {"input_bound", "dataloader_workers"} <= set(gone.before.ids)
    assert gone.share_before == pytest.approx(0.60) and gone.share_after == pytest.approx(
        HEALTHY["data"] / sum(HEALTHY.values())
    )
    top = only(cmp.new)
    assert top.after is not None and top.after.ids == ["compute_bound"]
    # the headline: the speed-up, and the after report's top problem in its own words
    assert cmp.headline.startswith(f"{cmp.speedup:.2f}x faster")
    assert headline(after) in cmp.headline and "Compute-bound" in cmp.headline
    text = str(cmp)
    assert cmp.headline in text
    data = f"data 60% → {fmt_fraction(gone.share_after)} of the step (20.0 ms → 200 µs per step)"
    assert data in text.split("Resolved (1):")[1].split("Still open")[0]


def test_the_fix_applied_and_its_cause_gone_is_resolved_with_its_stage_before_and_after() -> None:
    before = report(stages={**HEALTHY, "logging": 0.006})  # printing every step
    after = report(stages={**HEALTHY, "logging": 0.0001})  # every 50 steps
    cmp = compare(before, after)
    gone = only(cmp.resolved)
    assert gone.before is not None and gone.before.ids == ["sync_logging"] and gone.after is None
    assert gone.seconds_before == pytest.approx(0.006) and gone.seconds_after == pytest.approx(0.0001)
    # the model's own work was the largest stage before and is after: the state stays, in the after's words
    work = only(cmp.still_open)
    assert work.after is not None and work.after.ids == ["compute_bound"] and not cmp.new
    share = f"logging {fmt_fraction(gone.share_before)} → {fmt_fraction(gone.share_after)} of the step"
    assert f"{share} (6.0 ms → 100 µs per step)" in str(cmp)


def test_a_partial_improvement_stays_open_in_the_after_reports_words() -> None:
    before, after = waiting(0.87), waiting(0.40, workers=3)
    cmp = compare(before, after)
    assert not cmp.resolved and not cmp.new
    left = only(cmp.still_open)
    assert left.before is not None and left.after is not None
    words = {c["id"]: c for c in after["advice"]}
    assert left.after.title == after["advice"][0]["title"] == words["dataloader_workers"]["title"]
    assert left.after.title.endswith("instead of 3")  # the after's card, not "instead of 0"
    assert left.share_before == pytest.approx(0.87) and left.share_after == pytest.approx(0.40)
    saving = sum(c["saving_s"] or 0.0 for c in after["advice"] if c["id"] in left.after.ids)
    assert left.after.saving_s == pytest.approx(saving)
    line = str(cmp).split("Still open (1):")[1].splitlines()[1]
    assert line.startswith(f"  [{left.after.severity}] {left.after.title} — data 87% → 40% of the step")
    assert line.endswith(f"saves ~{fmt_seconds(saving)} per step")
    for card in before["advice"]:  # nothing of the before report's words
        assert card["title"] not in str(cmp)


def test_a_card_id_that_changed_about_the_same_stage_and_cause_is_the_same_problem() -> None:
    before = waiting(0.60)  # dataloader_workers and input_bound
    cpus = {**LOADER, "num_workers": 7}  # every CPU but the loop's already loads: only input_bound is left
    after = report(stages={**HEALTHY, "data": REST * 0.3 / 0.7}, loader=cpus)
    assert [c["id"] for c in after["advice"]][:1] == ["input_bound"]
    assert "dataloader_workers" not in {c["id"] for c in after["advice"]}
    cmp = compare(before, after)
    left = only(cmp.still_open)
    assert left.after is not None and left.after.title == after["advice"][0]["title"]
    assert not cmp.resolved  # and the backward pass, now the largest stage, is new
    assert [m.stages for m in cmp.new] == [("forward", "backward", "optimizer")]


def test_a_wait_left_with_its_cause_named_by_another_card_stays_open() -> None:
    """The loaders starved by a crowded machine: no input card, the data wait remains."""
    complete = {"ops": ["batch", "cache", "prefetch"], "serial_maps": 0, "cache": True, "prefetch": True}

    def tf_data(cpu_util: float) -> ReportData:
        a = plain(
            stages={**HEALTHY, "data": 0.01},
            loader=None,
            steady_means={**STEADY_MEANS, "host.cpu_util": cpu_util},
        )
        a = dataclasses.replace(a, config=dataclasses.replace(a.config, pipelines=[complete]))
        return Report.from_json(build_report(a).to_json()).to_dict()

    quiet, crowded = tf_data(0.3), tf_data(0.98)
    assert {c["id"] for c in crowded["advice"]} == {"cpu_contention"}
    cause = crowded["advice"][0]["title"]
    assert headline(crowded).endswith(f"of each step; cause: {cause}")  # not a bare "input-bound"
    cmp = compare(quiet, crowded)
    left = only(cmp.still_open)
    assert left.after is not None and not left.after.cards
    assert left.after.title.startswith("Waiting for the next batch takes 43% of each step; cause:")
    assert [m.after.ids for m in cmp.new if m.after] == [["cpu_contention"]]


def test_a_stage_still_over_its_rules_threshold_is_not_resolved() -> None:
    """Input cards gone but the data stage still past input_bound's threshold: the wait stays open."""
    before, after = waiting(0.60), waiting(0.30)
    after = {**after, "advice": [c for c in after["advice"] if "data" not in stages_of(c["id"])]}
    cmp = Comparison(before, after)
    left = only(cmp.still_open)
    assert left.after is not None and left.after.title.startswith("Waiting for the next batch takes 30%")


def text_sections(text: str) -> dict[str, list[str]]:
    """``{"Resolved (1)": [its lines], ...}`` from the text."""
    sections: dict[str, list[str]] = {}
    for part in re.split(r"\n(?=(?:Resolved|Still open|New) \(\d+\))", text)[1:]:
        head, *lines = part.splitlines()
        sections[head.rstrip(":")] = [line.strip() for line in lines if line.startswith("  ")]
    return sections


def html_sections(page: str) -> dict[str, list[str]]:
    """The same from the HTML: each ``<h4>`` and the ``<li>`` items under it, unescaped."""
    sections: dict[str, list[str]] = {}
    for head, body in re.findall(r"<h4>(.*?)</h4>(.*?)(?=<h4>|</div>$)", page):
        items = re.findall(r'<li class="pm-problem"[^>]*>(.*?)</li>', body)
        sections[html.unescape(head)] = [html.unescape(item) for item in items]
    return sections


@pytest.mark.parametrize(
    "case",
    [
        lambda: (waiting(0.60), report()),  # resolved, new
        lambda: (waiting(0.87), waiting(0.40, workers=3)),  # still open
        lambda: (report(stages={**HEALTHY, "logging": 0.006}), report()),  # the logging fix
    ],
    ids=["new-top-cause", "partial", "cause-gone"],
)
def test_text_and_html_say_the_same(case: Any) -> None:
    cmp = compare(*case())
    bundle = comparison_bundle(cmp.to_dict(), str(cmp))
    text, page = bundle["text/plain"], bundle["text/html"]
    assert cmp.headline in text and html.escape(cmp.headline) in page
    said = text_sections(text)
    assert said == html_sections(page)
    assert list(said) == [
        f"{t} ({len(m)})"
        for t, m in (("Resolved", cmp.resolved), ("Still open", cmp.still_open), ("New", cmp.new))
    ]
    assert sum(map(len, said.values())) == len(cmp.problems) > 0


def test_every_rule_says_what_it_is_about() -> None:
    assert set(ABOUT) == {rule.__name__ for rule in RULES}


def test_a_rule_of_the_machine_with_too_little_to_gain_is_a_problem_of_its_own() -> None:
    after = report()
    after["advice_minor"] = [{"id": "cpu_contention", "saving_s": 1e-4, "step_s": 0.0135}]
    cmp = compare(report(), after)
    crowded = only([m for m in cmp.new if m.after and m.after.ids == ["cpu_contention"]])
    assert crowded.now.title == "cpu_contention: under 2% of a step to gain" and crowded.now.stages == ()
    assert str(cmp).splitlines()[-1] == "  cpu_contention: under 2% of a step to gain; saves ~100 µs per step"
