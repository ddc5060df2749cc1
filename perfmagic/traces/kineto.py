"""Read a Chrome/Kineto trace (what ``torch.profiler`` exports) into columnar arrays.

A trace is one JSON object with ``traceEvents`` (plain or gzip-compressed). Only
complete events (``"ph": "X"``) matter here: GPU events (``kernel``, ``gpu_memcpy``,
``gpu_memset``) become :class:`GpuEvents`, classified as HTA does (:func:`kernel_kind`);
every other one is a CPU event (operators, ``record_function`` annotations, CUDA runtime
calls) in :class:`CpuEvents`. Times stay in microseconds on the trace's clock.

The JSON parse dominates the cost. The cyclic garbage collector is paused while a
trace is read: the parse creates hundreds of thousands of acyclic dicts and lists,
which the collector would otherwise traverse again and again (it doubles the time),
and they are freed by reference counting once the columns are built.
"""

from __future__ import annotations

import gc
import gzip
import json
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_MEMORY_CATEGORIES = frozenset({"gpu_memcpy", "gpu_memset"})
_GZIP_MAGIC = b"\x1f\x8b"

KINDS = ("computation", "communication", "memory")
"""GPU event kinds, as HTA classifies them; ``GpuEvents.kind`` indexes this tuple."""
COMPUTATION, COMMUNICATION, MEMORY = range(3)


class TraceFormatError(ValueError):
    """A file that is not a readable torch.profiler (Kineto/Chrome) trace."""


@dataclass(frozen=True)
class CpuEvents:
    """CPU-side complete events, columnar."""

    names: list[str]
    name_id: np.ndarray  # (n,) int32
    start: np.ndarray  # (n,) float64 µs
    dur: np.ndarray  # (n,) float64 µs
    threads: list[Any]  # the trace's (pid, tid) pairs
    thread: np.ndarray  # (n,) int32 index into threads
    correlation: np.ndarray  # (n,) int64; -1 where the event launched nothing

    def __len__(self) -> int:
        return len(self.start)

    @property
    def end(self) -> np.ndarray:
        end: np.ndarray = self.start + self.dur
        return end

    def take(self, mask: np.ndarray) -> CpuEvents:
        return CpuEvents(
            self.names,
            self.name_id[mask],
            self.start[mask],
            self.dur[mask],
            self.threads,
            self.thread[mask],
            self.correlation[mask],
        )


@dataclass(frozen=True)
class GpuEvents:
    """GPU activity of one process, columnar: one row per kernel, memcpy or memset."""

    names: list[str]
    name_id: np.ndarray  # (n,) int32 index into names
    kind: np.ndarray  # (n,) int8 index into KINDS
    start: np.ndarray  # (n,) float64 µs
    dur: np.ndarray  # (n,) float64 µs
    device: np.ndarray  # (n,) int64
    stream: np.ndarray  # (n,) int64
    launch: np.ndarray  # (n,) float64 µs: start of the CPU call that launched it; NaN when unknown
    bytes: np.ndarray  # (n,) float64: bytes copied or set; 0 for kernels
    # (n,) int64: the id that links it to the CPU call that launched it (CpuEvents.correlation); -1 when
    # unknown. None for events not read from a trace.
    correlation: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.start)

    def take(self, mask: np.ndarray) -> GpuEvents:
        return GpuEvents(
            self.names,
            self.name_id[mask],
            self.kind[mask],
            self.start[mask],
            self.dur[mask],
            self.device[mask],
            self.stream[mask],
            self.launch[mask],
            self.bytes[mask],
            None if self.correlation is None else self.correlation[mask],
        )


def kernel_kind(name: str, memory: bool) -> int:
    """HTA's classification: NCCL kernels communicate, memcpy/memset move memory, the rest compute.

    ``ncclDevKernel`` (NCCL >= 2.19's kernel names) counts as communication too; HTA 0.5.0
    only knows ``ncclKernel``.
    """
    if "ncclKernel" in name or "ncclDevKernel" in name:
        return COMMUNICATION
    if memory or "Memcpy" in name or "Memset" in name:
        return MEMORY
    return COMPUTATION


