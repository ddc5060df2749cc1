"""The ``gpu`` section's figures tallied over GPU events given a chunk at a time, in start order.

One home for the figures of :mod:`perfmagic.analyze.gpu`, whatever holds the events: a Kineto
trace's arrays are one chunk; an Nsight Systems capture streams its events from SQLite ordered by
start (:mod:`perfmagic.traces.nsys`), millions of them, so nothing kept may grow with them. What
is kept between chunks is running state: the busy interval being extended (one per union: all
events, each kind, communication or computation), each stream's last end and its gap sums, per
name totals and bytes. Gaps are classified when the interval after them starts, by the first event
that starts it, as in a whole-array pass. The launch delays and the launch calls' durations are
the figures that need every value (a median, a percentile): they are kept in memory up to
``SPILL_VALUES`` and beyond that written to a temporary file and selected there
(:mod:`perfmagic.analyze.spill`). A chunk's events that start last are held back to the next
chunk, so the events that start one busy interval are always seen together.
"""

from __future__ import annotations

import numpy as np

from perfmagic.analyze.spill import Values
from perfmagic.intervals import merge_intervals
from perfmagic.traces.events import COMMUNICATION, COMPUTATION, KINDS, MEMORY, GpuChunk

KERNEL_WAIT_US = 30.0
"""HTA's ``consecutive_kernel_delay`` default: shorter gaps are launch overhead."""
GAP_MIN_US = 1000.0
"""An idle stretch of the GPU this long (1 ms) is a starvation gap: longer than any launch overhead,
short enough to catch a host stall within a step of tens of milliseconds (Nsight's own check looks for
500 ms, across whole applications)."""
IDLE_CATEGORIES = ("host_wait", "kernel_wait", "other")
"""Idle-gap categories, in the order ``classify`` numbers them."""
LAUNCH_CALLS = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cudaLaunchCooperativeKernel",
    }
)
"""Runtime and driver calls that launch a kernel."""


def classify(gap_start: np.ndarray, gap: np.ndarray, next_launch: np.ndarray) -> np.ndarray:
    """Index into ``IDLE_CATEGORIES`` of each gap (HTA's rule; a NaN launch is not host wait)."""
    host = next_launch > gap_start
    # int8: one byte per gap, of which a capture has millions
    out: np.ndarray = np.where(host, np.int8(0), np.where(gap < KERNEL_WAIT_US, np.int8(1), np.int8(2)))
    return out


