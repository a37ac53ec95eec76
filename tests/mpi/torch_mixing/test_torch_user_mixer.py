"""A mixer of the user's own, defined here and registered with ``hvdx.register_mixer``,
runs in torch's ``DistributedOptimizer(sync=...)`` as the built-in mixers do.

Checked against a few lines of numpy that simulate every rank: quadratic losses
``0.5 ||x - c_r||^2`` (gradient ``x - c_r``), plain SGD, then the mix. Also: the mixer
chosen by ``HVDX_SYNC``, a different mixer or argument on one rank refused on every
rank, a matrix that differs between ranks (or fails on one) at a later step refused on
every rank, and the step counter and the mixer's own state through ``state_dict()``.
"""

import numpy as np
import pytest
import torch

import hvdx
import hvdx.torch as hvd
from hvdx.mixer_registry import UserMixing

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
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


class RandomPartner(hvdx.Mixer):
    """The README's example: average with one random partner, seeded alike."""

    def __init__(self, seed=0):
        self.seed = seed

    def settings(self):
        return {"seed": self.seed}

    def matrix(self, step, size):
        order = np.random.default_rng([self.seed, step]).permutation(size)
        w = np.eye(size)
        for a, b in zip(order[0::2], order[1::2]):
            w[[a, a, b, b], [a, b, a, b]] = 0.5
        return w


class RankDependentLater(hvdx.Mixer):
    """Agrees at step 0 (checked when the optimizer is built), then rank 1 draws its own
    matrix from step 2: the mistake the check at every step refuses."""

    def matrix(self, step, size):
        if step >= 2 and hvd.rank() == 1:
            return np.full((size, size), 1.0 / size)
        return Gossip(0.25).matrix(step, size)


class FailsLater(hvdx.Mixer):
    """Rank 1's matrix raises at step 2."""

    def matrix(self, step, size):
        if step == 2 and hvd.rank() == 1:
            raise RuntimeError("no matrix today")
        return np.eye(size)


hvdx.register_mixer("test_gossip", Gossip)
hvdx.register_mixer("test_pull", PullToMean)
hvdx.register_mixer("test_partner", RandomPartner)
hvdx.register_mixer("test_rank_dependent", RankDependentLater)
hvdx.register_mixer("test_fails_later", FailsLater)

SHAPES = [(3,), (2, 2)]
LR = 0.1


def targets(rank):
    return [np.arange(np.prod(s), dtype=np.float64).reshape(s) + 2.0 * rank + 1 + k
            for k, s in enumerate(SHAPES)]


def reference(matrix_at, steps, n, global_every=0, order="adapt_then_combine",
              start=0, x=None):
    """Every rank's parameters after ``steps`` steps, in numpy (float64)."""
    x = [[np.ones(s) for s in SHAPES] for _ in range(n)] if x is None else x
    for t in range(start, start + steps):
        grads = [[p - c for p, c in zip(x[r], targets(r))] for r in range(n)]
        if order == "combine_then_adapt":
            x = mixed(x, t, matrix_at, n, global_every)
            x = [[p - LR * g for p, g in zip(x[r], grads[r])] for r in range(n)]
        else:
            x = [[p - LR * g for p, g in zip(x[r], grads[r])] for r in range(n)]
            x = mixed(x, t, matrix_at, n, global_every)
    return x


def mixed(x, t, matrix_at, n, global_every):
    if global_every and (t + 1) % global_every == 0:
        w = np.full((n, n), 1.0 / n)
    else:
        w = matrix_at(t, n)
    return [[sum(w[i, j] * x[j][k] for j in range(n)) for k in range(len(SHAPES))]
            for i in range(n)]


def pull_matrix(a):
    return lambda t, n: (1 - a) * np.eye(n) + a * np.full((n, n), 1.0 / n)


def build(sync=None, params=None):
    params = [torch.nn.Parameter(torch.ones(s) if params is None else
                                 torch.tensor(params[k], dtype=torch.float32))
              for k, s in enumerate(SHAPES)]
    named = [(f"p{k}", p) for k, p in enumerate(params)]
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=LR),
                                         named_parameters=named,
                                         **({} if sync is None else {"sync": sync}))
    return optimizer, params


def train(optimizer, params, steps):
    c = [torch.tensor(t, dtype=torch.float32) for t in targets(hvd.rank())]
    for _ in range(steps):
        optimizer.zero_grad()
        sum(0.5 * ((p - t) ** 2).sum() for p, t in zip(params, c)).backward()
        optimizer.step()
    return [p.detach().numpy().astype(np.float64) for p in params]


def close(got, expected):
    return all(np.allclose(g, e, rtol=1e-5, atol=1e-5) for g, e in zip(got, expected))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("sync, matrix_at, global_every", [
    (lambda: hvdx.mixer("test_gossip", a=0.25), Gossip(0.25).matrix, 0),
    (lambda: hvdx.mixer("test_gossip", 0.4, global_every=3), Gossip(0.4).matrix, 3),
    (lambda: hvdx.mixer("test_pull", a=0.5), pull_matrix(0.5), 0),
    (lambda: hvdx.mixer("test_partner", seed=7), RandomPartner(7).matrix, 0),
], ids=["gossip", "gossip-global_every", "free-form", "random-partner"])
def test_a_registered_mixer_trains_as_the_numpy_reference(sync, matrix_at, global_every):
    optimizer, params = build(sync())
    got = train(optimizer, params, 5)
    expected = reference(matrix_at, 5, hvd.size(), global_every)[hvd.rank()]
    assert close(got, expected), (got, expected)
    assert optimizer.state_dict()["hvdx_mixer"]["step"] == 5


