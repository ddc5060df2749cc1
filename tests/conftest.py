"""Shared pytest fixtures."""

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from busy import busy_cpu, busy_cpus  # noqa: F401  (fixtures: other processes keeping CPUs busy)
from fake_nvml import fake_nvml  # noqa: F401  (fixture: a fake NVML at perfmagic's pynvml seam)
from fakeclock import FakeClock

pytest_plugins = ("pytest_jupyter.jupyter_server",)


@pytest.fixture(autouse=True)
def every_report_is_consistent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[AssertionError]]:
    """Every report a test builds passes the same checks (report_checks.assert_consistent), and one
    recorded fully says what its steps recorded in windows would (windowed_view.assert_windows_agree).
    A check that fails fails the test, also where perfmagic turned the failure into a warning (a
    session's report is built behind a guard that keeps the user's cell alive); a test that makes one
    fail on purpose clears the list the fixture gives."""
    from report_checks import assert_consistent
    from windowed_view import assert_windows_agree

    import perfmagic.report

    build = perfmagic.report.Report.__init__

    failed: list[AssertionError] = []

    def checked(self: perfmagic.report.Report, data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        build(self, data, *args, **kwargs)
        if "step_table" in data:  # built by the pipeline (hand-made report dicts test other things)
            try:
                assert_consistent(data)
                assert_windows_agree(self)
            except AssertionError as e:
                failed.append(e)
                raise

    monkeypatch.setattr(perfmagic.report.Report, "__init__", checked)
    yield failed
    if failed:
        raise failed[0]


@pytest.fixture
def fake_clock() -> FakeClock:
    """A clock only the test moves (``tests/fakeclock.py``): pass it as ``clock=`` and ``advance`` it."""
    return FakeClock()


@pytest.fixture
def gloo_group() -> Iterator[None]:
    """A one-rank gloo process group in this process, destroyed after the test."""
    import torch

    dist = torch.distributed
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
    try:
        yield
    finally:
        dist.destroy_process_group()
