"""Read a Chrome/Kineto trace (what ``torch.profiler`` exports) into columnar arrays.

A trace is one JSON object with ``traceEvents`` (plain or gzip-compressed). Only
complete events (``"ph": "X"``) matter here: GPU events (``kernel``, ``gpu_memcpy``,
``gpu_memset``) become :class:`~perfmagic.traces.events.GpuEvents`; every other one but
the GPU-side copies of annotations (``gpu_user_annotation``) is a CPU event (operators,
``record_function`` annotations, CUDA runtime calls) in
:class:`~perfmagic.traces.events.CpuEvents`. The allocator's ``[memory]`` instant events
(``profile_memory=True``) become :class:`~perfmagic.traces.events.MemoryEvents`. Times
stay in microseconds on the trace's clock.

The JSON parse dominates the cost, so a trace is streamed: decompressed and decoded
half a MiB at a time by msgspec into structs of only the fields used (the rest of each
event is skipped unread), each chunk turned into columns before the next is read. A
trace with odd values (a string where a number belongs, NaN) or another layout is read
whole with the standard library instead, where each odd event is left out and counted.
The cyclic garbage collector is paused while a trace is read: the whole-document parse
creates hundreds of thousands of acyclic dicts and lists, which the collector would
otherwise traverse again and again (it doubles the time).
"""

from __future__ import annotations

import dataclasses
import gc
import gzip
import json
import os
import re
import zlib
from pathlib import Path
from typing import Annotated, Any

import msgspec
import numpy as np

from perfmagic.traces.chunks import GZIP_MAGIC, Unstreamable, json_chunks, last_boundary
from perfmagic.traces.events import (
    COMPUTATION,
    MEMORY,
    CpuEvents,
    GpuEvents,
    KinetoTrace,
    MemoryEvents,
    finite_number,
    kernel_kind,
    no_memory,
    running_allocated,
)

GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"})
"""GPU events' categories: today's spellings and PyTorch 1.8/1.9's (``Kernel``, ``Memcpy``, ``Memset``;
their CPU events are ``Operator`` and ``Runtime``, today's ``cpu_op`` and ``cuda_runtime``)."""
GPU_ANNOTATION = "gpu_user_annotation"
"""The GPU-side copy of a ``record_function`` range (``ProfilerStep#N`` too): left out, not a CPU event."""
SKIPPED_CATEGORIES = frozenset({GPU_ANNOTATION})
"""Complete events that are no CPU event. The ``Trace`` range Kineto writes over the whole profiling
window (on a made-up ``Traces`` process) stays one: it is what the report's length covers."""
_MEMORY_CATEGORIES = frozenset({"gpu_memcpy", "gpu_memset", "Memcpy", "Memset"})
_STREAM_TID = re.compile(r"stream (\d+)")
MEMORY_EVENT = "[memory]"


class TraceFormatError(ValueError):
    """A file that is not a readable torch.profiler (Kineto/Chrome) trace."""


def read_trace(path: str | os.PathLike[str]) -> KinetoTrace:
    """Read a ``.json`` or ``.json.gz`` trace; raises :class:`TraceFormatError` on bad input."""
    p = Path(path)
    enabled = gc.isenabled()
    gc.disable()
    try:
        try:
            return _streamed(p)
        except Unstreamable:
            return _whole(p)
    finally:
        if enabled:
            gc.enable()


_INT64 = 2**63
_Int64 = Annotated[int, msgspec.Meta(ge=-_INT64, le=_INT64 - 1)]


class _Args(msgspec.Struct, gc=False):
    device: _Int64 = -1
    stream: _Int64 = -1
    correlation: _Int64 = -1
    bytes: float = 0.0
    # [memory] events
    allocated: float = msgspec.field(default=float("nan"), name="Total Allocated")
    reserved: float = msgspec.field(default=float("nan"), name="Total Reserved")
    device_type: _Int64 = msgspec.field(default=-1, name="Device Type")
    device_id: _Int64 = msgspec.field(default=-1, name="Device Id")
    delta: float = msgspec.field(default=float("nan"), name="Bytes")  # older traces: the bytes (de)allocated
    step_num: Any = None  # JAX's and TensorFlow's step annotations (a string in their traces)


