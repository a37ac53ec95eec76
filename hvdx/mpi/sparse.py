"""Sparse collectives: (int32 index, float32 value) pairs over an mpi4py communicator.

TopK pairs differ in number and position on every rank, so they travel with
``Allgatherv`` / ``Alltoallv`` rather than an allreduce. Each pair is packed into one
8-byte row (index, value bits) so that one collective carries both; the counts go first
in a small ``Allgather`` / ``Alltoall`` of int64.

Every function returns, with its result, the bytes this rank handed to MPI for others
(``sent``) and received from others (``received``), counts included: Horovod's timeline
does not see mpi4py traffic, so hvdx counts its own.

Waiting: the collectives are started non-blocking and completed by :func:`wait`, which
tests the request and sleeps ``HVDX_MPI_POLL_US`` microseconds (default 50) between
tests. A blocking MPI call spins on its core until the slowest rank arrives; where ranks
outnumber cores (or share them with data loaders and Horovod's background thread), that
spinning takes the core from the very rank being waited for. ``HVDX_MPI_POLL_US=0``
spins (``MPI_Wait``). Point-to-point exchanges, whose large messages move in chunks
that each need a test on both ends, wait with :func:`wait_all`: they test without
sleeping (yielding the core) for the first :data:`SPIN_S`, then sleep between tests.

Both add the seconds they wait to :func:`waited_s`. ``hvdx bench`` reads it around each
step of a local run: the time a rank's exchanges leave its core to the others, which a
cluster's wire can run in (:func:`hvdx.core.cost_model.predict`'s ``local_wait_s``).
"""

from __future__ import annotations

import os
import time
from typing import List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

__all__ = ["SPIN_S", "allgather_int", "allgatherv_floats", "allgatherv_pairs",
           "alltoallv_pairs", "pack_pairs", "pause", "unpack_pairs", "wait", "wait_all",
           "waited_s"]

Pairs = Tuple[np.ndarray, np.ndarray]
_INDEX_LIMIT = np.iinfo(np.int32).max


def _poll_seconds() -> float:
    raw = os.environ.get("HVDX_MPI_POLL_US", "50")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"HVDX_MPI_POLL_US={raw!r} must be a number of microseconds "
                         "(0: spin in MPI_Wait)") from None
    if value < 0:
        raise ValueError(f"HVDX_MPI_POLL_US={raw!r} must be >= 0")
    return value * 1e-6


_POLL_S = _poll_seconds()

#: How long :func:`wait_all` tests without sleeping (yielding the core between tests)
#: before it sleeps ``HVDX_MPI_POLL_US`` between tests: a 5.5 MB exchange between two
#: ranks on one host took 5.2 ms to finish with sleeps alone and 1.9 ms with this spin.
SPIN_S = 0.002


_waited = 0.0  # seconds in wait() and wait_all(), this process (waited_s)


def waited_s() -> float:
    """Seconds this process has spent in :func:`wait` and :func:`wait_all` so far."""
    return _waited


def wait(request: MPI.Request) -> None:
    """Complete ``request``, sleeping between tests instead of spinning (module docstring)."""
    global _waited
    start = time.perf_counter()
    try:
        if _POLL_S <= 0:
            request.Wait()
            return
        while not request.Test():
            time.sleep(_POLL_S)
    finally:
        _waited += time.perf_counter() - start


def pause(spin_until: float) -> None:
    """Between two tests of a spin-then-sleep wait that started spinning until
    ``spin_until`` (``time.perf_counter()``): yield the core, or sleep once it is past."""
    if time.perf_counter() < spin_until:
        os.sched_yield()
    else:
        time.sleep(max(_POLL_S, 1e-6))


def wait_all(requests: List[MPI.Request], statuses: Optional[List[MPI.Status]] = None
             ) -> None:
    """``MPI_Waitall`` of point-to-point ``requests``, spin-then-sleep (module docstring):
    a late peer is waited for with sleeps, which must not slow it down; the first
    milliseconds, while a large message moves in chunks, with yields."""
    global _waited
    start = time.perf_counter()
    try:
        if _POLL_S <= 0:
            MPI.Request.Waitall(requests, statuses)
            return
        spin_until = start + SPIN_S
        while not MPI.Request.Testall(requests, statuses):
            pause(spin_until)
    finally:
        _waited += time.perf_counter() - start


def allgather_int(comm: MPI.Comm, value: int) -> np.ndarray:
    """Every rank's ``value`` (int64), in rank order."""
    out = np.empty(comm.Get_size(), np.int64)
    wait(comm.Iallgather(np.array([value], np.int64), out))
    return out


