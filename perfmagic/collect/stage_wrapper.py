"""A function wrapped so that each call the recorder takes is recorded as a stage."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perfmagic.collect.tracebacks import drop_own_frame


def recorded_as_stage(
    fn: Callable[..., Any], enter: Callable[[int], bool], exit_: Callable[[], None], sid: int
) -> Callable[..., Any]:
    """``fn`` between ``enter(sid)`` and ``exit_()`` where ``enter`` takes it; its errors are raised
    without this wrapper's frame (the user's tracebacks are their own)."""

    def recorded(*args: Any, **kwargs: Any) -> Any:
        try:
            if not enter(sid):
                return fn(*args, **kwargs)
            try:
                return fn(*args, **kwargs)
            finally:
                exit_()
        except BaseException as e:
            drop_own_frame(e)
            raise

    return named_like(recorded, fn)


def named_like(wrapper: Callable[..., Any], fn: Callable[..., Any]) -> Callable[..., Any]:
    """``wrapper`` with ``fn``'s name and docstring, and ``fn`` as its ``__wrapped__`` (what
    ``inspect.unwrap`` and the user's introspection find)."""
    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    wrapper.__name__ = getattr(fn, "__name__", wrapper.__name__)
    wrapper.__doc__ = getattr(fn, "__doc__", None)
    return wrapper
