"""TopK's byte and step counters: what one rank handed to MPI and got from it.

Horovod's timeline does not see mpi4py's traffic, so hvdx counts its own: the
communicators (:mod:`hvdx.strategies.topk.mpi_communicators`) add each collective's
bytes to one phase, and the driver (:mod:`hvdx.strategies.topk.mpi_driver`) opens and
closes each step and counts Horovod's dense allreduce as a ring allreduce would move it.
"""

from __future__ import annotations

from hvdx.core.counters import Counters

__all__ = ["TopKStats"]


class TopKStats(Counters):
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

    INITIAL = {"last_sent": 0.0, "last_received": 0.0, "total_sent": 0.0,
               "total_received": 0.0, "last_sparse_tensors": 0, "last_dense_tensors": 0,
               "steps": 0,
               "phases": {"up": [0.0, 0.0], "down": [0.0, 0.0], "agree": [0.0, 0.0],
                          "dense": [0.0, 0.0]},
               "autotune": None}
    __slots__ = tuple(INITIAL)

    def begin_step(self) -> None:
        """Open a step: its ``last_*`` figures start from zero."""
        self.last_sent = self.last_received = 0.0
        self.last_sparse_tensors = self.last_dense_tensors = 0

    def record(self, sent: float, received: float, phase: str) -> None:
        """Add ``sent`` and ``received`` bytes to ``phase``'s counters in :attr:`phases`
        (``"up"``, ``"down"``, ``"agree"`` or ``"dense"``), to this step's ``last_*``
        and to the run's ``total_*``."""
        self.phases[phase][0] += sent
        self.phases[phase][1] += received
        self.last_sent += sent
        self.last_received += received
        self.total_sent += sent
        self.total_received += received

    def end_step(self, sparse: int, dense: int) -> None:
        """Close a step that compressed ``sparse`` tensors and left ``dense`` to the dense
        allreduce: set ``last_sparse_tensors`` and ``last_dense_tensors``, add one to
        ``steps``."""
        self.last_sparse_tensors, self.last_dense_tensors = sparse, dense
        self.steps += 1

    def record_autotune(self, dense_s: float, topk_s: float, choice: str) -> None:
        """Keep autotune's decision in :attr:`autotune`: the slowest rank's medians
        (seconds per step) and ``choice``."""
        self.autotune = {"dense_s": dense_s, "topk_s": topk_s, "choice": choice}
