"""Horovod's Keras optimizer API under DS-Sync and decentralized SGD.

Horovod's tests, subclasses and callbacks call ``_compute_gradients``,
``register_local_var`` and ``_agg_helper`` and pass ``backward_passes_per_step``;
hvdx's mixing optimizers keep them, with parameter mixing's meaning:
``backward_passes_per_step=N`` sums N passes' gradients locally, then takes one local
step and one mix; ``register_local_var(v)`` keeps ``v`` (and its momentum) out of the
mix, its gradient scaled by 1/size as Horovod scales it. Wrong values fail on every rank.

Every strategy here averages over all ranks at each mix (DS-Sync with one group of all
ranks, the complete graph), so the expected values are numpy means, computed here.
"""

import numpy as np
import pytest
import tensorflow as tf
from mpi4py import MPI

import hvdx
import hvdx.tensorflow as hvd
import hvdx.tensorflow.keras as hvd_keras

LR = 0.25  # exact in float32, so Keras' learning-rate variable holds it exactly
CTA = "decentralized-cta"  # the complete graph, combine-then-adapt
SMALL_WORLD = MPI.COMM_WORLD.Get_size() <= 2

# Passes per step, local variables and their refusals do not depend on the job's size past
# two ranks (tests/conftest.py).
pytestmark = [pytest.mark.up_to_two_ranks("Horovod's Keras arguments under parameter mixing"),
              pytest.mark.dssync, pytest.mark.decentralized]


def averaging_all(kind, **options):
    """A strategy that averages over all ranks at every mix."""
    if kind == "dssync":
        return hvdx.DSSync("shuffle", group_size=hvd.size(), **options)
    order = "combine_then_adapt" if kind == CTA else "adapt_then_combine"
    return hvdx.Decentralized("complete", order=order, **options)


def state_of(optimizer):
    return getattr(optimizer, "hvdx_dssync", None) or optimizer.hvdx_decentralized


def quadratic(n, d=4):
    """Per-rank centres and starting points; rank r minimises 0.5 * |x - c_r|^2."""
    centres = np.stack([np.random.default_rng(r).normal(size=d) for r in range(n)])
    initial = np.stack([np.random.default_rng(100 + r).normal(size=d) for r in range(n)])
    return centres, initial


def mean_everywhere(values):
    return np.broadcast_to(values.mean(axis=0), values.shape).copy()


def expected_quadratic(initial, centres, steps, scale, kind):
    """numpy: ``steps`` applied steps of plain SGD on every rank's quadratic with the
    gradient times ``scale`` (N passes summed: N; averaged: 1), each followed (or, for
    combine-then-adapt, preceded) by the mean over ranks."""
    x = initial.copy()
    for _ in range(steps):
        g = scale * (x - centres)  # taken before the mix in both orders
        x = mean_everywhere(x) - LR * g if kind == CTA else mean_everywhere(x - LR * g)
    return x


def nobody_waits(name):
    total = hvd.allreduce(tf.ones(2), op=hvd.Sum, name=f"after.{name}")
    return total.numpy().tolist() == [float(hvd.size())] * 2


def the_same_everywhere(message):
    return len(set(hvd.allgather_object(message))) == 1


# --- backward_passes_per_step ---------------------------------------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind, average, compiled, legacy", [
    ("dssync", False, True, False), ("decentralized", True, True, False),
    (CTA, False, True, False), ("dssync", True, True, True)] + (
    [("dssync", False, False, False), (CTA, True, False, True)] if SMALL_WORLD else []))
def test_backward_passes_per_step_steps_and_mixes_once_every_n_passes(
        kind, average, compiled, legacy):
    """Horovod's own route (``_compute_gradients`` then ``apply_gradients``, as in
    Horovod's test_gradient_aggregation): three passes at the same point, then one local
    step with their sum (or mean) and one mix; ``iterations`` counts every pass and the
    helper's counter the passes since the last step, as under Horovod."""
    n, rank, passes = hvd.size(), hvd.rank(), 3
    centres, initial = quadratic(n)
    x, centre = tf.Variable(initial[rank]), tf.constant(centres[rank])
    sgd = tf.keras.optimizers.legacy.SGD(LR) if legacy else tf.keras.optimizers.SGD(LR)
    optimizer = hvd_keras.DistributedOptimizer(
        sgd, sync=averaging_all(kind), backward_passes_per_step=passes,
        average_aggregated_gradients=average)

    def one_pass():
        pairs = optimizer._compute_gradients(
            lambda: 0.5 * tf.reduce_sum((x - centre) ** 2), var_list=[x])
        optimizer.apply_gradients(pairs)

    step = tf.function(one_pass) if compiled else one_pass
    for p in range(1, 8):  # two applied steps, and one pass of the third
        step()
        expected = expected_quadratic(initial, centres, p // passes,
                                      1 if average else passes, kind)
        np.testing.assert_allclose(x.numpy(), expected[rank], rtol=0, atol=1e-12)
        assert int(optimizer.iterations.numpy()) == p
        assert int(state_of(optimizer).step.numpy()) == p // passes
    assert int(optimizer._agg_helper.counter.numpy()) == 7 % passes


