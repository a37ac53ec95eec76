"""hvdx.tensorflow.Compression.topk: TensorFlow's tape and Keras optimizer give the numpy
reference's update bitwise (the one PyTorch's optimizer is tested against), eagerly and
inside tf.function, reduce to Horovod's dense average at ratio 1, train under model.fit,
checkpoint bitwise, fail on every rank together, and skip a step whose gradients are
not finite on every rank together."""

import copy
import pathlib
import shutil
import sys
import tempfile

import horovod.tensorflow
import horovod.tensorflow.keras
import numpy as np
import pytest
import tensorflow as tf
from mpi4py import MPI

import hvdx.tensorflow as hvd
import hvdx.tensorflow.keras as hvd_keras
from hvdx.strategies.topk.core_bidirectional import TopKConfig, simulate_step
from hvdx.strategies.topk.core_error_feedback import ResidualMemory
from tf_models import batches, small_cnn

LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
SIZES = (3000, 517, 8)  # the last stays below min_size: Horovod averages it densely
MIN_SIZE = 100
RATIOS = (0.02, 0.01)
COMPILED = [False, True]
COMPILED_IDS = ["eager", "tf.function"]

# Past two ranks only the references at other ranks' offsets change; the rest runs at 1
# and 2 ranks (tests/conftest.py).
pytestmark = [pytest.mark.up_to_two_ranks("TopK's settings, state, refusals and training"),
              pytest.mark.topk]

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import synthetic_gradients  # noqa: E402
from fake_comms import NoCollectives  # noqa: E402
from spec_errors import refused  # noqa: E402


def grads_of_all_ranks(step, d, seed=0):
    """Every rank's gradient at ``step`` (:mod:`synthetic_gradients`, shared with the
    other framework's TopK tests)."""
    return synthetic_gradients.grads_of_all_ranks(hvd.size(), step, d, seed)


def flat_variables(sizes=SIZES):
    return [tf.Variable(tf.zeros(d), name=f"w{t}") for t, d in enumerate(sizes)]


def tape_step(variables, compiled, **kwargs):
    """``grads -> updates`` through a TopK tape: the loss sum(w * g) has gradient g."""

    def step(*grads):
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(w * g) for w, g in zip(variables, grads)])
        tape = hvd.DistributedGradientTape(tape, **kwargs)
        return tape.gradient(loss, variables)

    return tf.function(step) if compiled else step


def same_everywhere(array):
    everyone = hvd.allgather_object(np.asarray(array))
    return all(np.array_equal(everyone[0], a) for a in everyone)


@pytest.mark.mpi(min_size=1)
@pytest.mark.all_sizes
@pytest.mark.parametrize("compiled", COMPILED, ids=COMPILED_IDS)
@pytest.mark.parametrize("mode", ["gathered", "sharded"])
def test_tape_update_equals_the_numpy_reference_bitwise(mode, compiled):
    variables = flat_variables()
    spec = hvd.Compression.topk(*RATIOS, mode=mode, min_size=MIN_SIZE)
    step = tape_step(variables, compiled, compression=spec)
    state = hvd.topk_state(variables)
    size, rank = hvd.size(), hvd.rank()
    config = TopKConfig(*RATIOS)
    names = [f"variable[{i}]" for i in range(len(variables))]  # keyed by position
    workers = [ResidualMemory(names) for _ in range(size)]
    servers = [ResidualMemory(names) for _ in range(size)]
    for t in range(3):
        grads = [grads_of_all_ranks(t, d, seed=i) for i, d in enumerate(SIZES)]
        agreed = state.stats.phases["agree"][1]
        updates = step(*[tf.constant(g[rank]) for g in grads])
        agreed = state.stats.phases["agree"][1] - agreed  # sharded: the global TopK's
        received = 0
        for name, g, u in zip(names[:2], grads, updates):
            ref = simulate_step(g, workers, servers, config, mode, step=t, name=name)
            assert u.dtype == tf.float32 and np.array_equal(u.numpy(), ref.u), name
            assert np.array_equal(state.synchronizer.worker.get(name), workers[rank].get(name))
            assert np.array_equal(state.synchronizer.server.get(name), servers[rank].get(name))
            received += ref.stats.recv_bytes[rank]
            assert same_everywhere(u)
        dense = horovod.tensorflow.allreduce(tf.constant(grads[2][rank]), op=hvd.Average)
        np.testing.assert_allclose(updates[2].numpy(), dense.numpy(), rtol=0, atol=1e-6)
        # Bytes as in PyTorch: pairs (8 bytes) and one 8-byte count per peer and
        # collective, plus the small tensor counted as a ring allreduce.
        collectives = 1 if mode == "gathered" else 2
        ring = 2 * (size - 1) / size * SIZES[2] * 4
        # (approx: the ring's share is a fraction, 2 (n - 1) / n, at 3 ranks not exact)
        assert state.stats.last_received - agreed == pytest.approx(
            received + collectives * 8 * (size - 1) + ring, rel=1e-12)
        assert (state.stats.last_sparse_tensors, state.stats.last_dense_tensors) == (2, 1)
    assert state.step == 3 and state.stats.steps == 3



