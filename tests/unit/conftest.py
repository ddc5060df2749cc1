"""Every test in tests/unit is marked ``unit``: ``pytest -m unit`` runs them (fake time only)."""

from pathlib import Path

import pytest

from perfmagic.collect import sampler

HERE = Path(__file__).resolve().parent

PATIENT_S = 120.0
"""The sampler's waits for its thread here: no source in these tests hangs, so a thread that is late is
a starved machine's, never a hung driver's (tests/e2e/test_session.py times the real 2 s waits)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.unit)


@pytest.fixture(autouse=True)
def patient_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sampler waits for its thread to open and close the sources as long as that takes."""
    monkeypatch.setattr(sampler, "START_TIMEOUT_S", PATIENT_S)
    monkeypatch.setattr(sampler, "STOP_TIMEOUT_S", PATIENT_S)
