"""A registered compressor's step: the algorithm, for either memory and communicator of
the compression protocol (:mod:`hvdx.core.compression_protocol`).

A user subclasses :class:`Compressor`, registers it (``hvdx.register_compressor``), and
passes ``compression=hvd.Compression.<name>(...)`` (or sets
``HVDX_COMPRESSION=<name>(...)``); hvdx runs it with error feedback (Karimireddy, Rebjock,
Stich & Jaggi, "Error Feedback Fixes SignSGD and other Gradient Compression Schemes",
ICML 2019; the GRACE framework, Xu et al., ICDCS 2021).

One step, for every tensor ``t`` in one fixed order (the same on every rank), on every
rank ``r`` of ``n``, with ``s`` the step counter (0 at the first step, saved in
checkpoints, the same on every rank):

1. ``corrected = grad + residual`` (``residual`` starts at zero; with the memory
   ``"none"``, ``corrected = grad``);
2. ``payloads = compress(corrected, s, t)``: a list of numpy arrays, any shapes and
   dtypes;
3. ``residual <- corrected - decompress(payloads, shape, dtype, s, t)``: what this rank's
   own payloads failed to carry is sent in a later step (memory ``"none"``: nothing is
   kept);
4. every rank's payloads of every tensor are exchanged (one collective per step);
5. communicator ``"allgather"``: ``average = (decompress(payloads_0) + ... +
   decompress(payloads_{n-1})) / n``, summed in rank order, so that every rank computes
   the same bits (``op=Sum``: no division); communicator ``"allreduce"``: the payloads
   are summed entry by entry over the ranks (in float64, then cast back to each
   payload's dtype) and ``average = decompress(sum) / n``.

Non-finite gradients: if any rank's gradient of any tensor holds NaN or Inf, no rank
changes a residual or the step counter, and every rank's result is NaN (what a loss
scaler expects of Horovod's allreduce).

The arithmetic is done in float64 for float64 gradients and in float32 otherwise
(:func:`working_dtype`). Only numpy and the standard library are used here;
:func:`step_all_ranks` is the whole step over all ranks in one process (for tests), and
:func:`compress_with_feedback` / :func:`combine` are its per-rank pieces, which
:mod:`hvdx.mpi.user_compression_exchange` runs around one collective.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from hvdx.core.compression_protocol import Compressor

__all__ = ["Compressor", "check_payloads", "combine", "combine_summed",
           "compress_with_feedback", "decoded", "step_all_ranks", "summed_payloads",
           "working_dtype"]


def working_dtype(dtype) -> np.dtype:
    """The dtype the step computes in: float64 stays, anything else is float32."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def check_payloads(payloads, compressor, name: str) -> List[np.ndarray]:
    """``payloads`` as a list of numpy arrays, else ``TypeError`` naming the class."""
    if not isinstance(payloads, (list, tuple)):
        raise TypeError(f"{type(compressor).__qualname__}.compress(..., name={name!r}) "
                        f"returned {type(payloads).__name__}; return a list of numpy "
                        "arrays")
    return [np.asarray(p) for p in payloads]


def decoded(compressor: Compressor, payloads, shape, dtype, step: int,
            name: str) -> np.ndarray:
    """``decompress`` checked: an array of exactly ``shape`` in ``dtype``."""
    out = np.asarray(compressor.decompress(payloads, tuple(shape), dtype, step, name))
    if out.shape != tuple(shape):
        raise ValueError(f"{type(compressor).__qualname__}.decompress(..., name={name!r}) "
                         f"returned shape {out.shape}; expected {tuple(shape)}")
    return out.astype(dtype, copy=False)


