"""A Horovod synthetic benchmark for TensorFlow 2, as Horovod ships it: a model, random
data, ``DistributedGradientTape`` in a ``tf.function``, a timed loop that prints
``Iter #N: X img/sec per CPU``.

Modeled on Horovod's ``examples/tensorflow2/tensorflow2_synthetic_benchmark.py`` (same
flags but the GPU ones, same output), with the small CNN of
``pytorch_synthetic_benchmark.py`` in place of Keras' ResNet-50 so that it runs on a few
CPU cores: two convolutions and a 2048 x 256 FC layer, 0.53 M parameters (2.1 MB of
gradients per step). It imports Horovod, not hvdx: it is the kind of script
``hvdx bench --script`` runs unchanged::

    hvdx bench --script examples/tensorflow2_synthetic_benchmark.py \\
        --strategies horovod,fast,dssync,decentralized
    mpirun -n 4 python examples/tensorflow2_synthetic_benchmark.py   # plain Horovod
"""

import argparse
import timeit

import numpy as np
import tensorflow as tf

import horovod.tensorflow as hvd

parser = argparse.ArgumentParser(description="TensorFlow Synthetic Benchmark",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="use fp16 compression during allreduce")
parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
parser.add_argument("--num-warmup-batches", type=int, default=10,
                    help="number of warm-up batches that don't count towards benchmark")
parser.add_argument("--num-batches-per-iter", type=int, default=10,
                    help="number of batches per benchmark iteration")
parser.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
args = parser.parse_args()

# Horovod: initialize Horovod.
hvd.init()
tf.random.set_seed(42)

# 32 x 32 RGB images, 10 classes.
model = tf.keras.Sequential([
    tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu",
                           input_shape=(32, 32, 3)),
    tf.keras.layers.MaxPooling2D(),
    tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
    tf.keras.layers.MaxPooling2D(),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(256, activation="relu"),
    tf.keras.layers.Dense(10),
])
opt = tf.optimizers.SGD(0.01)

data = tf.random.uniform([args.batch_size, 32, 32, 3])
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=10, dtype=tf.int64)


@tf.function
def benchmark_step(first_batch):
    # Horovod: (optional) compression algorithm.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    # Horovod: use DistributedGradientTape
    with tf.GradientTape() as tape:
        logits = model(data, training=True)
        loss = tf.losses.sparse_categorical_crossentropy(target, logits, from_logits=True)

    # Horovod: add Horovod Distributed GradientTape.
    tape = hvd.DistributedGradientTape(tape, compression=compression)

    gradients = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(gradients, model.trainable_variables))

    # Horovod: broadcast initial variable states from rank 0 to all other processes,
    # after the first gradient step, so that the optimizer's state exists.
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables() if callable(opt.variables) else opt.variables,
                                root_rank=0)


def log(s, nl=True):
    if hvd.rank() != 0:
        return
    print(s, end="\n" if nl else "", flush=True)


log("Model: SmallCNN (%d parameters)" % model.count_params())
log("Batch size: %d" % args.batch_size)
device = "CPU"
log("Number of %ss: %d" % (device, hvd.size()))

with tf.device(device):
    # Warm-up
    log("Running warmup...")
    benchmark_step(first_batch=True)
    timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_warmup_batches)

    # Benchmark
    log("Running benchmark...")
    img_secs = []
    for x in range(args.num_iters):
        time = timeit.timeit(lambda: benchmark_step(first_batch=False),
                             number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / time
        log("Iter #%d: %.1f img/sec per %s" % (x, img_sec, device))
        img_secs.append(img_sec)

    # Results
    img_sec_mean = np.mean(img_secs)
    img_sec_conf = 1.96 * np.std(img_secs)
    log("Img/sec per %s: %.1f +-%.1f" % (device, img_sec_mean, img_sec_conf))
    log("Total img/sec on %d %s(s): %.1f +-%.1f" %
        (hvd.size(), device, hvd.size() * img_sec_mean, hvd.size() * img_sec_conf))
