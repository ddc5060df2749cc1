"""The advice matrix: stable top cards and promises that come true, on five real loops (make advice-matrix)."""

from __future__ import annotations

import sys

import pytest
from paths import REPO

pytestmark = pytest.mark.matrix


def test_the_advice_holds_still_and_its_promises_come_true() -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import advice_matrix

    assert advice_matrix.main(["--runs", "5", "--pairs", "5"]) == 0
