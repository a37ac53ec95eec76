"""Train a small CNN on the digits data set with Horovod, TensorFlow and a gradient tape,
through hvdx.

A plain Horovod TF2 script (a custom training loop). With ``--strategy none`` the only
hvdx change is the import line:

    import hvdx.tensorflow as hvd     # was: import horovod.tensorflow as hvd

Each other strategy switches on one hvdx feature (README.md), and checkpoints its state:

    topk           DistributedGradientTape(..., compression=hvd.Compression.topk(preset="safe"))
                   state: hvd.topk_state(model.trainable_variables), TopK's residuals
    dssync         hvd.init(process_sets="dynamic"); DistributedGradientTape(..., sync=sync)
                   with sync = hvdx.DSSync(); state: hvd.dssync_state(sync)
    decentralized  sync = hvdx.Decentralized("one-peer-exp", order="combine_then_adapt")
                   (a tape mixes before the update); state: hvd.decentralized_state(sync)
    stanza         hvd.Stanza(model, split=..., optimizer=...): a trainer instead of a tape
                   (at least 2 ranks: the last one trains the head); state: trainer.state()

Run:  mpirun -n 4 python examples/tf_tape_digits.py --strategy decentralized
 or:  horovodrun -np 4 python examples/tf_tape_digits.py --checkpoint digits.hvdx
 and  HOROVOD_CYCLE_TIME=50 mpirun -n 4 python examples/tf_tape_digits.py --strategy topk
      (as TopK's presets advise: see examples/torch_digits.py)
Across hosts: examples/multi_host.sh.
"""

import argparse
import os
import time

import numpy as np
import tensorflow as tf

import hvdx
import hvdx.tensorflow as hvd  # the one-line change; was: import horovod.tensorflow as hvd
from hvdx.datasets import digits  # scikit-learn's 8x8 digits: no download

STRATEGIES = ("none", "topk", "dssync", "decentralized", "stanza")
FEATURES = 4  # the first 4 layers of the model are the features (Stanza's split)


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


def tape_options(strategy):
    """The hvdx arguments of DistributedGradientTape for ``strategy``."""
    if strategy == "topk":  # 1% up, 2% down: steadier late in a run than preset="fast"
        return {"compression": hvd.Compression.topk(preset="safe")}
    if strategy == "dssync":
        return {"sync": hvdx.DSSync()}
    if strategy == "decentralized":
        return {"sync": hvdx.Decentralized(graph="one-peer-exp", order="combine_then_adapt")}
    return {}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=STRATEGIES, default="none")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--steps-per-epoch", type=int, default=None,
                        help="default: one pass over the training data")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.025,
                        help="for one rank; scaled by the ranks that read data")
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
    rank, size = hvd.rank(), hvd.size()

    model = digits_cnn()
    optimizer = tf.keras.optimizers.SGD(learning_rate=args.lr * size, momentum=0.9)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    options = tape_options(args.strategy)
    sync = options.get("sync")  # one object for the whole run: it holds the state
    epoch = tf.Variable(0, dtype=tf.int64, trainable=False)  # epochs done
    if args.strategy == "stanza":
        # Conv ranks train the features, the last rank the head; only conv ranks read
        # data, and one step trains on their global batch. Stanza starts every rank
        # from rank 0's model itself.
        trainer = hvd.Stanza(model, split=FEATURES, optimizer=optimizer, fc_workers=1)
        readers = list(trainer.roles.conv_ranks)
        optimizer.learning_rate = args.lr * len(readers)
        state = {"stanza": trainer.state()}  # what the checkpoint holds
    else:
        readers = list(range(size))
        state = {"model": model, "optimizer": optimizer}
        if args.strategy == "topk":
            state["topk"] = hvd.topk_state(model.trainable_variables)
        elif args.strategy == "dssync":
            state["dssync"] = hvd.dssync_state(sync)
        elif args.strategy == "decentralized":
            state["decentralized"] = hvd.decentralized_state(sync)

    # The file lives where rank 0 writes it: rank 0 says whether there is one.
    if args.checkpoint and hvd.broadcast_object(os.path.exists(args.checkpoint), root_rank=0):
        # Each rank its own state; the optimizer's slots are restored when created.
        hvd.load_checkpoint(args.checkpoint, epoch=epoch, **state)
        if rank == 0:
            print(f"resumed from {args.checkpoint} after epoch {int(epoch)}", flush=True)
    elif args.strategy != "stanza":
        hvd.broadcast_variables(model.variables, root_rank=0)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape, **options)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    full = digits()
    reads = rank in readers
    data = full.shard(readers.index(rank) if reads else 0, len(readers))
    to_nhwc = lambda x: np.transpose(x, (0, 2, 3, 1))  # noqa: E731
    x_train, y_train = to_nhwc(data.x_train), data.y_train
    x_test, y_test = to_nhwc(full.x_test), full.y_test
    # Every rank takes the same number of steps (the collectives must match): the
    # smallest shard holds len // readers samples.
    steps = args.steps_per_epoch or len(full.x_train) // len(readers) // args.batch_size

    def evaluate(synchronize=True):
        """Test accuracy on rank 0 (None elsewhere); collective."""
        if args.strategy == "stanza":
            whole = trainer.full_model(rank=0)  # features and head together, on rank 0
        else:
            if sync is not None and synchronize:  # each rank trains its own: average them
                state[args.strategy].synchronize_parameters()
            whole = model if rank == 0 else None
        if whole is None:
            return None
        return float(np.mean(np.argmax(whole(x_test, training=False), axis=1) == y_test))

    start, step_times = int(epoch), []
    for e in range(start, args.epochs):
        order = np.random.default_rng([args.seed, rank, e]).permutation(len(x_train))
        for step in range(steps):
            i = step % (len(x_train) // args.batch_size)
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            begin = time.perf_counter()
            if args.strategy == "stanza":
                loss = trainer.step(x_train[idx], y_train[idx]) if reads else trainer.step()
            else:
                loss = float(train_step(tf.constant(x_train[idx]), tf.constant(y_train[idx])))
            step_times.append(time.perf_counter() - begin)
        accuracy = evaluate()
        epoch.assign(e + 1)
        if args.checkpoint:  # every rank: each rank's state, in one file on rank 0
            hvd.save_checkpoint(args.checkpoint, epoch=epoch, **state)
        if rank == 0:
            print(f"epoch {e + 1}/{args.epochs}  loss {loss:.4f}  "
                  f"test accuracy {accuracy:.4f}", flush=True)
    if start >= args.epochs:  # resumed after the last epoch: nothing left to train
        accuracy = evaluate(synchronize=False)  # (saved after averaging)
    if rank == 0:
        step_ms = f"{1000 * np.median(step_times):.2f} ms" if step_times else "-"
        print(f"ranks {size}  strategy {args.strategy}  final test accuracy "
              f"{accuracy:.4f}  median time per step {step_ms}", flush=True)


if __name__ == "__main__":
    # One thread per rank: the ranks share the host's cores. (Here, not in main: TF
    # refuses the setting once it has started, as in a test that calls main().)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    main()
