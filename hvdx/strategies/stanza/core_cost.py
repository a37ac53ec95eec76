"""Stanza's cost layout: activations to the FC workers and back, then an allreduce per
role (the cost model prices it under ``stanza``: its descriptor's ``cost_layout``,
:mod:`hvdx.core.cost.layouts`)."""

from __future__ import annotations

from typing import Tuple

import numpy as np

from hvdx.core.cost.collectives import _allreduces, _at_once
from hvdx.core.cost.types import Cluster, Workload, _Plan, _Traffic
from hvdx.strategies.stanza.core_roles import stanza_roles
from hvdx.core.validation import check_integer


def _stanza_roles(c: Cluster, fc_workers: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The trainer's own layout (:func:`hvdx.strategies.stanza.core_roles.stanza_roles`): the last
    ``F`` ranks are FC workers, each serving a contiguous group of conv workers. Returns
    (conv ranks, their FC worker, FC ranks)."""
    roles = stanza_roles(c.ranks, fc_workers)
    target = [fc for fc, group in zip(roles.fc_ranks, roles.groups) for _ in group]
    return (np.array(roles.conv_ranks, dtype=int), np.array(target, dtype=int),
            np.array(roles.fc_ranks, dtype=int))


def _stanza(c: Cluster, w: Workload, fc_workers: int = 1) -> _Plan:
    """Stanza layer separation (Wu et al., IEEE TSC 2020).

    1. conv workers send their batch's activations to their FC worker;
    2. FC workers run the head and send the activation gradients back;
    3. conv workers allreduce the conv gradients (FC workers the FC ones, if F > 1).
    """
    # From 1 to ranks // 2, as the trainer allows (stanza_roles names the value if not).
    fc_workers = check_integer("fc_workers", fc_workers, 1, max(1, c.ranks // 2))
    conv, target, fc = _stanza_roles(c, fc_workers)
    activations = w.batch_size * w.activation_size * w.bytes_per_element
    # Conv and FC rings run at once on disjoint ranks; F = 1 gives no FC ring at all.
    conv_ring = _allreduces("", conv[None, :], w.conv_params * w.bytes_per_element, c)
    fc_ring = _allreduces("", fc[None, :], w.fc_params * w.bytes_per_element, c)
    # The busiest FC worker runs the head for all of its conv workers, one after another.
    most_fed = int(np.bincount(target).max())
    compute = w.compute_s * ((1 - w.fc_compute_fraction) + most_fed * w.fc_compute_fraction)
    traffic = [
        _Traffic("activations to FC workers", [(conv, target, activations)], 1),
        _Traffic("activation gradients to conv workers", [(target, conv, activations)], 1),
        *_at_once("conv allreduce (and FC allreduce if F > 1)", conv_ring, fc_ring)]
    return _Plan(f"stanza F={fc_workers}", traffic, compute_s=compute, data_ranks=len(conv))
