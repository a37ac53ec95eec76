"""Bidirectional TopK with error feedback (Zou, De Sterck & Liu, arXiv 2209.15203): the
one-process reference keeps every bookkeeping identity, reduces to dense averaging and to
unidirectional TopK where it must, gives every rank the same bits, and moves the bytes
the cost model assumes."""

import numpy as np
import pytest

from hvdx.core.sharding import shard_bounds, shard_k, split_by_shard
from hvdx.strategies.topk.core_bidirectional import (
    TopKConfig,
    aggregate,
    dense_allreduce_bytes,
    downlink,
    gathered_bytes,
    select,
    selection_rng,
    sharded_bytes,
    simulate_step,
    step_bytes,
    to_dense,
    uplink,
)
from hvdx.strategies.topk.core_error_feedback import ResidualMemory
from hvdx.strategies.topk.core_selection import k_for, select_exact

pytestmark = [pytest.mark.topk]

MODES = ("gathered", "sharded")


def memories(n):
    return [ResidualMemory(["grad"]) for _ in range(n)]


def gradient_stream(steps, n_ranks, d, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    # Different scales per coordinate, so some entries wait many steps in a residual.
    scale = np.exp(rng.uniform(-3, 1, d))
    return [[(rng.standard_normal(d) * scale).astype(dtype) for _ in range(n_ranks)]
            for _ in range(steps)]


def run(config, mode, stream, workers=None, server=None):
    n = len(stream[0])
    workers = memories(n) if workers is None else workers
    server = memories(n) if server is None else server
    results = [simulate_step(grads, workers, server, config, mode, step=t)
               for t, grads in enumerate(stream)]
    return results, workers, server


def server_residual(server, mode, d):
    if mode == "gathered":
        return server[0].get("grad")
    return np.concatenate([memory.get("grad") for memory in server])


CONFIGS = [TopKConfig(0.02, 0.01), TopKConfig(0.05, 0.005), TopKConfig(0.02),
           TopKConfig(0.02, 0.01, topk_method="sampled_threshold", sample_size=64)]
IDS = ["bidirectional", "bidirectional-small-downlink", "unidirectional", "threshold"]


# --- configuration ----------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,message", [
    (dict(ratio=1.5), r"^ratio=1\.5 must be in \(0, 1\]$"),
    (dict(ratio=0), r"^ratio=0 must be in \(0, 1\]$"),
    (dict(ratio=0.1, downlink_ratio=2), r"^downlink_ratio=2 must be in \(0, 1\]$"),
    (dict(ratio=0.1, topk_method="random"), r"^topk_method='random' must be one of"),
    (dict(ratio=0.1, sample_size=0), r"^sample_size=0 must be an integer >= 1$"),
    (dict(ratio=0.1, seed=-1), r"^seed=-1 must be an integer >= 0$"),
])
def test_a_bad_setting_is_a_value_error_naming_it(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TopKConfig(**kwargs)


def test_the_old_topk_method_value_is_stored_as_the_new_one():
    # "threshold" was the value of topk_method's old name, selector.
    config = TopKConfig(0.1, topk_method="threshold")
    assert config == TopKConfig(0.1, topk_method="sampled_threshold")
    assert config.topk_method == "sampled_threshold"


def test_k_up_and_k_down_follow_the_ratios():
    config = TopKConfig(0.01, 0.002)
    assert (config.k_up(10_000), config.k_down(10_000)) == (100, 20)
    assert config.downlink_pairs(10_000, 8) == 20
    assert TopKConfig(0.01).k_down(10_000) is None
    assert TopKConfig(0.01).downlink_pairs(10_000, 8) == 800
    assert TopKConfig(0.5).downlink_pairs(100, 8) == 100
    with pytest.raises(ValueError, match="mode='ring'"):
        simulate_step([np.ones(4)], memories(1), None, TopKConfig(0.5), "ring")
    with pytest.raises(ValueError, match="same shape and dtype"):
        simulate_step([np.ones(4), np.ones(4, np.float32)], memories(2), None, TopKConfig(0.5))
    workers = memories(2)
    with pytest.raises(ValueError, match=r"flat float32 or float64, got float16\[4\]"):
        simulate_step([np.ones(4, np.float16)] * 2, workers, None, TopKConfig(0.5))
    with pytest.raises(ValueError, match="one server_state memory per rank"):
        simulate_step([np.ones(4)] * 2, workers, memories(1), TopKConfig(0.5, 0.5))
    assert all(w.get("grad") is None for w in workers)


# --- bookkeeping identities -------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_every_worker_sent_plus_its_residual_equals_its_gradients(config, mode):
    stream = gradient_stream(20, 4, 1000)
    results, workers, _ = run(config, mode, stream)
    for i in range(4):
        sent = sum(to_dense(*r.sent[i], 1000) for r in results)
        np.testing.assert_allclose(sent + workers[i].get("grad"),
                                   sum(grads[i] for grads in stream), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("config", CONFIGS[:2] + CONFIGS[3:], ids=IDS[:2] + IDS[3:])
def test_the_server_sent_plus_its_residual_equals_the_aggregates(config, mode):
    stream = gradient_stream(20, 4, 1000, seed=1)
    results, _, server = run(config, mode, stream)
    sent = sum(r.u for r in results)
    np.testing.assert_allclose(sent + server_residual(server, mode, 1000),
                               sum(r.m for r in results), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_the_identities_hold_in_float32_to_rounding(mode):
    stream = gradient_stream(20, 3, 500, seed=2, dtype=np.float32)
    results, workers, server = run(TopKConfig(0.02, 0.01), mode, stream)
    assert all(r.u.dtype == np.float32 for r in results)
    total = sum(r.u.astype(np.float64) for r in results)
    m = sum(r.m.astype(np.float64) for r in results)
    np.testing.assert_allclose(total + server_residual(server, mode, 500), m,
                               rtol=1e-5, atol=1e-5)
    for i in range(3):
        sent = sum(to_dense(*r.sent[i], 500).astype(np.float64) for r in results)
        np.testing.assert_allclose(sent + workers[i].get("grad"),
                                   sum(g[i].astype(np.float64) for g in stream),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_at_most_k_up_pairs_go_up_and_k_down_come_down(config, mode):
    d = 2000
    k_up, k_down = config.k_up(d), config.downlink_pairs(d, 4)
    for r in run(config, mode, gradient_stream(10, 4, d, seed=3))[0]:
        assert all(len(i) <= k_up for i, _ in r.sent)
        assert max(r.stats.nnz_up) <= k_up
        assert r.stats.nnz_down <= k_down
        assert np.count_nonzero(r.u) <= k_down
        assert r.stats.nnz_m == np.count_nonzero(r.m) <= min(d, 4 * k_up)


# --- reductions to simpler algorithms ---------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("config", [TopKConfig(1.0, 1.0), TopKConfig(1.0)],
                         ids=["bidirectional", "unidirectional"])
def test_keeping_everything_is_dense_averaging_with_zero_residuals(config, mode):
    stream = gradient_stream(5, 4, 300, seed=4)
    results, workers, server = run(config, mode, stream)
    for grads, r in zip(stream, results):
        in_rank_order = (((grads[0] + grads[1]) + grads[2]) + grads[3]) / 4
        np.testing.assert_array_equal(r.u, in_rank_order)
        np.testing.assert_allclose(r.u, np.mean(grads, axis=0), rtol=1e-13, atol=1e-15)
    assert all(np.all(w.get("grad") == 0) for w in workers)
    if config.bidirectional:
        assert np.all(server_residual(server, mode, 300) == 0)


def test_a_downlink_of_at_least_p_times_k_up_is_unidirectional():
    stream = gradient_stream(15, 4, 1000, seed=5)
    uni, _, _ = run(TopKConfig(0.01), "gathered", stream)
    for downlink_ratio in (0.04, 0.1, 1.0):  # k_down = 40 = 4 * 10, then more
        bi, _, server = run(TopKConfig(0.01, downlink_ratio), "gathered", stream)
        for a, b in zip(uni, bi):
            np.testing.assert_array_equal(a.u, b.u)
        assert np.all(server[0].get("grad") == 0)


def test_a_small_downlink_differs_from_unidirectional():
    stream = gradient_stream(5, 4, 1000, seed=5)
    uni, _, _ = run(TopKConfig(0.01), "gathered", stream)
    bi, _, server = run(TopKConfig(0.01, 0.005), "gathered", stream)
    assert not np.array_equal(uni[0].u, bi[0].u)
    assert np.count_nonzero(server[0].get("grad")) > 0


@pytest.mark.parametrize("ratio", [0.01, 0.2, 1.0])
def test_unidirectional_sharded_and_gathered_give_the_same_bits(ratio):
    stream = gradient_stream(10, 5, 997, seed=6)
    gathered, _, _ = run(TopKConfig(ratio), "gathered", stream)
    sharded, _, _ = run(TopKConfig(ratio), "sharded", stream)
    for a, b in zip(gathered, sharded):
        assert a.u.tobytes() == b.u.tobytes()
        assert a.m.tobytes() == b.m.tobytes()
        assert a.stats.nnz_down == b.stats.nnz_down == np.count_nonzero(a.m)


def test_one_rank_applies_its_own_top_k():
    g = np.array([0.1, -3.0, 2.0, 0.5])
    r = simulate_step([g], memories(1), memories(1), TopKConfig(0.5, 0.25), "gathered")
    np.testing.assert_array_equal(r.m, [0, -3.0, 2.0, 0])
    np.testing.assert_array_equal(r.u, [0, -3.0, 0, 0])
    assert r.stats.recv_bytes == (0,)


# --- every rank gets the same bits ------------------------------------------------------

@pytest.mark.parametrize("topk_method", ["exact", "sampled_threshold"])
def test_gathered_every_rank_computes_a_bitwise_identical_u_and_server_residual(
        topk_method):
    config = TopKConfig(0.05, 0.01, topk_method=topk_method, sample_size=100)
    stream = gradient_stream(10, 6, 2000, seed=7, dtype=np.float32)
    results, _, server = run(config, "gathered", stream)
    for r in results:
        assert len({u.tobytes() for u in r.updates}) == 1
    assert len({memory.get("grad").tobytes() for memory in server}) == 1


def test_aggregate_sums_in_the_given_rank_order():
    # Float addition is not associative: (1e16 + 1) - 1e16 == 0 but (1e16 - 1e16) + 1 == 1.
    idx = np.array([0])
    pairs = [(idx, np.array([1e16])), (idx, np.array([1.0])), (idx, np.array([-1e16]))]
    assert aggregate(pairs, 1, 3)[0] == 0.0
    assert aggregate([pairs[0], pairs[2], pairs[1]], 1, 3)[0] == 1.0 / 3
    # Same list, same bits, whoever computes it.
    rng = np.random.default_rng(8)
    pairs = [select_exact(rng.standard_normal(500).astype(np.float32), 50) for _ in range(8)]
    first = aggregate(pairs, 500, 8)
    assert all(aggregate(list(pairs), 500, 8).tobytes() == first.tobytes() for _ in range(3))
    with pytest.raises(ValueError, match="n_ranks=7"):
        aggregate(pairs, 500, 7)


def test_downlink_is_pure_and_zeroes_what_it_sends():
    m = np.array([0.0, 4.0, -1.0, 0.5])
    e = np.array([1.0, 0.0, -2.5, 0.0])
    kept_m, kept_e = m.copy(), e.copy()
    indices, values, new_e = downlink(m, e, 2)
    np.testing.assert_array_equal(indices, [1, 2])
    np.testing.assert_array_equal(values, [4.0, -3.5])
    np.testing.assert_array_equal(new_e, [1.0, 0.0, 0.0, 0.5])
    np.testing.assert_array_equal(m, kept_m)
    np.testing.assert_array_equal(e, kept_e)
    np.testing.assert_array_equal(downlink(m, None, 1)[2], [0.0, 0.0, -1.0, 0.5])
    with pytest.raises(ValueError, match="server residual"):
        downlink(m, e[:3], 1)


def test_uplink_is_compensate_select_update():
    memory = ResidualMemory(["w"])
    indices, values = uplink(memory, "w", np.array([1.0, -5.0, 2.0]), 1)
    np.testing.assert_array_equal(indices, [1])
    np.testing.assert_array_equal(memory.get("w"), [1.0, 0.0, 2.0])
    indices, values = uplink(memory, "w", np.array([1.5, 0.0, 0.0]), 1)
    np.testing.assert_array_equal(values, [2.5])


def test_selection_generators_are_pure_functions_of_their_key():
    a = selection_rng(3, 10, "down", 2).integers(1 << 30, size=4)
    b = selection_rng(3, 10, "down", 2).integers(1 << 30, size=4)
    c = selection_rng(3, 10, "up", 2).integers(1 << 30, size=4)
    d = selection_rng(3, 11, "down", 2).integers(1 << 30, size=4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c) and not np.array_equal(a, d)
    with pytest.raises(ValueError, match="needs rng"):
        select(np.ones(3), 1, TopKConfig(0.5, topk_method="sampled_threshold"))


# --- sharded mode -----------------------------------------------------------------------

@pytest.mark.parametrize("d,p", [(10, 3), (1000, 8), (2, 4), (0, 2), (7, 1)])
def test_shards_are_contiguous_cover_the_range_and_differ_by_at_most_one(d, p):
    bounds = shard_bounds(d, p)
    assert bounds[0] == 0 and bounds[-1] == d and len(bounds) == p + 1
    lengths = np.diff(bounds)
    assert lengths.min() >= 0 and lengths.max() - lengths.min() <= 1


def test_split_by_shard_sends_every_pair_to_its_owner_once():
    bounds = shard_bounds(100, 3)  # [0, 33, 66, 100]
    indices = np.array([0, 5, 32, 33, 65, 66, 99])
    values = np.arange(7.0)
    pieces = split_by_shard(indices, values, bounds)
    assert [list(i) for i, _ in pieces] == [[0, 5, 32], [33, 65], [66, 99]]
    assert [list(v) for _, v in pieces] == [[0, 1, 2], [3, 4], [5, 6]]
    assert all(len(i) == 0 for i, _ in split_by_shard(indices[:0], values[:0], bounds))


@pytest.mark.parametrize("k,d,p", [(10, 100, 3), (7, 1000, 8), (100, 100, 7), (0, 50, 4),
                                   (2, 2, 4), (1, 10, 3)])
def test_shard_shares_sum_to_k_in_proportion_and_fit_their_shards(k, d, p):
    bounds = shard_bounds(d, p)
    shares = shard_k(k, bounds)
    lengths = np.diff(bounds)
    assert shares.sum() == k
    assert np.all(shares <= lengths)
    if d:
        assert np.all(np.abs(shares - k * lengths / d) < 1)
    with pytest.raises(ValueError, match="k="):
        shard_k(d + 1, bounds)


def test_sharded_downlink_is_the_global_top_k_where_large_entries_cluster():
    # All large entries in shard 0: the global top-2 takes both (a TopK per shard
    # would take one per shard: [9, 0, 0, 0, 0, 0, 0, 1]).
    g = np.array([9.0, 8.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    config = TopKConfig(1.0, 0.25)
    for mode in MODES:
        result = simulate_step([g, g], memories(2), memories(2), config, mode)
        np.testing.assert_array_equal(result.u, [9.0, 8.0, 0, 0, 0, 0, 0, 0])


def top_k_from_scratch(x, k):
    """Keep the k largest |x| (ties to the smaller index: a stable argsort), zero the rest."""
    keep = np.argsort(-np.abs(x), kind="stable")[:k]
    kept = np.zeros_like(x)
    kept[keep] = x[keep]
    return kept


def bidirectional_from_scratch(stream, k_up, k_down):
    """Steps 1-3 of the paper with error feedback, dense numpy, written out here."""
    n, d = len(stream[0]), stream[0][0].size
    worker = [np.zeros(d) for _ in range(n)]
    server = np.zeros(d)
    updates = []
    for grads in stream:
        sent = []
        for i, g in enumerate(grads):
            a = worker[i] + g
            sent.append(top_k_from_scratch(a, k_up))
            worker[i] = a - sent[-1]
        m = np.zeros(d)
        for s in sent:  # rank order
            m = m + s
        m = m / n
        if k_down is None:
            updates.append(m)
            continue
        b = server + m
        updates.append(top_k_from_scratch(b, k_down))
        server = b - updates[-1]
    return updates


def clustered_stream(steps, n, d, seed):
    """Gradients whose large entries all lie in the last shard."""
    stream = gradient_stream(steps, n, d, seed=seed)
    last = shard_bounds(d, n)[-2]
    for grads in stream:
        for g in grads:
            g[last:] *= 1e3
    return stream


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("down", [0.01, 0.04, 0.1, None])
def test_several_steps_match_a_from_scratch_reference_with_clustered_entries(mode, n, down):
    d = 400
    config = TopKConfig(0.01, down)  # k_up = 4; k_down = 4, 16, 40 or unidirectional
    k_up, k_down = config.k_up(d), config.k_down(d)
    assert (k_up, k_down) == (4, None if down is None else round(down * d))
    stream = clustered_stream(6, n, d, seed=n)
    results, _, _ = run(config, mode, stream)
    for result, expected in zip(results, bidirectional_from_scratch(stream, k_up, k_down)):
        np.testing.assert_array_equal(result.u, expected)


@pytest.mark.parametrize("mode", MODES)
def test_k_down_at_least_p_k_up_is_unidirectional_topk_bitwise_with_clustered_entries(mode):
    n, d = 4, 400
    stream = clustered_stream(6, n, d, seed=11)
    bidirectional, _, server = run(TopKConfig(0.01, 0.04), mode, stream)  # 16 >= 4 * 4
    unidirectional, _, _ = run(TopKConfig(0.01), mode, stream)
    for b, u in zip(bidirectional, unidirectional):
        np.testing.assert_array_equal(b.u, u.u)
    assert not np.any(server_residual(server, mode, d))


def test_sharded_sends_no_zero_valued_pairs_down():
    n, d = 4, 400
    stream = clustered_stream(1, n, d, seed=12)
    result = simulate_step(stream[0], memories(n), memories(n), TopKConfig(0.01, 0.1),
                           "sharded")
    # 16 distinct nonzeros at most (4 ranks x k_up = 4) although k_down = 40.
    assert result.stats.nnz_down == np.count_nonzero(result.u) <= 16


def test_sharded_ranks_hold_only_their_shard_of_the_server_residual():
    stream = gradient_stream(3, 3, 100, seed=9)
    _, _, server = run(TopKConfig(0.1, 0.05), "sharded", stream)
    assert [memory.get("grad").size for memory in server] == list(np.diff(shard_bounds(100, 3)))


# --- a NaN stops the step before anything changes ---------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_a_nan_gradient_on_any_rank_names_the_parameter_and_changes_no_residual(mode):
    stream = gradient_stream(4, 3, 200, seed=10)
    _, workers, server = run(TopKConfig(0.05, 0.02), mode, stream[:3])
    before = [m.state_dict() for m in workers + server]
    grads = stream[3]
    grads[2] = grads[2].copy()
    grads[2][17] = np.nan
    with pytest.raises(ValueError, match="parameter 'layer3.weight'"):
        simulate_step(grads, workers, server, TopKConfig(0.05, 0.02), mode,
                      name="layer3.weight")
    with pytest.raises(ValueError, match="parameter 'grad'"):
        simulate_step(grads, workers, server, TopKConfig(0.05, 0.02), mode)
    for memory, state in zip(workers + server, before):
        np.testing.assert_array_equal(memory.get("grad"), state["grad"])


def test_a_checkpointed_simulation_continues_identically():
    stream = gradient_stream(12, 3, 400, seed=11)
    config = TopKConfig(0.02, 0.01)
    full, _, _ = run(config, "sharded", stream)
    _, workers, server = run(config, "sharded", stream[:6])
    restored = [ResidualMemory() for _ in range(6)]
    for memory, original in zip(restored, workers + server):
        memory.load_state_dict(original.state_dict())
    rest, _, _ = run(config, "sharded", stream[6:], restored[:3], restored[3:])
    for a, b in zip(full[6:], rest):
        np.testing.assert_array_equal(a.u, b.u)


# --- bytes ------------------------------------------------------------------------------

def test_gathered_bytes_grow_linearly_in_p_while_sharded_stay_flat():
    k = 10_000
    gathered = [gathered_bytes(k, p).received for p in (2, 4, 8, 16, 32)]
    sharded = [sharded_bytes(k, k, p).received for p in (2, 4, 8, 16, 32)]
    assert gathered == [(p - 1) * k * 8 for p in (2, 4, 8, 16, 32)]
    assert gathered[-1] / gathered[0] == 31
    assert sharded[-1] / sharded[0] < 2 and max(sharded) < 2 * k * 8
    # Unidirectional sharded allgathers all of m: up to P k_up pairs, linear again.
    d = 10**7
    uni = [step_bytes(TopKConfig(0.001), d, p, "sharded").received for p in (2, 32)]
    assert uni[1] / uni[0] > 10


@pytest.mark.parametrize("p", [4, 8])
@pytest.mark.parametrize("d", [10**6, 25_557_032])
def test_sharded_bytes_at_ratio_one_percent_are_at_most_2_5_percent_of_dense(p, d):
    config = TopKConfig(0.01, 0.01)
    traffic = step_bytes(config, d, p, "sharded")
    dense = dense_allreduce_bytes(d, p)
    assert dense == 2 * (p - 1) / p * d * 4
    assert traffic.sent <= 0.025 * dense and traffic.received <= 0.025 * dense


def test_simulated_bytes_match_the_formulas():
    p, d = 4, 4000
    config = TopKConfig(0.01, 0.01)
    stream = gradient_stream(8, p, d, seed=12)
    gathered, _, _ = run(config, "gathered", stream)
    expected = gathered_bytes(config.k_up(d), p).received
    assert all(r.stats.recv_bytes == (expected,) * p for r in gathered)
    sharded, _, _ = run(config, "sharded", stream)
    mean = np.mean([r.stats.recv_bytes for r in sharded])
    # Random gradients spread evenly over shards on average.
    assert mean == pytest.approx(step_bytes(config, d, p, "sharded").received, rel=0.2)
    assert all(r.stats.nnz_down == k_for(0.01, d) for r in sharded)
