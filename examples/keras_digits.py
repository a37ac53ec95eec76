"""Train a small CNN on the digits data set with Horovod's Keras API, through hvdx.

A plain Horovod TF2/Keras script. The only hvdx change is the import line:

    import hvdx.tensorflow.keras as hvd     # was: import horovod.tensorflow.keras as hvd

Run:  mpirun -n 4 python examples/keras_digits.py
"""

import argparse
import time

import numpy as np
import tensorflow as tf

import hvdx.tensorflow.keras as hvd  # the one-line change; was: import horovod.tensorflow.keras as hvd
from hvdx.datasets import digits


def digits_cnn():
    """Two conv layers and two fully-connected layers, 8x8 grey images, 10 classes."""
    return tf.keras.Sequential([
        tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu", input_shape=(8, 8, 1)),
        tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        tf.keras.layers.MaxPooling2D(2),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])


class StepTimer(tf.keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter() - self._start)

    def on_train_begin(self, logs=None):
        self.times = []


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.025, help="for one rank; scaled by size")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    hvd.init()
    tf.keras.utils.set_random_seed(args.seed)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    full = digits()
    data = full.shard(hvd.rank(), hvd.size())
    to_nhwc = lambda x: np.transpose(x, (0, 2, 3, 1))  # noqa: E731
    # Every rank takes the same number of steps (Horovod needs matching collectives):
    # the smallest shard holds len // size samples.
    steps = len(full.x_train) // hvd.size() // args.batch_size
    train = (tf.data.Dataset.from_tensor_slices((to_nhwc(data.x_train), data.y_train))
             .shuffle(len(data.y_train), seed=args.seed + hvd.rank())
             .batch(args.batch_size, drop_remainder=True).repeat())

    model = digits_cnn()
    optimizer = tf.keras.optimizers.SGD(learning_rate=args.lr * hvd.size(), momentum=0.9)
    model.compile(optimizer=hvd.DistributedOptimizer(optimizer),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    timer = StepTimer()
    model.fit(train, epochs=args.epochs, steps_per_epoch=steps,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvd.callbacks.MetricAverageCallback(), timer],
              verbose=2 if hvd.rank() == 0 else 0)
    _, accuracy = model.evaluate(to_nhwc(data.x_test), data.y_test, verbose=0)
    if hvd.rank() == 0:
        print(f"ranks {hvd.size()}  final test accuracy {accuracy:.4f}  "
              f"median time per step {1000 * np.median(timer.times):.2f} ms")


if __name__ == "__main__":
    main()
