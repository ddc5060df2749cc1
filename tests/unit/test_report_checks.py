"""The checks every report in the test suite passes catch what they promise to catch."""

from __future__ import annotations

import dataclasses
import linecache
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from analysis_builder import HEALTHY, STEADY_MEANS, plain
from report_checks import assert_consistent

from perfmagic.report import Report, build_report


def _report() -> dict[str, Any]:
    return build_report(plain(stages={**HEALTHY, "data": 0.02, "logging": 0.004})).to_dict()


def test_a_pipeline_report_passes() -> None:
    assert_consistent(_report())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r["advice"][0].update(saving_s=r["advice"][0]["metrics"]["step_s"] * 1.5), "saving"),
        (lambda r: r["advice"][0].update(fix="if step % N == 0:  # was every ? steps"), "unknown"),
        (lambda r: r["advice"][0].update(fix="num_workers=None"), "placeholder"),
        (lambda r: r.update(bottleneck="optimizer"), "headline"),
    ],
    ids=["saving-over-step", "unknown-in-comment", "none-in-code", "headline"],
)
def test_each_inconsistency_is_caught(change: Callable[[dict[str, Any]], None], message: str) -> None:
    report = _report()
    change(report)
    with pytest.raises(AssertionError, match=message):
        assert_consistent(report)


def test_every_report_built_in_the_tests_is_checked(every_report_is_consistent: list[AssertionError]) -> None:
    data = _report()
    data["bottleneck"] = "optimizer"
    with pytest.raises(AssertionError, match="headline"):
        Report(data)
    assert len(every_report_is_consistent) == 1  # and the test would fail at its end, had it not raised here
    every_report_is_consistent.clear()


def test_a_fix_that_is_not_python_is_caught() -> None:
    report = _report()
    report["advice"][0]["fix"] = "loader = DataLoader(dataset, num_workers=4"
    with pytest.raises(AssertionError, match="not Python"):
        assert_consistent(report)
    report["advice"][0]["fix"] = "ps -eo pid,pcpu --sort=-pcpu | head\ntorch.set_num_threads(1)"
    with pytest.raises(AssertionError, match="not Python"):
        assert_consistent(report)  # pasted into a notebook or a script, a shell line is a SyntaxError
    report["advice"][0]["fix"] = (
        "# $ ps -eo pid,pcpu --sort=-pcpu | head  (in a shell)\ntorch.set_num_threads(1)"
    )
    assert_consistent(report)


def test_a_fix_that_sets_what_already_is_is_caught() -> None:
    report = _report()
    report["advice"][0]["fix"] = "torch.set_num_threads(1)  # was 1"
    with pytest.raises(AssertionError, match="sets what already is"):
        assert_consistent(report)
    report["advice"][0]["fix"] = "loader = DataLoader(\n    dataset,\n    num_workers=2,  # was 2\n)"
    with pytest.raises(AssertionError, match="sets what already is"):
        assert_consistent(report)


def test_two_cards_that_set_one_knob_differently_are_caught() -> None:
    report = _report()
    first, second = report["advice"][:2]
    first["fix"] = "loader = DataLoader(\n    dataset,\n    num_workers=3,  # was 0\n)"
    second["fix"] = "# and fewer DataLoader workers: num_workers=1  # was 0"
    with pytest.raises(AssertionError, match=r"num_workers: .* says 3, .* says 1"):
        assert_consistent(report)
    second["fix"] = "# more workers: num_workers=3  # was 0"
    assert_consistent(report)  # the same change twice is one plan


USER_LOOP = """import torch

def train(train_set, epochs):
    loader = torch.utils.data.DataLoader(train_set, batch_size=64, shuffle=True)
    for epoch in range(epochs):
        for x, y in loader:
            pass
"""


def _pasted_at(tmp_path: Path, fix: str) -> dict[str, Any]:
    script = tmp_path / "train.py"
    script.write_text(USER_LOOP)
    linecache.checkcache(str(script))
    report = _report()
    report["advice"][0]["fix"] = fix
    report["advice"][0]["replaces"] = {"file": str(script), "line": 4, "end_line": 4}
    return report


def test_a_fix_in_place_of_the_users_call_keeps_their_names_and_arguments(tmp_path: Path) -> None:
    good = "loader = torch.utils.data.DataLoader(\n    train_set,\n    batch_size=64,\n    shuffle=True,\n    num_workers=2,  # was 0\n)"
    assert_consistent(_pasted_at(tmp_path, good))
    bare = good.replace("torch.utils.data.DataLoader", "DataLoader")
    with pytest.raises(AssertionError, match="never binds"):  # NameError when pasted
        assert_consistent(_pasted_at(tmp_path, bare))
    dropped = good.replace("    shuffle=True,\n", "")
    with pytest.raises(AssertionError, match="shuffle not kept"):
        assert_consistent(_pasted_at(tmp_path, dropped))
    added = good.replace("    shuffle=True,\n", "    shuffle=True,\n    pin_memory=False,\n")
    with pytest.raises(AssertionError, match="the user did not set"):
        assert_consistent(_pasted_at(tmp_path, added))


def _input_bound() -> dict[str, Any]:
    return build_report(plain(stages={**HEALTHY, "data": 0.02})).to_dict()


def test_a_headline_no_card_addresses_is_caught() -> None:
    report = _input_bound()
    assert report["bottleneck"] == "data"
    assert_consistent(report)
    report["advice"] = [c for c in report["advice"] if c["id"] not in ("input_bound", "dataloader_workers")]
    with pytest.raises(AssertionError, match=r"headline 'Input-bound: .*', but no card.* addresses data"):
        assert_consistent(report)


def test_a_card_that_measured_the_headlines_stage_otherwise_is_caught() -> None:
    report = _input_bound()
    card = next(c for c in report["advice"] if c["id"] == "input_bound")
    card["metrics"]["data_share"] = 0.2  # the headline says 60%
    with pytest.raises(AssertionError, match=r"input_bound says data takes 20\.0% of the step"):
        assert_consistent(report)


def test_a_headline_that_names_the_cause_another_card_found_passes() -> None:
    """Loaders starved by a crowded machine: no input card, the headline names cpu_contention's."""
    complete = {"ops": ["batch", "cache", "prefetch"], "serial_maps": 0, "cache": True, "prefetch": True}
    crowded = plain(
        stages={**HEALTHY, "data": 0.01}, loader=None, steady_means={**STEADY_MEANS, "host.cpu_util": 0.98}
    )
    crowded = dataclasses.replace(crowded, config=dataclasses.replace(crowded.config, pipelines=[complete]))
    report = build_report(crowded).to_dict()
    assert report["bottleneck"] == "data" and [c["id"] for c in report["advice"]] == ["cpu_contention"]
    assert_consistent(report)
    report["advice"] = []  # the cause unsaid: "input-bound" beside no card
    with pytest.raises(AssertionError, match="no card, minor card or listed explanation addresses data"):
        assert_consistent(report)
