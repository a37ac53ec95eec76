"""The mixing graphs of decentralized SGD (Ying et al., arXiv 2110.13363).

Expected matrices and values are built here from their definitions, with explicit loops
and permutation matrices, never from hvdx.core.mixing_graphs itself.
"""

import hashlib
import math

import numpy as np
import pytest

from explicit_graphs import (explicit, explicit_static_exp, explicit_torus, mixes_before,
                             receive_from, tau)
from hvdx.core.mixing_graphs import (GRAPHS, Neighbors, check_mixing_matrix, graph_name,
                                     is_exact, mix_index, mixing_matrix, neighbors, period,
                                     spectral_gap)
from hvdx.strategies.decentralized.spec import MixingGraph

pytestmark = [pytest.mark.decentralized]


def explicit_period(graph, n):
    return tau(n) if graph.startswith("one-peer") and n > 1 else 1


def second_singular_value(w):
    return np.linalg.svd(w, compute_uv=False)[1] if len(w) > 1 else 0.0


# --- the matrices -----------------------------------------------------------------------

@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("n", range(1, 18))
def test_every_matrix_is_doubly_stochastic_non_negative_and_its_definition(graph, n):
    for step in range(2 * max(tau(n), 1) + 1):
        w = mixing_matrix(graph, n, step)
        assert w.shape == (n, n) and w.dtype == np.float64
        assert (w >= 0).all()
        np.testing.assert_allclose(w.sum(axis=0), 1.0, rtol=0, atol=1e-12)
        np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=0, atol=1e-12)
        np.testing.assert_allclose(w, explicit(graph, n, step), rtol=0, atol=1e-15)


def test_static_exponential_graph_on_four_ranks_written_out():
    # tau = 2: rank i receives from i - 1 and i - 2, weights 1/3.
    want = np.array([[1, 0, 1, 1],
                     [1, 1, 0, 1],
                     [1, 1, 1, 0],
                     [0, 1, 1, 1]]) / 3.0
    np.testing.assert_allclose(mixing_matrix("static-exp", 4), want, rtol=0, atol=1e-15)


def test_static_exponential_graph_on_eight_ranks_sends_to_i_plus_1_2_4():
    w = mixing_matrix("static-exp", 8, step=5)
    want = np.eye(8) / 4
    for i in range(8):
        for d in (1, 2, 4):
            want[(i + d) % 8, i] = 0.25
    np.testing.assert_allclose(w, want, rtol=0, atol=1e-15)


def test_small_ring_torus_and_hypercube_cases_written_out():
    # Two ranks: the left and the right neighbour are one rank, weighed once (BlueFog).
    np.testing.assert_array_equal(mixing_matrix("ring", 2), [[0.5, 0.5], [0.5, 0.5]])
    np.testing.assert_array_equal(mixing_matrix("torus", 2), [[0.5, 0.5], [0.5, 0.5]])
    np.testing.assert_array_equal(mixing_matrix("ring", 1), [[1.0]])
    third = 1 / 3
    np.testing.assert_allclose(mixing_matrix("ring", 3), np.full((3, 3), third))
    # A prime number of ranks is a 1 x n grid: no up or down, so the ring itself.
    ring = (np.eye(7) + receive_from(7, 1) + receive_from(7, -1)) / 3
    np.testing.assert_allclose(mixing_matrix("torus", 7), ring, rtol=0, atol=1e-15)
    np.testing.assert_allclose(mixing_matrix("ring", 7), ring, rtol=0, atol=1e-15)
    # 2 x 2: up = down and left = right, so two distinct neighbours, never the diagonal.
    np.testing.assert_allclose(mixing_matrix("torus", 4),
                               [[third, third, third, 0], [third, third, 0, third],
                                [third, 0, third, third], [0, third, third, third]],
                               rtol=0, atol=1e-15)
    # 2 x 3: one neighbour in the other row, two in the own: four weights of 1/4.
    np.testing.assert_allclose(mixing_matrix("torus", 6)[0], [0.25, 0.25, 0.25, 0.25, 0, 0],
                               rtol=0, atol=1e-15)
    # 6 ranks at step 2 (bit 4): 0-4 and 1-5 exchange; 2 and 3 have no partner.
    w = mixing_matrix("one-peer-hypercube", 6, 2)
    want = np.eye(6)
    for a, b in ((0, 4), (1, 5)):
        want[a, a] = want[b, b] = want[a, b] = want[b, a] = 0.5
    np.testing.assert_array_equal(w, want)
    np.testing.assert_array_equal(w, w.T)