@dataclass(frozen=True)
class KinetoTrace:
    """One rank's trace."""

    path: Path
    cpu: CpuEvents
    gpu: GpuEvents
    distributed: dict[str, Any] = field(default_factory=dict)  # distributedInfo: rank, world_size, backend
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    base_time_ns: int = 0  # baseTimeNanoseconds: add to ts for wall-clock time, when the trace has it
    dropped: dict[str, int] = field(default_factory=dict)  # events left out, by reason

    @property
    def ns_resolution(self) -> bool:
        """Timestamps carry fractions of a microsecond (newer PyTorch writes ns resolution)."""
        starts = np.concatenate((self.cpu.start, self.gpu.start))
        return bool(np.any(starts != np.floor(starts)))

    @property
    def rank(self) -> int | None:
        rank = self.distributed.get("rank")
        return int(rank) if isinstance(rank, (int, float)) and _finite_number(rank) and rank >= 0 else None


def read_trace(path: str | os.PathLike[str]) -> KinetoTrace:
    """Read a ``.json`` or ``.json.gz`` trace; raises :class:`TraceFormatError` on bad input."""
    p = Path(path)
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _read(p)
    finally:
        if enabled:
            gc.enable()


def _read(p: Path) -> KinetoTrace:
    root = _load_json(p)
    if not isinstance(root, dict):
        raise TraceFormatError(
            f"{p}: not a torch.profiler trace: the JSON is a {type(root).__name__}, "
            "expected an object with 'traceEvents'"
        )
    events = root.get("traceEvents")
    if not isinstance(events, list):
        what = "has no 'traceEvents'" if events is None else "has a 'traceEvents' that is not a list"
        raise TraceFormatError(f"{p}: not a torch.profiler trace: the JSON object {what}")
    dropped: dict[str, int] = {}
    try:
        cpu, gpu = _columns(events)
    except (TypeError, ValueError, OverflowError):  # odd values somewhere: sort the events one by one
        cpu, gpu = _columns(_sound_events(events, dropped))
    cpu, gpu = _drop_bad_times(cpu, "CPU", dropped), _drop_bad_times(gpu, "GPU", dropped)
    info = root.get("distributedInfo")
    props = root.get("deviceProperties")
    base = root.get("baseTimeNanoseconds")
    return KinetoTrace(
        path=p,
        cpu=cpu,
        gpu=gpu,
        distributed=dict(info) if isinstance(info, dict) else {},
        device_properties=[d for d in props if isinstance(d, dict)] if isinstance(props, list) else [],
        base_time_ns=int(base)
        if isinstance(base, (int, float)) and _finite_number(base) and abs(base) < _INT64
        else 0,
        dropped=dropped,
    )


def _finite_number(value: Any) -> bool:
    return type(value) in (int, float) and np.isfinite(value)


_INT64 = 2**63


def _sound_events(events: list[Any], dropped: dict[str, int]) -> list[dict[str, Any]]:
    """The complete events whose fields the columns can hold; the others counted in ``dropped`` by reason."""
    out: list[dict[str, Any]] = []

    def drop(reason: str) -> None:
        dropped[reason] = dropped.get(reason, 0) + 1

    for e in events:
        if type(e) is not dict or e.get("ph") != "X" or "dur" not in e:
            continue
        if not isinstance(e.get("name", ""), str):
            drop("name not a string")
        elif not (_finite_number(e.get("ts")) and _finite_number(e["dur"])):
            drop("ts or dur not a number")
        elif not all(type(e.get(k)) in (int, str, type(None)) for k in ("pid", "tid")):
            drop("pid or tid not a number or a name")
        else:
            args = e.get("args")
            if type(args) is dict:
                ints = ("device", "stream", "correlation")
                bad = [k for k in ints if k in args and not (type(args[k]) is int and abs(args[k]) < _INT64)]
                if bad or ("bytes" in args and not _finite_number(args["bytes"])):
                    drop("args not numbers")
                    continue
            out.append(e)
    return out


def _drop_bad_times(ev: Any, side: str, dropped: dict[str, int]) -> Any:
    """Events whose time is not finite or whose duration is negative, left out and counted."""
    ok = np.isfinite(ev.start) & np.isfinite(ev.dur) & (ev.dur >= 0)
    if ok.all():
        return ev
    reason = f"{side} events with a negative or non-finite time"
    dropped[reason] = dropped.get(reason, 0) + int((~ok).sum())
    return ev.take(ok)


