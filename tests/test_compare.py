"""Report.compare: before/after per stage, speed-up, and which cards went away."""

from __future__ import annotations

import json

import pytest
from analysis_builder import HEALTHY, build

from perfmagic.compare import Comparison
from perfmagic.report import Report


def _report(**options: object) -> Report:
    # through JSON, as a user comparing saved reports would
    return Report.from_json(Report.from_analysis(build(**options)).to_json())


def test_compare_shows_the_fix_worked() -> None:
    before = _report(stages={**HEALTHY, "data": 0.02})  # input-bound
    after = _report()  # the same job with workers
    cmp = before.compare(after)
    assert isinstance(cmp, Comparison)
    step_before = 0.02 + sum(HEALTHY.values()) - HEALTHY["data"]
    assert cmp.step_before_s == pytest.approx(step_before)
    assert cmp.step_after_s == pytest.approx(sum(HEALTHY.values()))
    assert cmp.speedup == pytest.approx(step_before / sum(HEALTHY.values()))
    data = next(c for c in cmp.stages if c.name == "data")
    assert data.delta_s == pytest.approx(HEALTHY["data"] - 0.02)
    assert {c["id"] for c in cmp.resolved} >= {"input_bound", "dataloader_workers"}
    assert [c["id"] for c in cmp.new] == ["compute_bound"]

    text = str(cmp)
    assert "faster" in text and "advice resolved: [high] input_bound (predicted saving" in text
    assert "data" in text and "advice new: [info] compute_bound" in text

    d = cmp.to_dict()
    json.dumps(d)  # JSON-able, for the notebook renderer
    assert d["step"]["speedup"] == pytest.approx(cmp.speedup)
    assert {s["name"] for s in d["stages"]} >= {"data", "forward", "backward"}
    assert d["advice"]["new"][0]["id"] == "compute_bound"


def test_compare_counts_periodic_checkpoints_and_keeps_remaining_cards() -> None:
    ckpt = [0.1 if k % 5 == 4 else 0.0 for k in range(30)]
    before = _report(stages={**HEALTHY, "checkpoint": ckpt, "logging": 0.002})
    after = _report(stages={**HEALTHY, "logging": 0.002})
    cmp = before.compare(after)
    assert cmp.speedup is not None and cmp.speedup > 1.5  # the median step would not show it
    assert [c["id"] for c in cmp.resolved] == ["checkpoint_frequency"]
    assert [a["id"] for a, _ in cmp.remaining] == ["sync_logging"]
    assert "advice remaining: [low → medium] sync_logging" in str(cmp)  # same cost, shorter step


def test_compare_reports_without_steps() -> None:
    empty = _report(steps=0)
    cmp = empty.compare(empty)
    assert cmp.speedup is None and cmp.stages == []
    assert "n/a" in str(cmp)
