"""An exception passes perfmagic's wrappers without their frames: the user's traceback is their own."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from fakeclock import FakeClock

import perfmagic
from perfmagic.collect.tracebacks import TRACEBACKS_ENV, drop_own_frame


def _user() -> None:
    raise ValueError("the user's error")


def _wrapper() -> None:
    try:
        _user()
    except BaseException as e:
        drop_own_frame(e)
        raise


def _not_at_the_head() -> None:
    try:
        _user()
    except BaseException as e:
        _helper(e)  # a helper's frame is not the traceback's first entry: nothing is dropped
        raise


def _helper(e: BaseException) -> None:
    drop_own_frame(e)


def _functions(call: Callable[[], None]) -> list[str]:
    try:
        call()
    except BaseException as e:
        return [frame.name for frame in traceback.extract_tb(e.__traceback__)]
    raise AssertionError("did not raise")


def test_a_wrapper_leaves_only_its_own_frame_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRACEBACKS_ENV, raising=False)
    assert _functions(_wrapper) == ["_functions", "_user"]
    assert _functions(_not_at_the_head) == ["_functions", "_not_at_the_head", "_user"]
    monkeypatch.setenv(TRACEBACKS_ENV, "full")  # to see perfmagic's part in an error
    assert _functions(_wrapper) == ["_functions", "_wrapper", "_user"]


class Inner(torch.nn.Module):
    def __init__(self, error: type[BaseException]) -> None:
        super().__init__()
        self.error = error

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise self.error("innermost forward")


class Nested(torch.nn.Module):
    """Modules within modules, three levels deep, the innermost raising ``error``: each level passed
    through the forward hook."""

    def __init__(self, error: type[BaseException], depth: int = 3) -> None:
        super().__init__()
        self.inner: torch.nn.Module = Nested(error, depth - 1) if depth > 1 else Inner(error)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + 1


class BadDataset(torch.utils.data.Dataset[int]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        raise KeyError(i)


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text")


def _twice_backward() -> None:
    w = torch.ones(2, requires_grad=True)
    loss = (w * w).sum()
    loss.backward()
    loss.backward()  # the graph was freed: torch's own error, through the backward wrapper


def _step_with_failing_closure() -> None:
    w = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([w], lr=0.1)

    def closure() -> torch.Tensor:
        raise ValueError("closure")

    optimizer.step(closure)


CASES: dict[str, Callable[[], Any]] = {
    "nested modules": lambda: Nested(ValueError)(torch.ones(2)),
    "Ctrl-C in a forward": lambda: Nested(KeyboardInterrupt)(torch.ones(2)),
    "DataLoader": lambda: next(iter(torch.utils.data.DataLoader(BadDataset(), batch_size=2))),
    "item of two values": lambda: torch.ones(2).item(),
    "backward twice": _twice_backward,
    "optimizer closure": _step_with_failing_closure,
    "print": lambda: print(Unprintable()),
    "save": lambda: torch.save({}, "/nonexistent-dir/x.pt"),
    "to a bad device": lambda: torch.ones(2).to("no-such-device"),
}


def _formatted(call: Callable[[], Any]) -> str:
    try:
        call()
    except BaseException as e:
        return "".join(traceback.format_exception(e))
    raise AssertionError("did not raise")


@pytest.mark.parametrize("case", CASES)
def test_each_wrapper_passes_the_users_traceback_unchanged(
    case: str, tmp_path: Path, fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TRACEBACKS_ENV, raising=False)
    plain = _formatted(CASES[case])
    with perfmagic.profile(outdir=tmp_path, interval=3600, clock=fake_clock, sample=False):
        profiled = _formatted(CASES[case])
    assert "perfmagic/" not in profiled
    assert profiled == plain
