"""``--trace`` with TensorFlow and JAX: their profiler's trace merged into the exported Chrome trace."""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import keras
import pytest
import tensorflow as tf
import tfloops
from report_checks import assert_consistent

import perfmagic
from perfmagic.render.chrome import PID

pytestmark = pytest.mark.tfjax

TRACED = 3


def chrome(session: perfmagic.Session, tmp_path: Path) -> list[dict[str, Any]]:
    path = session.report.to_chrome_trace(tmp_path / "trace.json.gz")
    events: list[dict[str, Any]] = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return events


def stage_spans(events: list[dict[str, Any]], name: str) -> list[tuple[float, float]]:
    """perfmagic's stage intervals as recorded (µs), from the export's per-process tracks."""
    return [
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("ph") == "X" and e["pid"] > PID and e["name"] == name
    ]


def within(event: dict[str, Any], spans: list[tuple[float, float]], slack_us: float = 200.0) -> bool:
    start, end = event["ts"], event["ts"] + event.get("dur", 0.0)
    return any(s - slack_us <= start and end <= e + slack_us for s, e in spans)


def no_profiler_running() -> bool:
    """The process-wide profilers are free again: new ones start (and are stopped at once)."""
    with tempfile.TemporaryDirectory() as logdir:
        try:
            tf.profiler.experimental.start(logdir)
            tf.profiler.experimental.stop()
            jax.profiler.start_trace(logdir)
            jax.profiler.stop_trace()
        except (tf.errors.AlreadyExistsError, RuntimeError):
            return False
    return True


def test_a_traced_keras_fit_merges_the_tf_profiler_trace(tmp_path: Path) -> None:
    logdir = tmp_path / "tb"
    model = tfloops.model()
    with perfmagic.profile(trace=TRACED, outdir=tmp_path / "out") as session:
        model.fit(
            tfloops.slow_pipeline(), epochs=1, verbose=0, callbacks=[keras.callbacks.TensorBoard(str(logdir))]
        )
    report = session.report.to_dict()
    assert_consistent(report)
    (trace,) = report["torch_traces"]
    assert trace["profiler"] == "tensorflow" and trace["steps"] == TRACED
    assert Path(trace["path"]).parent == tmp_path / "out"
    # tf.data's own figure and perfmagic's data stage, over the same steps, tell the same story
    assert trace["input_fraction"] > 0.3 and abs(trace["input_fraction"] - trace["data_fraction"]) < 0.15
    # the user's logdir has the TensorBoard callback's logs, and no profile of ours
    assert (logdir / "train").is_dir() and not list(logdir.rglob("*.xplane.pb"))
    assert no_profiler_running()

    events = chrome(session, tmp_path)
    # TensorFlow's own trace: its kernels by op type (oneDNN's MatMuls here), three Dense layers a step
    ops = [e for e in events if e.get("ph") == "X" and "MatMul" in str(e.get("name")) and e["pid"] < PID]
    assert len(ops) >= TRACED * 3
    # on one clock: each of the train step's ops ran inside a forward stage perfmagic recorded
    forward = stage_spans(events, "forward")
    assert forward and all(within(op, forward) for op in ops)
    waits = [e for e in events if e.get("name") == "Iterator::Root"]
    assert waits and all(within(w, stage_spans(events, "data")) for w in waits)


def test_the_profiler_stops_when_fit_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where the profiler writes before the export
    model = tfloops.model()

    class Boom(keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch == 2:  # one step into the trace
                raise RuntimeError("boom")

    with (
        pytest.raises(RuntimeError, match="boom"),
        perfmagic.profile(trace=TRACED, outdir=tmp_path / "out") as session,
    ):
        model.fit(tfloops.fast_pipeline(), epochs=1, verbose=0, callbacks=[Boom()])
    assert no_profiler_running()
    (trace,) = session.report.to_dict()["torch_traces"]
    assert trace["steps"] == 1 and Path(trace["path"]).exists()
    assert not list(temp.glob("perfmagic-profile-*"))  # the profiler's own directory is gone


def test_a_traced_jax_loop_merges_jax_profiler_trace(tmp_path: Path) -> None:
    step = jax.jit(lambda w, x: w - 0.01 * jnp.tanh(x @ w).T @ x)
    key = jax.random.PRNGKey(0)
    w, x = jax.random.normal(key, (256, 256)), jax.random.normal(key, (128, 256))
    with perfmagic.profile(trace=TRACED, outdir=tmp_path) as session:
        for i in range(TRACED + 3):
            with (
                jax.profiler.StepTraceAnnotation("train", step_num=i),
                jax.profiler.TraceAnnotation("forward"),
            ):
                w = step(w, x)
    (trace,) = session.report.to_dict()["torch_traces"]
    assert trace["profiler"] == "jax" and trace["steps"] == TRACED
    events = chrome(session, tmp_path)
    # JAX's annotations are in its trace, each where perfmagic recorded the stage it is
    notes = [e for e in events if e.get("ph") == "X" and e.get("name") == "forward" and e["pid"] < PID]
    assert len(notes) == TRACED and all(within(n, stage_spans(events, "forward")) for n in notes)
    assert any("fusion" in str(e.get("name")) for e in events)  # and the compiled ops XLA ran
    assert no_profiler_running()
