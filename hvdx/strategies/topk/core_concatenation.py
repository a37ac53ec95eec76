"""``selection="global"``: the compressed tensors as one vector, one ``k`` over all.

Layer-wise TopK keeps ``k`` entries of each tensor; global TopK keeps the top ``k`` of
the concatenation of all compressed tensors (a tensor with large gradients gets more of
the budget). The driver (:mod:`hvdx.strategies.topk.mpi_driver`) runs it as the
exchange of one virtual tensor:

1. :func:`layout_of`: the ``(name, size)`` of the tensors concatenated, which must stay
   the same from the first compressed step on (the residual of the concatenation is
   keyed by it), and whose total must fit int32 indices;
2. :meth:`Concatenation.join`: the concatenation, in the fixed order (a view the
   adapter offers, else one buffer reused every step);
3. the exchange of that one tensor (compressor, memory, communicator);
4. :func:`cut`: its update and the indices this rank sent, cut back per tensor.

The reference is :func:`~hvdx.strategies.topk.core_bidirectional.simulate_step` on the
concatenated gradient.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from hvdx.strategies.topk.core_compressor import SparseUpdate

__all__ = ["INDEX_LIMIT", "Concatenation", "cut", "layout_of"]

#: The most entries one flat index space (a fused exchange) covers: its indices must
#: fit in int32.
INDEX_LIMIT = 2 ** 31

Layout = Tuple[Tuple[str, int], ...]
Tensors = Sequence[Tuple[int, int]]


def layout_of(names: Sequence[str], tensors: Tensors, previous: Optional[Layout]) -> Layout:
    """Step 1 for the ``(position, size)`` tensors; ``ValueError`` if they differ from
    ``previous`` or hold more than :data:`INDEX_LIMIT` entries."""
    layout = tuple((names[p], d) for p, d in tensors)
    if previous is not None and layout != previous:
        raise ValueError(
            "TopK selection='global': the compressed tensors changed since the first "
            f"compressed step ({len(previous)} tensors, now {len(layout)}); the "
            "residual of the concatenation no longer lines up")
    total = int(sum(d for _, d in tensors))
    if total > INDEX_LIMIT:
        raise ValueError(f"TopK selection='global' over {total} entries: indices must fit "
                         "in int32; use selection='layerwise'")
    return layout


class Concatenation:
    """Step 2. ``buffer``: the array the tensors are copied into, kept between steps (a
    fresh one would pay its page faults each step; selection only reads it, and the
    residual is an array of its own)."""

    def __init__(self):
        self.buffer: Optional[np.ndarray] = None

    def join(self, tensors: Tensors, flat: Callable[[int], np.ndarray],
             joined: Optional[Callable] = None) -> np.ndarray:
        """The float32 concatenation of the ``(position, size)`` tensors: ``joined``'s
        array when it gives one, else ``flat`` of each copied into :attr:`buffer` (of
        one tensor: its own array)."""
        total = int(sum(d for _, d in tensors))
        whole = None if joined is None else joined([p for p, _ in tensors])
        if whole is not None:
            if whole.shape != (total,) or whole.dtype != np.float32:
                raise RuntimeError(f"joined gave {whole.dtype}{list(whole.shape)} for "
                                   f"{total} float32 entries")
            return whole
        if len(tensors) > 1:
            if self.buffer is None or self.buffer.size != total:
                self.buffer = np.empty(total, np.float32)
            return np.concatenate([flat(p) for p, _ in tensors], out=self.buffer)
        return flat(tensors[0][0])


def cut(update, sent: np.ndarray, tensors: Tensors
        ) -> Tuple[Dict[int, object], Dict[int, np.ndarray]]:
    """Step 4: ``({position: update}, {position: indices sent})`` of each tensor, from
    the concatenation's ``update`` (dense or :class:`SparseUpdate`) and ``sent``."""
    offsets = np.concatenate([[0], np.cumsum([d for _, d in tensors], dtype=np.int64)])
    cuts = np.searchsorted(sent, offsets)
    sent_by = {p: sent[cuts[t]:cuts[t + 1]] - offsets[t] for t, (p, _) in enumerate(tensors)}
    if not isinstance(update, SparseUpdate):
        return ({p: update[offsets[t]:offsets[t + 1]] for t, (p, _) in enumerate(tensors)},
                sent_by)
    cuts = np.searchsorted(update.indices, offsets)
    return ({p: SparseUpdate(update.indices[cuts[t]:cuts[t + 1]] - offsets[t],
                             update.values[cuts[t]:cuts[t + 1]], d)
             for t, (p, d) in enumerate(tensors)}, sent_by)
