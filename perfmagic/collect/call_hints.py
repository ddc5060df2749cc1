"""Where the user built an object: the names it is bound to in their frames, and the files to search.

Fix code is the user's own call with one argument changed, so the advice needs the call that built
the DataLoader, the ``TrainingArguments`` or the ``Trainer``. Objects are mostly built before the
profiled block (an earlier notebook cell, a set-up function), so the call cannot be caught as it
happens. When perfmagic first meets the object, it notes which of the user's variables hold it and
which of the user's files it was met from; :mod:`perfmagic.advise.calls` finds the call from that
later, in those files and the rest of the user's code then loaded. This costs one walk of the stack
per object, never a parse.
"""

from __future__ import annotations

from types import FrameType
from typing import Any

from perfmagic.collect.stacks import user_frame
from perfmagic.contract.code import Binding, CallHint

FRAMES = 2
"""User frames searched outward from where the object was met: the loop's, and the one that called it."""


def call_hint(
    obj: Any, frame: FrameType | None, method: str | None = None, values: dict[str, Any] | None = None
) -> CallHint:
    """What to search for the call that built ``obj``, met in ``frame`` (or a caller of it); or, with
    ``method``, the user's call of that method on it (``model.compile(...)``). ``values``: its settings,
    where they are not its attributes (an optimizer's ``defaults``)."""
    bindings: list[Binding] = []
    files: list[str] = []
    f = user_frame(frame)
    while f is not None and len(files) < FRAMES:
        filename = f.f_code.co_filename
        files.append(filename)
        scope = 0 if f.f_code.co_name == "<module>" else f.f_code.co_firstlineno
        bindings += [Binding(name=n, file=filename, scope_line=scope) for n in _names_of(obj, f)]
        f = user_frame(f.f_back)
    cls = type(obj)
    init = getattr(cls.__init__, "__code__", None)  # a Python __init__: its positional parameters
    attributes = values if values is not None else getattr(obj, "__dict__", {})
    if method is not None:
        init = getattr(getattr(cls, method, None), "__code__", None)
    return CallHint(
        callees=[method] if method else [c.__name__ for c in cls.__mro__ if c.__module__ not in _NOT_CALLED],
        method=method,
        params=list(init.co_varnames[1 : init.co_argcount]) if init else [],
        values={k: v for k, v in attributes.items() if isinstance(v, _SCALARS) and not k.startswith("_")},
        bindings=bindings,
        files=list(dict.fromkeys(files)),
    )


_NOT_CALLED = frozenset({"builtins", "typing", "abc"})
_SCALARS = (bool, int, float, str, type(None))
"""Settings the advice can compare with a literal argument (objects and containers are not)."""


def _names_of(obj: Any, frame: FrameType) -> list[str]:
    """The frame's variables (and ``self``'s attributes) that hold ``obj``."""
    names = [name for name, value in frame.f_locals.items() if value is obj]
    owner = frame.f_locals.get("self")
    attributes = getattr(owner, "__dict__", None)
    if isinstance(attributes, dict):
        names += [f"self.{name}" for name, value in attributes.items() if value is obj]
    return names
