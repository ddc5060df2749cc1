"""The ``--trace`` collector for TensorFlow and JAX: their profiler over a bounded number of steps.

Steps are counted where the stage recorder ends them (Keras's train batches, JAX's
``StepTraceAnnotation``, a tf.data loop's batches, ``perfmagic.step()``). After
``wait`` steps (the first compiles), the profiler of the framework that trains
(``tf.profiler.experimental`` or ``jax.profiler``, Python tracer off) starts, into
a temporary directory: the user's TensorBoard logdir is never written. ``steps``
steps later it stops; at the end of the window (or there, if the block ends or
raises first) its trace is read (by the reader handed in), written to the
output directory as Chrome JSON and the temporary directory removed.

Clocks: right after the start, a profiler annotation ``perfmagic.clock`` is
opened on the training thread and the timeline's time read inside it; the mark
left at that time names the event, and the Chrome-trace export shifts the
profiler's events so that the two coincide (as for torch.profiler).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from perfmagic.collect.clock_pin import marker_midpoint_us, pin_clock
from perfmagic.collect.recorder import StageRecorder
from perfmagic.intervals import union_length
from perfmagic.schema import TORCH_TRACE_MARK

TRACE_NAMES = {"tensorflow": "tf_trace.json.gz", "jax": "jax_trace.json.gz"}
"""The profiled framework (the report's ``framework``) and the file its trace goes to."""
_LABELS = {"tensorflow": "TensorFlow", "jax": "JAX"}


class ProfileReader(Protocol):
    """What reads a profile (:mod:`perfmagic.traces.xplane`, handed in by the session: collectors and
    trace readers are siblings that import neither)."""

    def read_profile(self, logdir: str | os.PathLike[str]) -> list[dict[str, Any]]: ...

    def input_wait_s(self, events: list[dict[str, Any]], start_us: float, end_us: float) -> float: ...


class TfJaxProfiler:
    """Runs the TensorFlow or JAX profiler for ``steps`` steps after ``wait`` steps."""

    def __init__(
        self,
        recorder: StageRecorder,
        outdir: str | os.PathLike[str],
        reader: ProfileReader,
        steps: int = 5,
        wait: int = 1,
    ) -> None:
        if steps < 1:
            raise ValueError(f"--steps must be at least 1, got {steps}")
        self.steps = steps
        self.warnings: list[str] = []
        self._recorder = recorder
        self._reader = reader
        self._outdir = Path(outdir)
        self._wait = wait
        self._stepped = 0
        self._running: str | None = None  # the framework whose profiler runs now
        self._profiled: str | None = None  # the framework whose profile is in ``_tmp``
        self._done = False
        self._tmp: Path | None = None
        self._clock_t = self._stop_t = 0.0
        self._clock_name = ""  # the trace's annotation at ``_clock_t`` (``clock_pin``)
        self._recorded = 0
        self._stopped = False

    def start(self) -> None:
        self._recorder.on_step = self._on_step

    def stop(self) -> list[str]:
        """Stop the profiler if it still runs, write its trace, remove the temporary directory (once)."""
        if self._stopped:
            return []
        self._stopped = True
        self._recorder.on_step = None
        try:
            if self._running is not None:
                self._stop_profiler()
            if self._profiled is not None:
                self._export(self._profiled)
            elif self._recorder.timeline.meta.get("framework") in TRACE_NAMES and not self.warnings:
                self.warnings.append(
                    f"--trace: the profiler recorded nothing: it starts after {self._wait} step(s) and saw "
                    f"{self._stepped}"
                )
        except Exception as e:  # the report of the window must not be lost to its trace
            self.warnings.append(f"--trace: the {self._profiled} profiler's trace could not be read ({e!r})")
        finally:
            if self._tmp is not None:
                shutil.rmtree(self._tmp, ignore_errors=True)
        return self.warnings

    def _clock(self) -> float:
        return self._recorder.clock.now() - self._recorder.origin

    def _on_step(self) -> None:
        if self._done:
            return
        self._stepped += 1
        try:
            if self._running is None and self._stepped >= self._wait:
                self._start_profiler()
            elif self._running is not None and self._stepped >= self._wait + self.steps:
                self._stop_profiler()
        except Exception as e:  # a profiler that fails must not fail the training step
            self._done = True
            self.warnings.append(f"--trace: the profiler failed ({e!r}); no trace was written")

    def _start_profiler(self) -> None:
        self._done = True  # one profile at most, whatever happens next
        framework = self._recorder.timeline.meta.get("framework")
        if framework not in TRACE_NAMES:  # torch trains: torch.profiler traces it
            return
        self._tmp = Path(tempfile.mkdtemp(prefix="perfmagic-profile-"))
        if framework == "tensorflow":
            import tensorflow as tf
            from tensorflow.python.profiler.trace import Trace as annotation

            options = tf.profiler.experimental.ProfilerOptions(python_tracer_level=0)
            tf.profiler.experimental.start(str(self._tmp), options=options)
        else:
            import jax
            from jax._src.lib import _profiler

            # the raw annotation: jax.profiler.TraceAnnotation is a stage while profiling (collect.jax)
            annotation = _profiler.TraceMe
            jax_options = jax.profiler.ProfileOptions()
            jax_options.python_tracer_level = 0
            jax.profiler.start_trace(str(self._tmp), profiler_options=jax_options)
        self._running = self._profiled = framework
        self._done = False
        self._clock_name, self._clock_t = pin_clock(annotation, self._clock)

    def _stop_profiler(self) -> None:
        framework, self._running, self._done = self._running, None, True
        self._stop_t = self._clock()
        self._recorded = self._stepped - self._wait
        if framework == "tensorflow":
            import tensorflow as tf

            tf.profiler.experimental.stop()
        else:
            import jax

            jax.profiler.stop_trace()

    def _export(self, framework: str) -> None:
        assert self._tmp is not None
        events = self._reader.read_profile(self._tmp)
        for e in events:  # "/host:CPU" beside perfmagic's tracks: say whose
            if e.get("ph") == "M" and e.get("name") == "process_name" and isinstance(e.get("args"), dict):
                e["args"]["name"] = f"{_LABELS[framework]} profiler: {e['args'].get('name')}"
        path = self._outdir / TRACE_NAMES[framework]
        path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}, separators=(",", ":")).encode()))
        data: dict[str, Any] = {
            "path": str(path),
            "clock_name": self._clock_name,
            "steps": self._recorded,
            "profiler": framework,
        }
        marker_us = marker_midpoint_us(events, self._clock_name)
        window_s = self._stop_t - self._clock_t
        if framework == "tensorflow" and marker_us is not None and window_s > 0:
            # tf.data's own figure beside perfmagic's over the same steps: a large gap is worth a warning
            start_us = marker_us
            profiler = self._reader.input_wait_s(events, start_us, start_us + window_s * 1e6) / window_s
            ours = self._data_s() / window_s
            data.update(input_fraction=round(profiler, 4), data_fraction=round(ours, 4))
            if abs(profiler - ours) > 0.15:
                self.warnings.append(
                    f"--trace: over the traced steps tf.data's consumer waited {profiler:.0%} of the time "
                    f"(TensorFlow profiler) where perfmagic's data stage took {ours:.0%}"
                )
        self._recorder.timeline.add_mark(self._clock_t, TORCH_TRACE_MARK, **data)

    def _data_s(self) -> float:
        """Seconds of the ``data`` stage within the traced window."""
        spans = self._recorder.timeline.spans
        data = spans.name_id == self._recorder.stage_id("data")
        lo, hi = self._clock_t, self._stop_t
        return union_length(np.clip(spans.start[data], lo, hi), np.clip(spans.end[data], lo, hi))
