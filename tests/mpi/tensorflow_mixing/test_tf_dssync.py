"""DS-Sync for TensorFlow: the Keras optimizer (adapt-then-combine) and the tape
(combine-then-adapt), eagerly, inside tf.function and in Keras fit.

Checked against the numpy reference (hvdx.core.group_averaging, float64 at 1e-12),
against Horovod's parameter averaging and synchronous SGD, for exact consensus at
lr = 0, the final SWA merge, errors raised on every rank, and resuming a checkpoint.
Most tests train one float64 variable on a per-rank quadratic, whose gradient numpy
knows exactly, so that they stay fast on shared cores.
"""

import horovod.tensorflow
import numpy as np
import pytest
import tensorflow as tf
from mpi4py import MPI

import hvdx
import hvdx.tensorflow as hvd
import hvdx.tensorflow.keras as hvd_keras
from hvdx.core.group_averaging import COMBINE_THEN_ADAPT, simulate_dssync
from hvdx.core.topology import Topology

import quadratic_steps  # noqa: E402

pytestmark = [pytest.mark.dssync]

LR = 0.25  # exact in float32, so Keras' learning-rate variable holds it exactly
# Every variant runs at 1 and 2 ranks; at 4 ranks (on 2 cores, where a TensorFlow step
# costs most) the compiled ones, with groups that need registered process sets, and
# the tests only 4 ranks can run, so the job stays within its budget.
SMALL_WORLD = MPI.COMM_WORLD.Get_size() <= 2
ENTRIES = ["keras-function", "tape-function"] + \
    (["keras-eager", "tape-eager"] if SMALL_WORLD else [])
small_world_only = pytest.mark.skipif(not SMALL_WORLD, reason="run at 1 and 2 ranks")


def quadratic(n, d=4):
    """Per-rank centres and starting points; rank r minimises 0.5 * |x - c_r|^2."""
    centres = np.stack([np.random.default_rng(r).normal(size=d) for r in range(n)])
    initial = np.stack([np.random.default_rng(100 + r).normal(size=d) for r in range(n)])
    return centres, initial


def trainer(entry, sync, x, centre, lr=LR, optimizer=None):
    return quadratic_steps.trainer(entry, sync, x, centre, lr, optimizer)


def state_of(owner, sync):
    return owner.hvdx_dssync if owner is not None else hvd.dssync_state(sync)


def synchronize(owner, sync, swa=False):
    if owner is not None:
        owner.synchronize_parameters(swa=swa)
    else:
        hvd.dssync_state(sync).synchronize_parameters(swa=swa)


def racks_of_two(n):
    return Topology.from_ranks(hosts=range(n), racks=[r // 2 for r in range(n)])


# --- against the numpy reference ------------------------------------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", ["shuffle", "rotation"])
@pytest.mark.parametrize("entry", ENTRIES)
def test_matches_the_numpy_reference_with_the_swa_merge(entry, kind):
    n, rank = hvd.size(), hvd.rank()
    sync = hvdx.DSSync("shuffle", group_size=min(2, n), seed=7, swa_start=1, swa_every=2) \
        if kind == "shuffle" else \
        hvdx.DSSync("rotation", topology=racks_of_two(n), swa_start=1, swa_every=2)
    centres, initial = quadratic(n)
    x = tf.Variable(initial[rank])
    step, owner = trainer(entry, sync, x, centres[rank])
    for _ in range(5):
        step()
    state = state_of(owner, sync)
    order = COMBINE_THEN_ADAPT if entry.startswith("tape") else "adapt_then_combine"
    expected, swa = simulate_dssync(initial, lambda v, t: v - centres, LR, state.schedule,
                                    5, order=order, swa_start=1, swa_every=2)
    np.testing.assert_allclose(x.numpy(), expected[rank], rtol=0, atol=1e-12)
    np.testing.assert_allclose(state.swa[0].numpy(), swa[rank], rtol=0, atol=1e-12)
    assert int(state.step.numpy()) == 5 and int(state.swa_count.numpy()) == 2
    assert state.hvdx_stats.steps == 5
    synchronize(owner, sync, swa=True)
    np.testing.assert_allclose(x.numpy(), swa.mean(axis=0), rtol=0, atol=1e-12)


def regression(rank, d=4, batch=8):
    """Data exact in float32: Keras' data adapter casts float64 arrays to floatx."""
    rng = np.random.default_rng(50 + rank)
    x, y = rng.normal(size=(batch, d)), rng.normal(size=(batch, 1))
    return x.astype(np.float32).astype(np.float64), y.astype(np.float32).astype(np.float64)


@pytest.mark.mpi(min_size=1)
def test_keras_fit_matches_the_numpy_reference():
    # Rotation and shuffle through the same apply_gradients: see the test above.
    n, rank = hvd.size(), hvd.rank()
    sync = hvdx.DSSync("shuffle", group_size=min(2, n), seed=3)
    _, initial = quadratic(n)
    data = [regression(r) for r in range(n)]
    model = tf.keras.Sequential([tf.keras.layers.Dense(
        1, use_bias=False, dtype="float64",
        kernel_initializer=tf.keras.initializers.Constant(initial[rank].reshape(4, 1)))])
    model.build((None, 4))
    opt = hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.125), sync=sync)
    model.compile(optimizer=opt, loss="mse")
    model.fit(*data[rank], batch_size=8, epochs=4, shuffle=False, verbose=0)

    def grads(values, step):  # of mean((X w - y)^2), per rank
        return np.stack([2 / 8 * X.T @ (X @ w - y[:, 0]) for (X, y), w in zip(data, values)])

    expected = simulate_dssync(initial, grads, 0.125, opt.hvdx_dssync.schedule, 4)
    np.testing.assert_allclose(model.get_weights()[0][:, 0], expected[rank],
                               rtol=0, atol=1e-12)
    assert int(opt.hvdx_dssync.step.numpy()) == 4