def regression(rank, d=4, batch=8):
    """Data exact in float32: Keras' data adapter casts float64 arrays to floatx."""
    rng = np.random.default_rng(50 + rank)
    x, y = rng.normal(size=(batch, d)), rng.normal(size=(batch, 1))
    return x.astype(np.float32).astype(np.float64), y.astype(np.float32).astype(np.float64)


@pytest.mark.mpi(min_size=1)
def test_keras_fit_with_two_passes_per_step_mixes_every_second_batch():
    n, rank = hvd.size(), hvd.rank()
    _, initial = quadratic(n)
    data = [regression(r) for r in range(n)]
    model = tf.keras.Sequential([tf.keras.layers.Dense(
        1, use_bias=False, dtype="float64",
        kernel_initializer=tf.keras.initializers.Constant(initial[rank].reshape(4, 1)))])
    model.build((None, 4))
    optimizer = hvd_keras.DistributedOptimizer(
        tf.keras.optimizers.SGD(0.125), sync=averaging_all("dssync"),
        backward_passes_per_step=2)
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(*data[rank], batch_size=4, epochs=2, shuffle=False, verbose=0)

    # numpy: per rank, the gradients of mean((X w - y)^2) on batches 0 and 1, both at
    # the same w, summed; one SGD step; the mean over ranks; twice (two epochs).
    w = initial.copy()
    for _ in range(2):
        grads = np.stack([sum(2 / 4 * X[b:b + 4].T @ (X[b:b + 4] @ wr - y[b:b + 4, 0])
                              for b in (0, 4)) for (X, y), wr in zip(data, w)])
        w = mean_everywhere(w - 0.125 * grads)
    np.testing.assert_allclose(model.get_weights()[0][:, 0], w[rank], rtol=0, atol=1e-12)
    assert int(optimizer.iterations.numpy()) == 4
    assert int(optimizer.hvdx_dssync.step.numpy()) == 2


# --- register_local_var ---------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind, scale", [("dssync", True), ("decentralized", False),
                                         (CTA, True)])
def test_a_local_variable_and_its_momentum_stay_out_of_the_mix(kind, scale):
    """``w`` and the local ``v`` have the same shape, so only the variable a slot
    belongs to tells their momenta apart; ``average_optimizer_state`` mixes ``w``'s.
    ``v``'s gradient is divided by the number of ranks (``scale_local_gradients``, as
    under Horovod); ``synchronize_parameters`` leaves ``v`` as it is."""
    n, rank, mu = hvd.size(), hvd.rank(), 0.5
    centres, initial = quadratic(n)
    w, v = tf.Variable(initial[rank]), tf.Variable(initial[rank] + 1.0)
    optimizer = hvd_keras.DistributedOptimizer(
        tf.keras.optimizers.SGD(LR, momentum=mu),
        sync=averaging_all(kind, average_optimizer_state=True),
        scale_local_gradients=scale)
    optimizer.register_local_var(v)
    c = tf.constant(centres[rank])

    @tf.function
    def step():
        optimizer.minimize(lambda: 0.5 * tf.reduce_sum((w - c) ** 2)
                           + 0.5 * tf.reduce_sum((v - 2 * c) ** 2), [w, v])

    # numpy: Keras' SGD with momentum (m <- mu m - lr g; x <- x + m) on every rank; w
    # and its momentum are averaged over ranks after (combine-then-adapt: before) the
    # step, v and its momentum never.
    W, V = initial.copy(), initial + 1.0
    MW, MV = np.zeros_like(W), np.zeros_like(V)
    for _ in range(3):
        step()
        gw, gv = W - centres, (V - 2 * centres) / (n if scale else 1)
        if kind == CTA:
            W, MW = mean_everywhere(W), mean_everywhere(MW)
        MW, MV = mu * MW - LR * gw, mu * MV - LR * gv
        W, V = W + MW, V + MV
        if kind != CTA:
            W, MW = mean_everywhere(W), mean_everywhere(MW)
    np.testing.assert_allclose(w.numpy(), W[rank], rtol=0, atol=1e-12)
    np.testing.assert_allclose(v.numpy(), V[rank], rtol=0, atol=1e-12)
    optimizer.synchronize_parameters()
    np.testing.assert_allclose(v.numpy(), V[rank], rtol=0, atol=1e-12)



