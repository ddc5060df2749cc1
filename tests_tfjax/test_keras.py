"""Keras ``fit`` on real tf.data pipelines: steps, stages, the input-bound verdict and its fix."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
import tfloops
from report_checks import assert_consistent
from tensorflow.python.data.ops import iterator_ops

import perfmagic
from perfmagic.advise.tf_fixes import keras_jit_compile_code, keras_mixed_precision_code, tf_data_code
from perfmagic.collect.tfdata import describe_pipeline

pytestmark = pytest.mark.tfjax


def fit(dataset: Any, epochs: int = 2, **options: Any) -> dict[str, Any]:
    model = tfloops.model()
    with perfmagic.profile() as session:
        model.fit(dataset, epochs=epochs, verbose=0, **options)
    report = session.report.to_dict()
    assert_consistent(report)
    return report


def test_slow_map_is_input_bound_with_the_tf_data_fix() -> None:
    # one epoch: the step that begins a second one sometimes stalls for a moment outside any stage (0.4 s
    # once in a fresh-clone CI, 10-600 ms here), and in a dozen 80 ms steps that moment outweighs the
    # data stage: the loop is input-bound, but the window would say `other`
    report = fit(tfloops.slow_pipeline().repeat(3), epochs=1)
    assert report["framework"] == "tensorflow" and report["trainer"] == "keras.Model.fit"
    assert report["steps"]["count"] == 3 * tfloops.BATCHES
    stages = report["stages"]
    # a batch is ready every MAP_WAIT_S at best: the step waits for it what its own work does not cover
    assert stages["data"]["median_s"] + stages["forward"]["median_s"] >= 0.9 * tfloops.MAP_WAIT_S
    assert report["bottleneck"] == "data", (
        {s: (round(v["fraction"], 3), round(v["median_s"], 4)) for s, v in stages.items()},
        report["steps"],
    )
    card = next(c for c in report["advice"] if c["id"] == "input_bound")
    assert card["severity"] == "high" and card["metrics"]["data_share"] >= 0.2
    assert "serial map" in card["evidence"] and "no prefetch of its own" in card["evidence"]
    for fix in (".map(preprocess, num_parallel_calls=AUTOTUNE)", ".cache()", ".prefetch(AUTOTUNE)"):
        assert fix in card["fix"]


def test_a_fast_pipeline_is_not_input_bound() -> None:
    slow = fit(tfloops.slow_pipeline())["stages"]["data"]["fraction"]
    report = fit(tfloops.fast_pipeline())
    assert "input_bound" not in {c["id"] for c in report["advice"]}
    assert report["stages"]["data"]["fraction"] < slow / 4
    assert (
        report["stages"]["forward"]["fraction"] > report["stages"]["data"]["fraction"]
    )  # the step's own work


def test_standard_callbacks_are_checkpoint_and_logging(tmp_path: Path) -> None:
    callbacks = [
        keras.callbacks.ModelCheckpoint(str(tmp_path / "ck.weights.h5"), save_weights_only=True, save_freq=2),
        keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
        keras.callbacks.TensorBoard(str(tmp_path / "tb"), update_freq=1),
    ]
    report = fit(tfloops.fast_pipeline(), callbacks=callbacks)
    assert report["stages"]["checkpoint"]["total_s"] > 0
    assert report["stages"]["logging"]["total_s"] > 0
    assert (tmp_path / "ck.weights.h5").exists() and (tmp_path / "log.csv").exists()


def _hooked() -> dict[str, Any]:
    return {
        "fit": keras.Model.__dict__.get("fit"),
        "make_train_function": keras.Model.__dict__.get("make_train_function"),
        "__next__": iterator_ops.OwnedIterator.__next__,
        "__init__": iterator_ops.OwnedIterator.__init__,
        "save": keras.callbacks.ModelCheckpoint._save_model,
        "csv": keras.callbacks.CSVLogger.on_epoch_end,
    }


def test_everything_patched_is_put_back_even_when_fit_raises(tmp_path: Path) -> None:
    before = _hooked()
    model = tfloops.model()

    class Boom(keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch == 2:
                raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"), perfmagic.profile() as session:
        model.fit(tfloops.fast_pipeline(), epochs=1, verbose=0, callbacks=[Boom()])
    assert _hooked() == before
    assert not getattr(model.train_function, "_perfmagic", False)  # Keras's own function again
    assert session.report.to_dict()["steps"]["count"] >= 1
    model.fit(tfloops.fast_pipeline(), epochs=1, verbose=0)  # and the model still trains


def test_a_custom_loop_over_tf_data_gets_data_and_steps() -> None:
    model = tfloops.model()
    optimizer = keras.optimizers.SGD()

    @tf.function
    def train_step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_weights)
        optimizer.apply_gradients(zip(grads, model.trainable_weights, strict=True))
        return loss

    with perfmagic.profile() as session:
        for x, y in tfloops.slow_pipeline():
            train_step(x, y)
    report = session.report.to_dict()
    assert report["framework"] == "tensorflow" and report["trainer"] is None
    assert report["steps"]["count"] >= tfloops.BATCHES - 1
    assert report["stages"]["data"]["median_s"] >= 0.3 * tfloops.MAP_WAIT_S
    assert "input_bound" in {c["id"] for c in report["advice"]}


def test_the_tf_data_fix_builds_a_parallel_cached_prefetched_pipeline() -> None:
    observed = describe_pipeline(tfloops.slow_pipeline())
    assert observed["serial_maps"] == 1 and not observed["prefetch"] and not observed["cache"]
    scope = {
        "tf": tf,
        "source": tfloops.source(),
        "preprocess": tfloops.slow_read,
        "batch_size": tfloops.BATCH,
    }
    exec(tf_data_code(observed), scope)
    fixed = describe_pipeline(scope["dataset"])
    assert fixed["serial_maps"] == 0 and fixed["parallel_maps"] == 1 and fixed["prefetch"] and fixed["cache"]
    assert sum(1 for _ in scope["dataset"]) == tfloops.BATCHES


def test_the_keras_mixed_precision_and_xla_fixes_train() -> None:
    scope: dict[str, Any] = {"keras": keras, "optimizer": "sgd", "loss": "mse"}
    scope["build_model"] = lambda: keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    try:
        exec(keras_mixed_precision_code(bf16=True), scope)
        model = scope["model"]
        assert model.dtype_policy.name == "mixed_bfloat16"
        exec(keras_jit_compile_code(), scope)
        assert model.jit_compile is True
        history = model.fit(np.ones((32, 8), "float32"), np.ones((32, 4), "float32"), epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"][0])
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_validation_in_fit_is_an_evaluation_pass_not_part_of_a_step() -> None:
    """fit's validation at each epoch's end is an evaluation pass: the first epoch's last step ends where
    it begins and the next epoch's first step starts where it ended, so no step carries it."""
    passes: list[list[float]] = []  # each validation pass as Keras's own callbacks time it, in this run

    class TimedValidation(keras.callbacks.Callback):  # type: ignore[misc]
        def on_test_begin(self, logs: Any = None) -> None:
            passes.append([time.perf_counter()])

        def on_test_end(self, logs: Any = None) -> None:
            passes[-1].append(time.perf_counter())

    validation = tfloops.source().repeat(3).batch(tfloops.BATCH).cache()
    report = fit(tfloops.fast_pipeline(), validation_data=validation, callbacks=[TimedValidation()])
    evaluation = report["evaluation"]
    assert evaluation["passes"] == 2 and evaluation["every_steps"] == tfloops.BATCHES
    assert report["steps"]["count"] == 2 * tfloops.BATCHES
    table = report["step_table"]
    between = table["start"][tfloops.BATCHES] - table["end"][tfloops.BATCHES - 1]
    # the gap between the epochs' steps holds the whole first pass (the callbacks run inside it)
    first_pass_s = passes[0][1] - passes[0][0]
    assert between >= first_pass_s > 0, (between, passes, evaluation)


def test_the_xla_fix_is_the_users_own_compile_call() -> None:
    """The XLA lever rewrites ``model.compile(...)`` as the user wrote it: their optimizer, loss and
    metrics kept, ``jit_compile=True`` the one change."""
    from perfmagic.advise.trainer_fixes import compile_code

    net = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    net.compile(optimizer="sgd", loss="mse", metrics=["mae"], jit_compile=False)
    with perfmagic.profile() as session:
        net.fit(np.ones((64, 8), "float32"), np.ones((64, 4), "float32"), epochs=1, batch_size=8, verbose=0)
    assert session.report.analysis is not None
    fix = compile_code(session.report.analysis)
    assert fix is not None and "\nnet.compile(\n" in fix, fix
    assert 'optimizer="sgd"' in fix and 'loss="mse"' in fix and 'metrics=["mae"]' in fix, fix
    assert "jit_compile=True,  # was False" in fix, fix
    exec(fix, {"net": net})
    assert net.jit_compile is True and type(net.optimizer).__name__ == "SGD"
