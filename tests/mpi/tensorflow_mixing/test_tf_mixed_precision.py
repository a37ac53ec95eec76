"""Parameter mixing (DS-Sync, decentralized SGD) under Keras mixed precision.

A LossScaleOptimizer skips a step whose gradients are not finite on *this* rank. With
parameter mixing every rank has its own gradients, so an overflow on one rank would
skip its mix while its peers wait in theirs. hvdx's Keras optimizer makes the
gradients non-finite on every rank as soon as they are on one, so that every rank skips
the step, and halves its loss scale, together.
"""

import numpy as np
import pytest
import tensorflow as tf

import hvdx
import hvdx.tensorflow as hvd
import hvdx.tensorflow.keras as hvd_keras

# An overflow on one rank is skipped on every rank whatever the job's size past two ranks
# (tests/conftest.py).
pytestmark = [pytest.mark.up_to_two_ranks("a loss scale's skipped step under parameter mixing"),
              pytest.mark.dssync, pytest.mark.decentralized]

INITIAL_SCALE = 2.0 ** 15  # Keras' default initial loss scale


def syncs():
    # "horovod": no strategy, Horovod's own optimizer (its allreduce spreads the inf).
    return {"decentralized": hvdx.Decentralized("complete"),
            "dssync": hvdx.DSSync("shuffle", group_size=hvd.size(), seed=1),
            "horovod": None}


@pytest.fixture
def mixed_float16():
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    tf.keras.mixed_precision.set_global_policy("float32")


def gathered(value):
    return hvd.allgather_object(np.asarray(value))


def scaled(outside, sync):
    """SGD with a loss scale and hvdx's mixing, one wrapping the other."""
    scale = tf.keras.mixed_precision.LossScaleOptimizer
    if outside == "loss scale":
        return scale(hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), sync=sync))
    return hvd_keras.DistributedOptimizer(scale(tf.keras.optimizers.SGD(0.1)), sync=sync)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("strategy, outside", [
    ("decentralized", "loss scale"), ("decentralized", "hvdx"), ("dssync", "loss scale"),
    ("dssync", "hvdx"), ("horovod", "loss scale")])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
def test_an_overflow_on_one_rank_skips_the_step_on_every_rank(strategy, compiled, outside,
                                                              mixed_float16):
    x = tf.Variable(np.arange(4.0, dtype=np.float32) + hvd.rank())
    optimizer = scaled(outside, syncs()[strategy])
    blow_up = tf.Variable(1.0)

    def step():
        optimizer.minimize(lambda: blow_up * tf.reduce_sum(x ** 2), [x])

    step = tf.function(step) if compiled else step
    for t in range(3):
        before = x.numpy().copy()
        # Rank 1's loss overflows at step 1 (inf, then inf/NaN gradients).
        blow_up.assign(np.inf if (t == 1 and hvd.rank() == 1) else 1.0)
        step()
        skipped = np.array_equal(before, x.numpy())
        assert skipped == (t == 1)  # on every rank, the overflowing step only
    scales = gathered(optimizer.loss_scale.numpy())
    assert all(s == INITIAL_SCALE / 2 for s in scales)  # halved once, everywhere
    everyone = gathered(x.numpy())
    if strategy == "horovod":
        # Averaged gradients: every rank took the same steps from its own start.
        everyone = [e - r for r, e in enumerate(everyone)]
    # Mixed over all ranks (complete graph / one group): the same up to rounding.
    assert all(np.allclose(everyone[0], e, rtol=0, atol=1e-6) for e in everyone)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("strategy", ["decentralized", "dssync"])
def test_fit_under_mixed_float16_survives_an_overflow_on_one_rank(strategy, mixed_float16):
    """``compile`` wraps hvdx's optimizer in a LossScaleOptimizer itself."""
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2),
                                 tf.keras.layers.Dense(1, dtype="float32")])
    model.compile(optimizer=hvd_keras.DistributedOptimizer(
        tf.keras.optimizers.SGD(0.01), sync=syncs()[strategy]), loss="mse")
    assert isinstance(model.optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(32, 3)).astype(np.float32)
    if hvd.rank() == 1:
        x[8:16] = 1e9  # batch 1 overflows float16 on rank 1 only
    y = rng.normal(size=(32, 1)).astype(np.float32)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    scales = gathered(model.optimizer.loss_scale.numpy())
    # Lowered by rank 1's overflow (and any that float16 met on the way), the same
    # number of times on every rank.
    assert scales[0] < INITIAL_SCALE and all(s == scales[0] for s in scales)
    for w in model.get_weights():
        everyone = gathered(w)
        assert all(np.allclose(everyone[0], e, rtol=0, atol=1e-3) for e in everyone)
