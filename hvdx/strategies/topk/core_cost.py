"""TopK's cost layout: the (index, value) pairs, gathered or sharded (the cost model
prices it under ``topk``: its descriptor's ``cost_layout``,
:mod:`hvdx.core.cost.layouts`)."""

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np

from hvdx.core.cost.collectives import _as_measured, _rings, _shift
from hvdx.core.cost.types import Cluster, Workload, _fraction, _Plan, _Traffic

_INDEX_BYTES = 4  # a sparse entry travels as an int32 index next to its value


def topk_pair_bytes(params: int, ratio: float, downlink_ratio: Optional[float] = None,
                    bytes_per_element: int = 4) -> Tuple[int, int]:
    """``(uplink, downlink)`` bytes of the (index, value) pairs one rank's TopK selects
    from ``params`` parameters: ``ceil(ratio * params)`` pairs up, ``ceil(downlink_ratio *
    params)`` down (``downlink_ratio`` defaults to ``ratio``), each an int32 index next
    to its value. What the cost model prices, and what ``hvdx bench`` times sharded
    TopK's step at around its runs."""
    ratio = _fraction("ratio", ratio, low_open=True)
    down = _fraction("downlink_ratio", ratio if downlink_ratio is None else downlink_ratio,
                     low_open=True)
    pair = _INDEX_BYTES + bytes_per_element
    return math.ceil(ratio * params) * pair, math.ceil(down * params) * pair


def _topk(c: Cluster, w: Workload, ratio: float = 0.01, downlink_ratio: Optional[float] = None,
          mode: str = "gathered") -> _Plan:
    """TopK sparsification (Zou, De Sterck & Liu, arXiv 2209.15203).

    gathered: 1. every rank allgathers its k (index, value) pairs; every rank sums them
    (and applies its downlink TopK locally, which costs no bytes).
    sharded: 1. alltoall: the pairs of shard s go to rank s; 2. rank s sums its shard and
    keeps the top ``k_down / n``; 3. allgather of those downlink shards.
    A calibration that timed hvdx's allgather and alltoall prices them as timed; one that
    timed sharded TopK's two collectives one after the other, as its step runs them
    (:class:`~hvdx.core.calibration.Calibration` step 9), prices 1 and 3 together so.
    """
    if mode not in ("gathered", "sharded"):
        raise ValueError(f"mode={mode!r} must be 'gathered' or 'sharded'")
    n = c.ranks
    k_up, k_down = topk_pair_bytes(w.params, ratio, downlink_ratio, w.bytes_per_element)
    # hvdx's collectives as the calibration timed them (hvdx.core.calibration, step 7);
    # one rank has nothing to send.
    cal = c.calibration if n > 1 else None

    if mode == "gathered":
        # Ring allgather: each rank forwards the other n-1 ranks' k pairs.
        gather = _rings(np.arange(n)[None, :], (n - 1) * k_up)
        return _Plan(f"topk gathered {ratio:g}", [_as_measured(
            _Traffic("allgather of top-k pairs", gather, n - 1),
            cal and cal.allgather_s(k_up))])
    down = ratio if downlink_ratio is None else downlink_ratio
    # Indices spread evenly over the n shards: each owner gets k_up/n pairs from each rank.
    scatter = [_shift(n, d, k_up / n) for d in range(1, n)]
    gather = _rings(np.arange(n)[None, :], (n - 1) / n * k_down)
    both = cal and cal.sharded_topk_s(k_up, k_down / k_up)
    if both is not None:
        return _Plan(f"topk sharded {ratio:g}/{down:g}", [_as_measured(
            _Traffic("alltoall of top-k pairs to shard owners, then allgather of the "
                     "downlink shards", scatter + gather, 2 * (n - 1), repeated=False),
            both)])
    return _Plan(f"topk sharded {ratio:g}/{down:g}", [
        _as_measured(_Traffic("alltoall of top-k pairs to shard owners", scatter, n - 1,
                              repeated=False), cal and cal.alltoall_s(k_up)),
        _as_measured(_Traffic("allgather of downlink top-k shards", gather, n - 1),
                     cal and cal.allgather_s(k_down / n))])
