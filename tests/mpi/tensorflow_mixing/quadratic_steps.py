"""The training step both TensorFlow mixing test files drive: one variable ``x`` on a
per-rank quadratic ``0.5 |x - c|^2``, through the Keras optimizer or the tape, eagerly
or in ``tf.function`` (``entry``: ``"keras-function"``, ``"tape-eager"``, ...)."""

import tensorflow as tf

import hvdx.tensorflow as hvd
import hvdx.tensorflow.keras as hvd_keras


def trainer(entry, sync, x, centre, lr, optimizer=None):
    """A step function for ``x``, and the Keras hvdx optimizer (None for the tape,
    whose state the strategy's ``hvd.*_state(sync)`` gives)."""
    optimizer = optimizer or tf.keras.optimizers.SGD(lr)
    centre = tf.constant(centre)
    if entry.startswith("keras"):
        optimizer = hvd_keras.DistributedOptimizer(optimizer, sync=sync)

    def step():
        with tf.GradientTape() as tape:
            loss = 0.5 * tf.reduce_sum((x - centre) ** 2)
        if entry.startswith("tape"):
            tape = hvd.DistributedGradientTape(tape, sync=sync)
        grads = tape.gradient(loss, [x])
        optimizer.apply_gradients(zip(grads, [x]))

    if entry.endswith("function"):
        step = tf.function(step)
    owner = optimizer if entry.startswith("keras") else None
    return step, owner
