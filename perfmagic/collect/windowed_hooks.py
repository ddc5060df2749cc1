"""The stage hooks recorded in windows, switched without changing a class.

The hooks that run several times a step come and go with the recording windows (``collect.schedule``),
every few dozen steps. Set as class attributes, each change made CPython drop what it had specialized
for the class and for every subclass (``nn.Module``: every layer of the model) and learn it again over
the next steps. Python 3.13 gives up on a class for good after 1,000 changes: after about 200 windows
of a small loop, reading an attribute of any ``nn.Module`` took 250 ns instead of 29, for the rest of the
process (``benchmarks/module_attribute_reads.py``).

So a hook on a Python function leaves the function where it is (the same object, which is also what
``torch.compile``'s identity checks expect) and switches its ``__code__``: its own, or a trampoline
that calls the wrapper. The trampoline finds the wrapper in the function's keyword-only defaults, so
nothing outside the function object changes. What has no Python code of its own to switch (a C
method such as ``Tensor.to``, a closure) gets one wrapper for the whole profile, set once, which calls
the hook's wrapper while the hooks are on and the original otherwise: one call more outside the windows,
and still no class change at their edges.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from perfmagic.collect.patching import Patcher
from perfmagic.collect.tracebacks import drop_own_frame

Wrapping = Callable[[Callable[..., Any]], Callable[..., Any]]
"""Given the function hooked (a copy running its own code), the wrapper to call instead."""

_NOT_PLAIN = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def _trampoline(*args: Any, __perfmagic_wrapper__: Any, __perfmagic_drop__: Any, **kwargs: Any) -> Any:
    """The code a hooked function runs while its hook is on."""
    try:
        return __perfmagic_wrapper__(*args, **kwargs)
    except BaseException as e:
        __perfmagic_drop__(e)  # the user's traceback has no frame of this trampoline
        raise


@dataclass
class _Switched:
    """A function whose code the hook switches, and what each state needs."""

    function: types.FunctionType
    own_code: types.CodeType
    own_kwdefaults: dict[str, Any] | None
    routed_kwdefaults: dict[str, Any]  # its own, and the trampoline's wrapper
    signature: inspect.Signature | None  # shown while routed; None where it has one of its own


class WindowedHooks:
    """Hooks in place while :attr:`on`: the steps the schedule records fully (every step, without one).

    Each hook replaces ``owner.name``: a plain Python function (or the one a decorator wraps,
    ``__wrapped__``) by switching its code, anything else by setting the attribute.
    """

    def __init__(self) -> None:
        self.on = True
        self._switched: list[_Switched] = []
        self._gated = Patcher()  # what has no code to switch: set once, gated on ``on``
        self.wrappers: list[Callable[..., Any]] = []

    def set(self, owner: Any, name: str, wrapping: Wrapping) -> Callable[..., Any]:
        """Route calls of ``owner.name`` through ``wrapping(original)`` while on; returns the wrapper."""
        current = getattr(owner, name)
        function = _switchable(current)
        if function is None:
            wrapper = wrapping(current)
            self._gated.set(owner, name, _gate(self, wrapper, current))
        else:
            wrapper = wrapping(_copy(function))
            own = function.__kwdefaults__
            routed = {**(own or {}), "__perfmagic_wrapper__": wrapper, "__perfmagic_drop__": drop_own_frame}
            signature = None if "__signature__" in vars(function) else inspect.signature(function)
            switched = _Switched(function, function.__code__, own, routed, signature)
            self._switched.append(switched)
            if self.on:
                _route(switched)
        self.wrappers.append(wrapper)
        return wrapper

    def switch(self, on: bool) -> list[str]:
        """Put the hooks in (``on``) or take them out; returns warnings."""
        if on == self.on:
            return []
        self.on = on
        warnings: list[str] = []
        kept: list[_Switched] = []
        for switched in self._switched:
            # someone else changed the function's code meanwhile: theirs stays, the hook goes
            expected = switched.own_code if on else _trampoline.__code__
            if switched.function.__code__ is not expected:
                name = switched.function.__qualname__
                warnings.append(f"{name} was replaced during profiling; left as it is now")
                continue
            if on:
                _route(switched)
            else:
                _unroute(switched)
            kept.append(switched)
        self._switched = kept
        return warnings

    def restore(self) -> list[str]:
        """Take every hook out for good; returns warnings."""
        warnings = self.switch(False)
        self._switched = []
        return [*warnings, *self._gated.restore()]

    def functions(self) -> list[Callable[..., Any]]:
        """What runs in place of the hooked functions: the wrappers, the gates and the trampoline."""
        return [*self.wrappers, *self._gated.values(), _trampoline]


def _gate(hooks: WindowedHooks, wrapper: Callable[..., Any], original: Callable[..., Any]) -> Any:
    """Calls ``wrapper`` while ``hooks`` are on, ``original`` otherwise."""

    def gate(*args: Any, **kwargs: Any) -> Any:
        try:
            if hooks.on:
                return wrapper(*args, **kwargs)
            return original(*args, **kwargs)
        except BaseException as e:
            drop_own_frame(e)
            raise

    return gate


def _switchable(attribute: Any) -> types.FunctionType | None:
    """The plain function whose code calls of ``attribute`` run, following decorators; None if none."""
    function = attribute
    while isinstance(function, types.FunctionType) and function.__closure__ is not None:
        function = getattr(function, "__wrapped__", None)  # a decorator's: switched where it calls
    if not isinstance(function, types.FunctionType) or function.__closure__ is not None:
        return None
    if function.__code__.co_flags & _NOT_PLAIN:
        return None
    return function


def _copy(function: types.FunctionType) -> types.FunctionType:
    """A function running ``function``'s own code, whatever code ``function`` runs later."""
    copy = types.FunctionType(
        function.__code__,
        function.__globals__,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__qualname__ = function.__qualname__
    copy.__module__ = function.__module__
    copy.__doc__ = function.__doc__
    return copy


def _route(switched: _Switched) -> None:
    function = switched.function
    # the defaults first: a call between the two lines runs the function's own code, which finds its own
    function.__kwdefaults__ = switched.routed_kwdefaults
    function.__code__ = _trampoline.__code__
    if switched.signature is not None:
        function.__signature__ = switched.signature  # type: ignore[attr-defined]


def _unroute(switched: _Switched) -> None:
    function = switched.function
    function.__code__ = switched.own_code
    function.__kwdefaults__ = switched.own_kwdefaults
    if switched.signature is not None:
        vars(function).pop("__signature__", None)
