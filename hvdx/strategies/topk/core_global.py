"""The global TopK of a vector cut into shards, agreed with a few small collectives.

Sharded bidirectional TopK (:mod:`hvdx.strategies.topk.core_bidirectional`) leaves each rank with
one shard of ``b = e_s + m``. The paper's downlink keeps the global top ``k_down`` of
``b`` (Zou, De Sterck & Liu, arXiv 2209.15203), not a fixed share of every shard: when
the large entries cluster in one shard, that shard must keep more. What each shard owner
needs is its *share*: how many of the global top ``K`` lie in its shard, where
``K = min(k_down, nonzeros of b)`` (a zero entry changes nothing and is never sent).
Then every owner selects its top ``share`` entries, and their union is exactly
``select_exact(b, k_down)`` (ties to the smaller index), up to zero-valued pairs.

:func:`shares` computes the shares from every shard at once (the numpy reference).
:func:`agree_shares` computes this rank's shares across ranks, for many tensors at
once, moving a few hundred numbers per rank per round instead of the shards
(a distributed selection by sampled pivots):

1. every rank keeps, per tensor, its ``min(k, nonzeros)`` largest magnitudes (the
   global top ``k`` lies within the union of the ranks' top ``k``). The threshold
   ``tau``, the ``K``-th largest of them all (``K = min(k, their count)``), lies in the
   window ``[lo, hi)``, at first ``[0, inf)``;
2. a round, one allgather: every rank sends, per tensor, its part of the window whole
   if it fits ``min(q, k)`` slots, else ``q`` magnitudes evenly spaced through it, with
   its size and its count above the window. A tensor whose parts all arrived whole is
   settled (step 3). For the others every rank counts its magnitudes at or above each
   of the ``P q`` samples (one allreduce of counts); the largest sample counted at least
   ``K`` times and the next one bound the new window: each rank's part shrinks by about
   ``q``;
3. from the window's magnitudes and the counts above it, ``tau``; every rank's share
   is its count above ``tau`` plus its part of the ties at ``tau``, handed out in rank
   (shard) order, as :func:`~hvdx.strategies.topk.core_selection.select_exact` gives ties to the
   smaller index. Windows that ties keep from shrinking are gathered whole.

A tensor with ``k <= q`` is settled in one allgather of ``k + 2`` numbers per rank;
with ``q = 32``, ``k`` up to 32,768 needs 3 rounds.
"""

from __future__ import annotations

from typing import Callable, List, Sequence

import numpy as np

__all__ = ["DEFAULT_PIVOTS", "agree_shares", "shares"]

#: Pivots per rank and round (``q`` in the module docstring).
DEFAULT_PIVOTS = 32
#: Rounds after which the window is gathered whatever its size (ties can stall it).
_MAX_ROUNDS = 8


def shares(shards: Sequence[np.ndarray], k: int) -> np.ndarray:
    """How many of the global top ``k`` nonzero ``|b|`` lie in each shard (reference).

    Args:
        shards: ``b`` cut into shards, in shard order.
        k: the global number of entries to keep.

    Returns:
        int64 shares, one per shard, summing to ``min(k, nonzeros of b)``.
    """
    magnitudes = [np.abs(np.asarray(s, dtype=np.float64)) for s in shards]
    everything = np.concatenate(magnitudes) if magnitudes else np.zeros(0)
    nonzero = everything[everything > 0]
    top = min(int(k), nonzero.size)
    result = np.zeros(len(magnitudes), np.int64)
    if top == 0:
        return result
    tau = np.partition(nonzero, nonzero.size - top)[nonzero.size - top]
    above = np.array([np.count_nonzero(m > tau) for m in magnitudes], np.int64)
    ties = np.array([np.count_nonzero(m == tau) for m in magnitudes], np.int64)
    return above + _ties_in_order(ties, top - int(above.sum()))


