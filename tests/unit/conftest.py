"""Every test in tests/unit is marked ``unit``: ``pytest -m unit`` runs them (fake time only)."""

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.unit)
