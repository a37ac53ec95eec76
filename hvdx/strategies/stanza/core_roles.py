"""Stanza's roles: which ranks train the feature extractor, which the head, who serves whom.

Stanza (Wu, Xu, Li, Xiong, "Layer Separation for Distributed Training in Deep
Learning", arXiv 1812.10624) gives most ranks, the *conv workers*, the feature
extractor only and the remaining ``F`` ranks, the *FC workers*, the head only:

1. the FC workers are the last ``F`` ranks, the conv workers the first ``S = size - F``
   (rank 0, which usually logs and checkpoints, is always a conv worker);
2. conv worker ``c`` (its position among the conv workers) sends its activations to FC
   worker ``k`` when ``bounds[k] <= c < bounds[k + 1]``, ``bounds[k] = k * S // F``:
   contiguous groups whose sizes differ by at most one; ``F <= S``, so that no FC worker
   is idle;
3. scaling, so that one step equals single-process SGD on the concatenated global batch
   of ``B = sum_i b_i`` samples when the loss is a mean over samples: the FC worker
   weighs the mean loss over conv worker ``i``'s ``b_i`` samples by ``b_i / B``
   (:func:`loss_weights`); its head gradient is then ``(1 / B) * sum over its samples``
   and the activation gradient it returns already carries ``1 / B``. Both the conv
   gradients (among conv workers) and the head gradients (among FC workers) are then
   *summed*; averaging either would scale it by ``1 / S`` or ``1 / F``, the pitfall
   of section 4 in ``algorithms.md``.

Pure functions of ``(size, fc_workers)``: every rank computes the same roles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from hvdx.core.validation import check_integer

__all__ = ["AUTO", "CONV", "FC", "StanzaRoles", "auto_fc_workers", "fc_samples",
           "loss_weights", "mean_loss", "median_probe", "probe_counts", "stanza_roles",
           "weighted_loss"]

CONV = "conv"
FC = "fc"
#: ``fc_workers=AUTO``: the smallest ``F`` whose FC side keeps up (:func:`auto_fc_workers`).
AUTO = "auto"


@dataclass(frozen=True)
class StanzaRoles:
    """The role layout of a world of ``size`` ranks with ``fc_workers`` FC workers.

    Attributes:
        size: ranks in the world.
        fc_workers: ``F``.
        conv_ranks: the conv workers, ascending (``0 .. S - 1``).
        fc_ranks: the FC workers, ascending (``S .. size - 1``).
        groups: ``groups[k]``: the conv ranks that FC worker ``fc_ranks[k]`` serves,
            ascending (the order in which it concatenates their samples).
    """

    size: int
    fc_workers: int
    conv_ranks: Tuple[int, ...]
    fc_ranks: Tuple[int, ...]
    groups: Tuple[Tuple[int, ...], ...]

    def role(self, rank: int) -> str:
        """:data:`CONV` or :data:`FC`."""
        return FC if self._check(rank) >= len(self.conv_ranks) else CONV

    def fc_worker(self, rank: int) -> int:
        """The FC worker that conv rank ``rank`` sends its activations to."""
        if self.role(rank) != CONV:
            raise ValueError(f"rank {rank} is an FC worker, not a conv worker")
        for fc_rank, group in zip(self.fc_ranks, self.groups):
            if rank in group:
                return fc_rank
        raise AssertionError("unreachable: every conv rank is in a group")

    def conv_workers(self, rank: int) -> Tuple[int, ...]:
        """The conv ranks that FC rank ``rank`` serves, ascending."""
        if self.role(rank) != FC:
            raise ValueError(f"rank {rank} is a conv worker, not an FC worker")
        return self.groups[rank - len(self.conv_ranks)]

    def layout(self) -> dict:
        """What a checkpoint records to refuse a world of another layout."""
        return {"size": self.size, "fc_workers": self.fc_workers}

    def _check(self, rank: int) -> int:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or \
                not 0 <= rank < self.size:
            raise ValueError(f"rank={rank!r} is not a rank of a world of {self.size}")
        return int(rank)


def stanza_roles(size: int, fc_workers: int) -> StanzaRoles:
    """The roles of steps 1-2 of the module docstring.

    Raises:
        ValueError: naming ``fc_workers=`` and its value and the world size, unless
            ``fc_workers`` is an integer from 1 to ``size // 2`` (at least one FC
            worker, and at least as many conv workers as FC workers).
    """
    size = check_integer("size", size, 1)
    limit = size // 2
    allowed = (f"must be an integer from 1 to {limit}" if limit >= 1 else
               "cannot be met: Stanza needs at least 2 ranks, one conv worker and one FC "
               "worker")
    base = f"fc_workers={fc_workers!r} in a world of {size} ranks: {allowed}"
    if isinstance(fc_workers, bool) or not isinstance(fc_workers, (int, np.integer)):
        raise ValueError(f"{base} (the number of FC workers)")
    f = int(fc_workers)
    if f < 1:
        raise ValueError(f"{base} (at least one FC worker trains the head)")
    if f >= size:
        raise ValueError(f"{base} (it leaves no conv worker)")
    s = size - f
    if f > s:
        raise ValueError(f"{base} ({s} conv workers cannot feed {f} FC workers: every FC "
                         "worker needs at least one)")
    bounds = [k * s // f for k in range(f + 1)]
    groups = tuple(tuple(range(bounds[k], bounds[k + 1])) for k in range(f))
    return StanzaRoles(size, f, tuple(range(s)), tuple(range(s, size)), groups)


def loss_weights(batch_sizes: Sequence[int], global_batch: int) -> np.ndarray:
    """``b_i / B`` for each conv worker's mean loss (step 3), float64.

    Args:
        batch_sizes: ``b_i`` of the conv workers one FC worker serves.
        global_batch: ``B``, the samples of all conv workers this step.
    """
    sizes = np.asarray(batch_sizes, dtype=np.int64)
    if sizes.ndim != 1 or (sizes < 0).any():
        raise ValueError(f"batch_sizes={list(batch_sizes)!r} must be counts of samples")
    if isinstance(global_batch, bool) or not isinstance(global_batch, (int, np.integer)) \
            or global_batch < max(1, int(sizes.sum())):
        raise ValueError(f"global_batch={global_batch!r} must be an integer of at least "
                         f"{max(1, int(sizes.sum()))} (this FC worker's samples)")
    return sizes.astype(np.float64) / float(global_batch)


def weighted_loss(sizes: Sequence[int], bounds: Sequence[int], global_batch: int,
                  loss_of: Callable[[int, int], Tuple[object, float]],
                  scale: Callable[[object, float], object]) -> Tuple[Optional[object], np.ndarray]:
    """Step 3 on the samples one FC worker received (source ``k``'s at
    ``bounds[k]:bounds[k + 1]``): ``(objective, losses)``.

    1. each source's weight is ``b_k / B`` (:func:`loss_weights`; ``B`` at least 1);
    2. a source that sent no samples is skipped: it adds nothing, and its mean loss is
       undefined (``nan`` in ``losses``);
    3. ``loss_of(lo, hi)`` gives the framework's mean loss over those samples and its
       value; ``scale(loss, weight)`` multiplies it in the framework (so that the
       backward pass goes through it); the objective is the sum of the scaled losses,
       in source order, ``None`` when no source sent samples.
    """
    losses = np.full(len(sizes), np.nan)
    objective = None
    weights = loss_weights(sizes, max(global_batch, 1))
    for k, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        if hi == lo:
            continue
        part, losses[k] = loss_of(lo, hi)
        weighted = scale(part, weights[k])
        objective = weighted if objective is None else objective + weighted
    return objective, losses


def mean_loss(sizes: Sequence[int], losses: np.ndarray) -> Tuple[float, int]:
    """``(sum of b_k * loss_k, samples)`` over the sources that sent samples (the
    others' losses are ``nan``): the parts of an FC worker's mean loss."""
    counted = ~np.isnan(losses)
    return float(np.dot(np.asarray(sizes)[counted], losses[counted])), int(sum(sizes))


def fc_samples(size: int, fc_workers: int, batch: int) -> int:
    """Samples the busiest FC worker runs the head on per step: its conv workers' batches
    (``ceil(S / F)`` of them, step 2 of the module docstring)."""
    s = size - fc_workers
    return -(-s // fc_workers) * batch


def probe_counts(size: int, batch: int) -> Tuple[int, ...]:
    """The head batch sizes to time for ``fc_workers="auto"``, ascending, distinct: the
    busiest FC worker's samples for every allowed ``F`` (1 to ``size // 2``)."""
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValueError(f"batch={batch!r} must be a positive number of samples")
    return tuple(sorted({fc_samples(size, f, int(batch)) for f in range(1, size // 2 + 1)}))


def auto_fc_workers(size: int, batch: int, conv_seconds: float,
                    head_seconds: Mapping[int, float]) -> int:
    """``fc_workers="auto"``: the smallest ``F`` whose FC side is no slower than the conv
    side, from a probe.

    1. the conv side of a step: one conv worker's forward and backward pass through the
       features on its ``batch`` samples, ``conv_seconds``;
    2. the FC side with ``F`` FC workers: the busiest one runs the head forward and
       backward on :func:`fc_samples` samples, ``head_seconds[count]`` (timed at every
       count of :func:`probe_counts`);
    3. the answer is the smallest ``F`` from 1 to ``size // 2`` with FC side <= conv side:
       more FC workers than that take ranks from the conv side without shortening the
       step (the conv side is then the slower, and it has fewer workers); if even
       ``size // 2`` FC workers are slower, ``size // 2``.

    Pure: give it the same figures on every rank (an adapter agrees on them first) and
    every rank chooses the same ``F``.
    """
    if size < 2:
        stanza_roles(size, 1)  # raises: Stanza needs two ranks
    for f in range(1, size // 2 + 1):
        count = fc_samples(size, f, batch)
        if count not in head_seconds:
            raise ValueError(f"head_seconds has no time for {count} samples; time the head "
                             f"at every count of probe_counts({size}, {batch})")
        if head_seconds[count] <= conv_seconds:
            return f
    return size // 2


def median_probe(figures: Sequence[Tuple[float, Mapping[int, float]]]
                 ) -> Tuple[float, Dict[int, float]]:
    """Every rank's probe ``(conv_seconds, head_seconds)`` -> one agreed probe: the
    median over ranks of each figure (a rank slowed by a neighbour's burst on a shared
    core does not decide alone). Given the same list, every rank gets the same answer.
    """
    if not figures:
        raise ValueError("median_probe needs at least one rank's figures")
    conv = float(np.median([c for c, _ in figures]))
    counts = set(figures[0][1])
    if any(set(h) != counts for _, h in figures):
        raise ValueError("the ranks timed the head at different sample counts")
    head = {int(k): float(np.median([h[k] for _, h in figures])) for k in sorted(counts)}
    return conv, head
