"""What a PyTorch hvdx mixing optimizer shows of its strategy, read-only, without torch.

A mixing optimizer (DS-Sync, graphs: :mod:`hvdx.torch.mixing_optimizer`) shows the spec
it runs as ``optimizer.hvdx_strategy``, and a DS-Sync one its groups as
``optimizer.hvdx_groups``. Those properties are the functions here, the one place that
knows where the optimizer keeps them; code that reads an optimizer without importing
torch (the benchmark's bookkeeping, :mod:`hvdx.bench.strategies`) calls them directly.
"""

from __future__ import annotations

from hvdx.strategy import MixingStrategy

__all__ = ["dssync_groups", "mixing_strategy"]


def mixing_strategy(optimizer) -> MixingStrategy:
    """The spec ``optimizer`` runs: the user's ``hvdx.DSSync`` or ``hvdx.Decentralized``
    (``mix_every``, ``mixes_at``, ``global_every``, ...)."""
    return optimizer._hvdx_sync


def dssync_groups(optimizer):
    """A DS-Sync optimizer's :class:`~hvdx.strategies.dssync.mpi_groups.DSSyncGroups`: its
    ``schedule`` (rebuilt in place by ``probe_every``), ``step``, ``stats`` and
    ``registered_groups``."""
    return optimizer._hvdx_groups
