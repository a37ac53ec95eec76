"""The mixing graphs of decentralized SGD (Ying et al., arXiv 2110.13363).

Expected matrices and values are built here from their definitions, with explicit loops,
never from hvdx.core.mixing_graphs itself.
"""

import math

import numpy as np
import pytest

from hvdx.core.mixing_graphs import (TOPOLOGIES, check_mixing_matrix, is_exact,
                                     mixing_matrix, neighbors, period, spectral_gap)


def tau(n):
    return math.ceil(math.log2(n)) if n > 1 else 0


def explicit_static_exp(n):
    w = np.zeros((n, n))
    for i in range(n):
        w[i, i] = 1.0 / (tau(n) + 1)
        for k in range(tau(n)):
            w[i, (i - 2 ** k) % n] += 1.0 / (tau(n) + 1)  # receives from i - 2^k
    return w


def explicit_one_peer(n, step):
    w = np.eye(n)
    if n == 1:
        return w
    k = step % tau(n)
    w = 0.5 * np.eye(n)
    for i in range(n):
        w[i, (i - 2 ** k) % n] += 0.5
    return w


def second_singular_value(w):
    return np.linalg.svd(w, compute_uv=False)[1] if len(w) > 1 else 0.0


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("n", range(1, 18))
def test_every_matrix_is_doubly_stochastic_and_non_negative(topology, n):
    for step in range(4):
        w = mixing_matrix(topology, n, step)
        assert w.shape == (n, n)
        assert (w >= 0).all()
        np.testing.assert_allclose(w.sum(axis=0), 1.0, rtol=0, atol=1e-12)
        np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("n", [4, 8, 5])
def test_static_exponential_graph_is_its_definition(n):
    np.testing.assert_array_equal(mixing_matrix("static-exp", n), explicit_static_exp(n))


@pytest.mark.parametrize("n", [2, 4, 8, 16, 32, 64])
def test_static_exponential_gap_is_two_over_one_plus_tau_for_even_n(n):
    w = explicit_static_exp(n)
    assert 1 - second_singular_value(w) == pytest.approx(2 / (1 + tau(n)), abs=1e-9)
    assert spectral_gap(mixing_matrix("static-exp", n)) == pytest.approx(2 / (1 + tau(n)),
                                                                         abs=1e-9)
    if n == 64:
        assert round(spectral_gap(w), 4) == 0.2857


@pytest.mark.parametrize("n", [3, 5, 7, 9, 15])
def test_static_exponential_gap_is_larger_for_odd_n(n):
    assert spectral_gap(mixing_matrix("static-exp", n)) > 2 / (1 + tau(n))


@pytest.mark.parametrize("topology", ["one-peer-exp", "one-peer-hypercube"])
@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_one_peer_graphs_average_exactly_over_tau_steps_from_any_step(topology, n):
    assert period(topology, n) == tau(n) and is_exact(topology, n)
    for first in range(2 * tau(n) + 1):
        product = np.eye(n)
        for step in range(first, first + tau(n)):
            product = mixing_matrix(topology, n, step) @ product
        np.testing.assert_allclose(product, np.full((n, n), 1 / n), rtol=0, atol=1e-12)


@pytest.mark.parametrize("n", [6, 12])
def test_one_peer_exponential_graph_is_not_exact_for_other_n(n):
    product = np.eye(n)
    for step in range(tau(n)):
        product = explicit_one_peer(n, step) @ product
    assert np.abs(product - 1 / n).max() > 1e-3
    assert not is_exact("one-peer-exp", n)
    for step in range(tau(n)):
        np.testing.assert_array_equal(mixing_matrix("one-peer-exp", n, step),
                                      explicit_one_peer(n, step))


@pytest.mark.parametrize("n", [8, 16, 6])
def test_static_consensus_decays_at_least_like_one_minus_gap(n):
    w = explicit_static_exp(n)
    rho = second_singular_value(w)
    x = np.random.default_rng(n).normal(size=(n, 3))
    mean = x.mean(axis=0)
    start = np.linalg.norm(x - mean)
    for t in range(1, 12):
        x = w @ x
        np.testing.assert_allclose(x.mean(axis=0), mean, rtol=0, atol=1e-12)
        assert np.linalg.norm(x - mean) <= rho ** t * start + 1e-12


def test_gaps_of_the_other_graphs_at_64_ranks():
    assert round(spectral_gap(mixing_matrix("ring", 64)), 4) == 0.0032
    assert spectral_gap(mixing_matrix("torus", 64)) == pytest.approx(0.117, abs=5e-4)
    assert spectral_gap(mixing_matrix("complete", 64)) == pytest.approx(1.0)


@pytest.mark.parametrize("topology", TOPOLOGIES + ("matrix",))
@pytest.mark.parametrize("n", range(1, 13))
def test_neighbors_agree_with_the_matrix(topology, n):
    rng = np.random.default_rng(n)
    if topology == "matrix":
        p = np.eye(n)[rng.permutation(n)]
        topology = 0.5 * np.eye(n) + 0.5 * p
    for step in range(3):
        w = mixing_matrix(topology, n, step)
        for rank in range(n):
            nb = neighbors(topology, n, rank, step)
            row = {j: w[rank, j] for j in range(n) if j != rank and w[rank, j] > 0}
            assert nb.recv_from == tuple(sorted(row))
            assert nb.recv_weights == pytest.approx([row[j] for j in sorted(row)])
            assert nb.self_weight == pytest.approx(w[rank, rank])
            assert nb.send_to == tuple(k for k in range(n) if k != rank and w[k, rank] > 0)


@pytest.mark.parametrize("bad, message", [
    (np.ones((2, 3)) / 3, "square"),
    (np.full((3, 3), 1 / 3), "3x3 matrix but the job has 4"),
    (np.array([[1.5, -0.5], [-0.5, 1.5]]), "non-negative"),
    (np.array([[0.5, 0.4], [0.5, 0.6]]), "row 0 sums to"),
    (np.array([[0.5, 0.5], [0.6, 0.4]]), "doubly stochastic"),
    (np.array([[np.nan, 0.5], [0.5, 0.5]]), "NaN"),
])
def test_bad_matrices_are_refused_naming_the_argument(bad, message):
    with pytest.raises(ValueError, match="topology") as error:
        check_mixing_matrix(bad, 4 if "job has 4" in message else None)
    assert message in str(error.value)


def test_an_unknown_name_lists_the_accepted_ones():
    with pytest.raises(ValueError, match="topology='two-peer'.*one-peer-exp"):
        mixing_matrix("two-peer", 4)
