"""TopK's agreement on NaN/Inf across ranks: a bad gradient skips the step everywhere.

Horovod's allreduce would carry an inf or NaN into every rank's average; a loss scaler
(``torch.amp.GradScaler``, Keras ``LossScaleOptimizer``) relies on that to skip the step
and lower its scale on every rank together. TopK's exchange would not carry it
everywhere, and a bad gradient must not enter the residuals, where error feedback would
resend it forever. So before anything else, every step:

1. each rank names its first tensor holding NaN or Inf (:func:`first_nonfinite`; the
   number of tensors if none, :data:`JOINED` for a rank that has joined);
2. one tiny allgather combines them (:meth:`NonfiniteAgreement.agree`);
3. if any rank named one, every rank skips the step alike and makes every gradient NaN;
   rank 0 says so on stderr the first time only (a loss scaler meets such steps
   routinely while its scale settles, and a line per step would bury the log).
"""

from __future__ import annotations

import sys
from typing import Sequence

import numpy as np

from hvdx.core.finite import first_nonfinite

from hvdx.mpi import timeline
from hvdx.mpi.sparse import allgather_int

__all__ = ["JOINED", "NonfiniteAgreement", "first_nonfinite"]

#: What a rank that has joined (``hvd.join()``) gives the agreement instead of its
#: first bad position (:meth:`hvdx.strategies.topk.mpi_driver.TopKSynchronizer.joined_step`).
JOINED = -1


class NonfiniteAgreement:
    """Steps 2 and 3 above for one run.

    Args:
        wire: the run's :class:`~hvdx.strategies.topk.mpi_communicators.Wire`.
        labels: what the report calls each tensor, in the fixed order.

    Attributes:
        everyone_joined: whether the last agreement found every rank joined.
    """

    def __init__(self, wire, labels: Sequence[str]):
        self.wire = wire
        self.labels = tuple(labels)
        self.everyone_joined = False
        self._reported = False  # rank 0 reports the first skipped step only

    def agree(self, first_bad: int) -> bool:
        """Whether every rank's gradients are finite, the same answer on every rank.

        Collective: every rank calls it once per step, with ``len(labels)`` when all its
        gradients are finite, or :data:`JOINED` when it has joined: when every rank has,
        the answer is ``False`` and :attr:`everyone_joined` is set.
        """
        wire = self.wire
        began = wire.began()
        everyone = [int(i) for i in allgather_int(wire.comm, int(first_bad))]
        if began:
            others = 8 * (wire.size - 1)
            timeline.record("HVDX_TOPK_FINITE_CHECK", wire.row, began, others, others)
        self.everyone_joined = all(i == JOINED for i in everyone)
        if self.everyone_joined:
            return False  # nothing left to synchronize
        worst = min([i for i in everyone if i != JOINED], default=len(self.labels))
        if worst >= len(self.labels):
            return True
        if wire.rank == 0 and not self._reported:
            ranks = [r for r, i in enumerate(everyone) if i == worst]
            print(f"[hvdx] TopK: the gradient of '{self.labels[worst]}' has NaN or Inf "
                  f"values on rank(s) {ranks}; every rank's gradients are set to NaN and "
                  "TopK skips the step (no residual changes), as Horovod's allreduce "
                  "passes NaN/Inf on to a loss scaler; reported once",
                  file=sys.stderr, flush=True)
        self._reported = True
        return False