def agree_shares(magnitudes: Sequence[np.ndarray], ks: Sequence[int], rank: int,
                 allgather: Callable[[np.ndarray], List[np.ndarray]],
                 allreduce: Callable[[np.ndarray], np.ndarray],
                 pivots: int = DEFAULT_PIVOTS) -> np.ndarray:
    """This rank's share of the global top ``ks[t]`` of every tensor ``t`` (collective).

    Every rank calls it with its own shards, the same ``ks`` and the same collectives,
    and gets the same result as :func:`shares` would give it (module docstring).

    Args:
        magnitudes: this rank's shard of ``|b|`` per tensor (any float dtype, finite).
        ks: the global ``k`` per tensor, the same on every rank.
        rank: this rank's position in the collectives (its shard's index).
        allgather: every rank's 1-D float64 array, in rank order (lengths may differ).
        allreduce: the element-wise sum over ranks of an int64 array.
        pivots: ``q``.

    Returns:
        int64 shares, one per tensor.
    """
    ks = [int(k) for k in ks]
    if len(ks) != len(magnitudes):
        raise ValueError(f"ks has {len(ks)} entries for {len(magnitudes)} tensors")
    if pivots < 1:
        raise ValueError(f"pivots={pivots} must be at least 1")
    # Step 1: each tensor's candidates, sorted descending.
    candidates = []
    for m, k in zip(magnitudes, ks):
        m = np.abs(np.asarray(m, dtype=np.float64)).ravel()
        m = m[m > 0]
        if m.size > k:
            m = np.partition(m, m.size - k)[m.size - k:]
        candidates.append(np.sort(m)[::-1])
    n = len(candidates)
    # A tensor's slots per round: all its candidates when k fits (one round settles it).
    width = [min(pivots, k) for k in ks]
    lo, hi = np.zeros(n), np.full(n, np.inf)
    top = np.zeros(n, np.int64)
    result = np.zeros(n, np.int64)
    pending = [t for t in range(n) if ks[t] > 0]
    first, stalled, previous = True, set(), {}

    # Step 2: rounds. Each rank sends, per tensor, its window's size, its count above the
    # window and the window itself if it fits the slots, else evenly spaced samples.
    for _ in range(_MAX_ROUNDS):
        active = [t for t in pending if t not in stalled]
        if not active:
            break
        message = []
        for t in active:
            w = _window(candidates[t], lo[t], hi[t])
            slots = np.full(width[t], np.nan)
            if w.size <= width[t]:
                slots[:w.size] = w
            else:
                slots[:] = w[(np.arange(width[t]) * w.size) // width[t]]
            message.append(np.concatenate([[w.size, _count_at_least(candidates[t], hi[t])],
                                           slots]))
        rows = _split_rows(allgather(np.concatenate(message)), [2 + width[t] for t in active])
        sampled = []
        for t, row in zip(active, rows):  # row: ranks x (2 + width)
            sizes = row[:, 0].astype(np.int64)
            if first:  # the whole candidate lists: K = min(k, their total)
                top[t] = min(ks[t], int(sizes.sum()))
                if top[t] == 0:
                    pending.remove(t)
                    continue
            if sizes.max() <= width[t]:  # every window arrived whole: settle it
                parts = [r[2:2 + size] for r, size in zip(row, sizes)]
                result[t] = _share(parts, row[:, 1].astype(np.int64), int(top[t]), rank)
                pending.remove(t)
            elif previous.get(t) == int(sizes.sum()):
                stalled.add(t)  # ties keep the window from shrinking: gather it
            else:
                previous[t] = int(sizes.sum())
                samples = row[:, 2:].ravel()
                sampled.append((t, np.unique(samples[~np.isnan(samples)])))
        first = False
        if not sampled:
            continue
        total = allreduce(np.concatenate([_count_at_least(candidates[t], s)
                                          for t, s in sampled]))
        start = 0
        for t, s in sampled:
            at_least = total[start:start + s.size]  # s ascending, counts descending
            start += s.size
            enough = np.flatnonzero(at_least >= top[t])
            if enough.size:
                lo[t] = max(lo[t], s[enough[-1]])
            if enough.size < s.size:
                hi[t] = min(hi[t], s[enough.size])

    # Step 3: what is left, gathered whole with each rank's count above its window.
    if pending:
        windows = [_window(candidates[t], lo[t], hi[t]) for t in pending]
        head = np.array([w.size for w in windows] +
                        [_count_at_least(candidates[t], hi[t]) for t in pending],
                        np.float64)
        k_open = len(pending)
        everyone = []
        for g in allgather(np.concatenate([head] + windows)):
            lengths = g[:k_open].astype(np.int64)
            cuts = 2 * k_open + np.concatenate([[0], np.cumsum(lengths)])
            everyone.append((g[k_open:2 * k_open].astype(np.int64),
                             [g[a:b] for a, b in zip(cuts[:-1], cuts[1:])]))
        for row, t in enumerate(pending):
            result[t] = _share([parts[row] for _, parts in everyone],
                               np.array([above[row] for above, _ in everyone], np.int64),
                               int(top[t]), rank)
    return result


def _share(parts: Sequence[np.ndarray], above: np.ndarray, top: int, rank: int) -> int:
    """``rank``'s share, given every rank's window magnitudes (``parts``) and its count
    above the window: ``tau`` is the ``top - sum(above)``-th largest of the windows."""
    pool = np.concatenate(parts)
    need = top - int(above.sum())  # >= 1: tau lies in the window
    tau = np.partition(pool, pool.size - need)[pool.size - need]
    greater = np.array([np.count_nonzero(p > tau) for p in parts], np.int64)
    ties = np.array([np.count_nonzero(p == tau) for p in parts], np.int64)
    free = top - int(above.sum()) - int(greater.sum())
    return int(above[rank] + greater[rank] + _ties_in_order(ties, free)[rank])


def _split_rows(gathered: Sequence[np.ndarray], widths: Sequence[int]) -> List[np.ndarray]:
    """Per tensor, the ranks x width block of every rank's concatenated message."""
    cuts = np.concatenate([[0], np.cumsum(widths)])
    stacked = np.stack(gathered)
    return [stacked[:, a:b] for a, b in zip(cuts[:-1], cuts[1:])]


def _window(sorted_desc: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """The magnitudes in ``[lo, hi)``, still sorted descending."""
    return sorted_desc[(sorted_desc >= lo) & (sorted_desc < hi)]


def _count_at_least(sorted_desc: np.ndarray, values):
    """How many of ``sorted_desc`` are at least each of ``values`` (int64)."""
    ascending = sorted_desc[::-1]
    counts = ascending.size - np.searchsorted(ascending, values, side="left")
    return np.asarray(counts, dtype=np.int64)


def _ties_in_order(ties: np.ndarray, free: int) -> np.ndarray:
    """Hand ``free`` places to the tied entries, lower shards first."""
    before = np.concatenate([[0], np.cumsum(ties)[:-1]])
    return np.clip(int(free) - before, 0, ties).astype(np.int64)
