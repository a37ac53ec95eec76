"""The strategies ``hvdx bench`` compares, each a way to build the distributed optimizer.

A strategy turns a local optimizer into a distributed one and says how many bytes a
rank sends per step. Horovod's own collectives are not visible to hvdx, so for the
Horovod baseline the bytes are the standard cost of the algorithm MPI runs for a large
allreduce (reduce-scatter + allgather, Thakur, Rabenseifner & Gropp 2005): each rank
sends ``2 (n - 1) / n`` times the gradient bytes. The benchmark checks every such
figure against the interface byte counters of the emulated hosts.

The table (:data:`STRATEGIES`) is a view of the strategy catalogue
(:mod:`hvdx.strategies.catalogue`): Horovod's baseline, then each built-in strategy's
rows (its descriptor's ``bench``: a name, the lazy path of the function that makes the
row, its arguments), then the floor. Each strategy's rows are made in its own folder
(``hvdx/strategies/<name>/bench_rows.py``); the row's type (:class:`BenchRow`) and the
helpers the rows share are :mod:`hvdx.bench.strategy_row`'s.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Iterable, List

from hvdx.bench.strategy_row import BenchRow, allreduce_bytes_per_rank
from hvdx.strategies import catalogue
from hvdx.strategies.descriptor import load

__all__ = ["ALIASES", "DEFAULT_STRATEGIES", "FULL_STRATEGIES", "STRATEGIES",
           "strategy_names"]


def _horovod(optimizer, model):
    import horovod.torch as hvd

    return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())


def _gradient_bytes(optimizer, model, size, steps):
    """Horovod's traffic is not visible to hvdx: the allreduce's standard cost."""
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    each_way = allreduce_bytes_per_rank(nbytes, size)
    return each_way, each_way


#: The baseline: Horovod's own optimizer.
HOROVOD = BenchRow("horovod", "Horovod ring allreduce (baseline)", _horovod, _gradient_bytes,
                   cost_model="horovod", script_env={})
#: Not a way to train together: the limit of every strategy on these cores.
FLOOR = BenchRow("floor", "the floor: every rank trains alone, no communication at all "
                 "(Horovod idle)", lambda optimizer, model: optimizer,
                 lambda optimizer, model, size, steps: (0.0, 0.0), default=False,
                 needs_code="the floor (every rank training alone) cannot be had from a "
                 "script without changing it: its broadcasts and any metric allreduce "
                 "still communicate")


def _rows() -> Dict[str, BenchRow]:
    """Horovod, each built-in strategy's rows in catalogue order, the floor."""
    rows = [HOROVOD]
    for entry in catalogue.BUILT_IN:
        for variant in entry.bench:
            row = load(variant.make)(variant.name, **variant.kwargs)
            rows.append(dataclasses.replace(row, default=variant.default, full=variant.full,
                                            aliases=tuple(variant.aliases),
                                            strategy=entry.name))
    rows.append(FLOOR)
    table = {row.name: row for row in rows}
    if len(table) != len(rows):
        raise ValueError(f"hvdx bench: a row's name twice: {[row.name for row in rows]}")
    return table


STRATEGIES: Dict[str, BenchRow] = _rows()

#: What a plain ``hvdx bench`` runs (every method, TopK as its two presets): the adaptive DS-Sync pays off under contention
#: only, so it runs when asked for (``--strategies ...,dssync_adaptive``); so do the
#: static exponential graph and combine-then-adapt, variants of ``decentralized``, and
#: Stanza with two FC workers or a probed number, variants of ``stanza``.
DEFAULT_STRATEGIES = tuple(name for name, s in STRATEGIES.items() if s.default)
#: What ``hvdx bench --full`` runs: the defaults and TopK without the presets' tuning
#: (the paper's method as it stands; the presets are what a user is told to run, so
#: the quick run has those alone).
FULL_STRATEGIES = tuple(name for name, s in STRATEGIES.items() if s.default or s.full)

#: Other names ``--strategies`` accepts: the tuned TopKs' names before their rows took
#: the presets' (``topk_dgc`` for ``fast``, ``topk_masked`` for ``safe``).
ALIASES: Dict[str, str] = {alias: name for name, s in STRATEGIES.items()
                           for alias in s.aliases}


def strategy_names(names: Iterable[str]) -> List[str]:
    """``--strategies``' names (stripped) with each of :data:`ALIASES` replaced by the
    strategy it names; an unknown name is kept, for the run to refuse with the list."""
    return [ALIASES.get(name.strip(), name.strip()) for name in names]
