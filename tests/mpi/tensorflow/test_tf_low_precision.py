"""The built-in low-precision compressions, ``hvd.Compression.int8`` and
``hvd.Compression.sign``, run by the TensorFlow tape (eager) on a small model.

Every rank's batch comes from a generator seeded with its rank and the step, so each
rank computes every rank's local gradient from the current variables, and the test
simulates the job's step in numpy (each rank's error feedback, the average over the
ranks) with the algorithms written out here.
"""

import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

import hvdx.tensorflow as hvd
from hvdx.strategies.low_precision.spec import Int8Compression, SignCompression

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from low_precision_reference import int8_round_trip, sign_round_trip  # noqa: E402
from hvdx_variables import hvdx_variables  # noqa: E402

pytestmark = [pytest.mark.up_to_two_ranks("the compressors against their numpy reference"),
              pytest.mark.int8, pytest.mark.sign, pytest.mark.user_compression]

LR = np.float32(0.1)


CASES = [(lambda: hvd.Compression.int8(chunk=4), int8_round_trip, Int8Compression),
         (lambda: hvd.Compression.sign(), sign_round_trip, SignCompression)]
IDS = ["int8", "sign"]


def batch(rank, step):
    rng = np.random.default_rng([rank, step])
    return (tf.constant(rng.standard_normal((6, 4)).astype(np.float32)),
            tf.constant(rng.standard_normal((6, 3)).astype(np.float32)))


def loss_of(variables, rank, step):
    x, y = batch(rank, step)
    weight, bias = variables
    return tf.reduce_mean((tf.matmul(x, weight) + bias - y) ** 2)


def model():
    return [tf.Variable(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)),
            tf.Variable(np.zeros(3, np.float32))]


def local_gradients(variables, rank, step):
    """Rank ``rank``'s gradient at the current variables (a plain tape)."""
    with tf.GradientTape() as tape:
        loss = loss_of(variables, rank, step)
    return [g.numpy() for g in tape.gradient(loss, variables)]


def train(variables, spec, steps, first=0, round_trip=None, residuals=None):
    """``steps`` SGD steps through ``DistributedGradientTape``; with ``round_trip``,
    each step's averaged gradient is checked against the numpy simulation, which
    carries ``residuals``."""
    for step in range(first, first + steps):
        expected = None
        if round_trip is not None:
            every = [local_gradients(variables, r, step) for r in range(hvd.size())]
            expected = []
            for t in range(len(variables)):
                decoded = []
                for r in range(hvd.size()):
                    corrected = every[r][t] + residuals[r].get(t, np.float32(0))
                    decoded.append(round_trip(corrected))
                    residuals[r][t] = corrected - decoded[-1]
                total = decoded[0].copy()
                for d in decoded[1:]:
                    total = total + d
                expected.append(total / np.float32(hvd.size()))
        with tf.GradientTape() as tape:
            loss = loss_of(variables, hvd.rank(), step)
        grads = hvd.DistributedGradientTape(tape, compression=spec).gradient(loss, variables)
        if expected is not None:
            for g, e in zip(grads, expected):
                np.testing.assert_allclose(g.numpy(), e, rtol=1e-5, atol=1e-7)
        for v, g in zip(variables, grads):
            v.assign_sub(LR * g)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("build, round_trip, kind", CASES, ids=IDS)
def test_three_tape_steps_average_the_numpy_simulation_of_every_rank(build, round_trip,
                                                                      kind):
    variables, spec = model(), build()
    assert type(spec) is kind
    residuals = [{} for _ in range(hvd.size())]
    train(variables, spec, 3, round_trip=round_trip, residuals=residuals)
    assert hvd.compression_state(variables).step == 3


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("value, build", [
    ("int8(chunk=4)", lambda: hvd.Compression.int8(chunk=4)),
    ("sign", lambda: hvd.Compression.sign()),
])
def test_hvdx_compression_picks_them(value, build):
    in_code = model()
    train(in_code, build(), 3)
    chosen = model()
    with hvdx_variables(compression=value):
        train(chosen, hvd.Compression.none, 3)
    for a, b in zip(in_code, chosen):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
