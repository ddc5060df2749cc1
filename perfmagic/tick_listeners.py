"""The callables live views hang on a session's sampler ticks."""

from __future__ import annotations

from collections.abc import Callable


class TickListeners:
    """Called in turn after every tick; one that raises is dropped with a warning, the others go on
    (a view that fails must end neither the sampling nor the tuning)."""

    def __init__(self, warnings: list[str]) -> None:
        self._warnings = warnings
        self._listeners: list[Callable[[], None]] = []

    def add(self, fn: Callable[[], None]) -> None:
        self._listeners = [*self._listeners, fn]  # a new list: the sampler thread may be walking the old

    def clear(self) -> None:
        self._listeners = []

    def notify(self) -> None:
        for fn in self._listeners:
            try:
                fn()
            except Exception as e:
                self._listeners = [f for f in self._listeners if f is not fn]
                self._warnings.append(f"a live view failed and was turned off ({e!r})")