def pack_pairs(indices: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``(n, 2)`` int32 rows: the index, then the float32 value's bits."""
    indices = np.asarray(indices)
    values = np.asarray(values, dtype=np.float32)
    if indices.shape != values.shape or indices.ndim != 1:
        raise ValueError(f"indices {indices.shape} and values {values.shape} must be flat "
                         "and of the same length")
    if indices.size and (indices.min() < 0 or indices.max() > _INDEX_LIMIT):
        raise ValueError("indices must fit in int32 (tensors of at most 2**31 - 1 entries)")
    packed = np.empty((indices.size, 2), np.int32)
    packed[:, 0] = indices
    packed[:, 1] = values.view(np.int32)
    return packed


def unpack_pairs(packed: np.ndarray) -> Pairs:
    """Inverse of :func:`pack_pairs`: ``(int32 indices, float32 values)``, copies."""
    packed = np.asarray(packed, np.int32).reshape(-1, 2)
    return packed[:, 0].copy(), packed[:, 1].copy().view(np.float32)


def allgatherv_floats(comm: MPI.Comm, array: np.ndarray) -> List[np.ndarray]:
    """Every rank's 1-D float64 ``array`` (lengths may differ), in rank order: the
    lengths, then the arrays, both non-blocking and waited for with sleeps (module
    docstring), where mpi4py's pickled ``comm.allgather`` spins in ``MPI_Allgather``."""
    mine = np.ascontiguousarray(array, np.float64).ravel()
    counts = allgather_int(comm, mine.size)
    gathered = np.empty(int(counts.sum()), np.float64)
    displacements = np.concatenate([[0], np.cumsum(counts)[:-1]])
    wait(comm.Iallgatherv(mine, [gathered, counts, displacements, MPI.DOUBLE]))
    return np.split(gathered, np.cumsum(counts)[:-1])


def allgatherv_pairs(comm: MPI.Comm, indices: np.ndarray,
                     values: np.ndarray) -> Tuple[List[Pairs], int, int]:
    """Every rank's pairs, in rank order (this rank's included).

    Returns:
        ``(pairs_per_rank, sent_bytes, received_bytes)``; ``sent_bytes`` counts this
        rank's rows once per other rank (what a direct allgather sends).
    """
    size = comm.Get_size()
    mine = pack_pairs(indices, values)
    counts = allgather_int(comm, mine.shape[0])
    total = int(counts.sum())
    gathered = np.empty((total, 2), np.int32)
    elements = counts * 2
    displacements = np.concatenate([[0], np.cumsum(elements)[:-1]])
    wait(comm.Iallgatherv(mine, [gathered, elements, displacements, MPI.INT32_T]))
    offsets = np.concatenate([[0], np.cumsum(counts)])
    result = [unpack_pairs(gathered[offsets[r]:offsets[r + 1]]) for r in range(size)]
    others = size - 1
    sent = others * (mine.nbytes + 8)
    received = (total - mine.shape[0]) * 8 + others * 8
    return result, int(sent), int(received)


def alltoallv_pairs(comm: MPI.Comm,
                    pieces: Sequence[Pairs]) -> Tuple[List[Pairs], int, int]:
    """Send ``pieces[r]`` to rank ``r``; return what every rank sent here, in rank order.

    Returns:
        ``(pairs_per_source_rank, sent_bytes, received_bytes)``; a rank's piece for
        itself is not counted.
    """
    size, rank = comm.Get_size(), comm.Get_rank()
    if len(pieces) != size:
        raise ValueError(f"need one piece per rank ({size}), got {len(pieces)}")
    packed = [pack_pairs(i, v) for i, v in pieces]
    send_counts = np.array([p.shape[0] for p in packed], np.int64)
    recv_counts = np.empty(size, np.int64)
    wait(comm.Ialltoall(send_counts, recv_counts))
    send = np.concatenate(packed) if packed else np.empty((0, 2), np.int32)
    recv = np.empty((int(recv_counts.sum()), 2), np.int32)
    send_elements, recv_elements = send_counts * 2, recv_counts * 2
    send_displacements = np.concatenate([[0], np.cumsum(send_elements)[:-1]])
    recv_displacements = np.concatenate([[0], np.cumsum(recv_elements)[:-1]])
    wait(comm.Ialltoallv([send, send_elements, send_displacements, MPI.INT32_T],
                         [recv, recv_elements, recv_displacements, MPI.INT32_T]))
    offsets = np.concatenate([[0], np.cumsum(recv_counts)])
    result = [unpack_pairs(recv[offsets[r]:offsets[r + 1]]) for r in range(size)]
    others = size - 1
    sent = (int(send_counts.sum()) - int(send_counts[rank])) * 8 + others * 8
    received = (int(recv_counts.sum()) - int(recv_counts[rank])) * 8 + others * 8
    return result, int(sent), int(received)
