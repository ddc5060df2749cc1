"""What a profiled window runs while it records, and the order it stops them in."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Protocol


class Collector(Protocol):
    """Something a window turns on at its start and off at its end (hooks, a sampler thread, a tracer).

    ``start`` that raises has either undone what it did or leaves that to ``stop``, which
    is called right after it. ``stop`` undoes all that ``start`` did and returns warnings
    for the report; it copes with a start that failed half-way, and a second call does nothing.
    """

    def start(self) -> None: ...

    def stop(self) -> list[str]: ...


class Switch:
    """A collector made of two functions: ``on`` (which undoes itself where it raises) and ``off``
    (called after ``on`` however it ended, so it copes with what a failed ``on`` undid)."""

    def __init__(self, on: Callable[[], None], off: Callable[[], list[str] | None]) -> None:
        self._on, self._off = on, off
        self._running = False

    def start(self) -> None:
        # marked first: an interrupt (Ctrl-C) the moment ``on`` returns must still find ``off`` due
        self._running = True
        self._on()

    def stop(self) -> list[str]:
        if not self._running:
            return []
        self._running = False
        return self._off() or []


class Collectors:
    """The collectors a window has started, stopped in the reverse order on every way out."""

    def __init__(self) -> None:
        self._running: list[tuple[str, Collector]] = []

    def start(self, what: str, collector: Collector) -> None:
        """Start ``collector`` (``what`` names it in warnings); a start that raises is stopped at once
        (its warnings dropped) and the error goes on to the caller."""
        entry = (what, collector)
        self._running.append(entry)  # first, as in Switch: an interrupt as start returns leaves it listed
        try:
            collector.start()
        except BaseException:
            self._running.remove(entry)
            with contextlib.suppress(Exception):  # the start's own error is the one that says what went wrong
                collector.stop()
            raise

    def stop(self) -> list[str]:
        """Stop every collector, newest first, each even if another failed; their warnings, with one
        for each that failed. An interrupt (``KeyboardInterrupt``) waits until all have stopped."""
        warnings: list[str] = []
        interrupted: BaseException | None = None
        while self._running:
            what, collector = self._running.pop()
            try:
                warnings += collector.stop()
            except Exception as e:
                warnings.append(f"{what} failed to stop ({e!r})")
            except BaseException as e:
                interrupted = interrupted or e
        if interrupted is not None:
            raise interrupted
        return warnings
