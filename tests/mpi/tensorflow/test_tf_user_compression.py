"""A compressor defined here, registered, and run by the TensorFlow tape and the Keras
optimizer.

Every rank's gradients come from seeded generators (the loss ``sum(w * g)`` has
gradient ``g``), so the test computes the whole job's averages in numpy and compares.
"""

import pathlib
import shutil
import sys
import tempfile
import types
import zlib

import numpy as np
import pytest
import tensorflow as tf
from mpi4py import MPI

import hvdx
import hvdx.tensorflow as hvd
import hvdx.tensorflow.keras as hvd_keras
from hvdx import step_log
from hvdx.compression_registry import UserCompression
from hvdx.core.user_compression import Compressor

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from hvdx_variables import hvdx_variables  # noqa: E402

# The protocol's steps, checkpoints and Keras's passes do not depend on the size past two
# ranks (tests/conftest.py).
pytestmark = [pytest.mark.up_to_two_ranks("a registered compressor against its numpy reference"),
              pytest.mark.user_compression]


class ScaledSign(Compressor):
    def __init__(self, scale=1.0):
        if not scale > 0:
            raise ValueError(f"scale={scale!r} must be positive")
        self.scale = scale

    def compress(self, x, step, name):
        return [np.signbit(x), np.array(np.abs(x).mean(), x.dtype)]

    def decompress(self, payloads, shape, dtype, step, name):
        negative, mean = payloads
        return np.where(negative, -1.0, 1.0).astype(dtype) * (mean * dtype.type(self.scale))

    def settings(self):
        return {"scale": self.scale}


class RandomK(Compressor):
    """k entries chosen by a generator seeded with (seed, step, name)."""

    def __init__(self, k=3, seed=0):
        self.k, self.seed = k, seed

    def _indices(self, size, step, name):
        rng = np.random.default_rng([self.seed, step, zlib.crc32(name.encode())])
        return rng.choice(size, min(self.k, size), replace=False)

    def compress(self, x, step, name):
        return [x.reshape(-1)[self._indices(x.size, step, name)]]

    def decompress(self, payloads, shape, dtype, step, name):
        out = np.zeros(int(np.prod(shape)), dtype)
        out[self._indices(out.size, step, name)] = payloads[0]
        return out.reshape(shape)

    def settings(self):
        return {"k": self.k, "seed": self.seed}


class Identity(Compressor):
    def compress(self, x, step, name):
        return [x]

    def decompress(self, payloads, shape, dtype, step, name):
        return payloads[0]


class SummedRandomK(RandomK):
    """The same random-k through the "allreduce" communicator (its payloads hold the
    same entries on every rank, and decompress is linear in them)."""

    communicator = "allreduce"


hvdx.register_compressor("tf_scaled_sign", ScaledSign)
hvdx.register_compressor("tf_summed_random_k", SummedRandomK)
hvdx.register_compressor("tf_random_k", RandomK)
hvdx.register_compressor("tf_identity", Identity)

SHAPES = [(4, 3), (3,)]
NAMES = [f"variable[{i}]" for i in range(len(SHAPES))]  # how TensorFlow keys them


def gradient(rank, step, t):
    rng = np.random.default_rng([rank, step, t])
    return rng.standard_normal(SHAPES[t]).astype(np.float32)


def reference(compressor, steps, first=0):
    """The averages of steps ``first`` ... for the whole job, computed here."""
    size = hvd.size()
    residuals = [[np.zeros(s, np.float32) for s in SHAPES] for _ in range(size)]
    history = []
    for step in range(first, first + steps):
        averages = []
        for t, (name, shape) in enumerate(zip(NAMES, SHAPES)):
            decoded = []
            for r in range(size):
                corrected = gradient(r, step, t) + residuals[r][t]
                mine = compressor.decompress(compressor.compress(corrected, step, name),
                                             shape, np.dtype(np.float32), step, name)
                residuals[r][t] = corrected - mine
                decoded.append(mine)
            total = decoded[0].copy()
            for d in decoded[1:]:
                total = total + d
            averages.append(total / np.float32(size))
        history.append(averages)
    return history


