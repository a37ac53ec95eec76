"""Numpy reference of DS-Sync group averaging, and the uplink traffic it causes.

DS-Sync (Wang et al., arXiv 2007.03298) runs, at every step ``t`` on every rank ``i``:

1. a local SGD step ``x_i <- x_i - lr * grad_i(x_i)``;
2. an allreduce-average of ``x_i`` inside the rank's group of ``schedule.partition(t)``.

That is the "adapt-then-combine" order of the optimizers (torch, Keras). TensorFlow's
``DistributedGradientTape`` cannot see the optimizer's step, so it averages the
variables when it hands out the local gradients: "combine-then-adapt",
``x_i <- avg_group(x)_i - lr * grad_i(x_i)``, the order of D-PSGD (Lian et al., "Can
Decentralized Algorithms Outperform Centralized Algorithms?", arXiv 1705.09056).

:func:`simulate_dssync` runs either order on all ranks of one process; the framework
adapters are tested against it. The final SWA-style merge (``DSSync(swa_start=...)``):
every rank keeps a running mean of its averaged parameters (:func:`swa_due`,
:func:`running_mean`), and the merge is the mean over ranks of those running means.

Values are arrays whose first axis is the rank (a model is flattened into one vector per
rank, or any shape after the rank axis).
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

import numpy as np

from hvdx.core.topology import Partition, Topology

__all__ = [
    "ADAPT_THEN_COMBINE",
    "COMBINE_THEN_ADAPT",
    "average_in_groups",
    "consensus_distance",
    "mean_uplink_bytes",
    "running_mean",
    "simulate_dssync",
    "swa_due",
    "uplink_bytes",
]

#: Local step, then averaging (the optimizers).
ADAPT_THEN_COMBINE = "adapt_then_combine"
#: Averaging, then the local step with the gradient taken before it (the TF tape).
COMBINE_THEN_ADAPT = "combine_then_adapt"


def average_in_groups(values_per_rank, partition: Partition) -> np.ndarray:
    """Every rank's value replaced by the mean of its group (a new array, same dtype).

    Each group's mean is the mean of its members' values, so the global mean (over all
    ranks, of every parameter) is unchanged, up to rounding.
    """
    values = np.asarray(values_per_rank)
    out = values.copy()
    for group in partition:
        index = list(group)
        out[index] = values[index].mean(axis=0, dtype=values.dtype)
    return out


def consensus_distance(values_per_rank) -> float:
    """``sqrt(mean_i ||x_i - mean_j x_j||^2)``: zero when every rank holds the same value."""
    values = np.asarray(values_per_rank, dtype=np.float64)
    flat = values.reshape(values.shape[0], -1)
    return float(np.sqrt(np.mean(np.sum((flat - flat.mean(axis=0)) ** 2, axis=1))))


def simulate_dssync(initial, grads_fn: Callable[[np.ndarray, int], np.ndarray], lr: float,
                    schedule, steps: int, start: int = 0, order: str = ADAPT_THEN_COMBINE,
                    swa_start: Optional[int] = None, swa_every: int = 1):
    """Runs ``steps`` DS-Sync steps from ``start`` on all ranks (see the module docstring).

    Args:
        initial: values per rank, shape ``(n, ...)``.
        grads_fn: ``grads_fn(values, step)`` returns every rank's gradient at its own
            current values, same shape.
        lr: learning rate of the local SGD step.
        schedule: any schedule of :mod:`hvdx.strategies.dssync.core_schedule`.
        steps: number of steps.
        start: the first step's index (schedules depend on it).
        order: :data:`ADAPT_THEN_COMBINE` (step ``t``: ``x <- avg_t(x - lr * g(x))``)
            or :data:`COMBINE_THEN_ADAPT` (``x <- avg_t(x) - lr * g(x)``).
        swa_start, swa_every: as in :class:`hvdx.DSSync`; the running mean samples the
            group-averaged values (``avg_t(...)`` above) at the steps of :func:`swa_due`.

    Returns:
        The values per rank after the last step; with ``swa_start``, the pair
        ``(values, swa)``: ``swa`` holds every rank's running mean (zeros before the
        first sample), and ``swa.mean(axis=0)`` is the final merge.
    """
    if order not in (ADAPT_THEN_COMBINE, COMBINE_THEN_ADAPT):
        raise ValueError(f"order={order!r} must be {ADAPT_THEN_COMBINE!r} or "
                         f"{COMBINE_THEN_ADAPT!r}")
    values = np.array(initial, copy=True)
    swa, count = np.zeros_like(values), 0
    for step in range(start, start + steps):
        grads = np.asarray(grads_fn(values, step), dtype=values.dtype)
        if order == ADAPT_THEN_COMBINE:
            values = average_in_groups(values - lr * grads, schedule.partition(step))
            averaged = values
        else:
            averaged = average_in_groups(values, schedule.partition(step))
            values = averaged - lr * grads
        if swa_due(step, swa_start, swa_every):
            swa, count = running_mean(swa, count, averaged), count + 1
    return values if swa_start is None else (values, swa)


def swa_due(step: int, swa_start: Optional[int], swa_every: int = 1) -> bool:
    """Whether the SWA running mean samples the averaged values of ``step`` (0-based)."""
    return swa_start is not None and step >= swa_start and \
        (step - swa_start) % swa_every == 0


def running_mean(mean, count: int, sample):
    """The mean of ``count + 1`` samples from the mean of the first ``count``.

    Written as ``mean + (sample - mean) / (count + 1)``, the form every adapter uses,
    so adapter and reference round alike.
    """
    return mean + (sample - mean) / (count + 1)


def uplink_bytes(partition: Partition, topology: Topology, model_bytes: float) -> np.ndarray:
    """Bytes each rack's uplink carries, each way, when every group ring-allreduces.

    1. a group of ``g`` ranks runs a ring in ascending rank order (as Horovod and NCCL
       order a process set), each member sending ``2(g-1)/g * M`` to the next;
    2. a hop between two racks puts those bytes on the sender's uplink out and the
       receiver's uplink in. A ring enters a rack as often as it leaves it, so in and
       out are equal; with ranks numbered rack by rack, a ring leaves each rack once.

    A ring over all ``n`` ranks thus puts ``2(n-1)/n * M`` on every uplink (1.5 M for
    2 racks x 2 hosts); the full cross phase of that cluster puts 2 M.

    Returns:
        float64 array, one entry per rack.
    """
    out = np.zeros(topology.n_racks)
    for group in partition:
        g = len(group)
        for a, b in zip(group, group[1:] + group[:1]):
            if topology.racks[a] != topology.racks[b]:
                out[topology.racks[a]] += 2 * (g - 1) / g * model_bytes
    return out


def mean_uplink_bytes(schedule, topology: Topology, model_bytes: float,
                      steps: Optional[Iterable[int]] = None) -> float:
    """The busiest uplink's bytes each way, averaged over ``steps`` (default one period)."""
    steps = range(schedule.period) if steps is None else list(steps)
    loads = [uplink_bytes(schedule.partition(s), topology, model_bytes).max() for s in steps]
    return float(np.mean(loads))