@pytest.mark.mpi(min_size=1)
@pytest.mark.all_sizes
def test_global_selection_equals_the_reference_on_the_concatenated_gradient():
    variables = flat_variables()
    spec = hvd.Compression.topk(*RATIOS, mode="sharded", min_size=MIN_SIZE,
                                selection="global")
    step = tape_step(variables, False, compression=spec)
    size, rank = hvd.size(), hvd.rank()
    workers = [ResidualMemory(["all"]) for _ in range(size)]
    servers = [ResidualMemory(["all"]) for _ in range(size)]
    for t in range(2):
        grads = [grads_of_all_ranks(t, d, seed=i) for i, d in enumerate(SIZES)]
        updates = step(*[tf.constant(g[rank]) for g in grads])
        whole = [np.concatenate([grads[0][r], grads[1][r]]) for r in range(size)]
        ref = simulate_step(whole, workers, servers, TopKConfig(*RATIOS), "sharded", step=t,
                            name="all")
        assert np.array_equal(np.concatenate([updates[0], updates[1]]), ref.u)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("compiled", COMPILED, ids=COMPILED_IDS)
def test_small_tensors_averaged_by_hvdx_are_horovods_average_and_horovod_idles(
        compiled, monkeypatch):
    grads = [grads_of_all_ranks(0, d, seed=i) for i, d in enumerate(SIZES)]
    tensors = [tf.constant(g[hvd.rank()]) for g in grads]
    by_horovod = tape_step(flat_variables(), compiled, compression=hvd.Compression.topk(
        *RATIOS, min_size=MIN_SIZE))(*tensors)
    import hvdx.tensorflow.compression_driver as adapter
    monkeypatch.setattr(adapter, "_hvd", _NoAllreduce(adapter._hvd))
    variables = flat_variables()
    by_hvdx = tape_step(variables, compiled, compression=hvd.Compression.topk(
        *RATIOS, min_size=MIN_SIZE, small_tensors="in_topk_step"))(*tensors)
    for a, b in zip(by_horovod[:2], by_hvdx[:2]):
        assert np.array_equal(a.numpy(), b.numpy())
    # One MPI allreduce instead of Horovod's: float32 rounding apart, the same average.
    np.testing.assert_allclose(by_hvdx[2].numpy(), by_horovod[2].numpy(), rtol=0, atol=1e-6)
    assert same_everywhere(by_hvdx[2])
    stats = hvd.topk_state(variables).stats
    assert (stats.last_sparse_tensors, stats.last_dense_tensors) == (2, 1)


