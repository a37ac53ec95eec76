"""TopK's byte and step counters: what one rank handed to MPI and got from it.

Horovod's timeline does not see mpi4py's traffic, so hvdx counts its own: the
communicators (:mod:`hvdx.strategies.topk.mpi_communicators`) add each collective's
bytes to one phase, and the driver (:mod:`hvdx.strategies.topk.mpi_driver`) opens and
closes each step and counts Horovod's dense allreduce as a ring allreduce would move it.
"""

from __future__ import annotations

from typing import Dict, Optional

__all__ = ["TopKStats"]


class TopKStats:
    """Bytes this rank handed to MPI (``sent``) and got from it (``received``).

    ``last_*``: the last step; ``total_*``: since construction. Sparse exchanges count
    the buffers given to mpi4py (pairs and counts); Horovod's dense allreduce is counted
    as a ring allreduce, ``2 (P - 1) / P`` times the tensor's bytes each way.

    ``phases`` splits the totals by the path the bytes took: ``"up"`` (the workers'
    pairs: the allgather of gathered mode, the alltoall of sharded mode), ``"down"``
    (sharded mode's allgather of the selected shards; gathered mode computes the
    downlink on every rank and sends nothing), ``"agree"`` (sharded mode's agreement on
    each shard's share of the global downlink TopK,
    :mod:`hvdx.strategies.topk.core_global`) and ``"dense"`` (Horovod's allreduce of the
    small tensors), each ``[sent, received]``; the dry runs of ``autotune_steps``
    travel too and are counted.

    ``autotune``: with ``autotune_steps``, after the decision, the medians on the
    slowest rank (``"dense_s"``, ``"topk_s"``, seconds per step) and ``"choice"``
    (``"topk"`` or ``"dense"``); ``None`` before.
    """

    __slots__ = ("last_sent", "last_received", "total_sent", "total_received",
                 "last_sparse_tensors", "last_dense_tensors", "steps", "phases", "autotune")

    def __init__(self):
        self.last_sent = self.last_received = 0.0
        self.total_sent = self.total_received = 0.0
        self.last_sparse_tensors = self.last_dense_tensors = 0
        self.steps = 0
        self.phases = {"up": [0.0, 0.0], "down": [0.0, 0.0], "agree": [0.0, 0.0],
                       "dense": [0.0, 0.0]}
        self.autotune: Optional[Dict] = None

    def _begin(self):
        self.last_sent = self.last_received = 0.0
        self.last_sparse_tensors = self.last_dense_tensors = 0

    def record(self, sent, received, phase):
        """Add ``sent`` and ``received`` bytes to ``phase``'s counters in :attr:`phases`
        (``"up"``, ``"down"``, ``"agree"`` or ``"dense"``), to this step's ``last_*``
        and to the run's ``total_*``."""
        self.phases[phase][0] += sent
        self.phases[phase][1] += received
        self.last_sent += sent
        self.last_received += received
        self.total_sent += sent
        self.total_received += received

    def as_dict(self) -> Dict[str, float]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self):
        return f"TopKStats({self.as_dict()})"
