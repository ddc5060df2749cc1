"""Keras training on tf.data pipelines whose input cost is known: a map that sleeps per batch."""

from __future__ import annotations

import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

FEATURES, BATCH, BATCHES = 512, 256, 6
MAP_WAIT_S = 0.2
"""What the slow map waits per batch (I/O, as a network read: no CPU used). tf.data prefetches one
batch of its own after the last map (``inject_prefetch``): the step waits this less its compute, which
a busy machine stretches (40-45 ms beside two busy cores): the wait must stay the larger part."""


def model() -> Any:
    """A model whose fused train step takes tens of ms on one core: the fast pipeline's wait is small beside it."""
    m = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(1024, activation="relu"),
            keras.layers.Dense(1024, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    m.compile(optimizer="sgd", loss="mse")
    return m


def _wait(x: Any) -> Any:
    time.sleep(MAP_WAIT_S)
    return x


def slow_read(x: Any, y: Any) -> tuple[Any, Any]:
    out = tf.numpy_function(_wait, [x], tf.float32)
    out.set_shape(x.shape)
    return out, y


def source() -> Any:
    rng = np.random.default_rng(0)
    x = rng.random((BATCH * BATCHES, FEATURES), dtype=np.float32)
    y = rng.random((BATCH * BATCHES, 1), dtype=np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y))


def slow_pipeline() -> Any:
    """Batches read one at a time through a serial map, no cache, no prefetch."""
    return source().batch(BATCH).map(slow_read)


def fast_pipeline() -> Any:
    return source().batch(BATCH).cache().prefetch(tf.data.AUTOTUNE)
