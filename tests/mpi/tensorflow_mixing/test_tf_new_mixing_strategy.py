"""A new built-in mixing strategy is its folder and one catalogue line, in TensorFlow
too: the complete example of docs/design.md (a ring, tests/mpi/ring_strategy.py) trains
under Keras' ``DistributedOptimizer`` (adapt-then-combine) and the tape
(combine-then-adapt), eagerly and in ``tf.function``, through the shared mixing driver.

Checked against numpy that simulates every rank with the ring's matrix written out
here: quadratic losses ``0.5 ||x - c_r||^2``, SGD, ``x_i <- mean(x_{i-1}, x_i,
x_{i+1})``, every ``global_every``-th step the mean over all ranks.
"""

import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

import hvdx.tensorflow as hvd
from hvdx.tensorflow.mixing_state import state_of

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import quadratic_steps  # noqa: E402
import ring_strategy  # noqa: E402
from ring_catalogue import add_the_ring, ring_matrix  # noqa: E402

LR = 0.1
ENTRIES = ["keras-eager", "keras-function", "tape-eager", "tape-function"]


@pytest.fixture
def ring_in_the_catalogue(monkeypatch):
    add_the_ring(monkeypatch)


def centres(n, d=3):
    return np.stack([np.arange(d, dtype=np.float64) - 3.0 * r for r in range(n)])


def reference(steps, n, order, global_every):
    c = centres(n)
    x = np.ones_like(c)
    for t in range(steps):
        w = np.full((n, n), 1.0 / n) if global_every and (t + 1) % global_every == 0 \
            else ring_matrix(n)
        g = x - c
        x = w @ x - LR * g if order == "combine_then_adapt" else w @ (x - LR * g)
    return x


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("global_every", [0, 3])
def test_the_example_ring_trains_as_the_numpy_reference(ring_in_the_catalogue, entry,
                                                        global_every):
    sync = ring_strategy.Ring(global_every=global_every)
    x = tf.Variable(np.ones(3, np.float32))
    step, optimizer = quadratic_steps.trainer(
        entry, sync, x, centres(hvd.size())[hvd.rank()].astype(np.float32), LR)
    for _ in range(5):
        step()
    order = "combine_then_adapt" if entry.startswith("tape") else "adapt_then_combine"
    expected = reference(5, hvd.size(), order, global_every)[hvd.rank()]
    assert np.allclose(x.numpy(), expected, rtol=1e-5, atol=1e-5), (x.numpy(), expected)
    state = optimizer.hvdx_ring if optimizer is not None else state_of(sync)
    assert int(state.step.numpy()) == 5