# --- against Horovod ------------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
def test_one_group_of_all_ranks_is_horovod_parameter_averaging():
    n, rank = hvd.size(), hvd.rank()
    centres, initial = quadratic(n)
    x, ref = tf.Variable(initial[rank]), tf.Variable(initial[rank])
    step, opt = trainer("keras-eager", hvdx.DSSync("shuffle", group_size=n), x,
                        centres[rank], optimizer=tf.keras.optimizers.SGD(LR, momentum=0.9))
    ref_opt = tf.keras.optimizers.SGD(LR, momentum=0.9)
    for i in range(3):
        step()
        ref_opt.apply_gradients([(ref - centres[rank], ref)])
        ref.assign(horovod.tensorflow.allreduce(tf.convert_to_tensor(ref),
                                                op=horovod.tensorflow.Average,
                                                name=f"ref.avg.{i}"))
        np.testing.assert_allclose(x.numpy(), ref.numpy(), rtol=0, atol=1e-12)
    assert opt.hvdx_stats.steps == 3
    assert opt.hvdx_stats.last_bytes == pytest.approx(2 * (n - 1) / n * 4 * 8)


@small_world_only
@pytest.mark.mpi(min_size=1)
def test_average_optimizer_state_from_identical_weights_is_synchronous_momentum_sgd():
    n, rank = hvd.size(), hvd.rank()
    centres, initial = quadratic(n)
    x, ref = tf.Variable(initial[0]), tf.Variable(initial[0])
    sync = hvdx.DSSync("shuffle", group_size=n, average_optimizer_state=True)
    step, _ = trainer("keras-function", sync, x, centres[rank],
                      optimizer=tf.keras.optimizers.SGD(LR, momentum=0.9))
    ref_opt = tf.keras.optimizers.SGD(LR, momentum=0.9)
    for i in range(3):
        step()
        g = horovod.tensorflow.allreduce(tf.constant(ref.numpy() - centres[rank]),
                                         op=horovod.tensorflow.Average, name=f"ref.g.{i}")
        ref_opt.apply_gradients([(g, ref)])
    np.testing.assert_allclose(x.numpy(), ref.numpy(), rtol=0, atol=1e-12)


def small_model():
    init = tf.keras.initializers.GlorotUniform(seed=1)
    model = tf.keras.Sequential([tf.keras.layers.Dense(3, activation="tanh",
                                                       kernel_initializer=init)])
    model.build((None, 5))
    return model