class _NoAllreduce:
    """Horovod's module, except that an allreduce fails the test."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        if "allreduce" in name:
            raise AssertionError(f"Horovod's {name} was called")
        return getattr(self._module, name)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("mode", ["gathered", "sharded"])
def test_ratio_one_is_horovods_dense_average_and_residuals_stay_zero(mode):
    variables = flat_variables(SIZES[:1])
    step = tape_step(variables, True,
                     compression=hvd.Compression.topk(1.0, 1.0, mode=mode, min_size=0))
    for t in range(2):
        g = tf.constant(grads_of_all_ranks(t, SIZES[0])[hvd.rank()])
        dense = horovod.tensorflow.allreduce(g, op=hvd.Average)
        (u,) = step(g)
        np.testing.assert_allclose(u.numpy(), dense.numpy(), rtol=0, atol=1e-6)
    sync = hvd.topk_state(variables).synchronizer
    assert not np.any(sync.worker.get("variable[0]"))
    assert not np.any(sync.server.get("variable[0]"))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("compiled", COMPILED, ids=COMPILED_IDS)
@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16], ids=["float16", "bfloat16"])
def test_half_precision_gradients_are_upcast_and_come_back_in_their_dtype(dtype, compiled):
    w = tf.Variable(tf.zeros(SIZES[0], dtype), name="w0")
    step = tape_step([w], compiled, compression=hvd.Compression.topk(1.0, 1.0, min_size=0))
    g = tf.cast(grads_of_all_ranks(0, SIZES[0])[hvd.rank()], dtype)
    dense = horovod.tensorflow.allreduce(tf.cast(g, tf.float32), op=hvd.Average)
    (u,) = step(g)
    assert u.dtype == dtype
    # The average is taken in float32 (as Horovod's here), then rounded once to dtype.
    assert np.array_equal(tf.cast(u, tf.float32).numpy(),
                          tf.cast(tf.cast(dense, dtype), tf.float32).numpy())
    assert hvd.topk_state([w]).synchronizer.worker.get("variable[0]").dtype == np.float32


@pytest.mark.mpi(min_size=1)
def test_autotune_steps_are_dense_and_then_one_choice_holds_on_every_rank():
    variables = flat_variables(SIZES[:1])
    step = tape_step(variables, True, compression=hvd.Compression.topk(
        0.01, 0.01, min_size=0, autotune_steps=2))
    for t in range(3):
        g = tf.constant(grads_of_all_ranks(t, SIZES[0])[hvd.rank()])
        dense = horovod.tensorflow.allreduce(g, op=hvd.Average)
        (u,) = step(g)
        sync = hvd.topk_state(variables).synchronizer
        if t < 2:  # Horovod's allreduce; the dry run left no residual behind
            np.testing.assert_array_equal(u.numpy(), dense.numpy())
            assert sync.worker.get("variable[0]") is None
    assert sync.choice in ("topk", "dense") and same_everywhere([sync.choice == "topk"])
    assert sync.stats.autotune["dense_s"] > 0 and same_everywhere(u.numpy())


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("compiled", [False, True])
def test_after_a_dense_choice_a_step_is_horovods_allreduce_alone(compiled):
    variables = flat_variables(SIZES[:1])
    step = tape_step(variables, compiled, compression=hvd.Compression.topk(
        0.01, 0.01, min_size=0, autotune_steps=1))
    step(tf.constant(grads_of_all_ranks(0, SIZES[0])[hvd.rank()]))  # the tuning step
    sync = hvd.topk_state(variables).synchronizer
    sync.choice, sync.comm = "dense", NoCollectives()  # as if the dense allreduce won
    for t in range(1, 3):
        g = tf.constant(grads_of_all_ranks(t, SIZES[0])[hvd.rank()])
        dense = horovod.tensorflow.allreduce(g, op=hvd.Average)
        (u,) = step(g)
        np.testing.assert_array_equal(u.numpy(), dense.numpy())
    assert sync.stats.steps == 3 and sync.stats.last_sparse_tensors == 0


@pytest.mark.mpi(min_size=1)
def test_op_sum_is_size_times_the_average():
    g = tf.constant(grads_of_all_ranks(0, SIZES[0])[hvd.rank()])
    spec = hvd.Compression.topk(0.1, 0.1, min_size=0)
    (average,) = tape_step(flat_variables(SIZES[:1]), False, compression=spec)(g)
    (total,) = tape_step(flat_variables(SIZES[:1]), False, compression=spec, op=hvd.Sum)(g)
    np.testing.assert_array_equal(total.numpy(), average.numpy() * hvd.size())


def initial_model():
    model = small_cnn()
    model.build((None, 8, 8, 1))
    model.set_weights(hvd.broadcast_object(model.get_weights(), root_rank=0))
    return model


def model_from(weights):
    model = small_cnn()
    model.build((None, 8, 8, 1))
    model.set_weights(weights)
    return model


# small_cnn's fc1 kernel (128 x 32) and fc2 kernel (32 x 10) are compressed; the conv
# kernel (72 entries) and the biases go through Horovod's allreduce.
SPEC = dict(ratio=0.05, downlink_ratio=0.05, min_size=256)
STEPS = 12


def tape_training_step(model, optimizer, compiled):
    variables = model.trainable_variables

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = LOSS(yb, model(xb, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=hvd.Compression.topk(**SPEC))
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    return tf.function(step) if compiled else step


def run(step, x, y):
    return [float(step(x[i:i + 16], y[i:i + 16])) for i in range(0, len(x), 16)]


def keras_model(weights, **kwargs):
    model = model_from(weights)
    optimizer = hvd_keras.DistributedOptimizer(
        tf.keras.optimizers.SGD(learning_rate=0.1, momentum=0.9),
        compression=hvd_keras.Compression.topk(**SPEC), **kwargs)
    model.compile(optimizer=optimizer, loss=LOSS)
    return model, optimizer


def fit(model, x, y):
    return model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)


def repeated_batch(steps):
    x, y = batches(hvd.rank(), 1)
    return np.concatenate([x] * steps), np.concatenate([y] * steps)


def mean_over_ranks(values):
    return np.mean(hvd.allgather_object(values), axis=0)


def assert_trained_and_identical_on_every_rank(model, start):
    for w, w0 in zip(model.get_weights(), start):
        assert not np.array_equal(w, w0), "a weight did not train"
        assert same_everywhere(w)


# Eager and tf.function tapes train at 1 and 2 ranks (at 4 ranks on 2 cores, where a step
# costs most, their updates are still checked bitwise against the reference above).
TRAINING = ["keras_fit_two_passes_per_step", "eager", "tf.function"]
SMALL_WORLD = MPI.COMM_WORLD.Get_size() <= 2


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("how", TRAINING if SMALL_WORLD else TRAINING[:1])
def test_training_reduces_the_loss_and_keeps_ranks_identical(how):
    """Keras runs with backward_passes_per_step=2: Horovod's helper sums two passes and
    TopK compresses the sum, once per two batches (so it gets twice the batches)."""
    start = initial_model().get_weights()
    x, y = repeated_batch(STEPS)  # one batch, learnt by heart
    if how.startswith("keras_fit"):
        model, optimizer = keras_model(start, backward_passes_per_step=2)
        first = float(LOSS(y[:16], model(x[:16])))
        fit(model, np.concatenate([x, x]), np.concatenate([y, y]))
        stats = optimizer.hvdx_stats
        assert optimizer.hvdx_topk.step == STEPS
    else:
        model = model_from(start)
        optimizer = tf.keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
        first = float(LOSS(y[:16], model(x[:16])))
        run(tape_training_step(model, optimizer, how == "tf.function"), x, y)
        stats = hvd.topk_state(model.trainable_variables).stats
    last = float(LOSS(y[:16], model(x[:16])))
    first, last = mean_over_ranks([first, last])
    assert last < 0.8 * first, (first, last)
    assert stats.steps == STEPS
    assert (stats.last_sparse_tensors, stats.last_dense_tensors) == (2, 4)
    if hvd.size() > 1:
        assert stats.last_sent > 0 and stats.total_received > stats.last_received
    assert_trained_and_identical_on_every_rank(model, start)


@pytest.fixture
def directory():
    path = tempfile.mkdtemp(prefix=f"hvdx-topk-rank{hvd.rank()}-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.mpi(min_size=1)
def test_tape_checkpoint_resumes_bitwise(directory):
    x, y = batches(hvd.rank(), 6)
    start = initial_model().get_weights()

    def make():
        model = model_from(start)
        optimizer = tf.keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)
        optimizer.build(model.trainable_variables)
        state = hvd.topk_state(model.trainable_variables)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, topk=state)
        return model, tape_training_step(model, optimizer, compiled=True), state, checkpoint

    model, step, state, checkpoint = make()
    run(step, x[:48], y[:48])
    path = checkpoint.write(f"{directory}/ckpt")
    assert state.step == 3
    run(step, x[48:], y[48:])

    resumed, step2, state2, checkpoint2 = make()
    checkpoint2.read(path).assert_consumed()
    assert state2.step == 3  # applied when the first step binds the state
    run(step2, x[48:], y[48:])
    for a, b in zip(model.get_weights(), resumed.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert state2.step == 6 and state2.synchronizer.worker.state_dict()


@pytest.mark.mpi(min_size=2)
def test_loading_rank_0s_residuals_on_another_rank_fails_naming_both_ranks(directory):
    x, y = batches(hvd.rank(), 2)
    start = initial_model().get_weights()

    def make():
        model = model_from(start)
        optimizer = tf.keras.optimizers.SGD(learning_rate=0.05)
        state = hvd.topk_state(model.trainable_variables)
        return tape_training_step(model, optimizer, compiled=False), state

    step, state = make()
    run(step, x, y)
    path = tf.train.Checkpoint(topk=state).write(f"{directory}/ckpt")
    rank0 = MPI.COMM_WORLD.bcast(path, root=0)
    _, state2 = make()
    if hvd.rank() == 0:
        tf.train.Checkpoint(topk=state2).read(rank0).assert_consumed()
        assert state2.step == 2
    else:  # refused while the checkpoint is read, before any step could wait on it
        with pytest.raises(ValueError,
                           match=f"residuals of rank 0 and this is rank {hvd.rank()}"):
            tf.train.Checkpoint(topk=state2).read(rank0)
        assert state2.step == 0
    MPI.COMM_WORLD.Barrier()  # rank 0's directory outlives the others' reads


@pytest.mark.mpi(min_size=1)
def test_keras_checkpoint_of_the_model_holds_the_residuals_and_resumes_bitwise(directory):
    x, y = batches(hvd.rank(), 6)
    start = initial_model().get_weights()
    model, optimizer = keras_model(start)
    fit(model, x[:48], y[:48])
    path = tf.train.Checkpoint(model=model).write(f"{directory}/ckpt")
    assert optimizer.hvdx_topk.step == 3
    fit(model, x[48:], y[48:])

    resumed, optimizer2 = keras_model(start)
    optimizer2.build(resumed.trainable_variables)
    tf.train.Checkpoint(model=resumed).read(path).assert_existing_objects_matched()
    assert optimizer2.hvdx_topk.step == 3
    fit(resumed, x[48:], y[48:])
    for a, b in zip(model.get_weights(), resumed.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert optimizer2.hvdx_topk.step == 6


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_legacy_keras_optimizers_run_topk_and_save_its_residuals(name, directory):
    """Horovod's docs steer TensorFlow >= 2.11 users to tf.keras.optimizers.legacy,
    whose optimizers track no attribute by themselves. At ratio 1 TopK is Horovod's
    average, so hvdx's steps are the plain legacy optimizer's on the mean of the
    ranks' gradients (numpy's); a checkpoint of the optimizer holds the residuals."""
    legacy = getattr(tf.keras.optimizers.legacy, name)

    def make():
        return hvd_keras.DistributedOptimizer(
            legacy(0.1), compression=hvd_keras.Compression.topk(1.0, 1.0, min_size=0))

    w, reference = tf.Variable(tf.zeros(SIZES[1])), tf.Variable(tf.zeros(SIZES[1]))
    optimizer, plain = make(), legacy(0.1)
    for t in range(3):
        g = grads_of_all_ranks(t, SIZES[1])
        optimizer.minimize(lambda: tf.reduce_sum(w * g[hvd.rank()]), [w])
        plain.apply_gradients([(tf.constant(np.mean(g, axis=0)), reference)])
    np.testing.assert_allclose(w.numpy(), reference.numpy(), rtol=1e-5, atol=1e-6)
    assert optimizer.hvdx_topk.step == 3
    path = tf.train.Checkpoint(optimizer=optimizer).write(f"{directory}/ckpt")
    resumed = make()
    # (partial: the legacy optimizer makes its slots and hyperparameters at its first step)
    tf.train.Checkpoint(optimizer=resumed).read(path).expect_partial()
    assert resumed.hvdx_topk.step == 3


def first_step(entry, **arguments):
    """Build ``entry`` with ``arguments`` and take one step. Arguments TopK cannot
    honour raise at once in a job of one rank; in a job of several, at the first
    step, on every rank, after the cross-rank check of the variables."""
    x = tf.Variable(tf.ones([4]))
    if entry == "keras":
        opt = hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(), **arguments)
        opt.minimize(lambda: tf.reduce_sum(x ** 2), [x])
        return
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(x ** 2)
    hvd.DistributedGradientTape(tape, **arguments).gradient(loss, [x])


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("entry", ["tape", "keras"])
@pytest.mark.parametrize("op, name", [(hvd.Adasum, "Adasum")])
def test_unsupported_ops_are_rejected(op, name, entry):
    with pytest.raises(ValueError, match=f"op={name} is not supported with TopK"):
        first_step(entry, compression=hvd.Compression.topk(0.1), op=op)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("entry", ["tape", "keras"])
def test_momentum_correction_is_refused_with_tensorflow(entry):
    """DGC's momentum correction takes over PyTorch SGD's momentum; TF says so."""
    compression = hvd.Compression.topk(0.1, momentum_correction=True)
    with pytest.raises(ValueError, match="momentum_correction=True is implemented for "
                                         "PyTorch"):
        first_step(entry, compression=compression)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kwargs, message", [
    ({"ratio": 0.0}, "ratio=0.0 must be in"),
    ({"ratio": 0.1, "downlink_ratio": 1.5}, "downlink_ratio=1.5 must be in"),
])
def test_a_bad_ratio_is_refused_at_construction(kwargs, message):
    for compression in (hvd.Compression, hvd_keras.Compression):
        refused(lambda: compression.topk(**kwargs), message)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("compiled", COMPILED, ids=COMPILED_IDS)
def test_an_inf_gradient_on_one_rank_makes_every_ranks_gradients_nan_and_changes_no_state(
        compiled, capfd):
    """As Horovod's allreduce carries an inf into every rank's average, every rank's
    gradients come back non-finite, eagerly as in a graph, and the step changes no
    residual, step counter or byte counter; rank 0 reports it once. (Such a step used to
    raise ValueError, InvalidArgumentError in a graph, which ended every mixed-precision
    run at its first overflow.)"""
    variables = flat_variables()
    step = tape_step(variables, compiled,
                     compression=hvd.Compression.topk(*RATIOS, min_size=MIN_SIZE))
    rank, bad_rank = hvd.rank(), hvd.size() - 1
    grads = [grads_of_all_ranks(0, d, seed=i)[rank] for i, d in enumerate(SIZES)]
    step(*[tf.constant(g) for g in grads])
    state = hvd.topk_state(variables)
    before, stats = state.synchronizer.state_dict(), copy.deepcopy(state.stats.as_dict())
    bad = [g.copy() for g in grads]
    if rank == bad_rank:
        bad[1][5] = np.inf
    for _ in range(2):
        updates = step(*[tf.constant(g) for g in bad])
        assert all(np.isnan(u.numpy()).all() for u in updates)  # the small tensor's too
        after = state.synchronizer.state_dict()
        assert after["step"] == before["step"] == 1
        for side in ("worker", "server"):
            assert list(after[side]) == list(before[side])
            assert all(np.array_equal(after[side][n], before[side][n]) for n in before[side])
        assert state.stats.as_dict() == stats
    reports = capfd.readouterr().err.count("[hvdx] TopK: the gradient of 'w1:0'")
    assert reports == (1 if rank == 0 else 0)
    updates = step(*[tf.constant(g) for g in grads])  # finite again: TopK goes on
    assert state.step == 2 and all(np.isfinite(u.numpy()).all() for u in updates)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("compiled", COMPILED, ids=COMPILED_IDS)
def test_a_loss_scale_optimizer_skips_an_overflow_on_one_rank_on_every_rank(compiled):
    """Keras's LossScaleOptimizer around hvdx's TopK optimizer (Horovod's Keras
    DistributedOptimizer cannot wrap one: it rebuilds the optimizer from its config)
    applies a step only if the gradients it gets are finite: the last rank's loss
    overflows at step 1, and every rank skips that step (its variable, TopK's step
    counter and residuals unchanged) and halves its loss scale once."""
    rank = hvd.rank()
    x = tf.Variable(np.linspace(-1.0, 1.0, 300, dtype=np.float32))  # alike on every rank
    optimizer = tf.keras.mixed_precision.LossScaleOptimizer(hvd_keras.DistributedOptimizer(
        tf.keras.optimizers.SGD(0.1),
        compression=hvd_keras.Compression.topk(0.1, 0.1, min_size=0)))
    initial_scale = float(optimizer.loss_scale.numpy())
    topk = optimizer.inner_optimizer.hvdx_topk
    blow_up = tf.Variable(1.0)
    target = np.float32(rank + 1)

    def step():
        optimizer.minimize(lambda: blow_up * tf.reduce_sum((x - target) ** 2), [x])

    step = tf.function(step) if compiled else step
    for t in range(3):
        before, residuals = x.numpy().copy(), None
        if t == 1:
            residuals = topk.synchronizer.state_dict()["worker"]
        blow_up.assign(np.inf if (t == 1 and rank == hvd.size() - 1) else 1.0)
        step()
        assert np.array_equal(before, x.numpy()) == (t == 1)  # skipped on every rank
        if residuals is not None:
            after = topk.synchronizer.state_dict()["worker"]
            assert list(after) == list(residuals)
            assert all(np.array_equal(after[n], e) for n, e in residuals.items())
    assert topk.step == 2
    scales = hvd.allgather_object(float(optimizer.loss_scale.numpy()))
    assert all(s == initial_scale / 2 for s in scales)  # halved once, everywhere
    assert same_everywhere(x.numpy()) and np.isfinite(x.numpy()).all()


@pytest.mark.mpi(min_size=1)
def test_fit_under_mixed_float16_survives_an_overflow_on_one_rank():
    """``compile`` under the ``mixed_float16`` policy wraps hvdx's TopK optimizer in a
    LossScaleOptimizer; the last rank's batch 1 overflows float16, and the run goes on
    with the loss scale lowered alike and the weights identical on every rank."""
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(40),
                                     tf.keras.layers.Dense(1, dtype="float32")])
        model.compile(optimizer=hvd_keras.DistributedOptimizer(
            tf.keras.optimizers.SGD(0.01),
            compression=hvd_keras.Compression.topk(0.1, 0.1, min_size=0)), loss="mse")
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    assert isinstance(model.optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
    initial_scale = float(model.optimizer.loss_scale.numpy())
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(32, 3)).astype(np.float32)
    if hvd.rank() == hvd.size() - 1:
        x[8:16] = 1e9  # batch 1 overflows float16 on the last rank only
    y = rng.normal(size=(32, 1)).astype(np.float32)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    scales = hvd.allgather_object(float(model.optimizer.loss_scale.numpy()))
    assert scales[0] < initial_scale and all(s == scales[0] for s in scales)
    for w in model.get_weights():
        assert np.isfinite(w).all() and same_everywhere(w)


@pytest.mark.mpi(min_size=2)
def test_different_ratios_raise_the_fingerprint_error_on_every_rank():
    spec = hvd.Compression.topk(0.01 if hvd.rank() != 1 else 0.02, 0.01)
    step = tape_step(flat_variables(SIZES[:1]), False, compression=spec)
    with pytest.raises(ValueError, match="setting 'compression' differs") as info:
        step(tf.ones(SIZES[0]))
    message = str(info.value)
    assert "ratio=0.01" in message and "ratio=0.02" in message
    assert len(set(hvd.allgather_object(message))) == 1


@pytest.mark.mpi(min_size=1)
def test_compression_keeps_horovods_compressors_and_adds_topk():
    for ours, theirs in ((hvd, horovod.tensorflow), (hvd_keras, horovod.tensorflow.keras)):
        assert ours.Compression.none is theirs.Compression.none
        assert ours.Compression.fp16 is theirs.Compression.fp16
        assert ours.Compression.topk(0.01).ratio == 0.01


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("compression", ["none", "topk"])
@pytest.mark.parametrize("api", ["tape", "keras"])
def test_a_local_variable_keeps_its_own_gradient_divided_by_the_ranks(compression, api):
    """Horovod's ``register_local_source`` / ``register_local_var``, with no strategy
    (Horovod's own objects through hvdx) and with TopK at ratio 1: the shared variable
    gets the average over the ranks, the local one this rank's own gradient divided by
    the number of ranks (``scale_local_gradients``, Horovod's default)."""
    n, rank = hvd.size(), hvd.rank()
    every = hvd.Compression.topk(1.0, 1.0, min_size=0) if compression == "topk" \
        else hvd.Compression.none
    c = [tf.constant((r + 1) * np.arange(1.0, 5.0, dtype=np.float32)) for r in range(n)]
    w, v = tf.Variable(tf.zeros(4)), tf.Variable(tf.zeros(4))

    def loss():
        return tf.reduce_sum(w * c[rank]) + tf.reduce_sum(v * c[rank])

    if api == "tape":
        with tf.GradientTape() as tape:
            value = loss()
        tape = hvd.DistributedGradientTape(tape, compression=every)
        tape.register_local_source(v)
        gw, gv = tape.gradient(value, [w, v])
    else:
        optimizer = hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(1.0),
                                                   compression=every)
        optimizer.register_local_var(v)
        optimizer.minimize(loss, [w, v])
        gw, gv = -w, -v  # one step of SGD at learning rate 1 from zero
    np.testing.assert_allclose(gw.numpy(), np.mean([x.numpy() for x in c], axis=0),
                               rtol=0, atol=1e-6)
    np.testing.assert_allclose(gv.numpy(), c[rank].numpy() / n, rtol=0, atol=1e-6)
