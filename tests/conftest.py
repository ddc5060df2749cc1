"""Shared pytest fixtures."""

from typing import Any

import pytest
from fake_nvml import fake_nvml  # noqa: F401  (fixture: a fake NVML at perfmagic's pynvml seam)

pytest_plugins = ("pytest_jupyter.jupyter_server",)


@pytest.fixture(autouse=True)
def every_report_is_consistent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every report a test builds passes the same checks (report_checks.assert_consistent)."""
    from report_checks import assert_consistent

    import perfmagic.report

    build = perfmagic.report.Report.__init__

    def checked(self: perfmagic.report.Report, data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        build(self, data, *args, **kwargs)
        if "step_table" in data:  # built by the pipeline (hand-made report dicts test other things)
            assert_consistent(data)

    monkeypatch.setattr(perfmagic.report.Report, "__init__", checked)
