"""Every strategy's traffic per step, as a plan of phases: the cost model's table.

A layout is ``layout(cluster, workload, **options) -> _Plan``; its options are the
parameters after the first two (:func:`hvdx.core.cost.predict.predict` checks them).

1. Horovod's own layouts, the flat ring and the per-rack one, are here
   (:mod:`~hvdx.core.cost.layouts.horovod`): they belong to no strategy of hvdx;
2. each strategy's layout is in its folder, ``hvdx/strategies/<name>/core_cost.py``,
   and its descriptor names it (``cost_model``, its key here, and ``cost_layout``, the
   lazy path of the layout): :data:`STRATEGIES` is a view of the catalogue
   (:mod:`hvdx.strategies.catalogue`), as the framework registries are, so a new
   strategy is priced by its folder and its catalogue line, with no edit here;
3. :func:`default_entries` reads what the cost model compares by default from the same
   descriptors (``cost_compared``).

Why the cost model reads the catalogue, rather than the catalogue registering layouts
here: the catalogue imports no hvdx.core module and no framework (its paths are
strings, :mod:`hvdx.strategies.descriptor`), so importing it adds no cycle, and the
table is complete whoever imports the cost model first. A layout itself is imported
when it is first looked up; a ``core_cost.py`` is numpy and hvdx.core only, as every
``core_*.py`` (tests/unit/test_core_is_framework_neutral.py).
"""

from __future__ import annotations

from typing import Callable, Dict, Mapping, Tuple, Union

from hvdx.core.cost.layouts.horovod import _hierarchical, _horovod
from hvdx.strategies import catalogue

__all__ = ["HOROVOD", "STRATEGIES", "default_entries"]

#: Horovod's own layouts, first in :data:`STRATEGIES` and in :func:`default_entries`.
HOROVOD: Dict[str, Callable] = {"horovod": _horovod, "hierarchical": _hierarchical}


def _paths() -> Dict[str, Union[str, Callable]]:
    """Strategy key -> its layout or the layout's lazy path: Horovod's, then the
    catalogue's strategies' (``cost_model`` -> ``cost_layout``) in catalogue order."""
    paths: Dict[str, Union[str, Callable]] = dict(HOROVOD)
    for d in catalogue.all_descriptors():
        if d.cost_model is None:
            continue
        if paths.setdefault(d.cost_model, d.cost_layout) != d.cost_layout:
            raise ValueError(f"strategy {d.name!r}: cost_model={d.cost_model!r} is "
                             "already another layout's key")
    return paths


#: Strategy keys and the function that lays out their traffic: a live view of the
#: catalogue (a registered strategy is seen; looking a key up imports its layout's
#: module, iterating over the keys imports nothing).
STRATEGIES: Mapping[str, Callable] = catalogue.LazyView(_paths, "cost model layouts")


def default_entries() -> Tuple[Union[str, Tuple[str, Dict]], ...]:
    """What the cost model compares by default
    (:data:`hvdx.core.cost.predict.DEFAULT_STRATEGIES`): Horovod's flat ring and the
    per-rack one, then each built-in strategy's ``cost_compared`` entries in catalogue
    order, a bare key for ``{}`` and ``(key, options)`` otherwise."""
    entries = list(HOROVOD)
    for d in catalogue.BUILT_IN:
        if d.cost_model is not None:
            entries += [(d.cost_model, dict(options)) if options else d.cost_model
                        for options in d.cost_compared]
    return tuple(entries)