class _Event(msgspec.Struct, gc=False):
    """The fields of an event that the columns hold; every other field is skipped unread."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | msgspec.UnsetType | None = msgspec.UNSET  # null: complete, with a time to drop
    args: _Args | None = None


class _Facts(msgspec.Struct, gc=False):
    """The trace-wide facts beside ``traceEvents``."""

    distributedInfo: Any = None
    deviceProperties: Any = None
    baseTimeNanoseconds: Any = None


class _Rest(_Facts, gc=False):
    """The end of the document: its last events and the facts after them."""

    traceEvents: list[_Event] = []


_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_decode_events = msgspec.json.Decoder(list[_Event]).decode
_decode_facts = msgspec.json.Decoder(_Facts).decode
_decode_rest = msgspec.json.Decoder(_Rest).decode
_NO_ARGS = _Args()


def _streamed(p: Path) -> KinetoTrace:
    """The trace decoded ``CHUNK`` bytes at a time, so memory follows the events, not the file.

    The text before ``traceEvents`` gives the facts. Each chunk of events is cut after its
    last ``}, {`` and decoded as an array: a cut inside a string or a nested object leaves
    unbalanced JSON, which does not decode, so a decoded chunk is whole events. What
    follows the last cut is the rest of the document's object. Anything unexpected (odd
    values, another layout, bad input) raises :class:`Unstreamable`.
    """
    columns = _Columns()
    chunks = json_chunks(p)
    buf = bytearray()
    try:
        for chunk in chunks:
            buf += chunk
            key = _EVENTS_KEY.search(buf)
            if key is not None:
                break
        else:
            raise Unstreamable
        facts = _decode_facts(buf[: key.end()] + b"]}")
        del buf[: key.end() - 1]  # keep the "[" that opens the events
        for chunk in chunks:
            buf += chunk
            cut = last_boundary(buf)
            if cut > 0:
                buf[cut] = ord("]")  # what follows the cut is whitespace or the comma
                columns.add(_decode_events(memoryview(buf)[: cut + 1]))
                del buf[1 : buf.index(b"{", cut)]
        rest = _decode_rest(b'{"traceEvents":' + buf)
        columns.add(rest.traceEvents)
        return _trace(
            p,
            columns,
            rest.distributedInfo or facts.distributedInfo,
            rest.deviceProperties or facts.deviceProperties,
            rest.baseTimeNanoseconds or facts.baseTimeNanoseconds,
            {},
        )
    except (msgspec.DecodeError, TypeError, ValueError, OverflowError):
        raise Unstreamable from None


class _Columns:
    """Columns built a chunk of events at a time."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.threads: dict[tuple[Any, Any], int] = {}
        self.cpu: list[tuple[np.ndarray, ...]] = []
        self.gpu: list[tuple[np.ndarray, ...]] = []
        self.memory: list[tuple[np.ndarray, ...]] = []
        self.step_names: set[str] = set()

    def add(self, events: list[_Event]) -> None:
        names, threads = self.names, self.threads
        c_name: list[int] = []
        c_ts: list[Any] = []
        c_dur: list[Any] = []
        c_thread: list[int] = []
        c_corr: list[int] = []
        g_name: list[int] = []
        g_mem: list[bool] = []
        g_ts: list[Any] = []
        g_dur: list[Any] = []
        g_dev: list[int] = []
        g_stream: list[int] = []
        g_corr: list[int] = []
        g_bytes: list[float] = []
        memory: list[tuple[Any, float, float, int, int, float]] = []
        for e in events:
            if e.ph != "X" or e.dur is msgspec.UNSET:
                if e.ph == "i" and e.name == MEMORY_EVENT and e.args is not None:
                    a = e.args
                    memory.append((e.ts, a.allocated, a.reserved, a.device_type, a.device_id, a.delta))
                continue
            if e.cat in SKIPPED_CATEGORIES:
                continue
            nid = names.setdefault(e.name, len(names))
            args = e.args or _NO_ARGS
            if e.cat in GPU_CATEGORIES:
                g_name.append(nid)
                g_mem.append(e.cat in _MEMORY_CATEGORIES)
                g_ts.append(e.ts)
                g_dur.append(e.dur)
                # Kineto puts a GPU's events on process <device>, thread <stream> ("stream 7" in older
                # traces): where the args leave them out, that is where the event ran
                g_dev.append(args.device if args.device >= 0 else _device_of(e.pid))
                g_stream.append(args.stream if args.stream >= 0 else _stream_of(e.tid))
                g_corr.append(args.correlation)
                g_bytes.append(args.bytes)
            else:
                c_name.append(nid)
                c_ts.append(e.ts)
                c_dur.append(e.dur)
                c_thread.append(threads.setdefault((e.pid, e.tid), len(threads)))
                c_corr.append(args.correlation)
                if args.step_num is not None:
                    self.step_names.add(e.name)
        f64, i64, i32 = np.float64, np.int64, np.int32
        self.cpu.append(
            (
                np.array(c_name, i32),
                np.array(c_ts, f64),
                np.array(c_dur, f64),
                np.array(c_thread, i32),
                np.array(c_corr, i64),
            )
        )
        self.gpu.append(
            (
                np.array(g_name, i32),
                np.array(g_mem, bool),
                np.array(g_ts, f64),
                np.array(g_dur, f64),
                np.array(g_dev, i64),
                np.array(g_stream, i64),
                np.array(g_corr, i64),
                np.array(g_bytes, f64),
            )
        )

        if memory:
            types = (f64, f64, f64, i64, i64, f64)  # MemoryEvents' columns, then the older traces' deltas
            self.memory.append(
                tuple(np.array(c, t) for c, t in zip(zip(*memory, strict=True), types, strict=True))
            )

    def memory_events(self) -> MemoryEvents:
        if not self.memory:
            return no_memory()
        start, allocated, reserved, device_type, device, delta = _joined(self.memory, 6)
        return MemoryEvents(
            start,
            running_allocated(start, allocated, device_type, device, delta),
            reserved,
            device_type,
            device,
        )

    def cpu_events(self) -> CpuEvents:
        name_id, start, dur, thread, corr = _joined(self.cpu, 5)
        return CpuEvents(list(self.names), name_id, start, dur, list(self.threads), thread, corr)

    def gpu_events(self, cpu: CpuEvents) -> GpuEvents:
        """The GPU events, each linked to the call in ``cpu`` that launched it."""
        name_list = cpu.names
        g_name, g_mem, g_start, g_dur, g_dev, g_stream, g_corr, g_bytes = _joined(self.gpu, 8)
        by_name = np.array([kernel_kind(n, False) for n in name_list], dtype=np.int8)[g_name]
        kind = np.where(g_mem.astype(bool) & (by_name == COMPUTATION), np.int8(MEMORY), by_name)
        rows = launch_rows(cpu, g_corr)
        launch = np.full(len(rows), np.nan)
        launch[rows >= 0] = cpu.start[rows[rows >= 0]]
        return GpuEvents(
            names=name_list,
            name_id=g_name,
            kind=kind,
            start=g_start,
            dur=g_dur,
            device=g_dev,
            stream=g_stream,
            launch=launch,
            bytes=g_bytes,
            correlation=g_corr,
            launch_row=rows,
        )


