"""Whether gradients hold NaN or Inf, checked cheaply in torch (TopK's check of every
step, and the mixing strategies' agreement on a loss-scale overflow)."""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["first_nonfinite"]


def first_nonfinite(grads: Sequence[torch.Tensor]) -> int:
    """The first gradient with NaN or Inf (``len(grads)`` if none), checked in torch.

    One sum per tensor in its own dtype, on its device, instead of an elementwise
    ``isfinite`` (a boolean tensor the size of the gradient): a NaN or an infinity
    anywhere makes the sum non-finite, so a finite sum proves the tensor finite. A sum
    that is not finite may also be an overflow of finite entries: only then is the
    tensor checked entry by entry. (A float64 sum, which cannot overflow, costs a
    conversion of every entry: most of this check's time on a large gradient.)
    Sparse gradients are checked on their values.
    """
    for i, g in enumerate(grads):
        values = g.coalesce().values() if g.is_sparse else g
        if not bool(torch.isfinite(values.sum())) and not bool(torch.isfinite(values).all()):
            return i
    return len(grads)
