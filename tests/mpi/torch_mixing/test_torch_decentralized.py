"""Decentralized SGD for torch: local steps, then neighbour averaging over a graph.

Every expectation here is computed in the test from explicit mixing matrices (a few
lines of numpy), never from hvdx's own graphs or reference. The dynamic graphs are
indexed by the mix ``m``, the number of mixes before this one: with ``mix_every=J`` the
step ``t`` mixes when ``(t + 1) % J == 0``, and the graph advances once per mix.
"""

import copy
import math
import pathlib
import sys

import horovod.torch
import numpy as np
import pytest
import torch
import torch.nn as nn

import hvdx
import hvdx.torch as hvd
from hvdx.strategies.decentralized.spec import Decentralized

STATE_KEY = Decentralized.state_key

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from spec_errors import refused  # noqa: E402

pytestmark = [pytest.mark.topk, pytest.mark.dssync, pytest.mark.decentralized]

LR = 0.3


# --- explicit matrices (x_new[i] = sum_j W[i, j] x[j]) ----------------------------------

def tau(n):
    return math.ceil(math.log2(n)) if n > 1 else 0


def one_peer_exp(n, m):
    """Mix ``m``: rank i averages with i - 2^(m mod log2 n) (and sends to i + 2^...)."""
    w = np.eye(n)
    if n == 1:
        return w
    k = m % tau(n)
    w *= 0.5
    for i in range(n):
        w[i, (i - 2 ** k) % n] += 0.5
    return w


def static_exp(n, m=0):
    w = np.eye(n)
    for i in range(n):
        for k in range(tau(n)):
            w[i, (i - 2 ** k) % n] += 1.0
    return w / (tau(n) + 1)


def hypercube(n, m):
    w = np.eye(n)
    if n == 1:
        return w
    k = m % tau(n)
    w = np.zeros((n, n))
    for i in range(n):
        w[i, i] += 0.5
        w[i, i ^ (2 ** k)] += 0.5
    return w


MATRICES = {"one-peer-exp": one_peer_exp, "static-exp": static_exp,
            "one-peer-hypercube": hypercube}


def mixes_before(t, mix_every):
    """How many of the steps 0 .. t-1 mixed, counted one by one."""
    return sum(1 for s in range(t) if (s + 1) % mix_every == 0)


# --- a model whose gradient is known: f_r(x) = 0.5 ||x - c_r||^2 --------------------------

def centre(rank, dim=6):
    return np.random.default_rng(50 + rank).normal(size=dim)


def start(rank, dim=6):
    return np.random.default_rng(500 + rank).normal(size=dim)


class Point(nn.Module):
    def __init__(self, x0):
        super().__init__()
        self.x = nn.Parameter(torch.tensor(x0, dtype=torch.float64))

    def forward(self, c):
        return 0.5 * ((self.x - c) ** 2).sum()


def point_optimizer(model, sync, lr=LR, **sgd):
    return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, **sgd),
                                    named_parameters=model.named_parameters(), sync=sync)


def train_point(model, opt, steps, rank):
    c = torch.tensor(centre(rank), dtype=torch.float64)
    for _ in range(steps):
        opt.zero_grad()
        model(c).backward()
        opt.step()


def everyone(vector, name):
    """Every rank's vector, rank by rank (n x d)."""
    return hvd.allgather(vector.detach().reshape(1, -1), name=name).numpy()


def power_of_two(n):
    return n & (n - 1) == 0


# --- identities -----------------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("graph", ["one-peer-exp", "one-peer-hypercube"])
@pytest.mark.parametrize("first, mix_every", [(0, 1), (1, 1), (2, 1), (0, 2), (3, 2),
                                              (1, 3)])
