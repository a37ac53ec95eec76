"""GRACE's compressor for TopK: what a tensor becomes on the wire at one step.

Xu et al., "GRACE: A Compressed Communication Framework for Distributed Machine
Learning" (ICDCS 2021), split a compression strategy into a compressor, a memory and a
communicator. TopK's compressor is the selection of
:mod:`hvdx.strategies.topk.core_selection` (exact, or DGC's sampled threshold) with the
settings of one step:

1. the ratios: the sparsity warm-up's at this step
   (:func:`~hvdx.strategies.topk.core_sparsity_warmup.config_at`, whose clock starts
   when compression does, after ``warmup_steps`` and ``autotune_steps``), or the target
   ones in an autotune dry run, which times what the run would send once compressing
   for good (the warm-up's first ratio, 0.25, would make TopK look slow);
2. ``k`` per tensor of ``d`` entries: ``k_up(d)`` on the uplink, ``k_down(d)`` on the
   downlink (``None``: unidirectional TopK);
3. the sampled threshold's generators, a pure function of the seed, the step, the role
   (``"up"``/``"down"``), the rank or shard and the tensor's position
   (:func:`~hvdx.strategies.topk.core_bidirectional.selection_rng`): every rank that
   computes the same downlink samples the same entries.

The compressor keeps no state: what it leaves unsent is the memory's
(:mod:`hvdx.strategies.topk.core_memory`). Its other half, :func:`decompress`, writes
an update (:class:`SparseUpdate`, or dense) as the dense array the optimizer reads.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import numpy as np

from hvdx.strategies.topk.core_bidirectional import (TopKConfig, downlink_from, select,
                                                     selection_rng, to_dense)
from hvdx.strategies.topk.core_sparsity_warmup import config_at

__all__ = ["SparseUpdate", "TopKCompressor", "decompress"]


class TopKCompressor:
    """TopK selection with the settings of step ``step``.

    Args:
        target: the run's settings (ratios after the sparsity warm-up, method, seed).
        step: the step number (it seeds the sampled threshold).
        compressing_from: the first step that may compress (``warmup_steps +
            autotune_steps``): the sparsity warm-up counts from there.
        sparsity_warmup_steps: the length of the sparsity warm-up.
        dry_run: an autotune dry run: the target ratios (item 1 above).
    """

    __slots__ = ("config", "step", "_target")

    def __init__(self, target: TopKConfig, step: int, compressing_from: int,
                 sparsity_warmup_steps: int, dry_run: bool = False):
        self._target = target
        self.step = step
        #: The settings of this step (its ratios).
        self.config = target if dry_run else config_at(target, step - compressing_from,
                                                       sparsity_warmup_steps)

    def k_up(self, d: int) -> int:
        return self.config.k_up(d)

    def k_down(self, d: int) -> Optional[int]:
        return self.config.k_down(d)

    def rng(self, role: str, index: int, position: int) -> Optional[np.random.Generator]:
        """The generator of one selection (``None`` for exact TopK)."""
        target = self._target
        if target.topk_method != "sampled_threshold":
            return None
        return selection_rng(target.seed, self.step, role, index, position)

    def compress(self, a: np.ndarray, k: int, index: int,
                 position: int) -> Tuple[np.ndarray, np.ndarray]:
        """The uplink's pairs of rank ``index``: the top ``k`` of ``a``."""
        return select(a, k, self.config, self.rng("up", index, position))

    def compress_down(self, b: np.ndarray, k: int, index: int, position: int
                      ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The downlink's pairs of shard ``index`` (0 in gathered mode): the top ``k``
        of ``b``, and ``b`` itself made the new server residual ``b - u``
        (:func:`~hvdx.strategies.topk.core_bidirectional.downlink_from`)."""
        return downlink_from(b, k, self.config, self.rng("down", index, position))


class SparseUpdate(NamedTuple):
    """An update that is zero outside ``indices`` (ascending), before it is written."""

    indices: np.ndarray
    values: np.ndarray
    size: int


def decompress(update, out: Optional[np.ndarray]) -> np.ndarray:
    """The dense update of a :class:`SparseUpdate` (or of a dense one): in ``out`` when
    given (zeroed, then the entries set; no dense temporary to allocate and copy), else
    a new array."""
    if isinstance(update, SparseUpdate):
        if out is None:
            return to_dense(update.indices, update.values, update.size)
        out.fill(0)
        out[update.indices] = update.values
        return out
    if out is None:
        return update
    np.copyto(out, update)
    return out
