"""Horovod's allreduce: the flat ring over all ranks, and the two-level (per rack) one."""

from __future__ import annotations

import numpy as np

from hvdx.core.cost.collectives import _allreduce, _allreduces, _grid, _negotiation, _rings
from hvdx.core.cost.types import Cluster, Workload, _Plan, _Traffic


def _horovod(c: Cluster, w: Workload) -> _Plan:
    """Horovod's flat ring allreduce over all ranks (Patarasuk & Yuan 2009)."""
    everyone = np.arange(c.ranks)[None, :]
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