def test_one_peer_graphs_reach_exact_consensus_after_log2_n_mixes_from_any_step(
        graph, first, mix_every):
    # Any log2 n * mix_every consecutive steps hold log2 n consecutive mixes.
    n, rank = hvd.size(), hvd.rank()
    if not power_of_two(n):
        pytest.skip("exact averaging is promised for a power-of-two number of ranks")
    model = Point(start(rank))
    opt = point_optimizer(model, hvdx.Decentralized(graph, mix_every=mix_every), lr=0.0)
    opt.load_state_dict({**opt.state_dict(), STATE_KEY: {"step": first}})
    name = f"consensus.{graph}.{first}.{mix_every}"
    initial = everyone(model.x, name + ".before")
    train_point(model, opt, max(tau(n), 1) * mix_every, rank)
    opt.synchronize()
    after = everyone(model.x, name + ".after")
    assert np.abs(after - initial.mean(axis=0)).max() <= 1e-12
    np.testing.assert_allclose(after.mean(axis=0), initial.mean(axis=0), rtol=0, atol=1e-13)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("mix_every", [2, 3, 4])
@pytest.mark.parametrize("order", ["adapt_then_combine", "combine_then_adapt"])
def test_pure_mixing_every_j_steps_matches_the_product_of_one_peer_mixes(mix_every, order):
    # lr = 0: only the mixes move x. Mix m averages rank i with i - 2^(m mod log2 n),
    # so log2 n mixes average exactly; indexed by the step instead, 4 ranks mixing every
    # other step would only ever pair rank 0 with rank 2.
    n, rank = hvd.size(), hvd.rank()
    model = Point(start(rank))
    opt = point_optimizer(model, hvdx.Decentralized("one-peer-exp", order=order,
                                                    mix_every=mix_every), lr=0.0)
    mixes = max(tau(n), 1)
    train_point(model, opt, mixes * mix_every, rank)
    opt.synchronize()
    got = everyone(model.x, f"pure.{mix_every}.{order}")
    x = np.stack([start(r) for r in range(n)])
    product = np.eye(n)
    for m in range(mixes):
        product = one_peer_exp(n, m) @ product
    np.testing.assert_allclose(got, product @ x, rtol=0, atol=1e-12)
    if power_of_two(n):
        np.testing.assert_allclose(got, np.broadcast_to(x.mean(axis=0), got.shape),
                                   rtol=0, atol=1e-12)


@pytest.mark.mpi(min_size=1)
def test_complete_graph_from_identical_weights_is_horovod_synchronous_sgd():
    torch.manual_seed(0)
    initial = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2))
    ours, theirs = copy.deepcopy(initial), copy.deepcopy(initial)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(ours.parameters(), lr=0.1),
                                   named_parameters=ours.named_parameters(),
                                   sync=hvdx.Decentralized("complete"))
    ref = horovod.torch.DistributedOptimizer(torch.optim.SGD(theirs.parameters(), lr=0.1),
                                             named_parameters=theirs.named_parameters())
    for step in range(4):
        g = torch.Generator().manual_seed(100 * step + hvd.rank())
        x, y = torch.randn(8, 5, generator=g), torch.randn(8, 2, generator=g)
        for model, o in ((ours, opt), (theirs, ref)):
            o.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            o.step()
    opt.synchronize()
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


# --- against explicit matrices --------------------------------------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("graph", sorted(MATRICES))
@pytest.mark.parametrize("order", ["adapt_then_combine", "combine_then_adapt"])
def test_steps_match_explicit_mixing_matrices(graph, order):
    n, rank = hvd.size(), hvd.rank()
    if graph == "one-peer-hypercube" and not power_of_two(n):
        pytest.skip("the hypercube's pairs are defined for powers of two")
    model = Point(start(rank))
    opt = point_optimizer(model, hvdx.Decentralized(graph, order=order))
    steps = 5
    train_point(model, opt, steps, rank)
    opt.synchronize()
    got = everyone(model.x, f"explicit.{graph}.{order}")

    x = np.stack([start(r) for r in range(n)])
    c = np.stack([centre(r) for r in range(n)])
    for t in range(steps):
        w = MATRICES[graph](n, t)  # every step mixes: step t is mix t
        x = w @ (x - LR * (x - c)) if order == "adapt_then_combine" else \
            w @ x - LR * (x - c)
    np.testing.assert_allclose(got, x, rtol=0, atol=1e-12)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("graph, mix_every", [("static-exp", 3), ("one-peer-exp", 2),
                                              ("one-peer-exp", 3)])