def variables():
    return [tf.Variable(tf.zeros(s)) for s in SHAPES]


def tape_step(ws, compiled, **arguments):
    def step(*grads):
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(w * g) for w, g in zip(ws, grads)])
        return hvd.DistributedGradientTape(tape, **arguments).gradient(loss, ws)

    return tf.function(step) if compiled else step


def run_tape(step, steps, first=0):
    return [[g.numpy() for g in step(*[tf.constant(gradient(hvd.rank(), s, t))
                                       for t in range(len(SHAPES))])]
            for s in range(first, first + steps)]


def assert_close(got, expected):
    for a, b in zip(got, expected):
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("compressor, build", [
    (ScaledSign(0.5), lambda: hvd.Compression.tf_scaled_sign(scale=0.5)),
    (RandomK(5, seed=7), lambda: hvd.Compression.tf_random_k(5, seed=7)),
])
def test_the_tape_gives_the_numpy_reference(compressor, build, compiled):
    ws = variables()
    spec = build()
    assert isinstance(spec, UserCompression)
    got = run_tape(tape_step(ws, compiled, compression=spec), 4)
    assert_close(got, reference(compressor, 4))
    assert hvd.compression_state(ws).step == 4


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
def test_the_allreduce_communicator_gives_the_numpy_reference(compiled):
    ws = variables()
    got = run_tape(tape_step(ws, compiled,
                             compression=hvd.Compression.tf_summed_random_k(5, seed=7)), 4)
    assert_close(got, reference(RandomK(5, seed=7), 4))
    assert hvd.compression_state(ws).step == 4


@pytest.mark.mpi(min_size=1)
def test_the_identity_compressor_is_horovods_average():
    ws = variables()
    ours = run_tape(tape_step(ws, False, compression=hvd.Compression.tf_identity()), 2)
    theirs = run_tape(tape_step(ws, False), 2)
    assert_close(ours, theirs)


def keras_steps(optimizer, ws, steps, first=0):
    for s in range(first, first + steps):
        g = [tf.constant(gradient(hvd.rank(), s, t)) for t in range(len(SHAPES))]
        optimizer.minimize(lambda: tf.add_n([tf.reduce_sum(w * x) for w, x in zip(ws, g)]),
                           ws)


@pytest.fixture
def directory():
    path = tempfile.mkdtemp(prefix=f"hvdx_user_compression_{hvd.rank()}_")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.mpi(min_size=1)
def test_keras_trains_as_the_reference_and_its_checkpoint_resumes_bitwise(directory):
    def make():
        return hvd_keras.DistributedOptimizer(
            tf.keras.optimizers.SGD(0.1),
            compression=hvd_keras.Compression.tf_random_k(4, seed=2))

    ws, optimizer = variables(), make()
    keras_steps(optimizer, ws, 3)
    assert optimizer.hvdx_compression.step == 3
    expected = [np.zeros(s, np.float32) for s in SHAPES]
    for averages in reference(RandomK(4, seed=2), 3):
        expected = [e - np.float32(0.1) * a for e, a in zip(expected, averages)]
    for w, e in zip(ws, expected):
        np.testing.assert_allclose(w.numpy(), e, rtol=1e-5, atol=1e-6)

    path = tf.train.Checkpoint(optimizer=optimizer).write(f"{directory}/ckpt")
    saved = [w.numpy() for w in ws]
    keras_steps(optimizer, ws, 2, first=3)

    resumed_ws, resumed = [tf.Variable(s) for s in saved], make()
    tf.train.Checkpoint(optimizer=resumed).read(path).expect_partial()
    assert resumed.hvdx_compression.step == 3
    keras_steps(resumed, resumed_ws, 2, first=3)
    for a, b in zip(ws, resumed_ws):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert resumed.hvdx_compression.step == 5


