"""Fix code for TensorFlow/Keras and JAX: the user's tf.data pipeline rewritten, Keras's mixed
precision and XLA settings, ``jax.jit`` with donated buffers.

The tf.data code is the pipeline perfmagic saw (``collect.tfdata``), source first,
with each serial ``map`` made parallel, a ``cache`` after the last map and a
``prefetch`` at the end where they are missing; each change says what it was.
"""

from __future__ import annotations

from perfmagic.contract.marks import PipelineMark

_SOURCE_NOTE = "your source (from_tensor_slices, TFRecordDataset, ...)"
_SKIPPED = frozenset({"options", "model", "max_intra_op_parallelism", "private_thread_pool"})
"""Datasets tf.data adds itself (options, autotuning): not written by the user."""


def tf_data_code(pipeline: PipelineMark) -> str:
    """The observed pipeline with parallel maps, ``cache`` and ``prefetch`` where they are missing."""
    ops = [op for op in reversed(pipeline["ops"]) if op not in _SKIPPED]
    source, rest = (ops[0], ops[1:]) if ops else ("source", [])
    lines = ["AUTOTUNE = tf.data.AUTOTUNE", "dataset = (", f"    source  # {_SOURCE_NOTE}: was {source}"]
    last_map = max((i for i, op in enumerate(rest) if op in ("map", "parallel_map")), default=None)
    for i, op in enumerate(rest):
        if op == "map":
            lines.append(
                "    .map(preprocess, num_parallel_calls=AUTOTUNE)  # was a serial map: one element at a time"
            )
        elif op == "parallel_map":
            lines.append("    .map(preprocess, num_parallel_calls=AUTOTUNE)")
        elif op == "prefetch":
            lines.append("    .prefetch(AUTOTUNE)")
        elif op == "cache":
            lines.append("    .cache()")
        elif op == "batch":
            lines.append("    .batch(batch_size)")
        else:
            lines.append(f"    # .{op}(...) as you have it")
        if i == last_map and not pipeline["cache"]:
            lines.append(
                "    .cache()  # added: the maps run in the first epoch only (keep random augmentation after it)"
            )
    if not pipeline["prefetch"]:
        lines.append("    .prefetch(AUTOTUNE)  # added: the next batches are prepared while the step runs")
    lines.append(")")
    return "\n".join(lines)


def keras_mixed_precision_code(bf16: bool) -> str:
    policy = "mixed_bfloat16" if bf16 else "mixed_float16"
    return "\n".join(
        [
            f'keras.mixed_precision.set_global_policy("{policy}")  # before the model is built',
            "model = build_model()  # your model: float32 variables, {} compute".format(
                "bfloat16" if bf16 else "float16 (the optimizer scales the loss)"
            ),
            "model.compile(optimizer, loss)  # as before",
        ]
    )


def keras_jit_compile_code() -> str:
    return "model.compile(optimizer, loss, jit_compile=True)  # the train step compiled by XLA"


def jax_jit_code() -> str:
    return "\n".join(
        [
            "# compile the whole step once; donate the old parameters and optimizer state, so that",
            "# XLA updates them in place instead of allocating new buffers every step",
            "train_step = jax.jit(train_step, donate_argnums=(0, 1))  # train_step(params, opt_state, batch)",
            "params, opt_state, loss = train_step(params, opt_state, batch)  # never reuse the donated inputs",
        ]
    )
