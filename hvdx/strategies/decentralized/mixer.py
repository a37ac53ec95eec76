"""Decentralized SGD's mixer: each step, this rank's neighbours in the step's graph.

The spec and the algorithm are :class:`hvdx.Decentralized` (Ying et al., arXiv
2110.13363); the numpy reference is
:func:`hvdx.strategies.decentralized.core_reference.simulate_decentralized`. A
:class:`hvdx.core.mixer_protocol.Mixer`, run by the shared mixing drivers of torch and
TensorFlow: at a mixing step ``t`` (every ``mix_every``-th) it asks for a
:class:`~hvdx.core.mixer_protocol.Neighbours` exchange with the graph's
``neighbors(t)``, which the driver runs as one fused buffer per dtype family by mpi4py
point-to-point (:class:`hvdx.mpi.neighbor_exchange.FusedExchange`), combining
``w_ii x_i + sum_j w_ij x_j``. With ``order="combine_then_adapt"`` it mixes before the
local step (``combines_first``): torch then overlaps the exchange with the next
forward and backward pass.
"""

from __future__ import annotations

from hvdx.core.counters import MixingStats
from hvdx.core.group_averaging import COMBINE_THEN_ADAPT
from hvdx.core.mixer_protocol import Everyone, Mixer, Neighbours, Skip

__all__ = ["GraphMixer"]


class GraphMixer(Mixer):
    """Decentralized SGD's mixer (module docstring); ``graph``: this rank's
    :class:`~hvdx.strategies.decentralized.spec.MixingGraph`."""

    # The checkpoint entry keeps "change" and "layout" beside "step", as it always has.
    state_entry = None
    views = {"hvdx_graph": "graph", "graph": "graph"}

    def __init__(self, sync, graph):
        self.sync = sync
        self.graph = graph
        self.stats = MixingStats()  # (hvdx.Decentralized's DecentralizedStats)
        self.combines_first = sync.order == COMBINE_THEN_ADAPT

    def exchange(self, step: int, everyone: bool):
        if everyone:
            return Everyone()
        if not self.sync.mixes_at(step):
            return Skip()
        return Neighbours(self.graph.neighbors(step))
