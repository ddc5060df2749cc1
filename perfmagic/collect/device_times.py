"""Device times of recorded spans: event tokens taken at a span's ends, resolved as the device passes them.

A stage lasts until the device has also finished the work queued in it: its span ends no earlier
than the device reached the event token taken at its end.
"""

from __future__ import annotations

from typing import Protocol

from perfmagic.timeline import Timeline

DRAIN_AT = 2048
"""Spans awaiting device times before those the device has passed are resolved (bounds their memory)."""

_DRAIN_EVERY_S = 1.0
"""Longest time a span waits to be resolved: spans are spooled once their device times are known."""


class DeviceClock(Protocol):
    """Timestamps of device work: when the device reached a point in its queue.

    ``event_token`` is called on the hot path and returns an opaque token (None when it cannot take one
    now, e.g. while a CUDA graph is captured); ``done`` says, without waiting, whether the device got
    there; ``resolve`` turns tokens into seconds on the timeline's clock (``None`` where unknown), waiting
    for the device where it has to; ``close``, once the recorder has closed, frees what it holds of the
    device.
    """

    def event_token(self) -> object | None: ...

    def done(self, token: object) -> bool: ...

    def resolve(self, tokens: list[object]) -> list[float | None]: ...

    def close(self) -> None: ...


class DeviceSpans:
    """Spans awaiting their device times, and their resolution into the timeline.

    ``pending`` holds (span index, event token at its start, at its end) in the order recorded;
    what cannot be resolved is a warning in ``warnings`` (the recorder's own list).
    """

    def __init__(self, timeline: Timeline, t: float, warnings: list[str]) -> None:
        self.pending: list[tuple[int, object, object]] = []
        self._timeline = timeline
        self._drained_at = t  # timeline time of the last drain
        self._warnings = warnings

    def drain_if_due(self, clock: DeviceClock, t: float) -> None:
        """At ``DRAIN_AT`` spans pending, or ``_DRAIN_EVERY_S`` after the last drain: :meth:`drain`."""
        if len(self.pending) >= DRAIN_AT or t - self._drained_at >= _DRAIN_EVERY_S:
            self._drained_at = t
            self.drain(clock)

    def drain(self, clock: DeviceClock) -> None:
        """Resolve the spans the device has passed, without waiting for the device.

        A stream runs its work in order, so the spans done are a prefix of the list (by their end
        tokens, taken in list order): find its end by bisection, a few queries, and keep the rest
        pending. The newest token, taken a moment ago, is almost never done in a GPU-bound loop;
        waiting for it to be would let the spans pile up without limit.
        """
        pending = self.pending
        lo, hi = 0, len(pending)  # pending[:lo] are done, pending[hi:] are not
        while lo < hi:
            mid = (lo + hi) // 2
            if clock.done(pending[mid][2]):
                lo = mid + 1
            else:
                hi = mid
        if lo:
            self.pending = pending[lo:]
            self._apply(clock, pending[:lo])

    def close(self, clock: DeviceClock | None) -> None:
        """Resolve every span pending, waiting for the device (with no clock left: drop them)."""
        pending, self.pending = self.pending, []
        if clock is not None and pending:
            self._apply(clock, pending)

    def settled(self, span_count: int) -> int:
        """Spans before this logical index have their final times: none of them is pending."""
        pending = self.pending
        return min(span_count, pending[0][0]) if pending else span_count

    def _apply(self, clock: DeviceClock, spans: list[tuple[int, object, object]]) -> None:
        """A stage lasts until the device has also finished the work queued in it."""
        import numpy as np

        tokens: list[object] = []
        for _, a, b in spans:
            tokens += (a, b)
        try:
            times = clock.resolve(tokens)
        except Exception as e:  # e.g. a CUDA error the profiled code left in the context
            self._warnings.append(
                f"device times could not be read ({e!r}): stages are timed on the host only"
            )
            return
        device = np.array([np.nan if t is None else t for t in times], dtype=np.float64)
        index = np.array([i for i, _, _ in spans], dtype=np.int64)
        start, end = self._timeline.span_times(index)
        device_start, device_end = device[0::2], device[1::2]
        # fmax keeps the host time where the device time is unknown (NaN) or earlier; a start moves only
        # with its end, and never past it: a span whose end token was lost keeps its host times
        new_end = np.fmax(end, device_end)
        new_start = np.where(np.isnan(device_end), start, np.minimum(np.fmax(start, device_start), new_end))
        self._timeline.set_span_times(index, new_start, new_end)