def compress_with_feedback(compressor: Compressor, grad: np.ndarray,
                           residual: Optional[np.ndarray], step: int,
                           name: str) -> Tuple[List[np.ndarray], np.ndarray]:
    """Steps 1 to 3 on one rank and one tensor: ``(payloads, new residual)``.

    ``grad`` is not modified; ``residual`` ``None`` is zeros. With the memory ``"none"``
    the new residual is ``None`` (nothing kept)."""
    dtype = working_dtype(grad.dtype)
    corrected = np.array(grad, dtype=dtype, copy=True)
    keeps = compressor.memory == "residual"
    if residual is not None and keeps:
        corrected += residual
    payloads = check_payloads(compressor.compress(corrected, step, name), compressor, name)
    if not keeps:
        return payloads, None
    own = decoded(compressor, payloads, corrected.shape, dtype, step, name)
    return payloads, corrected - own


def summed_payloads(payloads_by_rank: Sequence[Sequence[np.ndarray]]) -> List[np.ndarray]:
    """The ``"allreduce"`` communicator's sum over the ranks of each payload, entry by
    entry, in float64 and in rank order, cast back to the payload's dtype."""
    first = payloads_by_rank[0]
    return [np.sum([np.asarray(p[i], dtype=np.float64) for p in payloads_by_rank],
                   axis=0).astype(np.asarray(first[i]).dtype) for i in range(len(first))]


def combine_summed(compressor: Compressor, summed: Sequence[np.ndarray], shape, dtype,
                   step: int, name: str, average: bool = True, ranks: int = 1) -> np.ndarray:
    """Step 5 for one tensor under the ``"allreduce"`` communicator: ``decompress`` of
    the payloads summed over the ranks, divided by ``ranks`` when ``average``."""
    dtype = working_dtype(dtype)
    total = decoded(compressor, [np.asarray(p) for p in summed], shape, dtype, step, name)
    if average:
        total = total / dtype.type(ranks)
    return total.astype(dtype, copy=False)


def combine(compressor: Compressor, payloads_by_rank: Sequence[Sequence[np.ndarray]],
            shape, dtype, step: int, name: str, average: bool = True,
            ranks: Optional[int] = None) -> np.ndarray:
    """Step 5 for one tensor: the sum, in rank order, of every rank's decompressed
    payloads, divided by the number of ranks when ``average``.

    ``ranks``: the number to divide by, when some ranks sent nothing (a rank that has
    joined, ``hvd.join()``, counts as zeros, as in Horovod); default
    ``len(payloads_by_rank)``."""
    dtype = working_dtype(dtype)
    total = np.zeros(shape, dtype)
    for payloads in payloads_by_rank:
        total = total + decoded(compressor, payloads, shape, dtype, step, name)
    if average:
        total = total / dtype.type(len(payloads_by_rank) if ranks is None else ranks)
    return total.astype(dtype, copy=False)


def step_all_ranks(compressor: Compressor, grads: Sequence[Mapping[str, np.ndarray]],
                   residuals: Sequence[Dict[str, np.ndarray]], step: int,
                   average: bool = True) -> Optional[Dict[str, np.ndarray]]:
    """One step over all ranks (steps 1 to 5): ``grads[r]`` and ``residuals[r]`` are rank
    ``r``'s, keyed by tensor name, iterated in ``grads[0]``'s order.

    Returns the result (the same for every rank), keyed by name, and updates
    ``residuals`` in place; ``None`` when some gradient is not finite (then nothing
    changes).
    """
    names = list(grads[0])
    if any(not np.all(np.isfinite(g[n])) for g in grads for n in names):
        return None
    sent = []
    for r, rank_grads in enumerate(grads):
        mine = {}
        for n in names:
            mine[n] = compress_with_feedback(compressor, rank_grads[n], residuals[r].get(n),
                                             step, n)
        sent.append(mine)
    for r, mine in enumerate(sent):
        for n in names:
            if mine[n][1] is not None:
                residuals[r][n] = mine[n][1]
    ranks = len(grads)
    if compressor.communicator == "allreduce":
        return {n: combine_summed(compressor, summed_payloads([sent[r][n][0]
                                                               for r in range(ranks)]),
                                  grads[0][n].shape, grads[0][n].dtype, step, n, average,
                                  ranks)
                for n in names}
    return {n: combine(compressor, [sent[r][n][0] for r in range(ranks)],
                       grads[0][n].shape, grads[0][n].dtype, step, n, average)
            for n in names}
