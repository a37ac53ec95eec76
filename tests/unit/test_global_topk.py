"""The global TopK of a sharded vector: every shard's share of the global top k.

The expectation is a brute-force sort of the whole vector (lexsort by magnitude, then
index: select_exact's tie rule) written here; the distributed agreement runs its ranks
as threads over an in-process allgather/allreduce.
"""

import threading

import numpy as np
import pytest

from hvdx.core.sharding import shard_bounds
from hvdx.strategies.topk.core_global import agree_shares, shares

pytestmark = [pytest.mark.topk]


def brute_force_shares(b, bounds, k):
    """Sort everything; keep the first k nonzero; count what each shard kept."""
    a = np.abs(b)
    order = np.lexsort((np.arange(a.size), -a))  # largest first, ties: smaller index
    kept = [i for i in order[:k] if a[i] > 0]
    owner = np.searchsorted(bounds, kept, side="right") - 1
    return np.bincount(owner, minlength=len(bounds) - 1).astype(np.int64)


class ThreadWorld:
    """allgather and allreduce among ``n`` threads, one per rank."""

    def __init__(self, n):
        self.n = n
        self.barrier = threading.Barrier(n)
        self.slots = [None] * n
        self.rounds = 0

    def allgather(self, rank, array):
        self.slots[rank] = np.array(array, copy=True)
        self.barrier.wait()
        out = list(self.slots)
        if rank == 0:
            self.rounds += 1
        self.barrier.wait()
        return out

    def allreduce(self, rank, array):
        return np.sum(self.allgather(rank, array), axis=0)


def agree(vectors, ks, n, pivots=4):
    """Run agree_shares on n thread ranks; each rank's shares (n x tensors)."""
    world = ThreadWorld(n)
    results, errors = [None] * n, []

    def rank_main(r):
        try:
            mine = [v[int(b[r]):int(b[r + 1])] for v, b in
                    zip(vectors, [shard_bounds(v.size, n) for v in vectors])]
            results[r] = agree_shares(mine, ks, r, lambda x: world.allgather(r, x),
                                      lambda x: world.allreduce(r, x), pivots=pivots)
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)
            world.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return np.stack(results), world.rounds


def clustered(rng, d, n):
    """Large entries all in the last shard, small ones elsewhere."""
    b = rng.normal(size=d) * 1e-3
    last = shard_bounds(d, n)[-2]
    b[last:] = rng.normal(size=d - last) * 10
    return b


VECTORS = {
    "normal": lambda rng, d, n: rng.normal(size=d),
    "clustered": clustered,
    "ties": lambda rng, d, n: rng.integers(-3, 4, size=d).astype(np.float64),
    "mostly-zero": lambda rng, d, n: rng.normal(size=d) * (rng.random(d) < 0.05),
    "float32": lambda rng, d, n: rng.normal(size=d).astype(np.float32),
}


@pytest.mark.parametrize("kind", sorted(VECTORS))
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_reference_shares_are_the_brute_force_global_topk(kind, n):
    rng = np.random.default_rng(n)
    for d, k in [(1, 1), (7, 3), (200, 20), (200, 500), (1000, 0)]:
        b = VECTORS[kind](rng, d, n)
        bounds = shard_bounds(d, n)
        got = shares([b[bounds[s]:bounds[s + 1]] for s in range(n)], k)
        np.testing.assert_array_equal(got, brute_force_shares(b, bounds, k))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_ranks_agree_on_the_reference_shares_for_many_tensors_at_once(n):
    rng = np.random.default_rng(10 + n)
    vectors = [VECTORS[kind](rng, d, n) for kind, d in
               [("normal", 3000), ("clustered", 2000), ("ties", 500), ("mostly-zero", 800),
                ("float32", 50), ("normal", 3), ("normal", 0)]]
    ks = [300, 150, 60, 100, 50, 2, 0]
    got, _ = agree(vectors, ks, n)
    for t, (v, k) in enumerate(zip(vectors, ks)):
        np.testing.assert_array_equal(got[:, t], brute_force_shares(v, shard_bounds(v.size, n), k))


def test_a_clustered_shard_keeps_more_than_its_proportional_share():
    n, d, k = 4, 4000, 400
    b = clustered(np.random.default_rng(0), d, n)
    got, _ = agree([b], [k], n)
    assert got[:, 0].tolist() == [0, 0, 0, k]  # proportional shares would be 100 each


def test_the_rounds_grow_with_log_k_not_with_k():
    n, d = 4, 200_000
    b = np.random.default_rng(1).normal(size=d)
    _, rounds = agree([b], [20_000], n, pivots=32)
    # one allreduce of counts, then (allgather + allreduce) per round, then the final
    # allgather; 20,000 candidates per rank need 3 rounds at 32 pivots.
    assert rounds <= 1 + 2 * 4 + 1


def test_more_than_every_nonzero_keeps_every_nonzero_and_no_zero():
    n = 3
    b = np.zeros(30)
    b[[2, 25, 26]] = [1.0, -2.0, 3.0]
    got, _ = agree([b], [10], n)
    assert got[:, 0].tolist() == [1, 0, 2]