def _load_json(p: Path) -> Any:
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise TraceFormatError(f"cannot read trace {p}: {e.strerror}") from e
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except EOFError as e:
            raise TraceFormatError(f"{p}: truncated gzip file (the compressed data ends early)") from e
        except (OSError, zlib.error) as e:
            raise TraceFormatError(f"{p}: corrupt gzip data ({e})") from e
    elif p.suffix == ".gz":
        raise TraceFormatError(f"{p}: not gzip-compressed, though its name ends in .gz")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise TraceFormatError(f"{p}: invalid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from e
    except UnicodeDecodeError as e:
        raise TraceFormatError(f"{p}: not UTF-8 text ({e.reason})") from e


def _columns(events: list[Any]) -> tuple[CpuEvents, GpuEvents]:
    """The events as columns; raises TypeError, ValueError or OverflowError on a field they cannot hold."""
    names: dict[str, int] = {}
    threads: dict[tuple[Any, Any], int] = {}
    c_name: list[int] = []
    c_ts: list[Any] = []
    c_dur: list[Any] = []
    c_thread: list[int] = []
    c_corr: list[Any] = []
    g_name: list[int] = []
    g_mem: list[bool] = []
    g_ts: list[Any] = []
    g_dur: list[Any] = []
    g_dev: list[Any] = []
    g_stream: list[Any] = []
    g_corr: list[Any] = []
    g_bytes: list[Any] = []
    for e in events:
        if type(e) is not dict or e.get("ph") != "X" or "dur" not in e:
            continue
        nid = names.setdefault(e.get("name", ""), len(names))
        args = e.get("args")
        if type(args) is not dict:
            args = {}
        cat = e.get("cat", "")
        if cat in GPU_CATEGORIES:
            g_name.append(nid)
            g_mem.append(cat in _MEMORY_CATEGORIES)
            g_ts.append(e.get("ts"))
            g_dur.append(e["dur"])
            g_dev.append(args.get("device", -1))
            g_stream.append(args.get("stream", -1))
            g_corr.append(args.get("correlation", -1))
            g_bytes.append(args.get("bytes", 0))
        else:
            c_name.append(nid)
            c_ts.append(e.get("ts"))
            c_dur.append(e["dur"])
            c_thread.append(threads.setdefault((e.get("pid"), e.get("tid")), len(threads)))
            c_corr.append(args.get("correlation", -1))

    name_list = list(names)
    if not all(type(n) is str for n in name_list):
        raise TypeError("an event's name is not a string")
    cpu = CpuEvents(
        names=name_list,
        name_id=np.array(c_name, dtype=np.int32),
        start=np.array(c_ts, dtype=np.float64),
        dur=np.array(c_dur, dtype=np.float64),
        threads=list(threads),
        thread=np.array(c_thread, dtype=np.int32),
        correlation=np.array(c_corr, dtype=np.int64),
    )
    g_start = np.array(g_ts, dtype=np.float64)
    g_correlation = np.array(g_corr, dtype=np.int64)
    g_name_id = np.array(g_name, dtype=np.int32)
    gpu = GpuEvents(
        names=name_list,
        name_id=g_name_id,
        kind=np.array(
            [kernel_kind(name_list[i], m) for i, m in zip(g_name, g_mem, strict=True)], dtype=np.int8
        ),
        start=g_start,
        dur=np.array(g_dur, dtype=np.float64),
        device=np.array(g_dev, dtype=np.int64),
        stream=np.array(g_stream, dtype=np.int64),
        launch=_launch_times(cpu, g_correlation),
        bytes=np.array(g_bytes, dtype=np.float64),
        correlation=g_correlation,
    )
    return cpu, gpu


def _launch_times(cpu: CpuEvents, correlation: np.ndarray) -> np.ndarray:
    """Per GPU event, the start of the CPU call (runtime launch) with its correlation id."""
    launch = np.full(len(correlation), np.nan)
    has = np.flatnonzero(cpu.correlation >= 0)
    if not len(has) or not len(correlation):
        return launch
    order = has[np.argsort(cpu.correlation[has], kind="stable")]
    keys = cpu.correlation[order]
    at = np.minimum(np.searchsorted(keys, correlation), len(keys) - 1)
    found = (keys[at] == correlation) & (correlation >= 0)
    launch[found] = cpu.start[order[at[found]]]
    return launch