class Union:
    """The union of intervals given in start order: the closed ones' length summed, the last one open."""

    def __init__(self) -> None:
        self.closed = 0.0
        self.open: tuple[float, float] | None = None

    def add(self, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The merged intervals of the open one and these (the last of them left open)."""
        if self.open is not None:
            start = np.concatenate(([self.open[0]], start))
            end = np.concatenate(([self.open[1]], end))
        s, e = merge_intervals(start, end)
        if len(s):
            self.closed += float((e[:-1] - s[:-1]).sum())
            self.open = (float(s[-1]), float(e[-1]))
        return s, e

    @property
    def length(self) -> float:
        return self.closed + (self.open[1] - self.open[0] if self.open is not None else 0.0)


class ByName:
    """Per event name: total duration, count, the kind last seen, bytes, bytes copied by copies.

    Kept per name seen (a slot each), not per name id: a capture's names are mostly its steps'."""

    def __init__(self) -> None:
        self.slot = np.zeros(0, np.int64)  # per name id, its slot + 1 (0: not seen)
        self.ids = np.zeros(0, np.int64)  # per slot, its name id
        self.columns: list[np.ndarray] = [
            np.zeros(0),
            np.zeros(0, np.int64),
            np.zeros(0, np.int8),
            np.zeros(0),
            np.zeros(0),
        ]

    def add(self, ids: np.ndarray, dur: np.ndarray, kind: np.ndarray, nbytes: np.ndarray) -> None:
        if not len(ids):
            return
        self.slot = _grown(self.slot, int(ids.max()) + 1)
        new = np.unique(ids[self.slot[ids] == 0])
        self.slot[new] = np.arange(len(self.ids) + 1, len(self.ids) + 1 + len(new))
        self.ids = np.concatenate((self.ids, new))
        at, n = self.slot[ids] - 1, len(self.ids)
        copy = (kind == MEMORY) & (nbytes > 0)
        total, count, kinds, nbytes_, copied = (_grown(c, n) for c in self.columns)
        kinds[at] = kind
        self.columns = [
            total + np.bincount(at, weights=dur, minlength=n),
            count + np.bincount(at, minlength=n),
            kinds,
            nbytes_ + np.bincount(at, weights=nbytes, minlength=n),
            copied + np.bincount(at[copy], weights=nbytes[copy], minlength=n),
        ]

    def _by_id(self, k: int) -> np.ndarray:
        out = np.zeros(len(self.slot), self.columns[k].dtype)
        out[self.ids] = self.columns[k]
        return out

    @property
    def total(self) -> np.ndarray:
        """Per name id, the events' total duration (µs)."""
        return self._by_id(0)

    @property
    def count(self) -> np.ndarray:
        return self._by_id(1)

    @property
    def kind(self) -> np.ndarray:
        return self._by_id(2)

    @property
    def bytes(self) -> np.ndarray:
        return self._by_id(3)

    @property
    def copied(self) -> np.ndarray:
        """Per name id, the bytes its copies (not memsets) moved."""
        return self._by_id(4)

    def ranked(self) -> np.ndarray:
        """The name ids seen, by total time, longest first (ties by name id)."""
        out: np.ndarray = self.ids[np.lexsort((self.ids, -self.columns[0]))]
        return out


def _grown(a: np.ndarray, n: int) -> np.ndarray:
    return a if len(a) >= n else np.concatenate((a, np.zeros(n - len(a), a.dtype)))


class GpuTally:
    """The ``gpu`` section's figures of one process's GPU events (:func:`perfmagic.analyze.gpu.gpu_summary`
    says which), fed with :meth:`add` in start order."""

    def __init__(self, names: list[str], launched_before: float | None, whole_us: bool) -> None:
        self.names = names  # the reader may go on appending
        self.whole_us = whole_us
        if whole_us and launched_before is not None:
            launched_before = float(np.ceil(launched_before))
        self.launched_before = launched_before
        self.busy = Union()
        self.kinds = [Union() for _ in KINDS]
        self.comm_or_compute = Union()
        self.first: float | None = None
        self.gap_sum = 0.0
        self.gap_by_category = np.zeros(len(IDLE_CATEGORIES))
        self.long_gaps = (0, 0.0, 0.0)  # count, total, longest (µs)
        self.streams: dict[tuple[int, int], list[float]] = {}  # last end, idle, then by category
        self.devices: set[int] = set()
        self.events = 0
        self.kernels = 0
        self.all = ByName()
        self.kernel_names = ByName()
        self.delays, self.calls = Values(), Values()
        self.launches = (0, 0, 0.0)  # count, shorter than their call, the calls' time beyond those
        self._launch_call = np.zeros(0, bool)
        self._held: GpuChunk | None = None

    def add(self, chunk: GpuChunk, final: bool = False) -> None:
        """Tally ``chunk``, whose events start no earlier than those before; ``final``: the last one."""
        if self._held is not None:
            chunk = _joined(self._held, chunk)
            self._held = None
        if not final and len(chunk):
            start = np.ceil(chunk.start) if self.whole_us else chunk.start
            later = start == start.max()
            self._held = _taken(chunk, later)
            chunk = _taken(chunk, ~later)
        if len(chunk):
            self._tally(chunk)
        if final:
            self.delays.done()
            self.calls.done()

    def _tally(self, ev: GpuChunk) -> None:
        self.devices.update(np.unique(ev.device).tolist())
        launch = np.ceil(ev.launch) if self.whole_us else ev.launch
        keep = np.ones(len(ev), bool) if self.launched_before is None else launch < self.launched_before
        if not keep.all():
            ev, launch = _taken(ev, keep), launch[keep]
        if not len(ev):
            return
        start, end = ev.start, ev.start + ev.dur
        if self.whole_us:
            start, end = np.ceil(start), np.floor(end)
        busy_start, busy_end = self.busy.add(start, end)
        if self.first is None:
            self.first = float(busy_start[0])
        self._gaps(start, end, launch, busy_start, busy_end)
        for k, union in enumerate(self.kinds):
            union.add(start[ev.kind == k], end[ev.kind == k])
        either = (ev.kind == COMMUNICATION) | (ev.kind == COMPUTATION)
        self.comm_or_compute.add(start[either], end[either])
        self._by_stream(ev.device, ev.stream, start, end, launch)
        kernels = ev.kind != MEMORY
        self.events += len(ev)
        self.kernels += int(kernels.sum())
        self.all.add(ev.name_id, ev.dur, ev.kind, ev.bytes)
        self.kernel_names.add(ev.name_id[kernels], ev.dur[kernels], ev.kind[kernels], ev.bytes[kernels])
        self._launched(ev, kernels)

    def _gaps(
        self,
        start: np.ndarray,
        end: np.ndarray,
        launch: np.ndarray,
        busy_start: np.ndarray,
        busy_end: np.ndarray,
    ) -> None:
        """Whole-GPU gaps (µs) before the busy intervals that start here, each classified by the first
        event that starts its interval."""
        gap = busy_start[1:] - busy_end[:-1]
        if not len(gap):
            return
        order = np.lexsort((end, start))
        first = order[np.searchsorted(start[order], busy_start[1:])]
        category = classify(busy_end[:-1], gap, launch[first])
        self.gap_sum += float(gap.sum())
        self.gap_by_category += [float(gap[category == i].sum()) for i in range(len(IDLE_CATEGORIES))]
        long = gap[gap >= GAP_MIN_US]
        if len(long):
            count, total, longest = self.long_gaps
            self.long_gaps = (count + len(long), total + float(long.sum()), max(longest, float(long.max())))

    def _by_stream(
        self,
        device_of: np.ndarray,
        stream_of: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
        launch: np.ndarray,
    ) -> None:
        """Per stream, the gaps between its consecutive events (HTA: an event's start minus the end of
        the one before it on the stream), classified by the later event's launch."""
        # each device's own streams found apart: a unique over stacked columns would copy every event twice
        for device in np.unique(device_of):
            on_device = device_of == device
            for stream in np.unique(stream_of[on_device]):
                on = np.flatnonzero(on_device & (stream_of == stream))
                on = on[np.argsort(start[on], kind="stable")]
                key = (int(device), int(stream))
                before = self.streams.get(key)
                ends = end[on][:-1] if before is None else np.concatenate(([before[0]], end[on][:-1]))
                later = on[1:] if before is None else on
                gap = start[later] - ends
                category = classify(ends, gap, launch[later])
                sums = [float(gap.sum())] + [
                    float(gap[category == i].sum()) for i in range(len(IDLE_CATEGORIES))
                ]
                if before is None:
                    self.streams[key] = [float(end[on][-1]), *sums]
                else:
                    self.streams[key] = [float(end[on][-1])] + [
                        a + b for a, b in zip(before[1:], sums, strict=True)
                    ]

    def _launched(self, ev: GpuChunk, kernels: np.ndarray) -> None:
        """The kernels launched by a kernel-launch call: their delay and their calls' durations."""
        if len(self._launch_call) < len(self.names):
            self._launch_call = np.array([n in LAUNCH_CALLS for n in self.names], dtype=bool)
        ok = kernels & (ev.launch_name >= 0)
        ok[ok] = self._launch_call[ev.launch_name[ok]]
        if not ok.any():
            return
        call_dur, kernel_dur = ev.launch_dur[ok], ev.dur[ok]
        self.delays.add(np.maximum(ev.start[ok] - (ev.launch[ok] + call_dur), 0.0))
        self.calls.add(call_dur)
        short = kernel_dur < call_dur
        count, shorter, beyond = self.launches
        self.launches = (
            count + int(ok.sum()),
            shorter + int(short.sum()),
            beyond + float((call_dur - kernel_dur)[short].sum()),
        )

    @property
    def span(self) -> float:
        """From the first event's start to the last one's end (µs); 0 without events."""
        if self.first is None or self.busy.open is None:
            return 0.0
        return self.busy.open[1] - self.first

    def stream_idle(self) -> list[tuple[int, int, float, list[float]]]:
        """Per (device, stream), in order: its idle µs and the µs of each idle category."""
        return [(d, s, v[1], v[2:]) for (d, s), v in sorted(self.streams.items())]


def _taken(chunk: GpuChunk, mask: np.ndarray) -> GpuChunk:
    return GpuChunk(*(column[mask] for column in _columns(chunk)))


def _joined(a: GpuChunk, b: GpuChunk) -> GpuChunk:
    return GpuChunk(*(np.concatenate((x, y)) for x, y in zip(_columns(a), _columns(b), strict=True)))


def _columns(chunk: GpuChunk) -> tuple[np.ndarray, ...]:
    return (
        chunk.name_id, chunk.kind, chunk.start, chunk.dur, chunk.device, chunk.stream, chunk.launch,
        chunk.bytes, chunk.launch_name, chunk.launch_dur,
    )  # fmt: skip
