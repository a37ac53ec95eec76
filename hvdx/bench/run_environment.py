"""The variables the harness sets for every rank of a benchmark run, and what they say.

:mod:`hvdx.bench.strategy_run` sets them in the launch; :mod:`hvdx.bench.runner` and the
strategies' builders (each strategy's ``bench_rows.py``) read them on each rank.
"""

from __future__ import annotations

import os

from hvdx.core.topology import Topology

__all__ = ["IFACE_ENV", "PLACEMENT_ENV", "TOPOLOGY_ENV", "bench_topology"]

#: The data interface of the emulated hosts, whose byte counters the runner reads.
IFACE_ENV = "HVDX_BENCH_IFACE"
#: The rank placement the harness launched the job with (recorded in the result).
PLACEMENT_ENV = "HVDX_BENCH_PLACEMENT"
#: ``RACKSxHOSTSxRANKS``: the emulated cluster a local run stands in for (every rank on
#: this host). DS-Sync then builds the cluster's rotation, with its groups and Horovod
#: process sets, instead of the one host's (:func:`bench_topology`).
TOPOLOGY_ENV = "HVDX_BENCH_TOPOLOGY"


def bench_topology():
    """The topology a local run stands in for (:data:`TOPOLOGY_ENV`,
    ``RACKSxHOSTSxRANKS``), or ``None``: detect it (:mod:`hvdx.mpi.topology`)."""
    value = os.environ.get(TOPOLOGY_ENV)
    if not value:
        return None
    try:
        racks, hosts, ranks = (int(x) for x in value.split("x"))
    except ValueError:
        raise ValueError(f"{TOPOLOGY_ENV}={value!r} must be RACKSxHOSTSxRANKS, "
                         "e.g. 2x2x1") from None
    return Topology.from_counts(racks, hosts, ranks)
