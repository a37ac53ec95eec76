"""A mixer of the user's own, defined here and registered with ``hvdx.register_mixer``,
runs in TensorFlow's ``DistributedGradientTape`` and Keras' ``DistributedOptimizer``
(``sync=...``) as the built-in mixers do.

Checked against a few lines of numpy that simulate every rank: one variable on a
quadratic ``0.5 |x - c_r|^2`` (gradient ``x - c_r``), plain SGD; the Keras optimizer
steps then mixes, the tape mixes ``x_t`` then the optimizer applies ``g(x_t)``. Also:
the mixer chosen by ``HVDX_SYNC``, a different mixer or argument on one rank refused
on every rank, a matrix that differs between ranks at a later step refused on every
rank, and the step counter and the mixer's own state through a
``tf.train.Checkpoint``.
"""

import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf
from mpi4py import MPI

import hvdx
import hvdx.tensorflow as hvd
from hvdx.mixer_registry import UserMixing
from hvdx.tensorflow import mixer_state

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import quadratic_steps  # noqa: E402
from hvdx_variables import hvdx_variables  # noqa: E402

pytestmark = [pytest.mark.user_mixer]


class Gossip(hvdx.Mixer):
    """On even steps ``x_i <- (1 - a) x_i + a x_{i-1}`` (a cyclic shift; doubly
    stochastic), odd steps local only."""

    def __init__(self, a=0.25):
        if not 0 <= a <= 1:
            raise ValueError(f"a={a!r} must lie in [0, 1]")
        self.a = a

    def settings(self):
        return {"a": self.a}

    def matrix(self, step, size):
        if step % 2:
            return np.eye(size)
        return (1 - self.a) * np.eye(size) + self.a * np.roll(np.eye(size), 1, axis=1)


class PullToMean(hvdx.Mixer):
    """A free-form mixer: ``x <- (1 - a) x + a mean_r(x)``, counting its mixes (its
    own state, checkpointed)."""

    def __init__(self, a=0.5):
        self.a = a
        self.count = 0

    def settings(self):
        return {"a": self.a}

    def mix(self, step, arrays, peers):
        self.count += 1
        means = peers.average(arrays)
        return [(1 - self.a) * x + self.a * m for x, m in zip(arrays, means)]

    def state(self):
        return {"count": self.count}

    def load_state(self, state):
        self.count = state.get("count", 0)


class RankDependentLater(hvdx.Mixer):
    """Agrees at step 0, then rank 1 draws its own matrix from step 2."""

    def matrix(self, step, size):
        if step >= 2 and hvd.rank() == 1:
            return np.full((size, size), 1.0 / size)
        return Gossip(0.25).matrix(step, size)


hvdx.register_mixer("tf_test_gossip", Gossip)
hvdx.register_mixer("tf_test_pull", PullToMean)
hvdx.register_mixer("tf_test_rank_dependent", RankDependentLater)

LR = 0.1
ENTRIES = ["keras-eager", "keras-function", "tape-eager", "tape-function"]


def centres(n, d=3):
    return np.stack([np.arange(d, dtype=np.float64) + 2.0 * r + 1 for r in range(n)])


def reference(matrix_at, steps, n, order, global_every=0):
    """Every rank's ``x`` after ``steps`` steps, in numpy (float64)."""
    c = centres(n)
    x = np.ones_like(c)
    for t in range(steps):
        w = np.full((n, n), 1.0 / n) if global_every and (t + 1) % global_every == 0 \
            else matrix_at(t, n)
        g = x - c
        x = w @ x - LR * g if order == "combine_then_adapt" else w @ (x - LR * g)
    return x


def pull_matrix(a):
    return lambda t, n: (1 - a) * np.eye(n) + a * np.full((n, n), 1.0 / n)


def order_of(entry):
    return "combine_then_adapt" if entry.startswith("tape") else "adapt_then_combine"


def trainer(entry, sync, x):
    """The step function and a function giving the state (Keras': the optimizer's)."""
    step, optimizer = quadratic_steps.trainer(entry, sync, x, centres(hvd.size())[
        hvd.rank()].astype(np.float32), LR)
    if optimizer is not None:
        return step, lambda: optimizer.hvdx_mixer
    return step, lambda: None if sync is None else mixer_state(sync)


def run(entry, sync, steps):
    x = tf.Variable(np.ones(3, np.float32))
    step, state = trainer(entry, sync, x)
    for _ in range(steps):
        step()
    return x.numpy().astype(np.float64), state()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("sync, matrix_at, global_every", [
    (lambda: hvdx.mixer("tf_test_gossip", a=0.25), Gossip(0.25).matrix, 0),
    (lambda: hvdx.mixer("tf_test_gossip", 0.4, global_every=3), Gossip(0.4).matrix, 3),
    (lambda: hvdx.mixer("tf_test_pull", a=0.5), pull_matrix(0.5), 0),
], ids=["gossip", "gossip-global_every", "free-form"])
def test_a_registered_mixer_trains_as_the_numpy_reference(entry, sync, matrix_at,
                                                          global_every):
    got, state = run(entry, sync(), 5)
    expected = reference(matrix_at, 5, hvd.size(), order_of(entry), global_every)
    np.testing.assert_allclose(got, expected[hvd.rank()], rtol=1e-5, atol=1e-5)
    assert int(state.step.numpy()) == 5