@pytest.mark.mpi(min_size=1)
def test_the_tapes_state_checkpoint_resumes_bitwise(directory):
    spec = hvd.Compression.tf_random_k(4, seed=5)
    ws = variables()
    state = hvd.compression_state(ws)
    step = tape_step(ws, False, compression=spec)
    run_tape(step, 2)
    path = tf.train.Checkpoint(compression=state).write(f"{directory}/ckpt")
    after = run_tape(step, 3, first=2)

    other = variables()
    restored = hvd.compression_state(other)
    assert restored is not state
    tf.train.Checkpoint(compression=restored).read(path).assert_consumed()
    again = run_tape(tape_step(other, False, compression=spec), 3, first=2)
    for a, b in zip(after, again):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert restored.step == state.step == 5


@pytest.mark.mpi(min_size=1)
def test_a_non_finite_gradient_on_one_rank_makes_every_gradient_nan():
    ws = variables()
    step = tape_step(ws, False, compression=hvd.Compression.tf_scaled_sign())
    run_tape(step, 1)
    state = hvd.compression_state(ws)
    before = {n: r.copy() for n, r in state.synchronizer.residuals.items()}
    grads = [gradient(hvd.rank(), 1, t) for t in range(len(SHAPES))]
    if hvd.rank() == hvd.size() - 1:
        grads[1][0] = np.inf
    out = step(*[tf.constant(g) for g in grads])
    assert all(np.isnan(g.numpy()).all() for g in out)
    assert state.step == 1
    for n, r in state.synchronizer.residuals.items():
        np.testing.assert_array_equal(r, before[n])


@pytest.mark.mpi(min_size=1)
def test_hvdx_compression_picks_the_registered_compressor():
    ws = variables()
    with hvdx_variables(compression="tf_scaled_sign(scale=0.5)"):
        got = run_tape(tape_step(ws, False), 3)
    assert_close(got, reference(ScaledSign(0.5), 3))
    assert hvd.compression_state(ws).step == 3


def first_step(entry, **arguments):
    x = tf.Variable(tf.ones([4]))
    if entry == "keras":
        opt = hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(), **arguments)
        opt.minimize(lambda: tf.reduce_sum(x ** 2), [x])
        return
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(x ** 2)
    hvd.DistributedGradientTape(tape, **arguments).gradient(loss, [x])


def refused_everywhere(entry, **arguments):
    with pytest.raises(ValueError) as info:
        first_step(entry, **arguments)
    message = str(info.value)
    assert len(set(hvd.allgather_object(message))) == 1
    return message


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("entry", ["tape", "keras"])
def test_another_setting_on_one_rank_fails_on_every_rank(entry):
    last = hvd.rank() == hvd.size() - 1
    message = refused_everywhere(
        entry, compression=hvd.Compression.tf_random_k(3, seed=1 if last else 0))
    assert "seed" in message


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("entry", ["tape", "keras"])
def test_a_bad_argument_on_one_rank_fails_on_every_rank(entry):
    last = hvd.rank() == hvd.size() - 1
    message = refused_everywhere(
        entry, compression=hvd.Compression.tf_scaled_sign(-1.0 if last else 1.0))
    assert "scale=-1.0 must be positive" in message


@pytest.mark.mpi(min_size=2)
def test_another_value_of_the_variable_on_one_rank_fails_on_every_rank():
    last = hvd.rank() == hvd.size() - 1
    with hvdx_variables(compression=f"tf_scaled_sign({2.0 if last else 1.0})"):
        message = refused_everywhere("tape")
    assert "HVDX_COMPRESSION" in message


