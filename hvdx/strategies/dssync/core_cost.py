"""DS-Sync's cost layout: averages inside the racks, then across them, on process sets
(the cost model prices it under ``dssync``: its descriptor's ``cost_layout``,
:mod:`hvdx.core.cost.layouts`)."""

from __future__ import annotations

from typing import List, Optional

import numpy as np

from hvdx.core.cost.collectives import (_allreduce, _allreduces, _as_measured, _grid,
                                        _group_kind, _set_negotiation)
from hvdx.core.cost.types import Cluster, Workload, _Plan, _Traffic
from hvdx.core.validation import check_integer


def _set_averages(name: str, groups: np.ndarray, nbytes: float, c: Cluster,
                  weight: float) -> List[_Traffic]:
    """DS-Sync's average of ``nbytes`` on the process sets of ``groups`` (every row at
    once): as the calibration timed that very op through Horovod where it did
    (:class:`~hvdx.core.calibration.Calibration` step 8: the negotiation and the
    background cycles are in the time; where the same average was timed with every rank
    on one host too, only what the cluster adds to it, which is what it adds to a local
    step), else MPI's allreduce (:func:`_allreduces`)
    plus the small collectives Horovod adds for an op on process sets
    (:func:`_set_negotiation`)."""
    cal, kind = c.calibration, _group_kind(groups, c)
    timed = cal is not None and kind is not None and groups.shape[1] > 1
    beyond = cal.set_allreduce_beyond_local_s(kind, nbytes) if timed else None
    if beyond is not None:  # a local step holds the rest (Calibration step 8)
        return [_as_measured(_allreduce(name + " through Horovod, beyond one host's",
                                        groups, nbytes, weight), beyond)]
    measured = cal.set_allreduce_s(kind, nbytes) if timed else None
    if measured is not None:
        return [_as_measured(_allreduce(name + " through Horovod", groups, nbytes, weight),
                             measured)]
    return [t._replace(weight=weight) for t in _set_negotiation(groups, c)] + \
        _allreduces(name, groups, nbytes, c, weight)


def _dssync(c: Cluster, w: Workload, intra_phases: int = 1,
            cross_ranks: Optional[int] = None) -> _Plan:
    """DS-Sync group averaging (Wang et al., arXiv 2007.03298), rotation schedule.

    1. ``intra_phases`` steps: every rack averages the full model in a ring of W ranks;
    2. one step: groups of one rank per rack average it (``cross_ranks`` groups at once);
    3. each step's average is an op on Horovod process sets, negotiated in the set and
       in every background cycle over all ranks (:func:`_set_averages`);
    4. the period's time is spread evenly over its steps.
    """
    grid, width = _grid(c), c.ranks_per_rack
    intra_phases = check_integer("intra_phases", intra_phases, 0)
    cross = width if cross_ranks is None else check_integer("cross_ranks", cross_ranks, 1, width)
    # With one rack every phase is intra-rack; with one rank per rack every phase crosses.
    intra = (intra_phases if c.racks > 1 else 1) if width > 1 else 0
    crossing = 1 if c.racks > 1 else 0
    period = max(intra + crossing, 1)
    # Crossing ranks are spread over hosts (first local rank of each host, then second).
    order = sorted(range(width), key=lambda j: (j % c.ranks_per_host, j // c.ranks_per_host))
    crossing_groups = grid[:, order[:cross]].T
    traffic = _set_averages("intra-rack group allreduce", grid, w.model_bytes, c,
                            intra / period) + \
        _set_averages("cross-rack group allreduce", crossing_groups, w.model_bytes, c,
                      crossing / period)
    return _Plan(f"dssync intra={intra_phases} cross={cross}", [t for t in traffic if t.weight > 0])
