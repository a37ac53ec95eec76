"""Decentralized SGD's cost layout: every rank sends its model to its neighbours in the
graph (the cost model prices it under ``decentralized``: its descriptor's
``cost_layout``, :mod:`hvdx.core.cost.layouts`)."""

from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from hvdx.core.cost.types import Cluster, Flow, Workload, _Plan, _Traffic
from hvdx.core.validation import check_integer

#: The graphs :func:`_decentralized` prices (those of ``hvdx.Decentralized``).
DECENTRALIZED_GRAPHS = ("one-peer-exp", "static-exp", "one-peer-hypercube", "ring",
                            "torus", "complete")
_ORDERS = ("adapt_then_combine", "combine_then_adapt")


def _graph_step_flows(graph: str, n: int, step: int, nbytes: float) -> Tuple[List[Flow], str]:
    """Mix ``step``'s flows: rank ``j`` sends ``nbytes`` to every ``i`` with
    ``W[i, j] > 0``, ``i != j``; and a name (the shifts, for a circulant graph)."""
    from hvdx.core import mixing_graphs

    w = np.asarray(mixing_graphs.mixing_matrix(graph, n, step))
    dst, src = np.nonzero((w != 0) & ~np.eye(n, dtype=bool))
    if len(src) == 0:
        return [], "no exchange"
    shifts = (dst - src) % n
    per_rank = [tuple(sorted(shifts[src == r])) for r in range(n)]
    if all(p == per_rank[0] for p in per_rank):  # every rank sends to i + the same shifts
        peers = per_rank[0]
        name = "send model to " + ", ".join(f"i+{d}" if d <= n // 2 else f"i-{n - d}"
                                            for d in peers)
        if len(peers) > 4:
            name = f"send model to {len(peers)} peers"
    else:
        name = f"step {step}: send model to {len(src) / n:g} peers on average"
    return [(src, dst, nbytes)], name


def _decentralized(c: Cluster, w: Workload, graph: Optional[str] = None,
                   order: str = "adapt_then_combine", mix_every: int = 1,
                   topology: Optional[str] = None) -> _Plan:
    """Decentralized SGD over a graph (Ying et al., "Exponential Graph is Provably
    Efficient for Decentralized Deep Training", NeurIPS 2021), as ``hvdx.Decentralized``.

    1. for each mix ``m`` of the graph's period, every rank sends its model to its
       out-neighbours at once (non-blocking point-to-point, one message each);
    2. the mix's phase is weighted ``1 / (period * mix_every)``: the graph follows the
       mixes, not the steps (:func:`hvdx.core.mixing_graphs.mix_index`), so every
       ``period * mix_every`` training steps hold each of the ``period`` mixes once,
       and local steps in between with ``mix_every > 1``;
    3. combine-then-adapt overlaps the exchange with the next forward and backward pass.

    ``graph`` defaults to ``"one-peer-exp"``; ``topology`` is its old name, which the
    ``cost_options`` of results saved by ``hvdx bench`` before the rename hold: they
    still price.
    """
    from hvdx.core import mixing_graphs

    if topology is not None and graph is not None:
        raise ValueError(f"graph={graph!r} and topology={topology!r}: topology is the "
                         "old name of graph; give graph only")
    graph = graph or topology or "one-peer-exp"
    if graph not in DECENTRALIZED_GRAPHS:
        raise ValueError(f"graph={graph!r} must be one of "
                         f"{', '.join(DECENTRALIZED_GRAPHS)}")
    if order not in _ORDERS:
        raise ValueError(f"order={order!r} must be one of {', '.join(_ORDERS)}")
    mix_every = check_integer("mix_every", mix_every, 1)
    n = c.ranks
    label = f"decentralized {graph}" + (" cta" if order == _ORDERS[1] else "") + \
        (f" every {mix_every}" if mix_every > 1 else "")
    if n == 1:
        return _Plan(label, [])
    period = mixing_graphs.period(graph, n)
    traffic = []
    for step in range(period):
        flows, name = _graph_step_flows(graph, n, step, w.model_bytes)
        if flows:
            traffic.append(_Traffic(name, flows, 1, 1 / (period * mix_every),
                                    sends_first=True))
    return _Plan(label, traffic, overlap=order == _ORDERS[1])
