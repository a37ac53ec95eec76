"""The communication of a registered mixer (:mod:`hvdx.mixer_registry`), for torch and
TensorFlow alike: numpy arrays in, numpy arrays out.

:class:`Peers` is what a mixer's ``mix(step, arrays, peers)`` gets:

1. ``by_matrix(w, arrays)``: ``x_i <- sum_j w[i, j] x_j`` with the ranks the matrix
   names. First every rank confirms that all hold the same valid matrix (one
   ``MPI_Allreduce`` of three integers: a digest of ``w``, its negation, and whether
   this rank refused it): ranks that disagreed would each wait for messages the others
   never send, so a matrix that differs between ranks (a mixer that draws randomness
   from the rank, or an unseeded generator), or that one rank refuses, raises the same
   ``ValueError`` on every rank instead. Then every array is packed into ONE
   contiguous buffer per dtype family (float64, and float32 for every other floating
   dtype: :mod:`hvdx.core.fused_layout`), sent to the ranks ``k`` with ``w[k, i] != 0``
   and received from the ranks ``j`` with ``w[i, j] != 0`` by mpi4py non-blocking
   point-to-point on hvdx's duplicated communicator
   (:class:`hvdx.mpi.neighbor_exchange.FusedExchange`, as the graphs of
   ``hvdx.Decentralized``), and combined in the buffer's dtype, sources in rank order;
2. ``average(arrays)``: the mean over all ranks (``MPI_Allreduce`` in float64);
3. ``comm``: the mpi4py communicator itself, for anything else (use tags of your own).

Byte counters: :class:`hvdx.core.counters.MixingStats`.
"""

from __future__ import annotations

import hashlib
from typing import List, Sequence

import numpy as np

from hvdx.core import mixing_graphs
from hvdx.core.counters import MixingStats
from hvdx.core.mixer_protocol import check_matrix
from hvdx.mpi.neighbor_exchange import FusedExchange

__all__ = ["Peers"]

#: MPI tags of the fused buffers (float32 family, float64) on hvdx's communicator,
#: distinct from the graphs' (0x4876-0x4879).
_TAGS = {np.dtype(np.float32): 0x487A, np.dtype(np.float64): 0x487B}


class Peers:
    """A mixer's view of the job (module docstring).

    Attributes:
        rank, size: this rank and the number of ranks.
        comm: hvdx's mpi4py communicator (a duplicate of Horovod's world).
        stats: :class:`~hvdx.core.counters.MixingStats`, bytes this rank sent.
    """

    def __init__(self, comm, stats: MixingStats = None):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.stats = stats if stats is not None else MixingStats()
        self._exchange = FusedExchange(comm, _TAGS)
        self._what = "matrix"
        #: The step being mixed (set by the spec, for messages); ``None`` outside one.
        self.step = None

    def by_matrix(self, w, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
        """``sum_j w[rank, j] arrays_j`` (collective over all ranks: the check that
        they hold the same matrix, module docstring; then over the ranks ``w`` links).

        ``w`` may be the exception this rank's mixer raised computing it: it is raised
        on every rank alike.
        """
        m = self._agreed(w)
        arrays = [np.asarray(a) for a in arrays]
        i = self.rank
        recv = tuple(int(j) for j in np.flatnonzero(m[i]) if j != i)
        send = tuple(int(k) for k in np.flatnonzero(m[:, i]) if k != i)
        if not send and not recv:
            self.stats.record(0, 0)
            return [a.copy() for a in arrays]
        neighbours = mixing_graphs.Neighbors(send, recv, float(m[i, i]),
                                             tuple(float(m[i, j]) for j in recv))
        exchange = self._exchange
        layout = exchange.layout_for((a.dtype.name, a.size) for a in arrays)
        layout.pack(arrays, out=exchange.buffers)
        exchange.start(neighbours.send_to, neighbours.recv_from)
        self.stats.record(*exchange.finish(neighbours.self_weight, neighbours.recv_weights))
        return layout.unpack(exchange.mixed, arrays)

    def _agreed(self, w) -> np.ndarray:
        """``w`` checked (:func:`hvdx.core.mixer_protocol.check_matrix`) and compared across
        ranks; ``ValueError``, the same on every rank, unless every rank holds the same
        valid matrix."""
        from mpi4py import MPI

        what = self._what if self.step is None else f"{self._what}(step={self.step})"
        try:
            if isinstance(w, Exception):
                raise ValueError(f"raised {type(w).__name__}: {w}")
            m = check_matrix(w, self.size, what)
            problem = None
        except ValueError as error:
            m, problem = None, str(error)
        digest = 0 if m is None else int.from_bytes(
            hashlib.blake2b(np.ascontiguousarray(m).tobytes(), digest_size=7).digest(),
            "little")
        mine = np.array([digest, -digest, problem is not None], dtype=np.int64)
        seen = np.empty_like(mine)
        self.comm.Allreduce(mine, seen, op=MPI.MAX)
        if not seen[2] and seen[0] == -seen[1]:
            return m
        # Rare: learn what every rank holds, and say the same on every rank.
        everyone = self.comm.allgather((problem, digest))
        refused = [(r, p) for r, (p, _) in enumerate(everyone) if p is not None]
        if refused:
            rank, message = refused[0]
            raise ValueError(f"rank {rank}: {message}" if message.startswith(what)
                             else f"rank {rank}: {what} {message}")
        by_rank = ", ".join(f"rank {r}: {d:014x}" for r, (_, d) in enumerate(everyone))
        raise ValueError(f"{what} differs between ranks (digests {by_rank}); every rank "
                         "must compute the same matrix: draw its randomness from "
                         "settings() and the step, never from the rank or an unseeded "
                         "generator")

    def average(self, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
        """The mean of ``arrays`` over all ranks (collective), each in its dtype."""
        from mpi4py import MPI

        arrays = [np.asarray(a) for a in arrays]
        flat = np.concatenate([a.astype(np.float64).reshape(-1) for a in arrays]) \
            if arrays else np.zeros(0)
        total = np.empty_like(flat)
        self.comm.Allreduce(flat, total, op=MPI.SUM)
        total /= self.size
        self.stats.add_everyone(sum(a.nbytes for a in arrays), self.size)
        out, offset = [], 0
        for a in arrays:
            out.append(total[offset:offset + a.size].reshape(a.shape).astype(a.dtype))
            offset += a.size
        return out