def _device_of(pid: Any) -> int:
    """The device a GPU event without a ``device`` argument ran on: its process id, where a number."""
    return pid if type(pid) is int and 0 <= pid < _INT64 else -1


def _stream_of(tid: Any) -> int:
    """The stream a GPU event without a ``stream`` argument ran on: its thread id, a number or
    ``"stream N"``."""
    if type(tid) is int:
        return tid if 0 <= tid < _INT64 else -1
    m = _STREAM_TID.fullmatch(tid) if isinstance(tid, str) else None
    return int(m.group(1)) if m else -1


def _joined(parts: list[tuple[np.ndarray, ...]], width: int) -> list[np.ndarray]:
    if not parts:
        return [np.zeros(0)] * width
    return [np.concatenate([p[i] for p in parts]) for i in range(width)]


def _trace(
    p: Path, columns: _Columns, info: Any, props: Any, base: Any, dropped: dict[str, int]
) -> KinetoTrace:
    # the CPU events are final before the GPU events are linked to their rows
    cpu = _drop_bad_times(columns.cpu_events(), "CPU", dropped)
    gpu = _drop_bad_times(columns.gpu_events(cpu), "GPU", dropped)
    memory = columns.memory_events()
    sound = np.isfinite(memory.start) & np.isfinite(memory.allocated)
    return KinetoTrace(
        path=p,
        cpu=cpu,
        gpu=gpu,
        distributed=dict(info) if isinstance(info, dict) else {},
        device_properties=[d for d in props if isinstance(d, dict)] if isinstance(props, list) else [],
        base_time_ns=int(base)
        if isinstance(base, (int, float)) and finite_number(base) and abs(base) < _INT64
        else 0,
        dropped=dropped,
        memory=memory if sound.all() else MemoryEvents(*(c[sound] for c in dataclasses.astuple(memory))),
        step_names=frozenset(columns.step_names),
    )