def test_a_user_matrix_is_returned_as_a_float64_copy():
    user = [[0.25, 0.75], [0.75, 0.25]]
    w = mixing_matrix(user, 2, step=3)
    assert w.dtype == np.float64
    np.testing.assert_array_equal(w, user)
    array = np.array(user)
    assert mixing_matrix(array, 2) is not array


# --- spectral gaps ----------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 4, 6, 8, 10, 16, 32, 64])
def test_static_exponential_gap_is_two_over_one_plus_tau_for_even_n(n):
    w = explicit_static_exp(n)
    assert 1 - second_singular_value(w) == pytest.approx(2 / (1 + tau(n)), abs=1e-9)
    assert spectral_gap(mixing_matrix("static-exp", n)) == pytest.approx(2 / (1 + tau(n)),
                                                                         abs=1e-9)
    if n == 64:
        assert round(spectral_gap(w), 4) == 0.2857


@pytest.mark.parametrize("n", [3, 5, 7, 9, 15, 33])
def test_static_exponential_gap_is_larger_for_odd_n(n):
    assert spectral_gap(mixing_matrix("static-exp", n)) > 2 / (1 + tau(n)) + 1e-6
    assert spectral_gap(explicit_static_exp(n)) == \
        pytest.approx(1 - second_singular_value(explicit_static_exp(n)), abs=1e-12)


def test_gaps_of_the_other_graphs_at_64_ranks_match_the_table():
    ring = spectral_gap(mixing_matrix("ring", 64))
    assert round(ring, 4) == 0.0032
    # Circulant: eigenvalues (1 + 2 cos(2 pi a / 64)) / 3, the second largest at a = 1.
    assert ring == pytest.approx(2 * (1 - math.cos(2 * math.pi / 64)) / 3, abs=1e-12)
    # The table's 0.117 is the 8 x 8 torus: eigenvalues (1 + 2 cos(2 pi a/8) +
    # 2 cos(2 pi b/8)) / 5, the second largest at (a, b) = (1, 0).
    torus = mixing_matrix("torus", 64)
    np.testing.assert_allclose(torus, explicit_torus(64), rtol=0, atol=1e-15)
    assert list(np.flatnonzero(torus[9])) == [1, 8, 9, 10, 17]  # (1, 1) on the 8 x 8 grid
    gap = spectral_gap(torus)
    assert gap == pytest.approx(2 * (1 - math.cos(2 * math.pi / 8)) / 5, abs=1e-12)
    assert gap == pytest.approx(0.117, abs=5e-4)
    assert spectral_gap(mixing_matrix("complete", 64)) == pytest.approx(1.0, abs=1e-12)
    assert spectral_gap(np.eye(1)) == 1.0


def test_spectral_gap_refuses_a_matrix_that_is_not_doubly_stochastic():
    with pytest.raises(ValueError, match=r"^w: row 0 sums to 2"):
        spectral_gap(np.ones((2, 2)))


@pytest.mark.parametrize("n", [8, 16, 6, 5])
def test_static_consensus_decays_at_least_like_one_minus_gap(n):
    w = explicit_static_exp(n)
    rho = second_singular_value(w)
    x = np.random.default_rng(n).normal(size=(n, 3))
    mean = x.mean(axis=0)
    start = np.linalg.norm(x - mean)
    for t in range(1, 12):
        x = mixing_matrix("static-exp", n, t) @ x
        np.testing.assert_allclose(x.mean(axis=0), mean, rtol=0, atol=1e-12)
        assert np.linalg.norm(x - mean) <= rho ** t * start + 1e-12


# --- exactness and period ---------------------------------------------------------------

@pytest.mark.parametrize("graph", ["one-peer-exp", "one-peer-hypercube"])
@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_one_peer_graphs_average_exactly_over_tau_steps_from_any_step(graph, n):
    assert period(graph, n) == tau(n) and is_exact(graph, n)
    for first in range(2 * tau(n) + 1):
        product = np.eye(n)
        for step in range(first, first + tau(n)):
            product = mixing_matrix(graph, n, step) @ product
        np.testing.assert_allclose(product, np.full((n, n), 1 / n), rtol=0, atol=1e-12)


@pytest.mark.parametrize("mix_every", [1, 2, 3, 4, 5])
def test_the_mix_index_counts_the_mixing_steps_before_a_step(mix_every):
    for t in range(40):
        assert mix_index(t, mix_every) == mixes_before(t, mix_every)
    with pytest.raises(ValueError, match=r"mix_every=0"):
        mix_index(3, 0)
    with pytest.raises(ValueError, match=r"step=-1"):
        mix_index(-1, 2)