@pytest.mark.mpi(min_size=1)
def test_keras_fit_with_two_passes_per_step_trains_alike_on_every_rank():
    """model.fit (a traced step) with Horovod's local aggregation of two passes: the
    compressor sees the sum every second pass, and every rank ends with the same
    weights."""
    model = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(3)])
    model.set_weights(hvd.broadcast_object(model.get_weights(), root_rank=0))
    start = model.get_weights()
    optimizer = hvd_keras.DistributedOptimizer(
        tf.keras.optimizers.SGD(0.05), backward_passes_per_step=2,
        compression=hvd_keras.Compression.tf_scaled_sign(0.5))
    model.compile(optimizer=optimizer, loss="mse")
    rng = np.random.default_rng(hvd.rank())
    x = rng.standard_normal((32, 6)).astype(np.float32)
    y = rng.standard_normal((32, 3)).astype(np.float32)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert optimizer.hvdx_compression.step == 2
    for w, w0 in zip(model.get_weights(), start):
        assert not np.array_equal(w, w0)
        everyone = hvd.allgather_object(w)
        assert all(np.array_equal(everyone[0], e) for e in everyone)


@pytest.mark.mpi(min_size=1)
def test_a_spec_built_inside_a_tf_function_is_the_same_compression():
    ws = variables()

    @tf.function
    def step(*grads):
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(w * g) for w, g in zip(ws, grads)])
        tape = hvd.DistributedGradientTape(
            tape, compression=hvd.Compression.tf_scaled_sign(scale=0.5))
        return tape.gradient(loss, ws)

    assert_close(run_tape(step, 3), reference(ScaledSign(0.5), 3))
    assert hvd.Compression.tf_scaled_sign.hvdx_builds == "compression"


# At 2 ranks only, as the step log's test of Horovod's and TopK's tapes
# (tests/mpi/tensorflow/test_tf_dropin.py).
@pytest.mark.mpi(min_size=2)
@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() != 2, reason="run at 2 ranks")
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
def test_the_step_log_counts_a_registered_compressors_bytes(compiled, monkeypatch,
                                                            tmp_path):
    """HVDX_BENCH_STEP_LOG (``hvdx bench --script``): a tape running a registered
    compressor logs its byte counters (``hvdx_stats``), as TopK's tape and PyTorch's
    optimizer do, and the gradients are the reference's."""
    monkeypatch.setenv(step_log.VARIABLE, str(tmp_path / "steps"))
    monkeypatch.setattr(step_log, "_WATCHES", [])
    monkeypatch.setattr(step_log, "_RANK", [])
    monkeypatch.setattr(step_log, "_TF_WATCHES", {})
    monkeypatch.setattr(step_log, "atexit", types.SimpleNamespace(register=lambda *a: None))
    ws = variables()
    got = run_tape(tape_step(ws, compiled, compression=hvd.Compression.tf_random_k(5, seed=3)),
                   3)
    monkeypatch.delenv(step_log.VARIABLE)
    assert_close(got, reference(RandomK(5, seed=3), 3))
    [watch] = step_log._WATCHES
    figures = watch.figures()
    assert len(figures["times"]) == 3
    stats = hvd.compression_state(ws).stats
    assert figures["hvdx_stats"] == {"total_sent": float(stats.total_sent),
                                     "total_received": float(stats.total_received),
                                     "steps": 3.0}
    assert stats.total_sent > 0 and stats.total_received > 0


@pytest.mark.mpi(min_size=1)
def test_keras_carries_a_registered_compressors_counters():
    optimizer = hvd_keras.DistributedOptimizer(
        tf.keras.optimizers.SGD(0.1), compression=hvd_keras.Compression.tf_random_k(4))
    assert optimizer.hvdx_stats is optimizer.hvdx_compression.stats
    keras_steps(optimizer, variables(), 2)
    # Alone, Horovod's Keras optimizer reduces nothing, and so nothing is sent.
    assert optimizer.hvdx_stats.steps == 2
    assert (optimizer.hvdx_stats.total_sent > 0) == (hvd.size() > 1)
