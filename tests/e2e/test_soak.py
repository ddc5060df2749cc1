"""A shorter soak than benchmarks/soak.py: what a long run keeps, and how big its report gets."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from paths import BENCHMARKS

import perfmagic
import perfmagic.report

sys.path.insert(0, str(BENCHMARKS))
from soak import soak


def test_a_short_soak_keeps_every_step_and_a_small_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(perfmagic.report, "MAX_STEP_ROWS", 5_000)  # as a run of over 100k steps would be
    monkeypatch.setattr(perfmagic.report, "BINNED_ROWS", 1_000)
    result = soak(20_000, 60.0, tmp_path)
    assert result["steps"] == result["steps_counted"] == 20_000
    assert result["spans"] == 2 * 20_000  # one user stage and one step boundary each
    report = json.loads((tmp_path / "report.json").read_text())
    table = report["step_table"]
    assert table["steps_per_row"] == 20 and len(table["start"]) == len(table["stages"]["work"]) == 1_000
    assert table["end"][-1] == pytest.approx(perfmagic.load(tmp_path).to_dict()["step_table"]["end"][-1])
    assert result["report_json_mb"] < 0.5 and result["stop_s"] < 5.0
