"""An unchanged Keras script: fit on a tf.data pipeline whose serial map waits per batch."""

import time

import keras
import numpy as np
import tensorflow as tf


def read(x):
    time.sleep(0.05)  # a network read
    return x


def slow_read(x, y):
    out = tf.numpy_function(read, [x], tf.float32)
    out.set_shape(x.shape)
    return out, y


# 15 batches an epoch: Keras replaces its tf.data iterator between epochs, and tearing the old one
# down (CPU work that a busy machine stretches to a second) falls in one step's "other"; as in real
# training, an epoch's batches outweigh it
x = np.random.default_rng(0).random((64 * 15, 32), dtype=np.float32)
y = x.sum(axis=1, keepdims=True)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64).map(slow_read)
model = keras.Sequential(
    [keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)]
)
model.compile(optimizer="sgd", loss="mse")
model.fit(dataset, epochs=2, verbose=2)
print("trained on", keras.backend.backend())
