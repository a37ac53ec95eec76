"""Numpy reference of decentralized SGD (DSGD, and DmSGD with local momentum).

Ying, Yuan, Chen, Hu, Pan and Yin, "Exponential Graph is Provably Efficient for
Decentralized Deep Training", NeurIPS 2021, arXiv 2110.13363 (code built on BlueFog,
``bluefog/common/topology_util.py``). Every rank takes a local step and averages its
parameters with its neighbours in a mixing graph (:mod:`hvdx.core.mixing_graphs`,
``x_new[i] = sum_j W_t[i, j] x[j]``). At step ``t`` on every rank ``i``:

1. ``g_i`` = the rank's gradient at its own parameters ``x_i``;
2. local momentum (DmSGD): ``m_i <- momentum * m_i + g_i``, the buffer starting at zero,
   so ``m_i = g_i`` on the first step as in PyTorch's SGD (dampening 0, no Nesterov);
   the direction is ``d_i = m_i`` (``g_i`` when ``momentum = 0``);
3. the step mixes when ``(t + 1) % mix_every == 0``, with ``W_t = mixing_matrix(graph,
   n, m)`` and ``m = t // mix_every`` the number of mixes before it
   (:func:`hvdx.core.mixing_graphs.mix_index`: the graph follows the mixes, so a
   one-peer graph takes every shift in turn); the other steps are local SGD steps
   ``x_i <- x_i - lr d_i``;
4. adapt-then-combine (ATC, the optimizers' order): ``x_i <- sum_j W_t[i, j] (x_j - lr
   d_j)``; combine-then-adapt (CTA, D-PSGD's order, used to overlap the exchange with
   the backward pass): ``x_i <- sum_j W_t[i, j] x_j - lr d_i``, ``d_i`` taken at ``x_i``.

The momentum buffers stay local, never mixed: DmSGD as in the paper's algorithm, where
each rank's buffer accumulates its own gradients and only the parameters travel. That
halves the bytes sent, and mixing the parameters already pulls the buffers together,
since the gradients are taken at nearly equal parameters.

A mixing step computes, like the MPI neighbour exchange the adapters use
(:mod:`hvdx.mpi.neighbor_exchange`), ``w_ii x_i`` first and then adds
``w_ij x_j`` for the in-neighbours in ascending rank order, in the values' dtype, with the weights
of :func:`hvdx.core.mixing_graphs.neighbors`: an adapter in float32 rounds like this
reference. :func:`hvdx.core.group_averaging.consensus_distance` measures how far the
ranks are apart.

Values are arrays whose first axis is the rank (a model flattened into one vector per
rank, or any shape after the rank axis).
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List

import numpy as np

from hvdx.core import mixing_graphs
from hvdx.core.group_averaging import ADAPT_THEN_COMBINE, COMBINE_THEN_ADAPT
from hvdx.core.validation import check_integer

__all__ = ["mix", "simulate_decentralized"]


def mix(values, graph, step: int = 0) -> np.ndarray:
    """One mixing step ``x_new[i] = sum_j W_step[i, j] x[j]`` on all ranks (a new array).

    Args:
        values: values per rank, shape ``(n, ...)``, floating point.
        graph: a name of :data:`hvdx.core.mixing_graphs.GRAPHS` or a mixing matrix.
        step: the mix index, the number of mixes before this one (the one-peer graphs
            depend on it).

    Returns:
        The mixed values, same shape and dtype, computed as the module docstring says.
    """
    x = _floating(values, "values")
    return _mix(x, _graph(graph, x.shape[0], step))


def _floating(values, name: str) -> np.ndarray:
    """A copy of ``values``, float64 unless already floating point."""
    x = np.array(values, copy=True)
    if x.ndim == 0 or x.shape[0] == 0:
        raise ValueError(f"{name}={values!r} must have a first axis of ranks, shape (n, ...) "
                         "with n at least 1")
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float64)
    return x


def _graph(graph, n: int, step: int) -> List[mixing_graphs.Neighbors]:
    """Every rank's neighbours at ``step``."""
    return [mixing_graphs.neighbors(graph, n, rank, step) for rank in range(n)]


