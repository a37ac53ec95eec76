"""Exact resume with hvdx.tensorflow.save_checkpoint / load_checkpoint, for every
strategy: stopping at step k, writing one checkpoint, and resuming in fresh objects
gives the weights of an uninterrupted run bit for bit (CPU, fixed seeds), each rank
its own although rank 0 alone writes and reads the file."""

import pickle

import numpy as np
import pytest
import tensorflow as tf
from mpi4py import MPI

import hvdx
import hvdx.tensorflow as hvd
import hvdx.tensorflow.keras as hvd_keras

# A checkpoint's round trip does not depend on the size of the job; the 4-rank step
# keeps its time for what does: DS-Sync's schedule and the graph's peer sequence after
# a resume are checked at 4 ranks in test_tf_dssync.py and test_tf_decentralized.py.
pytestmark = [pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 2,
                                 reason="checkpoint round trip: checked at 1 and 2 ranks"),
              pytest.mark.topk, pytest.mark.dssync, pytest.mark.decentralized]

STEPS, STOP = 6, 3
STRATEGIES = ["decentralized", "decentralized-cta", "dssync", "horovod", "topk"]


def options(strategy):
    return {
        "horovod": {},
        "topk": {"compression": hvd_keras.Compression.topk(0.2, 0.1, min_size=0)},
        "dssync": {"sync": hvdx.DSSync("shuffle", group_size=min(2, hvd.size()), seed=2,
                                       swa_start=1)},
        "decentralized": {"sync": hvdx.Decentralized("one-peer-exp", global_every=4)},
        "decentralized-cta": {"sync": hvdx.Decentralized(
            "ring", order="combine_then_adapt", average_optimizer_state=True)},
    }[strategy]


def build(strategy):
    tf.keras.utils.set_random_seed(1 + hvd.rank())  # other weights on every rank
    model = tf.keras.Sequential([tf.keras.layers.Dense(4),
                                 tf.keras.layers.BatchNormalization(),
                                 tf.keras.layers.Dense(1)])
    model.build((None, 3))
    extra = {"non_trainable_variables": model.non_trainable_variables} \
        if "sync" in options(strategy) else {}
    opt = hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.05, momentum=0.9),
                                         **options(strategy), **extra)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    return model, opt, step


def train(step, steps):
    for t in steps:
        rng = np.random.default_rng(1000 * t + hvd.rank())
        step(tf.constant(rng.normal(size=(8, 3)), tf.float32),
             tf.constant(rng.normal(size=(8, 1)), tf.float32))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_resuming_from_a_checkpoint_is_bitwise_an_uninterrupted_run(strategy, tmp_path):
    path = MPI.COMM_WORLD.bcast(str(tmp_path / "ckpt.hvdx"), root=0)
    straight, _, step = build(strategy)
    train(step, range(STEPS))

    first, opt, step = build(strategy)
    train(step, range(STOP))
    hvd.save_checkpoint(path, model=first, optimizer=opt)
    resumed, opt, step = build(strategy)
    hvd.load_checkpoint(path, model=resumed, optimizer=opt)
    train(step, range(STOP, STEPS))
    for a, b in zip(straight.get_weights(), resumed.get_weights()):
        np.testing.assert_array_equal(a, b, err_msg=strategy)


@pytest.mark.mpi(min_size=1)
def test_a_checkpoint_of_another_size_fails_on_every_rank(tmp_path):
    path = MPI.COMM_WORLD.bcast(str(tmp_path / "ckpt.hvdx"), root=0)
    model, opt, _ = build("horovod")
    with pytest.raises(ValueError, match="cannot read"):
        hvd.load_checkpoint(path + ".missing", model=model)
    if hvd.rank() == 0:
        with open(path, "wb") as f:
            pickle.dump({"format": "hvdx-tf-checkpoint-1", "size": 99, "ranks": []}, f)
    with pytest.raises(ValueError, match="holds 99 ranks' state"):
        hvd.load_checkpoint(path, model=model)