def test_mix_every_j_takes_local_steps_in_between(graph, mix_every):
    n, rank = hvd.size(), hvd.rank()
    model = Point(start(rank))
    opt = point_optimizer(model, hvdx.Decentralized(graph, mix_every=mix_every))
    train_point(model, opt, 7, rank)
    got = everyone(model.x, f"mix_every.{graph}.{mix_every}")
    x = np.stack([start(r) for r in range(n)])
    c = np.stack([centre(r) for r in range(n)])
    for t in range(7):
        x = x - LR * (x - c)
        if (t + 1) % mix_every == 0:
            x = MATRICES[graph](n, mixes_before(t, mix_every)) @ x
    np.testing.assert_allclose(got, x, rtol=0, atol=1e-12)


@pytest.mark.mpi(min_size=1)
def test_local_momentum_stays_local_dmsgd():
    """DmSGD: each rank's SGD momentum buffer sees only its own gradients."""
    n, rank = hvd.size(), hvd.rank()
    model = Point(start(rank))
    opt = point_optimizer(model, hvdx.Decentralized("one-peer-exp"), momentum=0.9)
    train_point(model, opt, 4, rank)
    opt.synchronize()
    got = everyone(model.x, "dmsgd")
    x = np.stack([start(r) for r in range(n)])
    c = np.stack([centre(r) for r in range(n)])
    m = np.zeros_like(x)
    for t in range(4):
        m = 0.9 * m + (x - c)
        x = one_peer_exp(n, t) @ (x - LR * m)
    np.testing.assert_allclose(got, x, rtol=0, atol=1e-12)


# --- bytes, overlap, consensus distance -----------------------------------------------

@pytest.mark.mpi(min_size=1)
def test_one_peer_sends_one_model_per_step_in_one_message():
    n, rank = hvd.size(), hvd.rank()
    torch.manual_seed(rank)
    model = nn.Sequential(nn.Linear(10, 8), nn.Linear(8, 3))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   sync=hvdx.Decentralized("one-peer-exp"))
    for _ in range(3):
        opt.zero_grad()
        model(torch.ones(2, 10)).sum().backward()
        opt.step()
    opt.synchronize()
    model_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert opt.hvdx_stats.steps == 3
    assert opt.hvdx_stats.last_messages == (1 if n > 1 else 0)
    assert opt.hvdx_stats.last_bytes == (model_bytes if n > 1 else 0)


@pytest.mark.mpi(min_size=2)
def test_combine_then_adapt_exchanges_during_the_next_forward_and_backward():
    rank = hvd.rank()
    model = Point(start(rank))
    opt = point_optimizer(model, hvdx.Decentralized("one-peer-exp",
                                                    order="combine_then_adapt"))
    train_point(model, opt, 1, rank)
    assert opt._hvdx_mixer._pending is not None  # x_1 is on its way after step()
    before = model.x.detach().clone()
    model(torch.zeros(6, dtype=torch.float64)).backward()  # reads x_1, unmixed
    assert torch.equal(before, model.x.detach())
    opt.step()  # combines x_1, then the local step
    assert opt.hvdx_stats.steps == 2


@pytest.mark.mpi(min_size=1)
def test_consensus_distance_matches_numpy():
    n, rank = hvd.size(), hvd.rank()
    model = Point(start(rank))
    opt = point_optimizer(model, hvdx.Decentralized("ring"))
    train_point(model, opt, 2, rank)
    distance = opt.consensus_distance()
    x = everyone(model.x, "distance")
    expected = math.sqrt(np.mean(np.sum((x - x.mean(axis=0)) ** 2, axis=1)))
    assert distance == pytest.approx(expected, rel=1e-12, abs=1e-15)
    opt.synchronize_parameters()
    assert opt.consensus_distance() <= 1e-12


