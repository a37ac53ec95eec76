"""The numpy reference of decentralized SGD (Ying et al., arXiv 2110.13363): one-peer
graphs reach consensus in log2 n mixes from any step and for any ``mix_every``, mixing
keeps the global mean, the static graph contracts like its spectral gap, the complete
graph is synchronous SGD (with momentum: DmSGD is SGD with momentum), ``mix_every``
leaves local SGD in between, and the momentum buffers stay local.

Expected values come from plain loops and explicit matrices written here, never from
hvdx.core.mixing_graphs, hvdx.strategies.decentralized.core_reference or hvdx.core.group_averaging.
"""

import numpy as np
import pytest

from explicit_graphs import (explicit, explicit_one_peer_exp, explicit_static_exp,
                             mixes_before, tau)
from hvdx.core.group_averaging import ADAPT_THEN_COMBINE, COMBINE_THEN_ADAPT
from hvdx.strategies.decentralized.core_reference import mix, simulate_decentralized

pytestmark = [pytest.mark.decentralized]

ORDERS = (ADAPT_THEN_COMBINE, COMBINE_THEN_ADAPT)


def spread(x):
    """sqrt(mean_i ||x_i - mean_j x_j||^2): how far the ranks are from their mean."""
    return float(np.sqrt(np.mean(np.sum((x - x.mean(axis=0)) ** 2, axis=1))))


def values(n, d=5, seed=0):
    return np.random.default_rng(seed).standard_normal((n, d))


def zero_grads(x, step):
    return np.zeros_like(x)