@pytest.mark.mpi(min_size=1)
def test_hvdx_sync_names_a_registered_mixer():
    with hvdx_variables(sync="test_gossip(a=0.25, global_every=2)"):
        optimizer, params = build()
        assert isinstance(optimizer.hvdx_strategy, UserMixing)
        assert optimizer.hvdx_strategy.global_every == 2
        got = train(optimizer, params, 4)
    expected = reference(Gossip(0.25).matrix, 4, hvd.size(), 2)[hvd.rank()]
    assert close(got, expected)


class RegisteredLater(Gossip):
    """Registered by the test after ``hvd.init``'s check of ``HVDX_SYNC``."""


@pytest.mark.mpi(min_size=1)
def test_a_mixer_named_in_hvdx_sync_may_be_registered_after_init():
    """As a compressor may: ``hvd.init`` leaves a name it does not know to the entry
    point, which runs it once the script has registered it."""
    from hvdx import environment
    from hvdx.mpi.init_environment import init_arguments

    with hvdx_variables(sync="test_registered_later(a=0.25)"):
        assert init_arguments((), {}, environment.check_at_init) == ((), {})
        hvdx.register_mixer("test_registered_later", RegisteredLater)
        optimizer, params = build()
        assert optimizer.hvdx_strategy.cls is RegisteredLater
        got = train(optimizer, params, 3)
    assert close(got, reference(Gossip(0.25).matrix, 3, hvd.size())[hvd.rank()])


@pytest.mark.mpi(min_size=1)
def test_synchronize_parameters_and_swa_come_from_the_shared_wrapper():
    optimizer, params = build(hvdx.mixer("test_gossip", a=0.25, swa_start=2))
    train(optimizer, params, 4)
    optimizer.synchronize_parameters(swa=True)
    values = [p.detach().numpy() for p in params]
    gathered = hvd.allgather_object(values)
    assert all(close(v, gathered[0]) for v in gathered)
    # the SWA mean of steps 2 and 3, averaged over the ranks
    x2 = reference(Gossip(0.25).matrix, 3, hvd.size())
    x3 = reference(Gossip(0.25).matrix, 4, hvd.size())
    n = hvd.size()
    expected = [sum(0.5 * (x2[r][k] + x3[r][k]) for r in range(n)) / n
                for k in range(len(SHAPES))]
    assert close(values, expected)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("wrong, text", [
    (lambda: hvdx.mixer("test_gossip", a=0.3), "0.3"),
    (lambda: hvdx.mixer("test_pull", a=0.25), "PullToMean"),
    (lambda: hvdx.mixer("test_gossip", a=0.25, global_every=2), "global_every"),
    (lambda: hvdx.mixer("test_gossip", a=2.0), "a=2.0"),
], ids=["argument", "class", "option", "invalid"])
def test_a_different_mixer_on_one_rank_is_refused_on_every_rank(wrong, text):
    sync = wrong() if hvd.rank() == 1 else hvdx.mixer("test_gossip", a=0.25)
    with pytest.raises(ValueError) as info:
        build(sync)
    message = str(info.value)
    assert text in message
    assert len(set(hvd.allgather_object(message))) == 1
    total = hvd.allreduce(torch.ones(2), op=hvd.Sum, name=f"after.user_mixer.{text}")
    assert torch.equal(total, torch.full((2,), float(hvd.size())))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name, text", [
    ("test_rank_dependent", "RankDependentLater.matrix(step=2) differs between ranks"),
    ("test_fails_later", "rank 1: FailsLater.matrix(step=2) raised RuntimeError: no "
                         "matrix today")])
def test_a_matrix_that_differs_or_fails_at_a_later_step_is_refused_on_every_rank(name,
                                                                                 text):
    """Every step, not only at construction: ranks holding different matrices would
    each wait for messages the others never send."""
    optimizer, params = build(hvdx.mixer(name))
    train(optimizer, params, 2)  # steps 0 and 1 agree
    with pytest.raises(ValueError) as info:
        train(optimizer, params, 1)
    message = str(info.value)
    assert text in message
    assert len(set(hvd.allgather_object(message))) == 1
    total = hvd.allreduce(torch.ones(2), op=hvd.Sum, name=f"after.{name}")
    assert torch.equal(total, torch.full((2,), float(hvd.size())))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", ["test_gossip", "test_pull"])
def test_the_step_and_the_mixers_state_go_through_a_checkpoint(name):
    optimizer, params = build(hvdx.mixer(name))
    middle = train(optimizer, params, 3)
    saved = optimizer.state_dict()
    assert saved["hvdx_mixer"]["step"] == 3
    if name == "test_pull":
        assert saved["hvdx_mixer"]["mixer"] == {"count": 3}
    uninterrupted = train(optimizer, params, 2)

    resumed, params = build(hvdx.mixer(name), params=middle)
    resumed.load_state_dict(saved)
    assert resumed._hvdx_mixer.step == 3
    if name == "test_pull":
        assert resumed.hvdx_strategy.mixer.count == 3
    assert close(train(resumed, params, 2), uninterrupted)