@small_world_only
@pytest.mark.mpi(min_size=1)
def test_keras_fit_one_group_from_identical_weights_is_synchronous_sgd():
    rng = np.random.default_rng(hvd.rank())
    x, y = rng.normal(size=(16, 5)).astype("float32"), rng.normal(size=(16, 3)).astype("float32")
    ours = small_model()
    ours.compile(optimizer=hvd_keras.DistributedOptimizer(
        tf.keras.optimizers.SGD(0.1), sync=hvdx.DSSync("shuffle", group_size=hvd.size())),
        loss="mse")
    ours.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    # Synchronous SGD: Horovod's average of the local gradients, two steps (eager and
    # by hand, cheaper than a second fit with Horovod's optimizer).
    theirs, opt = small_model(), tf.keras.optimizers.SGD(0.1)
    for i in range(2):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((theirs(x[8 * i:8 * i + 8]) - y[8 * i:8 * i + 8]) ** 2)
        grads = horovod.tensorflow.grouped_allreduce(
            tape.gradient(loss, theirs.trainable_variables), op=horovod.tensorflow.Average,
            name=f"sync.sgd.{i}")
        opt.apply_gradients(zip(grads, theirs.trainable_variables))
    for a, b, start in zip(ours.get_weights(), theirs.get_weights(),
                           small_model().get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
        assert not np.allclose(a, start)


# --- identities -----------------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("entry", ["keras-function", "tape-function"])
def test_lr0_rotation_reaches_the_global_mean_after_one_period(entry):
    n, rank = hvd.size(), hvd.rank()
    centres, initial = quadratic(n)
    x = tf.Variable(initial[rank])
    sync = hvdx.DSSync("rotation", topology=racks_of_two(n))
    step, owner = trainer(entry, sync, x, centres[rank], lr=0.0)
    period = state_of(owner, sync).schedule.period
    assert period == (2 if n > 2 else 1)
    for t in range(period):
        step()
        if t < period - 1:
            assert not np.allclose(x.numpy(), initial.mean(axis=0), rtol=0, atol=1e-6)
    np.testing.assert_allclose(x.numpy(), initial.mean(axis=0), rtol=0, atol=1e-12)


@pytest.mark.mpi(min_size=1)
def test_global_every_and_synchronize_parameters_average_over_all_ranks():
    n, rank = hvd.size(), hvd.rank()
    centres, initial = quadratic(n)
    x = tf.Variable(initial[rank])
    sync = hvdx.DSSync("shuffle", group_size=1, global_every=2)
    step, _ = trainer("tape-eager", sync, x, centres[rank], lr=0.0)
    step()
    np.testing.assert_array_equal(x.numpy(), initial[rank])  # groups of one: local
    assert hvd.dssync_state(sync).hvdx_stats.total_bytes == 0
    step()
    np.testing.assert_allclose(x.numpy(), initial.mean(axis=0), rtol=0, atol=1e-12)
    assert hvd.dssync_state(sync).hvdx_stats.last_group_size == n
    x.assign(initial[rank])
    hvd.dssync_state(sync).synchronize_parameters()
    np.testing.assert_allclose(x.numpy(), initial.mean(axis=0), rtol=0, atol=1e-12)
    assert int(hvd.dssync_state(sync).step.numpy()) == 2


# --- bad input: the same error on every rank ------------------------------------------

def build(entry, sync):
    if entry == "tape":
        return hvd.DistributedGradientTape(tf.GradientTape(), sync=sync)
    return hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), sync=sync)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("entry", ["tape", "keras"])
def test_group_size_above_the_number_of_ranks_is_rejected_on_every_rank(entry):
    n = hvd.size()
    with pytest.raises(ValueError, match=f"group_size={n + 1}"):
        build(entry, hvdx.DSSync("shuffle", group_size=n + 1))
    total = hvd.allreduce(tf.ones(2), op=hvd.Sum, name=f"after.group_size.{entry}")
    assert total.numpy().tolist() == [float(n)] * 2


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("entry", ["tape", "keras"])
def test_group_size_too_large_on_one_rank_stops_every_rank(entry):
    n = hvd.size()
    with pytest.raises(ValueError, match="dssync"):
        build(entry, hvdx.DSSync("shuffle", group_size=n + 1 if hvd.rank() == 1 else n))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("entry", ["tape", "keras"])
def test_different_seeds_raise_the_fingerprint_error_on_every_rank(entry):
    with pytest.raises(ValueError, match="setting 'dssync.seed'") as info:
        build(entry, hvdx.DSSync("shuffle", group_size=2, seed=hvd.rank()))
    assert len(set(hvd.allgather_object(str(info.value)))) == 1


@pytest.mark.mpi(min_size=3)
def test_without_dynamic_process_sets_the_error_says_what_to_do(monkeypatch):
    n = hvd.size()
    # A group no other test registers: ranks 0, 1 and the last.
    partition = [[0, 1, n - 1]] + [[r] for r in range(2, n - 1)]
    monkeypatch.setenv("HOROVOD_DYNAMIC_PROCESS_SETS", "0")
    with pytest.raises(ValueError, match='process_sets="dynamic"') as info:
        build("keras", hvdx.DSSync([partition]))
    assert "hvdx.tensorflow.dssync_process_sets(sync, size)" in str(info.value)


