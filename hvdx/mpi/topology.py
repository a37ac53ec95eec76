"""Detect the job's :class:`~hvdx.core.topology.Topology` (host and rack of every rank).

1. hosts: ``comm.Split_type(MPI.COMM_TYPE_SHARED)`` groups the ranks that share memory;
   each rank's host label is the ``comm`` rank of its host's first rank, allgathered;
2. racks: the environment variable ``HVDX_RACK`` (any string, e.g. a switch name), or
   else ``HVDX_CLUSTER_RACK`` (set per rank by the emulated cluster of
   :mod:`hvdx.cluster`), allgathered. With neither set on any rank, every host is its own
   rack (no rack hierarchy: the rotation then alternates between host groups and groups
   of one rank per host). Set on some ranks only, it is an error;
3. every rank builds :meth:`Topology.from_ranks` from the same gathered lists, so every
   rank holds an equal topology, or every rank raises the same ``ValueError``.

The call is collective over ``comm``.
"""

from __future__ import annotations

import os
from typing import List, Optional

from mpi4py import MPI

from hvdx.core.topology import Topology

__all__ = ["RACK_VARIABLES", "detect_topology", "host_labels", "rack_labels"]

#: Environment variables naming a rank's rack, in order of precedence.
RACK_VARIABLES = ("HVDX_RACK", "HVDX_CLUSTER_RACK")


def detect_topology(comm: Optional[MPI.Comm] = None) -> Topology:
    """The topology of ``comm``'s ranks (default ``MPI.COMM_WORLD``), index = rank in comm.

    Raises:
        ValueError: on every rank, if a rack variable is set on some ranks but not on
            others, or if one host's ranks name different racks.
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    hosts = host_labels(comm)
    labels = rack_labels(comm)
    if labels is None:
        return Topology.from_ranks(hosts, hosts)
    try:
        return Topology.from_ranks(hosts, labels)
    except ValueError as error:
        raise ValueError(f"the rack labels from {'/'.join(RACK_VARIABLES)} do not fit the "
                         f"hosts: {error}") from None


def host_labels(comm: MPI.Comm) -> List[int]:
    """Every rank's host: the ``comm`` rank of its shared-memory group's first rank
    (module step 1). Collective; the same list on every rank."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        host = node.bcast(comm.Get_rank(), root=0)
    finally:
        node.Free()
    return comm.allgather(host)


def rack_labels(comm: MPI.Comm) -> Optional[List[str]]:
    """Every rank's rack label from the environment, or ``None`` if no rank has one
    (module step 2). Collective; the same answer, or the same ``ValueError``, on every
    rank."""
    label = next((os.environ[v] for v in RACK_VARIABLES if os.environ.get(v)), None)
    labels = comm.allgather(label)
    unset = [r for r, x in enumerate(labels) if x is None]
    if len(unset) == len(labels):
        return None
    if unset:
        raise ValueError(f"{' or '.join(RACK_VARIABLES)} is set on some ranks but not on "
                         f"ranks {unset}: set it on every rank or on none")
    return labels
