"""Decentralized SGD for TensorFlow: the Keras optimizer (both orders) and the tape
(combine-then-adapt), eagerly, inside tf.function and in Keras fit.

Expectations come from explicit mixing matrices (tests/unit/explicit_graphs.py, loops
and permutation matrices, never hvdx.core.mixing_graphs) applied in numpy, and from
Horovod's own Keras optimizer. The dynamic graphs are indexed by the mix, the number of
mixes before this one, counted step by step in the test. Most tests train one float64
variable on a per-rank quadratic f_r(x) = 0.5 |x - c_r|^2, whose gradient numpy knows
exactly.
"""

import pathlib
import sys

import horovod.tensorflow.keras
import numpy as np
import pytest
import tensorflow as tf
from mpi4py import MPI

import hvdx
import hvdx.tensorflow as hvd
import hvdx.tensorflow.keras as hvd_keras

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "unit"))
from explicit_graphs import explicit, mixes_before, tau  # noqa: E402
import quadratic_steps  # noqa: E402

pytestmark = [pytest.mark.topk, pytest.mark.dssync, pytest.mark.decentralized]

LR = 0.25  # exact in float32, so Keras' learning-rate variable holds it exactly
ATC, CTA = "adapt_then_combine", "combine_then_adapt"
SMALL_WORLD = MPI.COMM_WORLD.Get_size() <= 2
# (entry, order): the tape mixes before the update only.
ENTRIES = [("keras-function", ATC), ("keras-function", CTA), ("tape-function", CTA)] + \
    ([("keras-eager", ATC), ("tape-eager", CTA)] if SMALL_WORLD else [])


def quadratic(n, d=4):
    """Per-rank centres and starting points."""
    centres = np.stack([np.random.default_rng(60 + r).normal(size=d) for r in range(n)])
    initial = np.stack([np.random.default_rng(600 + r).normal(size=d) for r in range(n)])
    return centres, initial


def trainer(entry, sync, x, centre, lr=LR):
    """A step function for one variable ``x``, and the object holding the state."""
    step, optimizer = quadratic_steps.trainer(entry, sync, x, centre, lr)
    if optimizer is not None:
        return step, lambda: optimizer.hvdx_decentralized
    return step, lambda: hvd.decentralized_state(sync)


def everyone(values):
    """Every rank's array, rank by rank."""
    return np.stack(MPI.COMM_WORLD.allgather(np.asarray(values)))


def power_of_two(n):
    return n & (n - 1) == 0


def expected_run(graph, order, steps, lr=LR, mix_every=1, global_every=0, first=0):
    """The explicit-matrix recursion of every rank (n x d)."""
    n = hvd.size()
    centres, x = quadratic(n)
    for t in range(first, first + steps):
        local = x - lr * (x - centres)
        if global_every and (t + 1) % global_every == 0:
            w = np.full((n, n), 1.0 / n)
        elif (t + 1) % mix_every == 0:
            w = explicit(graph, n, mixes_before(t, mix_every))
        else:
            w = np.eye(n)
        x = w @ local if order == ATC else w @ x - lr * (x - centres)
    return x


# --- against explicit matrices --------------------------------------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("graph", ["one-peer-exp", "static-exp"])
@pytest.mark.parametrize("entry,order", ENTRIES)
def test_steps_match_explicit_mixing_matrices(entry, order, graph):
    n, rank = hvd.size(), hvd.rank()
    centres, initial = quadratic(n)
    x = tf.Variable(initial[rank])
    sync = hvdx.Decentralized(graph, order=order)
    step, state = trainer(entry, sync, x, centres[rank])
    for _ in range(5):
        step()
    np.testing.assert_allclose(everyone(x.numpy()), expected_run(graph, order, 5),
                               rtol=0, atol=1e-12)
    assert int(state().step.numpy()) == 5


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("mix_every", [2, 3, 4])
@pytest.mark.parametrize("entry,order", [("keras-function", ATC), ("tape-function", CTA)])
def test_pure_mixing_every_j_steps_matches_the_product_of_one_peer_mixes(entry, order,
                                                                        mix_every):
    # lr = 0: only the mixes move x. Mix m averages rank i with i - 2^(m mod log2 n),
    # written out here; log2 n mixes average exactly for a power-of-two n. Indexed by
    # the step instead, 4 ranks mixing every other step would only pair 0 with 2.
    n, rank = hvd.size(), hvd.rank()
    _, initial = quadratic(n)
    x = tf.Variable(initial[rank])
    sync = hvdx.Decentralized("one-peer-exp", order=order, mix_every=mix_every)
    step, _ = trainer(entry, sync, x, np.zeros(4), lr=0.0)
    mixes = max(tau(n), 1)
    for _ in range(mixes * mix_every):
        step()
    product = np.eye(n)
    for m in range(mixes if n > 1 else 0):
        w = 0.5 * np.eye(n)
        w[np.arange(n), (np.arange(n) - 2 ** (m % tau(n))) % n] += 0.5
        product = w @ product
    after = everyone(x.numpy())
    np.testing.assert_allclose(after, product @ initial, rtol=0, atol=1e-12)
    if power_of_two(n):
        assert np.abs(after - initial.mean(axis=0)).max() <= 1e-12


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("order", [ATC, CTA])
def test_mix_every_and_global_every_match_explicit_matrices(order):
    n, rank = hvd.size(), hvd.rank()
    centres, initial = quadratic(n)
    x = tf.Variable(initial[rank])
    sync = hvdx.Decentralized("one-peer-exp", order=order, mix_every=2, global_every=5)
    step, state = trainer("keras-function", sync, x, centres[rank])
    for _ in range(6):
        step()
    expected = expected_run("one-peer-exp", order, 6, mix_every=2, global_every=5)
    np.testing.assert_allclose(everyone(x.numpy()), expected, rtol=0, atol=1e-12)
    assert state().hvdx_stats.global_steps == 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("first, mix_every", [(0, 1), (1, 1), (1, 2), (3, 3)])