def test_swa_merge_before_any_sample_is_rejected():
    x = tf.Variable([1.0, 2.0], dtype=tf.float64)
    sync = hvdx.DSSync("shuffle", group_size=1, swa_start=5)
    step, opt = trainer("keras-eager", sync, x, np.zeros(2))
    step()
    with pytest.raises(ValueError, match="swa=True"):
        opt.synchronize_parameters(swa=True)


# --- state ----------------------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("entry", ["keras-function", "tape-function"][:None if SMALL_WORLD
                                                                     else 1])
def test_checkpoint_resume_continues_the_same_schedule(entry, tmp_path):
    n, rank = hvd.size(), hvd.rank()
    centres, initial = quadratic(n)

    def run(start):
        sync = hvdx.DSSync("shuffle", group_size=min(2, n), seed=5, swa_start=0)
        x = tf.Variable(start)
        optimizer = tf.keras.optimizers.SGD(LR, momentum=0.5)
        step, owner = trainer(entry, sync, x, centres[rank], optimizer=optimizer)
        state = state_of(owner, sync)
        checkpoint = tf.train.Checkpoint(x=x, dssync=state, optimizer=owner or optimizer)
        return x, step, state, checkpoint

    x, step, state, checkpoint = run(initial[rank])
    for _ in range(3):
        step()
    path = checkpoint.write(str(tmp_path / f"ckpt-{rank}"))
    for _ in range(3):
        step()

    x2, step2, state2, checkpoint2 = run(np.zeros(4))
    checkpoint2.read(path)
    assert int(state2.step.numpy()) == 3
    for _ in range(3):
        step2()
    assert int(state2.step.numpy()) == 6
    np.testing.assert_allclose(x2.numpy(), x.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(state2.swa[0].numpy(), state.swa[0].numpy(), rtol=0,
                               atol=1e-12)


# --- static registration --------------------------------------------------------------

def test_static_process_sets_of_a_rotation():
    sync = hvdx.DSSync("rotation", topology=Topology.from_counts(2, 2, 1))
    sets = hvd.dssync_process_sets(sync, 4)
    assert [ps.ranks for ps in sets] == [[0, 1], [0, 2], [1, 3], [2, 3]]
    assert all(isinstance(ps, horovod.tensorflow.ProcessSet) for ps in sets)
    with pytest.raises(ValueError, match="dynamic"):
        hvd.dssync_process_sets(hvdx.DSSync("shuffle", group_size=2), 4)


# --- probe_every: the rebuilt rotation survives a checkpoint --------------------------

def contended_from(step_slowed):
    """A probe answer (2 racks, 1 Gbit inside, 100 Mbit across) in which rank 0's NIC
    is slowed to 10 Mbit from ``step_slowed`` on."""
    def probe(step):
        n = hvd.size()
        rack = np.arange(n) // max(n // 2, 1)
        m = np.where(rack[:, None] == rack[None, :], 125e6, 12.5e6)
        if step >= step_slowed:
            m[0, :] = m[:, 0] = 1.25e6
        np.fill_diagonal(m, 0)
        return m
    return probe


@pytest.mark.mpi(min_size=4)
def test_a_resumed_run_continues_on_the_rotation_rebuilt_from_the_probe(tmp_path):
    n, rank = hvd.size(), hvd.rank()
    centres, initial = quadratic(n)

    def run(start):
        sync = hvdx.DSSync(topology=Topology.from_counts(2, n // 2), cross_ranks=1,
                           probe_every=2, probe=contended_from(0))
        x = tf.Variable(start)
        step, _ = trainer("tape-function", sync, x, centres[rank])
        state = hvd.dssync_state(sync)
        return x, step, state, tf.train.Checkpoint(x=x, dssync=state)

    x, step, state, checkpoint = run(initial[rank])
    for _ in range(3):  # rebuilt at step 2: rank 0 no longer crosses
        step()
    assert state.hvdx_stats.adaptations == 1
    path = checkpoint.write(str(tmp_path / f"ckpt-{rank}"))
    for _ in range(3):
        step()

    x2, step2, state2, checkpoint2 = run(np.zeros(4))
    checkpoint2.read(path)
    for _ in range(3):
        step2()
    np.testing.assert_allclose(x2.numpy(), x.numpy(), rtol=0, atol=1e-12)
    assert state2.hvdx_stats.adaptations == 1
