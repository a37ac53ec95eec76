"""Train a small CNN on the digits data set with Horovod's Keras API (fit), through hvdx.

A plain Horovod TF2/Keras script. With ``--strategy none`` the only hvdx change is the
import line:

    import hvdx.tensorflow.keras as hvd     # was: import horovod.tensorflow.keras as hvd

Each other strategy switches on one hvdx feature (README.md):

    topk           DistributedOptimizer(..., compression=hvd.Compression.topk(preset="safe"))
    dssync         hvd.init(process_sets="dynamic"); DistributedOptimizer(..., sync=hvdx.DSSync())
    decentralized  DistributedOptimizer(..., sync=hvdx.Decentralized("one-peer-exp"))

(Stanza trains with a tape, not with fit: examples/tf_tape_digits.py.)

Run:  mpirun -n 4 python examples/keras_digits.py --strategy dssync
 or:  horovodrun -np 4 python examples/keras_digits.py --checkpoint digits.hvdx
 and  HOROVOD_CYCLE_TIME=50 mpirun -n 4 python examples/keras_digits.py --strategy topk
      (as TopK's presets advise: see examples/torch_digits.py)
Across hosts: examples/multi_host.sh.
"""

import argparse
import os

import numpy as np
import tensorflow as tf

import hvdx
import hvdx.tensorflow.keras as hvd  # the one-line change; was: horovod.tensorflow.keras
from hvdx.datasets import digits  # scikit-learn's 8x8 digits: no download

STRATEGIES = ("none", "topk", "dssync", "decentralized")


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


def distributed_optimizer(optimizer, model, strategy):
    """Horovod's DistributedOptimizer, with the hvdx argument of ``strategy``."""
    options = {}
    if strategy == "topk":  # 1% up, 2% down: steadier late in a run than preset="fast"
        options["compression"] = hvd.Compression.topk(preset="safe")
    elif strategy in ("dssync", "decentralized"):
        options["sync"] = hvdx.DSSync() if strategy == "dssync" else \
            hvdx.Decentralized(graph="one-peer-exp")
        # Averaged with the variables: BatchNorm statistics (this model has none).
        options["non_trainable_variables"] = model.non_trainable_variables
    return hvd.DistributedOptimizer(optimizer, **options)


class EndOfEpoch(tf.keras.callbacks.Callback):
    """After every epoch: average the ranks' variables (DS-Sync, decentralized: each
    rank trains its own), write the checkpoint, add the test accuracy to Keras' log."""

    def __init__(self, args, test, epoch):
        super().__init__()
        self.args, self.test, self.epoch = args, test, epoch

    def on_epoch_end(self, epoch, logs=None):
        if self.args.strategy in ("dssync", "decentralized"):
            self.model.optimizer.synchronize_parameters()
        if self.args.checkpoint:  # every rank: each rank's state, in one file on rank 0
            self.epoch.assign(epoch + 1)
            hvd.save_checkpoint(self.args.checkpoint, model=self.model,
                                optimizer=self.model.optimizer, epoch=self.epoch)
        logs["test_accuracy"] = accuracy(self.model, *self.test)


def accuracy(model, x, y):
    return float(np.mean(np.argmax(model(x, training=False), axis=1) == y))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=STRATEGIES, default="none")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--steps-per-epoch", type=int, default=None,
                        help="default: one pass over the training data")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.025, help="for one rank; scaled by size")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--checkpoint", metavar="PATH",
                        help="saved after every epoch; the run resumes from it if it exists")
    args = parser.parse_args(argv)

    # (Calling hvd.init() again in a job that has initialised Horovod, as the tests of
    # this example do, changes nothing: Horovod initialises once per process.)
    if args.strategy == "dssync":
        hvd.init(process_sets="dynamic")  # DS-Sync registers a process set per group
    else:
        hvd.init()
    tf.keras.utils.set_random_seed(args.seed)  # the same initial model on every rank
    full = digits()
    data = full.shard(hvd.rank(), hvd.size())
    to_nhwc = lambda x: np.transpose(x, (0, 2, 3, 1))  # noqa: E731
    # Every rank takes the same number of steps (the collectives must match): the
    # smallest shard holds len // size samples.
    steps = args.steps_per_epoch or len(full.x_train) // hvd.size() // args.batch_size
    train = (tf.data.Dataset.from_tensor_slices((to_nhwc(data.x_train), data.y_train))
             .shuffle(len(data.y_train), seed=args.seed + hvd.rank())
             .batch(args.batch_size, drop_remainder=True).repeat())

    model = digits_cnn()
    optimizer = tf.keras.optimizers.SGD(learning_rate=args.lr * hvd.size(), momentum=0.9)
    model.compile(optimizer=distributed_optimizer(optimizer, model, args.strategy),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])

    epoch = tf.Variable(0, dtype=tf.int64, trainable=False)  # epochs done, checkpointed
    callbacks = [hvd.callbacks.MetricAverageCallback(),
                 EndOfEpoch(args, (to_nhwc(full.x_test), full.y_test), epoch)]
    # The file lives where rank 0 writes it: rank 0 says whether there is one.
    if args.checkpoint and hvd.broadcast(int(os.path.exists(args.checkpoint)), root_rank=0):
        # Each rank its own state (TopK's residuals, the mixing strategies' variables,
        # momenta and step counters); Keras' slots are restored when fit creates them.
        hvd.load_checkpoint(args.checkpoint, model=model, optimizer=model.optimizer,
                            epoch=epoch)
        if hvd.rank() == 0:
            print(f"resumed from {args.checkpoint} after epoch {int(epoch)}", flush=True)
    else:
        # A new run starts every rank from rank 0's variables (after the first step,
        # when the optimizer's exist too). Not on a resume: it would overwrite every
        # rank's own state with rank 0's.
        callbacks.insert(0, hvd.callbacks.BroadcastGlobalVariablesCallback(0))
    model.fit(train, epochs=args.epochs, initial_epoch=int(epoch), steps_per_epoch=steps,
              callbacks=callbacks, verbose=2 if hvd.rank() == 0 else 0)
    if hvd.rank() == 0:
        print(f"ranks {hvd.size()}  strategy {args.strategy}  final test accuracy "
              f"{accuracy(model, to_nhwc(full.x_test), full.y_test):.4f}", flush=True)

if __name__ == "__main__":
    # One thread per rank: the ranks share the host's cores. (Here, not in main: TF
    # refuses the setting once it has started, as in a test that calls main().)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    main()