def test_one_peer_reaches_exact_consensus_after_log2_n_mixes_from_any_step(first,
                                                                           mix_every):
    # Any log2 n * mix_every consecutive steps hold log2 n consecutive mixes.
    n, rank = hvd.size(), hvd.rank()
    if not power_of_two(n):
        pytest.skip("exact averaging is promised for a power-of-two number of ranks")
    _, initial = quadratic(n)
    x = tf.Variable(initial[rank])
    sync = hvdx.Decentralized("one-peer-exp", order=CTA, mix_every=mix_every)
    step, state = trainer("tape-function", sync, x, np.zeros(4), lr=0.0)
    state().step.assign(first)
    for _ in range(max(tau(n), 1) * mix_every):
        step()
    after = everyone(x.numpy())
    assert np.abs(after - initial.mean(axis=0)).max() <= 1e-12
    np.testing.assert_allclose(after.mean(axis=0), initial.mean(axis=0), rtol=0, atol=1e-13)
    assert state().consensus_distance() <= 1e-12


# --- against Horovod ------------------------------------------------------------------

def regression_model(seed):
    tf.keras.utils.set_random_seed(seed)
    model = tf.keras.Sequential([tf.keras.layers.Dense(3, activation="tanh"),
                                 tf.keras.layers.Dense(1)])
    model.build((None, 5))
    return model


def regression_data(rank):
    rng = np.random.default_rng(70 + rank)
    return rng.normal(size=(16, 5)).astype(np.float32), \
        rng.normal(size=(16, 1)).astype(np.float32)


@pytest.mark.mpi(min_size=1)
def test_complete_graph_from_identical_weights_is_horovods_synchronous_sgd():
    # Adapt-then-combine over the complete graph: mean_i(x - lr g_i) = x - lr mean_i g_i.
    data = regression_data(hvd.rank())
    models = []
    for optimizer in (
            hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1),
                                           sync=hvdx.Decentralized("complete")),
            horovod.tensorflow.keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1))):
        model = regression_model(seed=1)  # the same weights on every rank
        model.compile(optimizer=optimizer, loss="mse")
        model.fit(*data, batch_size=8, epochs=2, shuffle=False, verbose=0)
        models.append(model)
    for ours, theirs in zip(*(m.get_weights() for m in models)):
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)


# --- buffers, diagnostics, checkpoints ----------------------------------------------------

def batchnorm_model():
    tf.keras.utils.set_random_seed(hvd.rank())  # different weights on every rank
    model = tf.keras.Sequential([tf.keras.layers.Dense(4),
                                 tf.keras.layers.BatchNormalization(),
                                 tf.keras.layers.Dense(1)])
    model.build((None, 5))
    return model


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("strategy", ["decentralized", "dssync"])
def test_synchronize_parameters_makes_weights_and_moving_statistics_identical(strategy):
    sync = hvdx.Decentralized("one-peer-exp") if strategy == "decentralized" else \
        hvdx.DSSync("shuffle", group_size=min(2, hvd.size()), seed=5)
    model = batchnorm_model()
    opt = hvd_keras.DistributedOptimizer(
        tf.keras.optimizers.SGD(0.05), sync=sync,
        non_trainable_variables=model.non_trainable_variables)
    model.compile(optimizer=opt, loss="mse")
    model.fit(*regression_data(hvd.rank()), batch_size=8, epochs=2, shuffle=False,
              verbose=0)
    opt.synchronize_parameters()
    weights = model.get_weights()  # trainable and moving statistics
    assert len(weights) == len(model.trainable_variables) + 2
    for mine, gathered in zip(weights, (everyone(w) for w in weights)):
        np.testing.assert_array_equal(gathered, np.broadcast_to(mine, gathered.shape))


