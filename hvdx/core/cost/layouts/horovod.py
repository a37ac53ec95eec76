"""Horovod's allreduce: the flat ring over all ranks, and the two-level (per rack) one."""

from __future__ import annotations

import numpy as np

from hvdx.core.cost.collectives import (_allreduce, _allreduces, _as_measured, _grid,
                                        _negotiation, _rings)
from hvdx.core.cost.types import Cluster, Workload, _Plan, _Traffic


def _horovod(c: Cluster, w: Workload) -> _Plan:
    """Horovod's flat ring allreduce over all ranks (Patarasuk & Yuan 2009).

    1. where the calibration timed Horovod's own average on all ranks both on the
       cluster and with every rank on one host, at sizes up to the model's
       (:meth:`~hvdx.core.calibration.Calibration.set_allreduce_beyond_local_s`): what
       the cluster adds to it, the rest being in a local step (on the 2x2 cluster, 150
       KB: 74 ms on the cluster, 50 on one host, where MPI's allreduce and Horovod's
       negotiation priced apart came to 47);
    2. else Horovod's negotiation and MPI's allreduce, each priced on its own.
    """
    everyone = np.arange(c.ranks)[None, :]
    beyond = c.calibration.set_allreduce_beyond_local_s("world", w.model_bytes) \
        if c.calibration is not None and c.ranks > 1 else None
    if beyond is not None:
        return _Plan("horovod", [_as_measured(_allreduce(
            "allreduce through Horovod, beyond one host's", everyone, w.model_bytes),
            beyond)])
    return _Plan("horovod", _negotiation(everyone, c) +
                 _allreduces("ring allreduce", everyone, w.model_bytes, c))


def _hierarchical(c: Cluster, w: Workload) -> _Plan:
    """Two-level allreduce (Thakur et al. 2005; Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE).

    1. ring reduce-scatter inside each rack: rank j of a rack ends with shard j summed;
    2. ring allreduce of shard j among the j-th ranks of all racks (W rings at once);
    3. ring allgather inside each rack.
    """
    grid, width = _grid(c), c.ranks_per_rack
    half = (width - 1) / width * w.model_bytes  # one ring pass: reduce-scatter or allgather
    return _Plan("hierarchical", [
        _Traffic("intra-rack reduce-scatter", _rings(grid, half), width - 1),
        _allreduce("cross-rack allreduce of shards", grid.T, w.model_bytes / width),
        _Traffic("intra-rack allgather", _rings(grid, half), width - 1)])
