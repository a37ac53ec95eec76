"""TopK's autotune: compress only where TopK's exchange beats the dense allreduce.

With ``autotune_steps=N`` the N steps after ``warmup_steps`` are dense, and the driver
(:mod:`hvdx.strategies.topk.mpi_driver`) times, in each, the dense allreduce and a dry
run of TopK's exchange on the same gradients (:meth:`Autotune.record`). After the N-th:

1. one allgather of every rank's ``(dense, topk)`` timings;
2. per rank the median of each; per method the slowest rank's median (a step waits for
   the slowest rank);
3. ``"topk"`` if TopK's is below the dense allreduce's, else ``"dense"`` for good; rank 0
   logs the figures and the choice.

Every rank thus takes the same decision. Once dense for good, a step is Horovod's
(:meth:`Autotune.overlaps_dense`): adapters may start the allreduces during the backward
pass, and hvdx runs no collective of its own.
"""

from __future__ import annotations

import sys
from typing import List, Optional, Tuple

import numpy as np

__all__ = ["Autotune"]


class Autotune:
    """The timings and the decision of one run (steps 1 to 3 above).

    Args:
        compression: the :class:`~hvdx.strategies.topk.spec.TopKCompression` spec.
        wire: the run's :class:`~hvdx.strategies.topk.mpi_communicators.Wire`.

    Attributes:
        timings: this rank's ``(dense, topk)`` seconds per tuning step.
        choice: ``None`` before the decision, ``"topk"`` or ``"dense"`` after.
    """

    def __init__(self, compression, wire):
        self.compression, self.wire = compression, wire
        self.timings: List[Tuple[float, float]] = []
        self.choice: Optional[str] = None

    def tuning(self, step: int) -> bool:
        """Whether ``step`` is one of the ``autotune_steps`` (dense, with a dry run)."""
        c = self.compression
        return self.choice is None and \
            c.warmup_steps <= step < c.warmup_steps + c.autotune_steps

    def overlaps_dense(self) -> bool:
        """Whether every step from now on is Horovod's allreduce of every tensor."""
        return self.choice == "dense"

    def record(self, dense_s: float, topk_s: float) -> None:
        self.timings.append((dense_s, topk_s))

    def decide(self) -> str:
        """Steps 1 to 3: the decision, the same on every rank. Collective."""
        wire = self.wire
        everyone = wire.comm.allgather([tuple(t) for t in self.timings])
        medians = [np.median(np.asarray(t, dtype=np.float64), axis=0) for t in everyone if t]
        if not medians:  # resumed past the tuning steps without their timings
            self.choice = "topk"
            return self.choice
        dense_s, topk_s = (float(x) for x in np.max(np.stack(medians), axis=0))
        self.choice = "topk" if topk_s < dense_s else "dense"
        wire.stats.record_autotune(dense_s, topk_s, self.choice)
        if wire.rank == 0:
            then = "compressing from now on" if self.choice == "topk" else \
                "staying dense (Horovod's allreduce) for the rest of the run"
            print(f"[hvdx] TopK autotune over {len(self.timings)} steps: dense allreduce "
                  f"{1e3 * dense_s:.1f} ms, TopK exchange {1e3 * topk_s:.1f} ms per step "
                  f"on the slowest rank; {then}", file=sys.stderr, flush=True)
        return self.choice
