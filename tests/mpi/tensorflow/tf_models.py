"""Small models and data for the TensorFlow MPI tests."""

import numpy as np
import tensorflow as tf


def small_cnn(hidden=32, seed=1):
    """Conv and FC layers on 8x8 inputs, with weights from a seeded initializer."""
    init = tf.keras.initializers.GlorotUniform(seed=seed)
    return tf.keras.Sequential([
        tf.keras.layers.Conv2D(8, 3, padding="same", activation="relu", input_shape=(8, 8, 1),
                               kernel_initializer=init),
        tf.keras.layers.MaxPooling2D(2),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(hidden, activation="relu", kernel_initializer=init),
        tf.keras.layers.Dense(10, kernel_initializer=init),
    ])


def batches(rank, steps, batch=16, seed=0):
    """Different data on every rank, the same on every run (NHWC)."""
    rng = np.random.default_rng(seed * 1000 + rank)
    x = rng.standard_normal((steps * batch, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 10, steps * batch).astype(np.int64)
    return x, y


def copy_of(model, hidden=32):
    clone = small_cnn(hidden)
    clone.set_weights(model.get_weights())
    return clone
