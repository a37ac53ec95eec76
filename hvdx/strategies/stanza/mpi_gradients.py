"""Stanza's role sum: a role's gradients summed over its ranks, with presence flags.

Step 5 of Stanza (:mod:`hvdx.strategies.stanza.mpi_step`): the conv workers SUM their feature
gradients, the FC workers their head gradients (:mod:`hvdx.strategies.stanza.core_roles` says
why a sum, not a mean). :class:`RoleGradientSum` does it for any framework, in one
host buffer per dtype family (:class:`hvdx.core.fused_layout.FusedLayout`), reused
from step to step:

1. a parameter without a gradient on this rank (a branch not taken) is packed as
   zeros, and its presence flag (one element per parameter at the end of the first
   family's buffer) is 0, else 1;
2. the allreduce sums gradients and flags alike: each flag then counts the role's
   ranks that had a gradient for the parameter, the same count on every rank, so no
   message of its own is needed;
3. a parameter that some rank had a gradient for gets the sum on every rank of the
   role (missing ones count as zeros, as in Horovod's allreduce); one that no rank had
   gets ``None`` everywhere, so that the optimizer leaves it out (momentum and weight
   decay leave it as it is), as single-process training does, and the role's
   replicas stay equal.

A role of one rank sends nothing: every gradient stays as it is (``None`` stays
``None``), since there is nothing to agree on.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from hvdx.core.fused_layout import FusedLayout
from hvdx.strategies.stanza.mpi_exchange import StanzaExchange

__all__ = ["RoleGradientSum"]


class RoleGradientSum:
    """Step 5 of one role on one rank (module docstring).

    Args:
        exchange: this rank's exchange (its role communicator sums).
        kind: the byte counter (``"conv_allreduce"`` or ``"fc_allreduce"``).
        new_buffer: ``new_buffer(family, count)``: a host buffer of ``count`` elements
            of ``family``'s dtype, in the framework's type (default: numpy).
        view: the numpy view of such a buffer, which MPI sums in place.
    """

    def __init__(self, exchange: StanzaExchange, kind: str,
                 new_buffer: Callable[[np.dtype, int], object] = None,
                 view: Callable[[object], np.ndarray] = None):
        self.exchange = exchange
        self.kind = kind
        self._new_buffer = new_buffer or (lambda family, count: np.empty(count, family))
        self._view = view or (lambda buffer: buffer)
        self.layout: Optional[FusedLayout] = None
        self.buffers: Dict[np.dtype, object] = {}
        self._views: Dict[np.dtype, np.ndarray] = {}

    def __call__(self, gradients: Sequence[Optional[object]],
                 zeros: Callable[[int], object],
                 describe: Callable[[object], Tuple[str, int]],
                 pack: Callable[[FusedLayout, Dict[np.dtype, object], list], None],
                 unpack: Callable[[FusedLayout, Dict[np.dtype, object], list], list]
                 ) -> List[Optional[object]]:
        """The summed gradients, ``None`` where no rank of the role had one.

        Args:
            gradients: this rank's, ``None`` where it has none.
            zeros: ``zeros(i)``: a zero gradient for parameter ``i`` (step 1).
            describe: ``(dtype name, element count)`` of a gradient (the layout's key;
                the buffers are rebuilt when it changes).
            pack: copies the gradients into the buffers (:attr:`layout`'s slots).
            unpack: the sums read back from the buffers, one per gradient.
        """
        if self.exchange.role_comm.Get_size() == 1:
            return list(gradients)
        present = [g is not None for g in gradients]
        filled = [zeros(i) if g is None else g for i, g in enumerate(gradients)]
        key = tuple(describe(g) for g in filled)
        if self.layout is None or key != self.layout.key:
            self.layout = FusedLayout(key, flags=True)
            self.buffers = {family: self._new_buffer(family, count)
                            for family, count in self.layout.families.items()}
            self._views = {family: self._view(b) for family, b in self.buffers.items()}
        pack(self.layout, self.buffers, filled)
        self.layout.set_flags(self._views, present)
        for view in self._views.values():
            self.exchange.allreduce_sum(view, self.kind)
        summed = unpack(self.layout, self.buffers, filled)
        counts = self.layout.flag_counts(self._views)
        return [None if count == 0 else value for value, count in zip(summed, counts)]