@pytest.mark.parametrize("mix_every", [1, 2, 3, 4])
def test_a_rank_meets_every_one_peer_partner_in_turn_whatever_mix_every_is(mix_every):
    # 8 ranks: rank 0 sends to 1, 2, 4, 1, 2, 4, ... at its successive mixes. Indexed by
    # the training step, mix_every = 2 would give 2, 1, 2, 1, ... (never 4) and
    # mix_every = 3 would give 4, 4, 4, ...
    graph = MixingGraph("one-peer-exp", 8, 0, mix_every)
    mixing_steps = [t for t in range(9 * mix_every) if (t + 1) % mix_every == 0]
    assert [graph.neighbors(t).send_to for t in mixing_steps] == [(1,), (2,), (4,)] * 3
    assert [graph.neighbors(t).recv_from for t in mixing_steps] == [(7,), (6,), (4,)] * 3
    cube = MixingGraph("one-peer-hypercube", 4, 1, mix_every)
    assert [cube.neighbors(t).send_to for t in mixing_steps[:4]] == [(0,), (3,)] * 2


@pytest.mark.parametrize("graph", ["one-peer-exp", "one-peer-hypercube"])
@pytest.mark.parametrize("n", [6, 12])
def test_one_peer_graphs_are_not_exact_for_other_n(graph, n):
    product = np.eye(n)
    for step in range(tau(n)):
        product = explicit(graph, n, step) @ product
    assert np.abs(product - 1 / n).max() > 1e-3
    assert not is_exact(graph, n)
    assert period(graph, n) == tau(n)


@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("n", range(1, 18))
def test_is_exact_and_period_match_the_product_of_explicit_matrices(graph, n):
    assert period(graph, n) == explicit_period(graph, n)
    product = np.eye(n)
    for step in range(explicit_period(graph, n)):
        product = explicit(graph, n, step) @ product
    exact = np.allclose(product, 1.0 / n, rtol=0, atol=1e-12)
    assert is_exact(graph, n) == exact
    # The sequence repeats after one period.
    p = period(graph, n)
    for step in range(p):
        np.testing.assert_array_equal(mixing_matrix(graph, n, step),
                                      mixing_matrix(graph, n, step + p))


def test_a_user_matrix_has_period_one_and_is_exact_only_when_it_is_the_average():
    assert period(np.eye(3), 3) == 1 and not is_exact(np.eye(3), 3)
    assert is_exact(np.full((3, 3), 1 / 3), 3)


# --- neighbours -------------------------------------------------------------------------

@pytest.mark.parametrize("graph", GRAPHS + ("matrix",))
@pytest.mark.parametrize("n", range(1, 13))
def test_neighbors_agree_exactly_with_the_matrix(graph, n):
    rng = np.random.default_rng(n)
    if graph == "matrix":
        p = np.eye(n)[rng.permutation(n)]
        graph = 0.5 * np.eye(n) + 0.5 * p
    for step in range(2 * max(tau(n), 1)):
        w = explicit(graph, n, step) if isinstance(graph, str) else graph
        for rank in range(n):
            nb = neighbors(graph, n, rank, step)
            assert isinstance(nb, Neighbors)
            recv = tuple(j for j in range(n) if j != rank and w[rank, j] != 0)
            assert nb.recv_from == recv
            assert nb.recv_weights == tuple(w[rank, j] for j in recv)
            assert nb.self_weight == w[rank, rank]
            assert nb.send_to == tuple(k for k in range(n) if k != rank and w[k, rank] != 0)
            assert all(type(r) is int for r in nb.send_to + nb.recv_from)
            assert all(type(x) is float for x in (nb.self_weight,) + nb.recv_weights)