@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind, scale", [("dssync", True), (CTA, False)])
def test_a_local_source_of_the_tape_stays_out_of_the_mix(kind, scale):
    """Horovod's tape API ``register_local_source(v)``, on a new tape each step: ``v``
    is never mixed and its gradient is divided by the number of ranks
    (``scale_local_gradients``); ``w`` is mixed when the gradients are taken."""
    n, rank = hvd.size(), hvd.rank()
    centres, initial = quadratic(n)
    w, v = tf.Variable(initial[rank]), tf.Variable(initial[rank] + 1.0)
    sync = averaging_all(kind)
    optimizer = tf.keras.optimizers.SGD(LR)
    c = tf.constant(centres[rank])
    # numpy: the tape mixes before the step (the gradients are taken at x_t); v never.
    W, V = initial.copy(), initial + 1.0
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = 0.5 * tf.reduce_sum((w - c) ** 2) + 0.5 * tf.reduce_sum((v - 2 * c) ** 2)
        tape = hvd.DistributedGradientTape(tape, sync=sync, scale_local_gradients=scale)
        tape.register_local_source(v)
        grads = tape.gradient(loss, [w, v])
        optimizer.apply_gradients(zip(grads, [w, v]))
        gw, gv = W - centres, (V - 2 * centres) / (n if scale else 1)
        W, V = mean_everywhere(W) - LR * gw, V - LR * gv
    np.testing.assert_allclose(w.numpy(), W[rank], rtol=0, atol=1e-12)
    np.testing.assert_allclose(v.numpy(), V[rank], rtol=0, atol=1e-12)


def minimize_once(optimizer, variables):
    optimizer.minimize(lambda: tf.add_n([0.5 * tf.reduce_sum(u ** 2) for u in variables]),
                       variables)


@pytest.mark.mpi(min_size=1)
def test_registering_a_local_variable_after_the_first_step_is_refused():
    a, b = tf.Variable(tf.ones(4)), tf.Variable(tf.ones(4))
    optimizer = hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(LR),
                                               sync=averaging_all("decentralized"))
    minimize_once(optimizer, [a, b])
    with pytest.raises(ValueError, match="register_local_var.*before the first step"):
        optimizer.register_local_var(b)
    assert nobody_waits("register.late")


@pytest.mark.mpi(min_size=2)
def test_ranks_that_register_different_local_variables_fail_on_every_rank():
    """Same shapes, so only the registered positions, checked across ranks at the first
    step, tell the ranks apart: mixing would otherwise average ``a`` with ``b``."""
    a, b = tf.Variable(tf.ones(4)), tf.Variable(tf.ones(4))
    optimizer = hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(LR),
                                               sync=averaging_all("dssync"))
    optimizer.register_local_var(a if hvd.rank() == 1 else b)
    with pytest.raises(ValueError, match="register_local_var") as info:
        minimize_once(optimizer, [a, b])
    assert "rank 1" in str(info.value) and the_same_everywhere(str(info.value))
    np.testing.assert_array_equal(a.numpy(), np.ones(4))  # nothing was applied
    assert nobody_waits("register.differs")


# --- wrong aggregation arguments: the same error on every rank ------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", ["dssync", "decentralized"])
def test_backward_passes_per_step_below_one_is_refused_on_every_rank(kind):
    with pytest.raises(ValueError, match=r"backward_passes_per_step=0 must be a whole "
                                         r"number >= 1 with hvdx\.(DSSync|Decentralized)"):
        hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(LR), sync=averaging_all(kind),
                                       backward_passes_per_step=0)
    assert nobody_waits(f"passes.zero.{kind}")


@pytest.mark.mpi(min_size=2)
def test_a_different_backward_passes_per_step_on_one_rank_fails_on_every_rank():
    """Ranks that sum different numbers of passes would mix at different steps."""
    with pytest.raises(ValueError, match="backward_passes_per_step") as info:
        hvd_keras.DistributedOptimizer(
            tf.keras.optimizers.SGD(LR), sync=averaging_all("dssync"),
            backward_passes_per_step=3 if hvd.rank() == 1 else 2)
    assert "rank 1" in str(info.value) and the_same_everywhere(str(info.value))
    assert nobody_waits("passes.differ")


# --- the legacy optimizers keep the state in their checkpoints ------------------------

@pytest.mark.mpi(min_size=1)
def test_a_legacy_optimizer_saves_the_mixing_state(tmp_path):
    x = tf.Variable(tf.ones(4, tf.float64))

    def make():
        return hvd_keras.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(LR),
                                              sync=averaging_all("dssync"))

    optimizer = make()
    for _ in range(2):
        minimize_once(optimizer, [x])
    path = tf.train.Checkpoint(optimizer=optimizer).write(
        str(tmp_path / f"ckpt-{hvd.rank()}"))
    resumed = make()
    # (partial: the legacy optimizer makes its hyperparameters at its first step)
    tf.train.Checkpoint(optimizer=resumed).read(path).expect_partial()
    assert int(resumed.hvdx_dssync.step.numpy()) == 2
