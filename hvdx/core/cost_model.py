"""Alpha-beta cost model: predicted step time of each hvdx strategy on a rack cluster.

Every message costs ``alpha + m / beta`` (Hockney, "The communication challenge for MPP",
Parallel Computing 20, 1994). Collectives are built from the standard algorithms of
Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations in
MPICH" (IJHPCA 2005): a ring allreduce of ``M`` bytes over ``m`` ranks is a reduce-scatter
and an allgather, ``2(m-1)`` rounds, each rank sending ``2(m-1)/m * M`` bytes, which is
bandwidth-optimal (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for
clusters of workstations", JPDC 2009).

The network: every host has a NIC (``nic_bps`` each way), every rack one uplink to the
core (``uplink_bps`` each way), ranks on one host talk at ``intra_host_bps`` (``None``:
free). Ranks fill hosts in the order of the cluster's *placement*, ``ranks_per_host``
each, as an MPI hostfile lists them (:func:`host_order`): ``"blocked"`` lists the hosts
rack by rack (ranks ``0..W-1`` in rack 0), ``"interleaved"`` deals them out over the
racks in turn (rank ``r`` in rack ``r mod R`` with one rank per host). A ring follows rank
order; a strategy's groups "inside a rack" are the ranks that placement puts there. A
phase is a set of concurrent flows (src, dst, bytes); flows share links evenly (fluid
model), so the phase ends when its busiest link has moved its bytes::

    T_phase = rounds * alpha + max over links (bytes through the link, one way) / rate

Per strategy (``n`` ranks, ``R`` racks, ``W = n/R`` ranks per rack, ``M`` model bytes,
``k = ratio * params``, ``e`` bytes per element, ``p = 4 + e`` bytes per (int32 index,
value) pair, 8 for float32):

- horovod: one ring over all ranks. A rack-ordered ring (blocked placement) leaves and
  enters each rack exactly once, so an uplink carries one flow each way, ``2(n-1)/n * M``,
  whatever the oversubscription; the time is that over the slowest hop,
  ``min(nic, uplink)``. Interleaved, every hop of the ring crosses racks.
- hierarchical: intra-rack reduce-scatter (ring of ``W``), ``W`` concurrent cross-rack ring
  allreduces of one ``M/W`` shard each (uplink: ``2(R-1)/R * M``), intra-rack allgather.
- topk gathered: ring allgather of every rank's ``k`` pairs: ``(n-1) * p * k`` per rank.
- topk sharded: alltoall of the ``k`` pairs to shard owners (``(n-1)/n * p * k``), then
  ring allgather of the ``k_down`` downlink pairs (``(n-1)/n * p * k_down``): flat in ``n``.
- dssync: ring allreduce of ``M`` inside each rack (no uplink bytes); every
  ``intra_phases + 1``-th step, rings of one rank per rack instead (``cross_ranks`` rings,
  uplink: ``cross_ranks * 2(R-1)/R * M``); the period's time is spread over its steps.
- decentralized: every step, rank ``j`` sends ``M`` to each rank ``i`` with
  ``W_t[i, j] > 0`` (the mixing matrices of :mod:`hvdx.core.mixing_graphs`, over one
  period of the graph, each step weighted ``1 / (period * mix_every)``). One-peer
  exponential graph: ``M`` to ``i + 2^(t mod tau)``, ``tau = ceil(log2 n)``: one model per
  step each way; static exponential graph: ``M`` to every ``i + 2^j``, ``j < tau``: ``tau``
  models each way. Under blocked placement a hop of distance ``d`` takes
  ``min(d, W)`` flows of each rack across its uplink (all of them once ``d >= W``); under
  interleaved placement a hop crosses racks only if ``R`` does not divide ``d``, so the
  long hops (``2^k >= R``, ``R`` a power of two) stay inside the racks.
  ``order="combine_then_adapt"`` overlaps the exchange with the forward and backward
  pass: its step is ``max(compute, comm)``, the only strategy priced with overlap.
- stanza: the trainer's layout (the last ``F`` ranks are FC workers, each serving a
  contiguous group of conv workers: with two FC workers on 2 x 2 hosts both sit in the
  second rack, so their FC allreduce stays inside it and the first rack's activations
  cross the uplink); ``batch * activation_size * e`` from each conv worker to its FC worker and back,
  then a ring allreduce of the conv parameters among the ``n - F`` conv workers (and of the
  FC parameters among the ``F`` FC workers if ``F > 1``; never on the wire when ``F = 1``).

Not modelled: overlap of communication with backward (a step is compute + comm, an upper
bound; Horovod too overlaps its allreduce with the backward pass in practice, and only
decentralized combine-then-adapt is credited with overlap here), TCP incast losses, TopK
selection time, other jobs' traffic on the uplinks, and host-level hierarchy (NCCL inside
a multi-GPU host; "hierarchical" here is per rack).

The model's parts live in :mod:`hvdx.core.cost` (the types, the collectives' flows,
Horovod's layouts, the pricing, ``predict``) and each strategy's layout in its folder
(``hvdx/strategies/<name>/core_cost.py``, found through the strategy catalogue:
:mod:`hvdx.core.cost.layouts`); this module is their API, under the name callers
import.
"""

from hvdx.core.cost.layouts import STRATEGIES
from hvdx.core.cost.predict import (DEFAULT_STRATEGIES, compare, predict, prediction_error,
                                    speedup, speedup_over_horovod)
from hvdx.core.cost.types import (PLACEMENTS, Cluster, Phase, Prediction, Workload,
                                  host_order)
from hvdx.core.units import format_rate, parse_rate, parse_time
from hvdx.strategies.topk.core_cost import topk_pair_bytes

# Reachable here as they always were, outside __all__: the model's constants and types,
# and MPICH's allreduce layout, which the calibration's tests compare with its timings.
from hvdx.core.cost.collectives import (  # noqa: F401
    HOROVOD_NEGOTIATION_BYTES, MPICH_SHORT_ALLREDUCE_BYTES, _recursive_halving)
from hvdx.core.cost.types import Flow, Number  # noqa: F401
from hvdx.strategies.decentralized.core_cost import DECENTRALIZED_GRAPHS  # noqa: F401

__all__ = [
    "Cluster",
    "DEFAULT_STRATEGIES",
    "PLACEMENTS",
    "Phase",
    "Prediction",
    "STRATEGIES",
    "Workload",
    "compare",
    "format_rate",
    "host_order",
    "parse_rate",
    "parse_time",
    "predict",
    "prediction_error",
    "speedup",
    "speedup_over_horovod",
    "topk_pair_bytes",
]
