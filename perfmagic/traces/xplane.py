"""Readers of what the TensorFlow and JAX profilers write: their Chrome trace, without TensorBoard.

Both profilers write an XSpace (``<host>.xplane.pb``) under ``plugins/profile/<run>/``
of the directory they were given. JAX also writes its Chrome trace
(``<host>.trace.json.gz``) beside it; for TensorFlow the XSpace is converted by
TensorFlow's own copy of the converter the ``xprof`` package wraps (its
``trace_viewer@`` tool: the trace as Trace Event Format JSON), so neither
TensorBoard nor xprof is needed. Event times are microseconds on the profiler's
clock; :func:`perfmagic.render.chrome.torch_events` moves them onto the report's.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from perfmagic.intervals import union_length
from perfmagic.traces.kineto import TraceFormatError

INPUT_WAIT_EVENT = "Iterator::Root"
"""tf.data's outermost iterator's ``GetNext``: the consumer waiting for its next element."""


def read_profile(logdir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The trace events of the latest profile in a profiler log directory."""
    runs = sorted((Path(logdir) / "plugins" / "profile").glob("*/"), key=os.path.getmtime)
    if not runs:
        raise TraceFormatError(f"{logdir}: the profiler wrote no profile")
    run = runs[-1]
    traces = sorted(run.glob("*.trace.json.gz"))
    if traces:  # JAX's: already converted
        return _events(json.loads(gzip.decompress(traces[0].read_bytes())), traces[0])
    xplanes = sorted(run.glob("*.xplane.pb"))
    if not xplanes:
        raise TraceFormatError(f"{run}: no trace and no xplane.pb")
    return xplane_events(xplanes)


def xplane_events(paths: list[Path]) -> list[dict[str, Any]]:
    """The trace events of XSpace files, by TensorFlow's converter (the one ``xprof`` wraps)."""
    return _events(xplane_document(paths), paths[0])


def xplane_document(paths: list[Path]) -> Any:
    """XSpace files as one Trace Event Format document (TensorFlow's converter: TensorFlow must be installed)."""
    try:
        from tensorflow.python.profiler.internal import _pywrap_profiler_plugin as plugin
    except ImportError as e:
        raise TraceFormatError(
            f"{paths[0]}: an XSpace (TensorFlow or JAX profiler) file; reading it needs TensorFlow's "
            f"converter ({e}). JAX also writes its trace as *.trace.json.gz beside it: give that one"
        ) from e
    data, ok = plugin.xspace_to_tools_data([str(p) for p in paths], "trace_viewer@", {})
    if not ok:
        raise TraceFormatError(f"{paths[0]}: the converter failed ({bytes(data)[:200]!r})")
    return json.loads(data)


def input_wait_s(events: list[dict[str, Any]], start_us: float, end_us: float) -> float:
    """Seconds between ``start_us`` and ``end_us`` in which tf.data's consumer waited for an element."""
    waits = [e for e in events if e.get("name") == INPUT_WAIT_EVENT and e.get("ph") == "X"]
    start = np.array([float(e["ts"]) for e in waits])
    end = start + np.array([float(e.get("dur", 0.0)) for e in waits])
    return union_length(np.clip(start, start_us, end_us), np.clip(end, start_us, end_us)) / 1e6


def _events(trace: Any, path: Path) -> list[dict[str, Any]]:
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise TraceFormatError(f"{path}: no traceEvents")
    return events
