"""What both Stanza trainers check and say, framework-neutral.

Stanza (Wu, Xu, Li, Xiong, arXiv 1812.10624) runs the same checks in PyTorch
(:mod:`hvdx.torch.stanza`) and TensorFlow (:mod:`hvdx.tensorflow.stanza`):

1. at the first step the conv workers agree on the per-sample shapes and dtypes of
   their activations and labels (:class:`Samples`); from then on a batch must match;
2. a checkpoint records the role layout it was saved in, and a trainer of another
   layout refuses it, naming both (:func:`describe_layout`);
3. ``fc_workers="auto"`` times both parts (:func:`timed`) before the ranks agree on
   the figures (:func:`hvdx.core.stanza_roles.median_probe`).
"""

from __future__ import annotations

import time
from typing import Callable, NamedTuple, Sequence, Tuple

import numpy as np

__all__ = ["Samples", "describe_layout", "star", "timed"]


class Samples(NamedTuple):
    """Per-sample shapes and dtypes of the activations and labels (agreed at step 1)."""

    activation_shape: Tuple[int, ...]
    activation_dtype: str
    label_shape: Tuple[int, ...]
    label_dtype: str

    def describe(self) -> str:
        return (f"activations {star(self.activation_shape)} {self.activation_dtype}, "
                f"labels {star(self.label_shape)} {self.label_dtype}")


def star(shape: Sequence[int]) -> str:
    """A per-sample shape with the batch dimension as ``*``: ``[*, 3, 8]``."""
    return "[" + ", ".join(["*"] + [str(d) for d in shape]) + "]"


def describe_layout(layout: dict) -> str:
    """A checkpoint's or a trainer's layout (``role``, ``rank``, ``size``,
    ``fc_workers``) in words."""
    return (f"a {layout.get('role')} worker (rank {layout.get('rank')}) of {layout.get('size')} "
            f"ranks with fc_workers={layout.get('fc_workers')}")


def timed(run: Callable[[], object], repeats: int = 3) -> float:
    """Median seconds of ``run()`` after one untimed call (which pays for allocation)."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times))