def _mix(x: np.ndarray, graph: List[mixing_graphs.Neighbors]) -> np.ndarray:
    cast = x.dtype.type
    out = np.empty_like(x)
    for rank, nb in enumerate(graph):
        row = x[rank] * cast(nb.self_weight)
        for source, weight in zip(nb.recv_from, nb.recv_weights):
            row += x[source] * cast(weight)
        out[rank] = row
    return out


def simulate_decentralized(initial, grads_fn: Callable[[np.ndarray, int], np.ndarray],
                           lr: float, graph, steps: int, start: int = 0,
                           order: str = ADAPT_THEN_COMBINE, momentum: float = 0.0,
                           mix_every: int = 1, return_momentum: bool = False):
    """Runs ``steps`` steps of decentralized SGD from ``start`` on all ranks.

    The algorithm is in the module docstring.

    Args:
        initial: values per rank, shape ``(n, ...)``; an integer array becomes float64,
            a floating one keeps its dtype.
        grads_fn: ``grads_fn(values, step)`` returns every rank's gradient at its own
            current values, same shape.
        lr: learning rate.
        graph: a name of :data:`hvdx.core.mixing_graphs.GRAPHS` or an ``n x n``
            doubly stochastic mixing matrix.
        steps: number of steps, at least 0.
        start: the first step's index (``mix_every`` and, through the number of mixes
            before it, the one-peer graphs depend on it).
        order: :data:`~hvdx.core.group_averaging.ADAPT_THEN_COMBINE` or
            :data:`~hvdx.core.group_averaging.COMBINE_THEN_ADAPT`.
        momentum: the local SGD momentum (DmSGD), at least 0; 0: plain DSGD.
        mix_every: mix at the steps ``t`` with ``(t + 1) % mix_every == 0`` only.
        return_momentum: also return the momentum buffers.

    Returns:
        The values per rank after the last step; with ``return_momentum``, the pair
        ``(values, buffers)``, ``buffers`` holding every rank's ``m_i`` (zeros before the
        first step; the last gradients when ``momentum = 0``).

    Raises:
        ValueError: naming the argument and its value: a bad ``order``, ``steps``,
            ``start``, ``mix_every``, ``lr`` or ``momentum``, or a graph that
            :func:`hvdx.core.mixing_graphs.mixing_matrix` refuses.
    """
    if order not in (ADAPT_THEN_COMBINE, COMBINE_THEN_ADAPT):
        raise ValueError(f"order={order!r} must be {ADAPT_THEN_COMBINE!r} or "
                         f"{COMBINE_THEN_ADAPT!r}")
    steps = check_integer("steps", steps, 0)
    start = check_integer("start", start, 0)
    mix_every = check_integer("mix_every", mix_every, 1)
    lr = _real("lr", lr)
    momentum = _real("momentum", momentum)
    if momentum < 0:
        raise ValueError(f"momentum={momentum!r} must be at least 0 (0: no momentum)")
    values = _floating(initial, "initial")
    n = values.shape[0]
    if not isinstance(graph, str):
        graph = mixing_graphs.check_mixing_matrix(graph, n)
    period = mixing_graphs.period(graph, n)
    graphs: Dict[int, List[mixing_graphs.Neighbors]] = {}
    buffers = np.zeros_like(values)
    for step in range(start, start + steps):
        grads = np.asarray(grads_fn(values, step), dtype=values.dtype)
        if grads.shape != values.shape:
            raise ValueError(f"grads_fn returned shape {grads.shape} at step {step}; it must "
                             f"return every rank's gradient, shape {values.shape}")
        buffers = momentum * buffers + grads if momentum else grads.copy()
        mixes = (step + 1) % mix_every == 0
        key = mixing_graphs.mix_index(step, mix_every) % period
        if mixes and key not in graphs:
            graphs[key] = _graph(graph, n, key)
        if order == ADAPT_THEN_COMBINE:
            values = values - lr * buffers
            if mixes:
                values = _mix(values, graphs[key])
        else:
            mixed = _mix(values, graphs[key]) if mixes else values
            values = mixed - lr * buffers
    return (values, buffers) if return_momentum else values


def _real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be a finite number")
    return float(value)