def quadratic(n, d, seed=0, same_on_every_rank=False):
    """Rank i minimises 0.5 x' A_i x - b_i' x: gradient A_i x - b_i (+ a step term)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, d, d)) / np.sqrt(d)
    a = np.einsum("nij,nkj->nik", a, a) + np.eye(d)
    b = rng.standard_normal((n, d))
    if same_on_every_rank:
        a, b = np.broadcast_to(a[0], a.shape), np.broadcast_to(b[0], b.shape)

    def grads(x, step):
        return np.einsum("nij,nj->ni", a, x) - b + 0.01 * np.sin(step)

    return grads


# --- consensus without learning ---------------------------------------------------------

def one_peer_mixes(n, mixes, first=0):
    """The product of the one-peer matrices of mixes first .. first+mixes-1, written out:
    at mix m rank i averages with i - 2^(m mod log2 n)."""
    k = int(np.log2(n))
    product = np.eye(n)
    for m in range(first, first + mixes):
        w = 0.5 * np.eye(n)
        w[np.arange(n), (np.arange(n) - 2 ** (m % k)) % n] += 0.5
        product = w @ product
    return product


@pytest.mark.parametrize("n", [2, 4, 8, 16])
@pytest.mark.parametrize("mix_every", [1, 2, 3, 4])
@pytest.mark.parametrize("order", ORDERS)
def test_pure_mixing_reaches_exact_consensus_after_log2_n_mixes_whatever_mix_every(
        n, mix_every, order):
    # lr = 0: only the mixes move the values. log2 n mixes take log2 n * mix_every steps,
    # and their product is the average, so every rank ends at the mean of the start.
    x = values(n, seed=n)
    mean = x.mean(axis=0)
    steps = int(np.log2(n)) * mix_every
    y = simulate_decentralized(x, zero_grads, 0.0, "one-peer-exp", steps, order=order,
                               mix_every=mix_every)
    product = one_peer_mixes(n, int(np.log2(n)))
    np.testing.assert_allclose(product, np.full((n, n), 1 / n), rtol=0, atol=1e-15)
    np.testing.assert_allclose(y, product @ x, rtol=0, atol=1e-12)
    np.testing.assert_allclose(y, np.broadcast_to(mean, y.shape), rtol=0, atol=1e-12)
    # One mix short, they are not there yet: every mix of the cycle is needed.
    if n > 2:
        z = simulate_decentralized(x, zero_grads, 0.0, "one-peer-exp", steps - mix_every,
                                   order=order, mix_every=mix_every)
        assert spread(z) > 1e-3 * spread(x)


def test_four_ranks_mixing_every_other_step_meet_both_partners():
    # lr = 0, 4 ranks, mix_every = 2: the mixes at steps 1 and 3 are mixes 0 and 1, so
    # rank 0 takes rank 3's value (shift 1), then rank 2's (shift 2), not rank 2's twice.
    x = np.array([[1.0], [2.0], [4.0], [8.0]])
    after_one = simulate_decentralized(x, zero_grads, 0.0, "one-peer-exp", 2, mix_every=2)
    np.testing.assert_array_equal(after_one, [[4.5], [1.5], [3.0], [6.0]])
    after_two = simulate_decentralized(x, zero_grads, 0.0, "one-peer-exp", 4, mix_every=2)
    np.testing.assert_array_equal(after_two, np.full((4, 1), 3.75))


@pytest.mark.parametrize("graph", ["one-peer-exp", "one-peer-hypercube"])
@pytest.mark.parametrize("n", [2, 4, 8, 16])
@pytest.mark.parametrize("mix_every", [1, 3])
@pytest.mark.parametrize("order", ORDERS)
def test_one_peer_graphs_reach_consensus_in_any_window_of_log2_n_mixes(graph, n,
                                                                       mix_every, order):
    # Any log2 n * mix_every consecutive steps hold log2 n consecutive mixes.
    x = values(n, seed=n)
    mean = x.mean(axis=0)
    for start in range(2 * tau(n) * mix_every + 1):
        y = simulate_decentralized(x, zero_grads, 0.0, graph, tau(n) * mix_every,
                                   start=start, order=order, mix_every=mix_every)
        assert spread(y) <= 1e-12
        np.testing.assert_allclose(y, np.broadcast_to(mean, y.shape), rtol=0, atol=1e-12)
        np.testing.assert_allclose(y.mean(axis=0), mean, rtol=0, atol=1e-12)


@pytest.mark.parametrize("n", [6, 12])
def test_one_peer_exponential_graph_is_not_exact_at_other_sizes(n):
    x = values(n, seed=n)
    y = simulate_decentralized(x, zero_grads, 0.0, "one-peer-exp", tau(n))
    assert spread(y) > 1e-3 * spread(x)
    np.testing.assert_allclose(y.mean(axis=0), x.mean(axis=0), rtol=0, atol=1e-12)


@pytest.mark.parametrize("n", [5, 6, 8, 16])
def test_static_graph_consensus_decays_at_least_like_one_minus_gap(n):
    rho = np.linalg.svd(explicit_static_exp(n), compute_uv=False)[1]
    x = values(n, d=3, seed=n)
    initial = spread(x)
    for t in range(1, 10):
        y = simulate_decentralized(x, zero_grads, 0.0, "static-exp", t)
        assert spread(y) <= rho ** t * initial + 1e-12
        np.testing.assert_allclose(y.mean(axis=0), x.mean(axis=0), rtol=0, atol=1e-12)


@pytest.mark.parametrize("graph", ["one-peer-exp", "static-exp", "one-peer-hypercube",
                                   "ring", "torus", "complete"])
@pytest.mark.parametrize("order", ORDERS)
def test_the_global_mean_moves_by_the_mean_step_only(graph, order):
    # W doubly stochastic: mean(W (x - lr d)) = mean(W x - lr d) = mean(x) - lr mean(d).
    n, d, lr = 7, 4, 0.1
    grads = quadratic(n, d, seed=3)
    x = values(n, d, seed=4)
    for step in range(6):
        y = simulate_decentralized(x, grads, lr, graph, 1, start=step, order=order)
        want = x.mean(axis=0) - lr * grads(x, step).mean(axis=0)
        np.testing.assert_allclose(y.mean(axis=0), want, rtol=0, atol=1e-12)
        x = y


# --- identity settings ------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 3, 4, 5])
def test_complete_graph_from_identical_values_is_synchronous_sgd_on_the_mean_gradient(n):
    d, lr = 4, 0.05
    grads = quadratic(n, d, seed=1)
    start = values(1, d, seed=2)[0]
    got = simulate_decentralized(np.broadcast_to(start, (n, d)), grads, lr, "complete", 25)
    w = start.copy()
    for step in range(25):
        w = w - lr * grads(np.broadcast_to(w, (n, d)), step).mean(axis=0)
    np.testing.assert_allclose(got, np.broadcast_to(w, (n, d)), rtol=0, atol=1e-12)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("graph", ["complete", "one-peer-exp"])
def test_dmsgd_with_identical_values_and_gradients_is_sgd_with_momentum(order, graph):
    # Every rank sees the same gradient at the same point, so mixing changes nothing.
    n, d, lr, mu = 4, 3, 0.05, 0.9
    grads = quadratic(n, d, seed=5, same_on_every_rank=True)
    start = values(1, d, seed=6)[0]
    got, buffers = simulate_decentralized(np.broadcast_to(start, (n, d)), grads, lr,
                                          graph, 20, order=order, momentum=mu,
                                          return_momentum=True)
    w, m = start.copy(), np.zeros(d)
    for step in range(20):
        g = grads(np.broadcast_to(w, (n, d)), step)[0]
        m = mu * m + g  # torch.optim.SGD, dampening 0: the first buffer is g itself
        w = w - lr * m
    np.testing.assert_allclose(got, np.broadcast_to(w, (n, d)), rtol=0, atol=1e-12)
    np.testing.assert_allclose(buffers, np.broadcast_to(m, (n, d)), rtol=0, atol=1e-12)


def test_one_rank_is_plain_sgd_with_momentum():
    grads = quadratic(1, 3, seed=7)
    x0 = values(1, 3, seed=8)
    got = simulate_decentralized(x0, grads, 0.1, "one-peer-exp", 10, momentum=0.5)
    want, m = x0.copy(), np.zeros_like(x0)
    for step in range(10):
        m = 0.5 * m + grads(want, step)
        want = want - 0.1 * m
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-14)


@pytest.mark.parametrize("mix_every", [2, 3])
@pytest.mark.parametrize("order", ORDERS)
def test_between_mixing_steps_every_rank_runs_local_sgd(mix_every, order):
    n, d, lr = 4, 3, 0.05
    grads = quadratic(n, d, seed=9)
    x0 = values(n, d, seed=10)
    local = x0.copy()
    for t in range(mix_every - 1):  # no step before t = mix_every - 1 mixes
        got = simulate_decentralized(x0, grads, lr, "complete", t + 1, order=order,
                                     mix_every=mix_every)
        local = local - lr * grads(local, t)
        np.testing.assert_array_equal(got, local)
    # The next step mixes: every rank gets the average.
    got = simulate_decentralized(x0, grads, lr, "complete", mix_every, order=order,
                                 mix_every=mix_every)
    g = grads(local, mix_every - 1)
    want = (local - lr * g).mean(axis=0) if order == ADAPT_THEN_COMBINE else \
        local.mean(axis=0) - lr * g
    np.testing.assert_allclose(got, np.broadcast_to(want, got.shape), rtol=0, atol=1e-12)


@pytest.mark.parametrize("graph, n", [("one-peer-exp", 4), ("one-peer-exp", 6),
                                      ("one-peer-exp", 8), ("one-peer-hypercube", 8),
                                      ("static-exp", 5), ("complete", 3)])
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("mix_every, start", [(1, 0), (1, 3), (3, 0), (2, 5), (3, 4)])
def test_the_reference_is_the_algorithm_written_as_a_loop(graph, n, order, momentum,
                                                          mix_every, start):
    d, lr, steps = 3, 0.05, 9
    grads = quadratic(n, d, seed=n)
    x0 = values(n, d, seed=11)
    got, buffers = simulate_decentralized(x0, grads, lr, graph, steps, start=start,
                                          order=order, momentum=momentum,
                                          mix_every=mix_every, return_momentum=True)
    x, m = x0.copy(), np.zeros_like(x0)
    for t in range(start, start + steps):
        g = grads(x, t)
        m = momentum * m + g  # local: each row sees only its own rank's gradients
        # The graph follows the mixes: this one is number mixes_before(t) of the run.
        w = explicit(graph, n, mixes_before(t, mix_every)) \
            if (t + 1) % mix_every == 0 else np.eye(n)
        x = w @ (x - lr * m) if order == ADAPT_THEN_COMBINE else w @ x - lr * m
    np.testing.assert_allclose(got, x, rtol=0, atol=1e-12)
    np.testing.assert_allclose(buffers, m, rtol=0, atol=1e-12)


def test_a_user_matrix_is_used_at_every_step():
    w = np.array([[0.5, 0.25, 0.25], [0.25, 0.5, 0.25], [0.25, 0.25, 0.5]])
    x0 = values(3, seed=12)
    got = simulate_decentralized(x0, zero_grads, 0.0, w.tolist(), 3)
    np.testing.assert_allclose(got, w @ w @ w @ x0, rtol=0, atol=1e-14)


# --- one mixing step, dtypes -------------------------------------------------------------

def test_mix_is_the_matrix_product_and_keeps_the_dtype():
    x = values(6, d=2, seed=13)
    np.testing.assert_allclose(mix(x, "one-peer-exp", 1), explicit_one_peer_exp(6, 1) @ x,
                               rtol=0, atol=1e-15)
    # Any shape after the rank axis.
    x3 = np.random.default_rng(14).standard_normal((5, 2, 3))
    want = np.einsum("ij,jkl->ikl", explicit_static_exp(5), x3)
    np.testing.assert_allclose(mix(x3, "static-exp"), want, rtol=0, atol=1e-15)
    x32 = x.astype(np.float32)
    got = mix(x32, "static-exp")
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, explicit_static_exp(6) @ x, rtol=1e-6, atol=1e-6)


def test_float32_stays_float32_and_integers_become_float64():
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    y = simulate_decentralized(x, lambda v, t: np.ones_like(v), 0.5, "one-peer-exp", 2,
                               momentum=0.5)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(x, np.arange(8, dtype=np.float32).reshape(4, 2))
    assert simulate_decentralized(np.arange(4).reshape(4, 1), zero_grads, 0.1, "ring",
                                  1).dtype == np.float64


# --- bad input --------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(order="atc"), "order='atc' must be 'adapt_then_combine' or 'combine_then_adapt'"),
    (dict(steps=-1), "steps=-1 must be an integer of at least 0"),
    (dict(start=1.5), "start=1.5 must be an integer"),
    (dict(mix_every=0), "mix_every=0 must be an integer of at least 1"),
    (dict(momentum=-0.1), "momentum=-0.1 must be at least 0"),
    (dict(lr=float("nan")), "lr=nan must be a finite number"),
    (dict(graph="two-peer"), "graph='two-peer' is not a known graph"),
    (dict(graph=np.eye(3)), "graph: a 3x3 matrix but the job has 4 ranks"),
    (dict(grads_fn=lambda v, t: np.zeros(3)), "grads_fn returned shape (3,) at step 0"),
    (dict(initial=np.zeros((0, 2))), "initial="),
])
def test_bad_arguments_are_named_with_their_value(kwargs, message):
    args = dict(initial=values(4), grads_fn=zero_grads, lr=0.1, graph="ring", steps=2)
    args.update(kwargs)
    with pytest.raises(ValueError) as error:
        simulate_decentralized(**args)
    assert message in str(error.value)
