"""Contiguous shards of an index space ``[0, d)``, one per rank.

In sharded TopK (:mod:`hvdx.strategies.topk.core_bidirectional`) rank ``s`` owns the indices
``[bounds[s], bounds[s + 1])``: every rank sends it the pairs that fall there (one
alltoall), it aggregates and selects that shard, and the selected shards are allgathered.
The same split is used for reduce-scatter in Horovod and MPICH ("Optimization of
collective communication operations in MPICH", Thakur, Rabenseifner & Gropp, IJHPCA 2005).
"""

from __future__ import annotations

from typing import List, Tuple

import numpy as np

from hvdx.core.validation import check_integer

__all__ = ["shard_bounds", "shard_k", "split_by_shard"]


def shard_bounds(size: int, n_shards: int) -> np.ndarray:
    """``n_shards + 1`` int64 offsets: shard ``s`` is ``[bounds[s], bounds[s + 1])``.

    ``bounds[s] = s * size // n_shards``: lengths differ by at most one, and a shard is
    empty only when ``size < n_shards``.
    """
    check_integer("size", size, 0)
    check_integer("n_shards", n_shards, 1)
    return np.arange(n_shards + 1, dtype=np.int64) * int(size) // int(n_shards)


def split_by_shard(indices: np.ndarray, values: np.ndarray,
                   bounds: np.ndarray) -> List[Tuple[np.ndarray, np.ndarray]]:
    """Cut one rank's ``(indices, values)`` into the pieces each shard owner receives.

    ``indices`` must be sorted ascending (the selectors return them so); the pieces keep
    global indices and are views of the inputs, in shard order.
    """
    cuts = np.searchsorted(indices, bounds)
    return [(indices[lo:hi], values[lo:hi]) for lo, hi in zip(cuts[:-1], cuts[1:])]


def shard_k(k: int, bounds: np.ndarray) -> np.ndarray:
    """Split ``k`` selections among the shards in proportion to their lengths.

    Largest-remainder rounding (ties to the lower shard): the shares sum to exactly ``k``
    and none exceeds its shard's length. Every rank computes the same shares.
    """
    lengths = np.diff(np.asarray(bounds, dtype=np.int64))
    size = int(lengths.sum())
    check_integer("k", k, 0, size)
    if size == 0:
        return np.zeros_like(lengths)
    base, remainder = np.divmod(int(k) * lengths, size)
    leftover = int(k) - int(base.sum())
    # lexsort: last key first; larger remainder first, then the lower shard index.
    order = np.lexsort((np.arange(lengths.size), -remainder))
    base[order[:leftover]] += 1
    return base
