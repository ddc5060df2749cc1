"""The user's own code, as the collectors point at it and the fixes rewrite it."""

from __future__ import annotations

from typing import Any, TypedDict


class Binding(TypedDict):
    """A name the object was bound to in one of the user's frames when perfmagic first saw it."""

    name: str  # a variable, or ``self.attribute``
    file: str  # the frame's source file (a notebook cell's is IPython's cell file)
    scope_line: int  # the first line of the frame's function; 0 at a module's (a cell's) top level


class CallHint(TypedDict):
    """Where to look for the call that built an object: what the collector saw, cheaply, at the time.

    The search itself (:mod:`perfmagic.advise.calls`) runs when the advice is written, off the
    training loop's path."""

    callees: list[str]  # the names its class is called by: its own, then its bases' (``DataLoader``)
    method: str | None  # a method's call on the object instead (``compile``): found by its receiver only
    params: list[str]  # the constructor's positional parameters, in order (for arguments passed by position)
    values: dict[str, Any]  # the object's public attributes that are scalars: its settings, mostly
    bindings: list[Binding]
    files: list[str]  # the user's files on the stack where it was met, nearest first


class FixSite(TypedDict):
    """``advice[i].replaces``: the user's statement a card's fix code takes the place of."""

    file: str
    line: int  # first line, 1-based
    end_line: int  # last line, inclusive
    where: str  # its first line as its user knows it: ``In [2], line 5``, ``train.py:12``
