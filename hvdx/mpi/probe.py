"""Bandwidth probe: time point-to-point transfers between every pair of ranks.

The measured half of DS-Sync's topology awareness (Wang et al., "Divide-and-Shuffle
Synchronization for Distributed Machine Learning", arXiv 2007.03298: groups placed so
that their traffic avoids the bottleneck); the pure half, from the matrix to racks,
slow links and crossing ranks, is :mod:`hvdx.core.bandwidth`. Collective over ``comm``:

1. hosts come from the shared-memory split (:func:`hvdx.mpi.topology.host_labels`);
2. the pairs are scheduled in rounds of disjoint pairs
   (:func:`hvdx.core.bandwidth.pair_rounds`): ``n - 1`` rounds for ``n`` ranks (``n``
   if odd). The pairs of a round run at the same time, as traffic does in a training
   step, so pairs that share a bottleneck (a rack uplink) each see their share of it;
3. in its round, each pair on different hosts exchanges a small message (so the
   connection is set up outside the clock), then the lower rank sends ``nbytes`` and
   waits for a one-byte acknowledgement, then the other way round. The sender's clock
   gives ``matrix[sender, receiver]`` in bytes per second. Pairs on one host share
   memory, are skipped and hold NaN;
4. a barrier closes every round, then the rows are allgathered: every rank holds the
   same matrix, bit for bit.

Cost: about ``2 * nbytes / rate`` per round, for the slowest pair of the round.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from hvdx.core.bandwidth import DEFAULT_PROBE_BYTES, pair_rounds
from hvdx.mpi.topology import host_labels

__all__ = ["DEFAULT_PROBE_BYTES", "Probe", "probe_bandwidth"]

_TAG_WARM, _TAG_DATA, _TAG_ACK = 7301, 7302, 7303


@dataclass(frozen=True)
class Probe:
    """One probe's result, the same on every rank.

    Attributes:
        matrix: ``n x n`` bytes per second from row to column; NaN between ranks of
            one host (not measured), 0 on the diagonal.
        hosts: every rank's host label.
        nbytes: bytes per transfer.
        seconds: wall time of the probe on rank 0.
    """

    matrix: np.ndarray
    hosts: Tuple[int, ...]
    nbytes: int
    seconds: float


def probe_bandwidth(comm: Optional[MPI.Comm] = None, nbytes: int = DEFAULT_PROBE_BYTES,
                    hosts: Optional[List[int]] = None, same_host: bool = False) -> Probe:
    """Measures every pair of ranks of ``comm`` (see the module docstring). Collective.

    Args:
        comm: default ``MPI.COMM_WORLD``. A private duplicate is used for the traffic.
        nbytes: bytes per transfer, at least 1.
        hosts: every rank's host label, if already known (else step 1).
        same_host: measure pairs on one host too (shared memory; for diagnosis).

    Raises:
        ValueError: on every rank, if ``nbytes`` is not a positive integer.
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 1:
        raise ValueError(f"probe_bytes={nbytes!r} must be a positive number of bytes")
    comm = MPI.COMM_WORLD if comm is None else comm
    started = time.perf_counter()
    hosts = list(host_labels(comm) if hosts is None else hosts)
    comm = comm.Dup()  # the probe's tags can never meet the caller's messages
    try:
        rank, n = comm.Get_rank(), comm.Get_size()
        row = np.zeros(n)
        payload = np.ones(int(nbytes), dtype=np.uint8)
        small = np.zeros(1, dtype=np.uint8)
        for pairs in pair_rounds(n):
            for a, b in pairs:
                if rank in (a, b):
                    peer = b if rank == a else a
                    if hosts[a] == hosts[b] and not same_host:
                        row[peer] = np.nan
                    else:
                        row[peer] = _exchange(comm, rank, peer, rank == a, payload, small)
            comm.Barrier()
        matrix = np.array(comm.allgather(row))
        seconds = comm.bcast(time.perf_counter() - started, root=0)
    finally:
        comm.Free()
    return Probe(matrix, tuple(int(h) for h in hosts), int(nbytes), float(seconds))


def _exchange(comm: MPI.Comm, rank: int, peer: int, first: bool, payload: np.ndarray,
              small: np.ndarray) -> float:
    """Step 3 for one pair: returns this rank's send rate to ``peer``, bytes/s."""
    if first:
        comm.Send(small, peer, _TAG_WARM)
        comm.Recv(small, peer, _TAG_WARM)
    else:
        comm.Recv(small, peer, _TAG_WARM)
        comm.Send(small, peer, _TAG_WARM)
    rate = 0.0
    for sending in ((True, False) if first else (False, True)):
        if sending:
            start = time.perf_counter()
            comm.Send(payload, peer, _TAG_DATA)
            comm.Recv(small, peer, _TAG_ACK)
            rate = payload.nbytes / max(time.perf_counter() - start, 1e-9)
        else:
            comm.Recv(payload, peer, _TAG_DATA)
            comm.Send(small, peer, _TAG_ACK)
    return rate
