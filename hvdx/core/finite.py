"""Which gradient first holds NaN or Inf: what each rank tells the others before a
compressed step (numpy; torch's, on the tensors' own devices, is :mod:`hvdx.torch.finite`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["first_nonfinite"]


def first_nonfinite(arrays: Sequence[np.ndarray]) -> int:
    """The position of the first array holding NaN or Inf, ``len(arrays)`` if none."""
    for position, a in enumerate(arrays):
        if not np.isfinite(a).all():
            return position
    return len(arrays)
