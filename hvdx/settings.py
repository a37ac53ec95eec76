"""Settings shared by the framework adapters: validation and fingerprint entries."""

from __future__ import annotations

import inspect
from typing import List, Tuple

from hvdx._version import __version__
from hvdx.strategy_contract import Strategy, strategy_of

__all__ = ["group_sizes", "horovod_settings", "validate_sync"]


def validate_sync(sync) -> None:
    """``sync=`` takes an hvdx synchronization strategy (:class:`hvdx.DSSync`,
    :class:`hvdx.Decentralized`); ``None`` keeps Horovod's gradient allreduce."""
    strategy_of(None, sync)


def horovod_settings(**settings) -> List[Tuple[str, object]]:
    """Fingerprint entries for the optimizer's settings, rendered rank-independently.

    Classes (Horovod compressors) are rendered by qualified name, process sets by their
    ranks, hvdx strategies by :meth:`~hvdx.strategy_contract.Strategy.describe`, so that the
    same settings give the same text on every rank. A strategy whose constructor failed
    (:func:`hvdx.strategy_contract.validating`) adds its error as ``<strategy>.error``, which
    :func:`hvdx.mpi.check_consistent` reports on every rank. A strategy built from the
    environment (:mod:`hvdx.environment`) adds ``(variable, raw value)`` first, so that
    ranks launched with different values name the variable where they disagree.
    """
    entries: List[Tuple[str, object]] = [("hvdx.version", __version__)]
    for name, value in settings.items():
        if isinstance(value, Strategy) and value.environment is not None:
            entries.append(value.environment)
        if isinstance(value, Strategy) and value.error is not None:
            entries += [(name, value.name), (f"{value.name}.error", str(value.error))]
            continue
        if isinstance(value, Strategy):
            value = value.describe()
        elif isinstance(value, type) or inspect.isfunction(value):
            # (a function: compression=hvd.Compression.topk, refused on every rank)
            value = f"{value.__module__}.{value.__qualname__}"
        elif hasattr(value, "process_set_id") and hasattr(value, "ranks"):
            value = ("process_set", value.ranks)
        entries.append((name, value))
    return entries


def group_sizes(groups):
    """Horovod's ``groups=`` as the fingerprint sees it: tensors are not comparable
    across ranks, the sizes of the groups are."""
    if groups is None or isinstance(groups, int):
        return groups
    return [len(g) for g in groups]