# --- buffers (BatchNorm) ----------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("sync", ["decentralized", "dssync"])
def test_synchronize_parameters_makes_parameters_and_buffers_identical(sync):
    n, rank = hvd.size(), hvd.rank()
    torch.manual_seed(rank)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2))
    strategy = hvdx.Decentralized("one-peer-exp") if sync == "decentralized" else \
        hvdx.DSSync("shuffle", group_size=1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   named_buffers=model.named_buffers(), sync=strategy)
    for step in range(3):
        g = torch.Generator().manual_seed(10 * step + rank)
        opt.zero_grad()
        model(torch.randn(8, 4, generator=g) + rank).pow(2).mean().backward()
        opt.step()
    opt.synchronize_parameters()
    state = model.state_dict()
    for name in sorted(state):
        values = everyone(state[name].double(), f"bn.{sync}.{name}")
        assert np.abs(values - values[0]).max() <= 1e-6, name
    bn = model[1]
    if n > 1:  # the running statistics were averaged, not left per rank
        mean = everyone(bn.running_mean, f"bn.{sync}.check")
        assert np.allclose(mean, mean[0])


# --- checkpoint -----------------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("order", ["adapt_then_combine", "combine_then_adapt"])
@pytest.mark.parametrize("mix_every", [1, 2])
def test_resumed_run_continues_the_same_peer_sequence_bitwise(order, mix_every):
    # Saved after step 3: with mix_every = 2 the run has mixed once, and the resumed one
    # takes the next mixes (1, 2) from the saved step alone.
    rank = hvd.rank()
    sync = hvdx.Decentralized("one-peer-exp", order=order, mix_every=mix_every)
    straight = Point(start(rank))
    opt = point_optimizer(straight, sync, momentum=0.5)
    train_point(straight, opt, 7, rank)
    opt.synchronize()

    first = Point(start(rank))
    opt1 = point_optimizer(first, sync, momentum=0.5)
    train_point(first, opt1, 3, rank)
    saved_model, saved_opt = copy.deepcopy(first.state_dict()), copy.deepcopy(opt1.state_dict())
    assert saved_opt[STATE_KEY]["step"] == 3
    resumed = Point(np.zeros(6))
    resumed.load_state_dict(saved_model)
    opt2 = point_optimizer(resumed, sync, momentum=0.5)
    opt2.load_state_dict(saved_opt)
    train_point(resumed, opt2, 4, rank)
    opt2.synchronize()
    assert torch.equal(resumed.x, straight.x)


# --- bad input --------------------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
def test_bad_arguments_raise_value_errors_naming_them():
    refused(lambda: hvdx.Decentralized("two-peer"), "graph='two-peer'")
    refused(lambda: hvdx.Decentralized(np.array([[0.5, 0.5], [0.6, 0.4]])),
            "doubly stochastic")
    refused(lambda: hvdx.Decentralized(mix_every=0), "mix_every=0")
    refused(lambda: hvdx.Decentralized(order="sideways"), "order='sideways'")


@pytest.mark.mpi(min_size=1)
def test_a_matrix_of_another_size_fails_on_every_rank():
    n = hvd.size()
    model = Point(start(hvd.rank()))
    with pytest.raises(ValueError, match="ranks"):
        point_optimizer(model, hvdx.Decentralized(np.full((n + 1, n + 1), 1.0 / (n + 1))))


@pytest.mark.mpi(min_size=1)
def test_decentralized_with_topk_compression_fails_naming_compression():
    model = Point(start(hvd.rank()))
    with pytest.raises(ValueError, match="compression"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(),
                                 compression=hvd.Compression.topk(0.01),
                                 sync=hvdx.Decentralized())


@pytest.mark.mpi(min_size=2)
def test_one_rank_with_another_graph_fails_on_every_rank():
    model = Point(start(hvd.rank()))
    graph = "ring" if hvd.rank() == hvd.size() - 1 else "static-exp"
    with pytest.raises(ValueError, match="decentralized.topology"):
        point_optimizer(model, hvdx.Decentralized(graph))