@pytest.mark.up_to_two_ranks("the environment's value")
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("entry", ["keras-function", "tape-eager"])
def test_hvdx_sync_names_a_registered_mixer(entry):
    with hvdx_variables(sync="tf_test_gossip(a=0.25, global_every=2)"):
        got, state = run(entry, None, 4)
        if state is not None:  # the Keras optimizer's (a tape's lives on its spec)
            assert isinstance(state._sync, UserMixing) and state._sync.global_every == 2
    expected = reference(Gossip(0.25).matrix, 4, hvd.size(), order_of(entry), 2)
    np.testing.assert_allclose(got, expected[hvd.rank()], rtol=1e-5, atol=1e-5)


@pytest.mark.up_to_two_ranks("the shared state's helpers")
@pytest.mark.mpi(min_size=1)
def test_synchronize_parameters_and_swa_come_from_the_shared_state():
    x = tf.Variable(np.ones(3, np.float32))
    step, state = trainer("keras-eager", hvdx.mixer("tf_test_gossip", swa_start=2), x)
    for _ in range(4):
        step()
    state().synchronize_parameters(swa=True)
    n = hvd.size()
    order = "adapt_then_combine"
    mean = 0.5 * (reference(Gossip(0.25).matrix, 3, n, order) +
                  reference(Gossip(0.25).matrix, 4, n, order))
    np.testing.assert_allclose(x.numpy(), mean.mean(axis=0), rtol=1e-5, atol=1e-5)


@pytest.mark.up_to_two_ranks('a refusal')
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("entry", ["keras-eager", "tape-eager"])
@pytest.mark.parametrize("wrong, text", [
    (lambda: hvdx.mixer("tf_test_gossip", a=0.3), "0.3"),
    (lambda: hvdx.mixer("tf_test_pull", a=0.25), "PullToMean"),
    (lambda: hvdx.mixer("tf_test_gossip", a=2.0), "a=2.0"),
], ids=["argument", "class", "invalid"])
def test_a_different_mixer_on_one_rank_is_refused_on_every_rank(entry, wrong, text):
    sync = wrong() if hvd.rank() == 1 else hvdx.mixer("tf_test_gossip", a=0.25)
    with pytest.raises(ValueError) as info:
        run(entry, sync, 1)
    message = str(info.value)
    assert text in message
    assert len(set(MPI.COMM_WORLD.allgather(message))) == 1
    total = hvd.allreduce(tf.ones(2), op=hvd.Sum, name=f"after.user_mixer.{entry}.{text}")
    np.testing.assert_array_equal(total.numpy(), np.full(2, float(hvd.size())))


@pytest.mark.up_to_two_ranks('a refusal')
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("entry", ["keras-eager", "tape-function"])
def test_a_matrix_that_differs_at_a_later_step_is_refused_on_every_rank(entry):
    """Checked at every step, inside the mixing py_function too: TensorFlow reports
    the error as its own (an OpError, inside tf.function), with hvdx's message."""
    x = tf.Variable(np.ones(3, np.float32))
    step, _ = trainer(entry, hvdx.mixer("tf_test_rank_dependent"), x)
    step()
    step()  # steps 0 and 1 agree
    with pytest.raises((ValueError, tf.errors.OpError)) as info:
        step()
    message = str(info.value)
    assert "RankDependentLater.matrix(step=2) differs between ranks" in message
    total = hvd.allreduce(tf.ones(2), op=hvd.Sum, name=f"after.rank_dependent.{entry}")
    np.testing.assert_array_equal(total.numpy(), np.full(2, float(hvd.size())))


@pytest.mark.up_to_two_ranks('a checkpoint round trip')
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("entry", ["keras-function", "tape-eager"])
@pytest.mark.parametrize("name", ["tf_test_gossip", "tf_test_pull"])
def test_the_step_and_the_mixers_state_go_through_a_checkpoint(entry, name, tmp_path):
    path = MPI.COMM_WORLD.bcast(str(tmp_path), root=0) + f"/rank{hvd.rank()}"

    def go(steps, restore=None, save=None):
        x = tf.Variable(np.ones(3, np.float32))
        sync = hvdx.mixer(name)
        step, state = trainer(entry, sync, x)
        if restore:
            tf.train.Checkpoint(x=x, hvdx=state()).read(restore)
        for _ in range(steps):
            step()
        if save:
            tf.train.Checkpoint(x=x, hvdx=state()).write(save)
        return x.numpy(), state()

    straight, _ = go(5)
    go(3, save=path)
    resumed, state = go(2, restore=path)
    np.testing.assert_array_equal(resumed, straight)
    assert int(state.step.numpy()) == 5
    if name == "tf_test_pull":
        assert state._sync.mixer.count == 5
