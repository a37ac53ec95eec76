"""GRACE's memory for bidirectional TopK: the worker and server residuals of one run.

Error feedback (:mod:`hvdx.strategies.topk.core_error_feedback`) on both paths of Zou,
De Sterck & Liu, "Downlink Compression Improves TopK Sparsification" (arXiv
2209.15203), in GRACE's ``compensate -> compress -> update`` (Xu et al., ICDCS 2021):

1. uplink, on every rank: ``a = e_i + g`` (:meth:`TopKMemory.compensate_up`); the
   compressor sends the top ``k_up`` of ``a``; ``e_i <- a - s``
   (:meth:`TopKMemory.update_up`);
2. downlink, where the average ``m`` (or a shard of it) is known: ``b = e_s + m``
   (:meth:`TopKMemory.compensate_down`); the compressor selects ``u`` and turns ``b``
   into ``b - u``, which becomes ``e_s`` (:meth:`TopKMemory.update_down`).

With ``error_feedback=False`` nothing is kept: ``a = g``, ``b = m`` (plain TopK).
Residuals are keyed by tensor name, in the fixed order; under ``selection="global"``
the concatenation of the compressed tensors is one tensor keyed :data:`GLOBAL_NAME`,
and :attr:`TopKMemory.layout` records which tensors it holds. DGC's momentum
correction, the other memory of TopK, keeps torch tensors on the parameters' device:
:mod:`hvdx.torch.momentum_correction`.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Sequence, Tuple

import numpy as np

from hvdx.strategies.topk.core_bidirectional import compensate_server
from hvdx.strategies.topk.core_error_feedback import ResidualMemory

__all__ = ["GLOBAL_NAME", "TopKMemory"]

#: The residuals' key of the concatenated vector under ``selection="global"``.
GLOBAL_NAME = "hvdx.global"

Layout = Tuple[Tuple[str, int], ...]


class TopKMemory:
    """The residuals of one TopK run (steps 1 and 2 above).

    Args:
        names: the tensors' names in the fixed order; position ``len(names)`` is the
            concatenation of ``selection="global"``.
        global_selection: key everything by :data:`GLOBAL_NAME`.
        enabled: ``error_feedback``; ``False`` keeps no residual.

    Attributes:
        worker: this rank's uplink residuals
            (:class:`~hvdx.strategies.topk.core_error_feedback.ResidualMemory`).
        server: this rank's replica (gathered) or shard (sharded) of the server
            residuals.
        layout: ``selection="global"``: the ``(name, size)`` of the concatenated
            tensors, fixed at the first compressed step (it keys the residual).
    """

    def __init__(self, names: Sequence[str], global_selection: bool, enabled: bool):
        self.names = tuple(names)
        self.enabled = bool(enabled)
        keys = (GLOBAL_NAME,) if global_selection else self.names
        self.worker = ResidualMemory(keys)
        self.server = ResidualMemory(keys)
        self.layout: Optional[Layout] = None

    def key(self, position: int) -> str:
        """The residuals' key of ``position`` (the virtual global tensor included)."""
        return GLOBAL_NAME if position == len(self.names) else self.names[position]

    def compensate_up(self, position: int, g: np.ndarray) -> np.ndarray:
        """``a = e_i + g``, a new array (``g`` itself without error feedback)."""
        if not self.enabled:
            return g
        # checked: every rank agreed that the gradients are finite before the
        # exchange (mpi_nonfinite), so the residual's own scan would only repeat it.
        return self.worker.compensate(self.key(position), g, checked=True)

    def update_up(self, position: int, a: np.ndarray, indices: np.ndarray,
                  values: np.ndarray) -> None:
        """``e_i <- a - s``, handing ``a`` over (no copy)."""
        if self.enabled:
            self.worker.update(self.key(position), a, indices, values, copy=False)

    def compensate_down(self, position: int, m: np.ndarray) -> np.ndarray:
        """``b = e_s + m``, a new array (a copy of ``m`` without error feedback)."""
        server = self.server.get(self.key(position)) if self.enabled else None
        return compensate_server(m, server)

    def update_down(self, position: int, residual: np.ndarray) -> None:
        """``e_s <- residual`` (the compressor's ``b - u``, handed over)."""
        if self.enabled:
            self.server.set(self.key(position), residual, copy=False)

    def fresh(self) -> "TopKMemory":
        """Empty residuals under the same keys and layout: an autotune dry run's,
        thrown away after it."""
        other = TopKMemory(self.names, False, self.enabled)
        keys = self.worker.names  # a loaded checkpoint may have added names
        other.worker, other.server = ResidualMemory(keys), ResidualMemory(keys)
        other.layout = self.layout
        return other

    @contextlib.contextmanager
    def worker_sitting_out(self) -> Iterator[None]:
        """Inside, an empty worker memory stands in for this rank's residuals, which
        stay as they were (a rank that has joined sends zeros)."""
        worker, self.worker = self.worker, ResidualMemory(self.worker.names)
        try:
            yield
        finally:
            self.worker = worker
