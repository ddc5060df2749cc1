"""The hooks that come and go with the recording windows: no class changes, torch's functions run as
their own outside the windows, and everything is as it was after."""

from __future__ import annotations

import functools
import inspect
import traceback
from collections.abc import Callable
from typing import Any

import pytest

from perfmagic.collect.windowed_hooks import WindowedHooks


class Layer:
    def __call__(self, x: int, *, scale: int = 2) -> int:
        return x * scale

    def fails(self) -> None:
        raise ValueError("the user's own error")


class Conv(Layer):
    pass


def counting(calls: list[str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrapping(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls.append(original.__name__)
            return original(*args, **kwargs)

        return wrapper

    return wrapping


def test_a_function_is_hooked_by_its_code_and_no_class_changes() -> None:
    calls: list[str] = []
    own_code = Layer.__call__.__code__
    layer_dict, conv_dict = dict(vars(Layer)), dict(vars(Conv))
    hooks = WindowedHooks()
    hooks.set(Layer, "__call__", counting(calls))
    assert Conv()(3) == 6 and Conv()(3, scale=5) == 15  # the original's keyword-only default too
    assert calls == ["__call__", "__call__"]
    assert hooks.switch(False) == []
    assert Conv()(3) == 6 and len(calls) == 2 and Layer.__call__.__code__ is own_code
    assert hooks.switch(True) == []
    assert Conv()(4) == 8 and len(calls) == 3
    assert dict(vars(Layer)) == layer_dict and dict(vars(Conv)) == conv_dict  # in and out alike
    assert hooks.restore() == []
    assert Layer.__call__.__code__ is own_code and Layer.__call__.__kwdefaults__ == {"scale": 2}
    assert Conv()(3) == 6 and len(calls) == 3


def test_a_hooked_function_shows_its_own_signature() -> None:
    before = inspect.signature(Layer.__call__)
    hooks = WindowedHooks()
    hooks.set(Layer, "__call__", counting([]))
    assert inspect.signature(Layer.__call__) == before
    hooks.restore()
    assert "__signature__" not in vars(Layer.__call__)


def test_the_users_traceback_has_no_frame_of_the_hook() -> None:
    def wrapping(original: Callable[..., Any]) -> Callable[..., Any]:
        return original  # the wrapper is the original itself: only the trampoline is between

    hooks = WindowedHooks()
    hooks.set(Layer, "fails", wrapping)
    try:
        with pytest.raises(ValueError, match="own error") as raised:
            Layer().fails()
    finally:
        hooks.restore()
    frames = [frame.name for frame in traceback.extract_tb(raised.value.__traceback__)]
    assert frames == ["test_the_users_traceback_has_no_frame_of_the_hook", "fails"]


def decorated(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def outer(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return outer


class Optimizer:
    @decorated
    def zero_grad(self) -> str:
        return "zeroed"


def test_a_decorated_function_is_hooked_where_the_decorator_calls_it() -> None:
    calls: list[str] = []
    outer = Optimizer.__dict__["zero_grad"]
    hooks = WindowedHooks()
    hooks.set(Optimizer, "zero_grad", counting(calls))
    assert Optimizer.__dict__["zero_grad"] is outer and Optimizer().zero_grad() == "zeroed"
    assert calls == ["zero_grad"]
    hooks.restore()
    assert Optimizer().zero_grad() == "zeroed" and calls == ["zero_grad"]


class Tensor:
    to = staticmethod(abs)  # a C function: no code to switch


def test_what_has_no_code_to_switch_is_gated_and_its_class_changes_only_at_install() -> None:
    calls: list[str] = []
    own = dict(vars(Tensor))
    hooks = WindowedHooks()
    hooks.set(Tensor, "to", counting(calls))
    installed = dict(vars(Tensor))
    assert Tensor.to(-2) == 2 and calls == ["abs"]
    hooks.switch(False)
    assert dict(vars(Tensor)) == installed and Tensor.to(-3) == 3 and calls == ["abs"]
    hooks.switch(True)
    assert dict(vars(Tensor)) == installed and Tensor.to(-4) == 4 and calls == ["abs", "abs"]
    hooks.restore()
    assert dict(vars(Tensor)) == own and Tensor.__dict__["to"].__func__ is abs


def test_a_gated_hook_leaves_no_frame_of_its_own_in_the_users_traceback() -> None:
    class Owner:
        fails = staticmethod(int)  # a C function: no code to switch

    hooks = WindowedHooks()
    hooks.set(Owner, "fails", lambda original: original)  # only the gate is between
    try:
        for on in (True, False):
            hooks.switch(on)
            with pytest.raises(ValueError) as raised:
                Owner.fails("not a number")
            names = [frame.name for frame in traceback.extract_tb(raised.value.__traceback__)]
            assert names == ["test_a_gated_hook_leaves_no_frame_of_its_own_in_the_users_traceback"]
    finally:
        hooks.restore()


def test_code_someone_else_put_in_meanwhile_stays_theirs() -> None:
    class Model:
        def forward(self) -> str:
            return "torch's"

    def theirs(self: Any) -> str:
        return "theirs"

    hooks = WindowedHooks()
    hooks.set(Model, "forward", counting([]))
    hooks.switch(False)
    Model.forward.__code__ = theirs.__code__
    assert hooks.switch(True) == [
        "test_code_someone_else_put_in_meanwhile_stays_theirs.<locals>.Model.forward"
        " was replaced during profiling; left as it is now"
    ]
    assert Model().forward() == "theirs"
    assert hooks.restore() == []
    assert Model().forward() == "theirs"