@pytest.mark.mpi(min_size=1)
def test_consensus_distance_matches_numpy():
    n, rank = hvd.size(), hvd.rank()
    centres, initial = quadratic(n)
    x = tf.Variable(initial[rank])
    sync = hvdx.Decentralized("ring", order=CTA)
    step, state = trainer("tape-eager", sync, x, centres[rank])
    step()
    values = everyone(x.numpy())
    expected = np.sqrt(((values - values.mean(axis=0)) ** 2).sum(axis=1).mean())
    assert state().consensus_distance() == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.mpi(min_size=1)
def test_one_peer_sends_one_model_per_step_in_one_message():
    n, rank = hvd.size(), hvd.rank()
    centres, initial = quadratic(n)
    x = tf.Variable(initial[rank])
    step, state = trainer("keras-function", hvdx.Decentralized("one-peer-exp"), x,
                          centres[rank])
    step()
    stats = state().hvdx_stats
    assert stats.last_bytes == (8 * 4 if n > 1 else 0)  # 4 float64
    assert stats.last_messages == (1 if n > 1 else 0)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("entry,order,mix_every", [("tape-function", CTA, 1),
                                                   ("keras-function", ATC, 1),
                                                   ("tape-function", CTA, 2)])
def test_resumed_run_continues_the_same_peer_sequence_bitwise(entry, order, mix_every,
                                                              tmp_path):
    # Saved after step 3: with mix_every = 2 the run has mixed once, and the resumed one
    # takes the next mixes from the saved step alone.
    n, rank = hvd.size(), hvd.rank()
    centres, initial = quadratic(n)
    path = MPI.COMM_WORLD.bcast(str(tmp_path), root=0) + f"/rank{rank}"

    def run(steps, restore=None, save=None):
        x = tf.Variable(initial[rank])
        sync = hvdx.Decentralized("one-peer-exp", order=order, swa_start=1,
                                  mix_every=mix_every)
        step, state = trainer(entry, sync, x, centres[rank])
        if restore:  # the state exists once its owner does: the tape's on request
            tf.train.Checkpoint(x=x, hvdx=state()).read(restore)
        for _ in range(steps):
            step()
        if save:
            tf.train.Checkpoint(x=x, hvdx=state()).write(save)
        return x.numpy(), state()

    straight, _ = run(6)
    run(3, save=path)
    resumed, state = run(3, restore=path)
    np.testing.assert_array_equal(resumed, straight)
    assert int(state.step.numpy()) == 6 and int(state.swa_count.numpy()) == 5


# --- bad input: a clear error on every rank ---------------------------------------------

@pytest.mark.up_to_two_ranks('a refusal')
@pytest.mark.mpi(min_size=1)
def test_adapt_then_combine_on_the_tape_is_refused_naming_the_order():
    sync = hvdx.Decentralized("one-peer-exp")
    with pytest.raises(ValueError, match="order='adapt_then_combine'.*combine_then_adapt"):
        hvd.DistributedGradientTape(tf.GradientTape(), sync=sync)


@pytest.mark.up_to_two_ranks('a refusal')
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("entry", ["tape", "keras"])
def test_decentralized_with_topk_compression_fails_naming_compression(entry):
    sync = hvdx.Decentralized("ring", order=CTA)
    topk = hvd.Compression.topk(0.1, 0.1)
    with pytest.raises(ValueError, match="compression"):
        if entry == "tape":
            hvd.DistributedGradientTape(tf.GradientTape(), compression=topk, sync=sync)
        else:
            hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=topk,
                                           sync=sync)


@pytest.mark.mpi(min_size=1)
def test_a_matrix_of_another_size_fails_on_every_rank_naming_graph():
    n = hvd.size()
    sync = hvdx.Decentralized(np.full((n + 1, n + 1), 1.0 / (n + 1)))
    with pytest.raises(ValueError, match="graph"):
        hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), sync=sync)


@pytest.mark.mpi(min_size=2)
def test_one_rank_with_another_graph_fails_on_every_rank():
    graph = "ring" if hvd.rank() == 1 else "one-peer-exp"
    with pytest.raises(ValueError, match="decentralized.topology"):
        hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1),
                                       sync=hvdx.Decentralized(graph))