def test_one_peer_neighbours_on_a_thousand_ranks_without_the_matrix():
    nb = neighbors("one-peer-exp", 1000, 3, step=12)  # tau = 10, shift 2^2
    assert nb == Neighbors((7,), (999,), 0.5, (0.5,))
    # bit 512: rank 500's partner would be 1012, so it keeps its value this step.
    assert neighbors("one-peer-hypercube", 1000, 500, 9) == Neighbors((), (), 1.0, ())
    assert neighbors("one-peer-hypercube", 1000, 3, 8) == Neighbors((259,), (259,), 0.5, (0.5,))
    assert neighbors("static-exp", 1000, 0).send_to == (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def test_neighbors_refuses_a_rank_outside_the_job():
    with pytest.raises(ValueError, match=r"rank=4 must be an integer from 0 to 3"):
        neighbors("ring", 4, 4)
    with pytest.raises(ValueError, match=r"step=-1"):
        neighbors("ring", 4, 0, -1)
    with pytest.raises(ValueError, match=r"n=0"):
        mixing_matrix("ring", 0)


# --- bad input --------------------------------------------------------------------------

@pytest.mark.parametrize("bad, n, message", [
    (np.ones((2, 3)) / 3, None, "must be square (n x n, n the number of ranks), got shape (2, 3)"),
    (np.ones((2, 2, 2)), None, "must be square"),
    (np.full((3, 3), 1 / 3), 4, "a 3x3 matrix but the job has 4 ranks; pass a 4x4 matrix"),
    (np.array([[1.5, -0.5], [-0.5, 1.5]]), None,
     "entry [0, 1] is -0.5; mixing weights must be non-negative"),
    (np.array([[0.5, 0.4], [0.5, 0.6]]), None,
     "row 0 sums to 0.9; a mixing matrix must be doubly stochastic (every row and column "
     "sums to 1)"),
    (np.array([[0.5, 0.5], [0.6, 0.4]]), None, "column 0 sums to 1.1; a mixing matrix"),
    (np.array([[0.5, 0.5], [0.6, 0.4]]).T, None, "row 0 sums to 1.1"),
    (np.array([[0.5, 0.5, 0.0], [0.0, 0.5, 0.5], [0.4, 0.0, 0.6]]), None,
     "column 0 sums to 0.9"),
    (np.array([[np.nan, 0.5], [0.5, 0.5]]), None, "entry [0, 0] is nan; a mixing matrix "
     "must hold finite numbers (no NaN or infinity)"),
    (np.array([[1.0, np.inf], [0.5, 0.5]]), None, "entry [0, 1] is inf"),
    ([["a", "b"], ["c", "d"]], None, "is not a matrix of numbers"),
])
def test_bad_matrices_are_refused_naming_the_argument_and_the_value(bad, n, message):
    with pytest.raises(ValueError, match=r"^graph") as error:
        check_mixing_matrix(bad, n)
    assert message in str(error.value)
    with pytest.raises(ValueError, match=r"^W"):
        check_mixing_matrix(bad, n, name="W")
    with pytest.raises(ValueError, match=r"^graph"):
        mixing_matrix(bad, 4 if n else len(np.asarray(bad)))


def test_check_mixing_matrix_returns_a_float64_copy_and_tolerates_rounding():
    w = np.array([[0.25, 0.75], [0.75, 0.25]], dtype=np.float32)
    got = check_mixing_matrix(w, 2)
    assert got.dtype == np.float64 and got is not w
    # float32 thirds sum to 1 + 3e-8, beyond the tolerance of 1e-9 * n: build in float64.
    with pytest.raises(ValueError, match=r"row 0 sums to 1\.00000002"):
        check_mixing_matrix(np.full((3, 3), 1 / 3, dtype=np.float32))
    check_mixing_matrix(np.full((3, 3), 1 / 3))
    nearly = np.eye(5)
    nearly[0, 0] += 1e-10  # row and column 0 sum to 1 + 1e-10: rounding, accepted
    np.testing.assert_array_equal(check_mixing_matrix(nearly), nearly)


@pytest.mark.parametrize("call", [
    lambda: mixing_matrix("two-peer", 4),
    lambda: neighbors("two-peer", 1, 0),
    lambda: period("two-peer", 4),
    lambda: is_exact("two-peer", 1),
    lambda: graph_name("two-peer"),
])
def test_an_unknown_name_is_named_and_the_accepted_ones_listed(call):
    with pytest.raises(ValueError, match=r"graph='two-peer'") as error:
        call()
    assert all(name in str(error.value) for name in GRAPHS)


# --- fingerprint ------------------------------------------------------------------------

def test_graph_name_is_the_name_or_a_hash_of_the_matrix_bytes():
    for name in GRAPHS:
        assert graph_name(name) == name
    w = [[0.25, 0.75], [0.75, 0.25]]
    want = "matrix:" + hashlib.sha1(np.array(w, dtype=np.float64).tobytes()).hexdigest()[:12]
    assert graph_name(w) == want
    assert graph_name(np.array(w, dtype=np.float32)) == want
    assert graph_name(np.array(w).T.copy()) == want  # symmetric: same bytes
    assert graph_name([[0.5, 0.5], [0.5, 0.5]]) != want
