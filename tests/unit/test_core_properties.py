"""Property-based tests of hvdx.core (hypothesis): selection, residual bookkeeping,
sharding, the global TopK's shares, DS-Sync schedules and mixing graphs, over random
sizes and dtypes, empty and one-element tensors and a world of one rank.

Each property is stated from its definition (sorting, sums, set cover), not from the
function under test.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from hvdx.core.mixing_graphs import GRAPHS, mixing_matrix, neighbors
from hvdx.core.sharding import shard_bounds, shard_k, split_by_shard
from hvdx.strategies.dssync.core_schedule import ShuffleSchedule
from hvdx.strategies.topk.core_bidirectional import TopKConfig, simulate_step
from hvdx.strategies.topk.core_error_feedback import ResidualMemory
from hvdx.strategies.topk.core_global import shares
from hvdx.strategies.topk.core_selection import select_exact

pytestmark = [pytest.mark.topk, pytest.mark.dssync]

SETTINGS = settings(max_examples=60, deadline=None)
DTYPES = st.sampled_from([np.float32, np.float64])


def vectors(min_size=0, max_size=300):
    """Finite float vectors, with ties and zeros likely (small integers, scaled)."""
    return DTYPES.flatmap(lambda dtype: hnp.arrays(
        dtype, st.integers(min_size, max_size),
        elements=st.integers(-20, 20).map(lambda v: v / 4)))


@SETTINGS
@given(vectors(), st.integers(0, 400))
def test_select_exact_keeps_the_k_largest_magnitudes_ties_to_the_smaller_index(x, k):
    indices, values = select_exact(x, k)
    expected = np.sort(np.argsort(-np.abs(x), kind="stable")[:min(k, x.size)])
    np.testing.assert_array_equal(indices, expected)
    np.testing.assert_array_equal(values, x[expected])
    assert values.dtype == x.dtype


@SETTINGS
@given(st.integers(1, 4), st.integers(0, 60), st.integers(1, 5), DTYPES,
       st.sampled_from(["gathered", "sharded"]), st.floats(0.05, 1.0),
       st.one_of(st.none(), st.floats(0.05, 1.0)), st.integers(0, 2 ** 16))
def test_residual_bookkeeping_sent_plus_kept_is_what_came_in(
        n, d, steps, dtype, mode, ratio, down, seed):
    # Worker i: sum_t s_i + e_i == sum_t g_i. Server: sum_t u + e_s == sum_t m.
    rng = np.random.default_rng(seed)
    workers = [ResidualMemory(["g"]) for _ in range(n)]
    servers = [ResidualMemory(["g"]) for _ in range(n)]
    config = TopKConfig(ratio, down)
    came_in, sent = np.zeros((n, d)), np.zeros((n, d))
    averaged, applied = np.zeros(d), np.zeros(d)
    for t in range(steps):
        grads = [rng.normal(size=d).astype(dtype) for _ in range(n)]
        result = simulate_step(grads, workers, servers, config, mode, step=t, name="g")
        for i in range(n):
            came_in[i] += grads[i]
            sent[i][result.sent[i][0]] += result.sent[i][1]
        averaged += result.m
        applied += result.u
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for i in range(n):
        kept = workers[i].get("g")
        kept = np.zeros(d) if kept is None else kept
        np.testing.assert_allclose(sent[i] + kept, came_in[i], atol=tol * steps)
    if down is not None and d:
        pieces = [m.get("g") for m in (servers[:1] if mode == "gathered" else servers)]
        server = np.concatenate([np.zeros(0) if p is None else p for p in pieces])
        np.testing.assert_allclose(applied + server, averaged, atol=tol * steps)
    else:
        np.testing.assert_allclose(applied, averaged, atol=tol * steps)


@SETTINGS
@given(st.integers(0, 500), st.integers(1, 40), st.data())
def test_shards_cover_the_index_space_in_order_with_lengths_within_one(d, n, data):
    bounds = shard_bounds(d, n)
    lengths = np.diff(bounds)
    assert bounds[0] == 0 and bounds[-1] == d and np.all(lengths >= 0)
    assert lengths.max() - lengths.min() <= 1
    k = data.draw(st.integers(0, d))
    share = shard_k(k, bounds)
    assert share.sum() == k and np.all(share <= lengths) and np.all(share >= 0)
    indices = np.unique(np.array(data.draw(st.lists(st.integers(0, max(d - 1, 0)),
                                                    max_size=50)), dtype=np.int64))
    indices = indices[indices < d]
    pieces = split_by_shard(indices, indices.astype(np.float64), bounds)
    assert len(pieces) == n
    np.testing.assert_array_equal(np.concatenate([i for i, _ in pieces]), indices)
    for s, (i, _) in enumerate(pieces):
        assert np.all((i >= bounds[s]) & (i < bounds[s + 1]))


@SETTINGS
@given(vectors(), st.integers(1, 8), st.integers(0, 400))
def test_global_shares_count_each_shards_part_of_the_sorted_global_top_k(b, n, k):
    bounds = shard_bounds(b.size, n)
    got = shares([b[bounds[s]:bounds[s + 1]] for s in range(n)], k)
    order = np.argsort(-np.abs(b.astype(np.float64)), kind="stable")[:k]
    kept = order[np.abs(b[order]) > 0]
    owner = np.searchsorted(bounds, kept, side="right") - 1
    np.testing.assert_array_equal(got, np.bincount(owner, minlength=n))


@SETTINGS
@given(st.integers(1, 64), st.integers(1, 64), st.integers(0, 2 ** 20),
       st.integers(0, 10 ** 6))
def test_every_shuffle_step_partitions_the_ranks_into_groups_within_one_in_size(
        n, g, seed, step):
    g = min(g, n)
    groups = ShuffleSchedule(n, g, seed).partition(step)
    members = sorted(r for group in groups for r in group)
    assert members == list(range(n))
    sizes = [len(group) for group in groups]
    assert max(sizes) <= g and max(sizes) - min(sizes) <= 1


@SETTINGS
@given(st.sampled_from(sorted(GRAPHS)), st.integers(1, 40), st.integers(0, 1000))
def test_every_graph_is_doubly_stochastic_and_its_neighbours_are_its_rows(graph, n, step):
    w = mixing_matrix(graph, n, step)
    np.testing.assert_allclose(w.sum(axis=0), 1.0, atol=1e-12)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
    assert np.all(w >= 0)
    for rank in {0, n // 2, n - 1}:
        nb = neighbors(graph, n, rank, step)
        row = np.zeros(n)
        row[rank] += nb.self_weight
        for j, weight in zip(nb.recv_from, nb.recv_weights):
            row[j] += weight
        np.testing.assert_allclose(row, w[rank], atol=1e-15)
        assert sorted(set(nb.send_to)) == sorted(
            j for j in range(n) if j != rank and w[j, rank] > 0)


@pytest.mark.parametrize("mode", ["gathered", "sharded"])
def test_a_world_of_one_rank_applies_its_own_compressed_gradient(mode):
    g = np.array([3.0, -1.0, 0.5, 2.0])
    result = simulate_step([g], [ResidualMemory(["g"])], [ResidualMemory(["g"])],
                           TopKConfig(0.5, 0.25), mode, name="g")
    np.testing.assert_array_equal(result.u, [3.0, 0, 0, 0])  # top 2 up, top 1 down