# -- the slow path: the whole document, every event checked -----------------------------


def _whole(p: Path) -> KinetoTrace:
    return trace_of_document(_load_json(p), p)


def trace_of_document(root: Any, p: Path) -> KinetoTrace:
    """The trace a parsed Trace Event Format document holds (``p``: where it came from, for messages);
    every event is checked, as in a trace read whole."""
    if isinstance(root, list) and root and type(root[0]) is dict and "ph" in root[0]:
        root = {"traceEvents": root}  # the Trace Event Format's other layout (PyTorch 1.8's): the events
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
    columns = _Columns()
    columns.add(msgspec.convert(_sound_events(events, dropped), list[_Event]))
    info, props, base = (root.get(k) for k in ("distributedInfo", "deviceProperties", "baseTimeNanoseconds"))
    return _trace(p, columns, info, props, base, dropped)


_ARG_INTS = ("device", "stream", "correlation")


def _sound_events(events: list[Any], dropped: dict[str, int]) -> list[dict[str, Any]]:
    """The complete events whose fields the columns can hold, as :class:`_Event`'s fields;
    the others counted in ``dropped`` by reason."""
    out: list[dict[str, Any]] = []

    def drop(reason: str) -> None:
        dropped[reason] = dropped.get(reason, 0) + 1

    for e in events:
        if type(e) is dict and e.get("ph") == "i" and e.get("name") == MEMORY_EVENT:
            memory = _sound_memory_event(e)
            if memory is None:
                drop("memory event fields not numbers")
            else:
                out.append(memory)
            continue
        if type(e) is not dict or e.get("ph") != "X" or "dur" not in e:
            continue
        name = e.get("name", "")
        if not isinstance(name, str):
            drop("name not a string")
        elif not (finite_number(e.get("ts")) and finite_number(e["dur"])):
            drop("ts or dur not a number")
        elif not all(type(e.get(k)) in (int, str, type(None)) for k in ("pid", "tid")):
            drop("pid or tid not a number or a name")
        else:
            args = e.get("args")
            args = args if type(args) is dict else {}
            bad = [k for k in _ARG_INTS if k in args and not (type(args[k]) is int and abs(args[k]) < _INT64)]
            if bad or ("bytes" in args and not finite_number(args["bytes"])):
                drop("args not numbers")
                continue
            cat = e.get("cat")
            out.append(
                {
                    "ph": "X",
                    "cat": cat if isinstance(cat, str) else "",
                    "name": name,
                    "pid": e.get("pid"),
                    "tid": e.get("tid"),
                    "ts": e["ts"],
                    "dur": e["dur"],
                    "args": {k: args[k] for k in (*_ARG_INTS, "bytes", "step_num") if k in args},
                }
            )
    return out


_MEMORY_ARGS = {
    "Total Allocated": float,
    "Total Reserved": float,
    "Device Type": int,
    "Device Id": int,
    "Bytes": float,
}


def _sound_memory_event(e: dict[str, Any]) -> dict[str, Any] | None:
    """A ``[memory]`` event as :class:`_Event`'s fields, or None when a field it needs is odd."""
    args = e.get("args")
    if (
        type(args) is not dict
        or not finite_number(e.get("ts"))
        or not ("Total Allocated" in args or "Bytes" in args)
    ):
        return None
    kept = {k: args[k] for k in _MEMORY_ARGS if k in args}
    for k, v in kept.items():
        if not finite_number(v) or (_MEMORY_ARGS[k] is int and not (type(v) is int and abs(v) < _INT64)):
            return None
    return {"ph": "i", "name": MEMORY_EVENT, "ts": e["ts"], "args": kept}


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
    if raw[:2] == GZIP_MAGIC:
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


def launch_rows(cpu: CpuEvents, correlation: np.ndarray) -> np.ndarray:
    """Per GPU event, the row of the CPU call (runtime launch) with its correlation id; -1 when none."""
    rows = np.full(len(correlation), -1, dtype=np.int64)
    has = np.flatnonzero(cpu.correlation >= 0)
    if not len(has) or not len(correlation):
        return rows
    order = has[np.argsort(cpu.correlation[has], kind="stable")]
    keys = cpu.correlation[order]
    at = np.minimum(np.searchsorted(keys, correlation), len(keys) - 1)
    found = (keys[at] == correlation) & (correlation >= 0)
    rows[found] = order[at[found]]
    return rows
