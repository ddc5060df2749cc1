"""``perfmagic report`` on what JAX's and TensorFlow's own profilers wrote, with no perfmagic in the run:
the steps their step annotations mark, timed as the loop's own stopwatch says."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
import tensorflow as tf
import tfloops

pytestmark = pytest.mark.tfjax

STEPS = 6


def reported(trace: Path, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "report.json"
    command = [sys.executable, "-m", "perfmagic.cli", "report", str(trace), "--json", str(out)]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def test_a_jax_trace_gives_the_steps_its_step_annotations_mark(tmp_path: Path) -> None:
    @jax.jit
    def step(w: Any, x: Any) -> Any:
        return w - 0.01 * jax.grad(lambda w: ((x @ w) ** 2).mean())(w)

    w, x = jnp.ones((256, 256)), jnp.ones((64, 256))
    w = step(w, x).block_until_ready()  # compiled before the trace, as a traced window usually is
    stopwatch = []
    jax.profiler.start_trace(str(tmp_path / "log"))
    try:
        for i in range(STEPS):
            begin = time.perf_counter()
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                w = step(w, x).block_until_ready()
                time.sleep(0.02)  # the host's own part of a step: logging, say
            stopwatch.append(time.perf_counter() - begin)
    finally:
        jax.profiler.stop_trace()

    (trace,) = (tmp_path / "log" / "plugins" / "profile").glob("*/*.trace.json.gz")
    report = reported(trace, tmp_path)
    assert report["framework"] == "jax" and report["steps"]["count"] == STEPS
    # the steady steps (the first is warm-up) against the loop's own stopwatch over the same steps
    assert report["steps"]["median_s"] == pytest.approx(statistics.median(stopwatch[1:]), rel=0.1)
    assert any("a jax trace" in w for w in report["warnings"])
    assert not any("torch.profiler.record_function" in w for w in report["warnings"]), report["warnings"]


def test_a_tensorflow_xplane_gives_its_annotated_steps_and_the_input_wait(tmp_path: Path) -> None:
    """A custom loop over a slow tf.data pipeline, each step in ``tf.profiler.experimental.Trace``."""
    model = tfloops.model()
    batches = iter(tfloops.slow_pipeline().repeat())
    model.train_on_batch(*next(batches))  # traced and compiled before the window
    waited, stopwatch = [], []
    tf.profiler.experimental.start(str(tmp_path / "log"))
    try:
        for i in range(STEPS):
            begin = time.perf_counter()
            with tf.profiler.experimental.Trace("train", step_num=i, _r=1):
                x, y = next(batches)
                got = time.perf_counter()
                model.train_on_batch(x, y)
            end = time.perf_counter()
            waited.append(got - begin)
            stopwatch.append(end - begin)
    finally:
        tf.profiler.experimental.stop()

    (xplane,) = (tmp_path / "log" / "plugins" / "profile").glob("*/*.xplane.pb")
    report = reported(xplane, tmp_path)
    assert report["framework"] == "tensorflow" and report["steps"]["count"] == STEPS
    assert report["steps"]["median_s"] == pytest.approx(statistics.median(stopwatch[1:]), rel=0.15)
    # the slow map's waits, from tf.data's own events: about what the loop measured around next()
    measured = sum(waited[1:]) / sum(stopwatch[1:])
    assert measured > 0.3 and report["stages"]["data"]["fraction"] == pytest.approx(measured, abs=0.1)
