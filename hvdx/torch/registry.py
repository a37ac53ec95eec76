"""Which PyTorch adapter runs which hvdx strategy, as the catalogue says.

:func:`hvdx.torch.DistributedOptimizer` resolves the strategy it was given
(:mod:`hvdx.strategy_contract`), checks it across ranks, then calls :func:`build`, which looks
the strategy's name up in :data:`ADAPTERS`, a view of the catalogue
(:mod:`hvdx.strategies.catalogue`: each descriptor's ``torch_adapter``). A new strategy
is one descriptor there and its adapter module; neither this module nor the entry point
changes. Before the check, :func:`fit` lets a strategy settle what depends on the
optimizer (:data:`FITS`, the descriptors' ``torch_fit``).
"""

from __future__ import annotations

from typing import Any, Callable, List, Mapping, NamedTuple, Optional, Tuple

import horovod.torch as _hvd

from hvdx.strategies import catalogue
from hvdx.strategy_contract import Job, Strategy, adapter_for

__all__ = ["ADAPTERS", "FITS", "OptimizerArguments", "build", "fit", "job",
           "outside_the_set"]


class OptimizerArguments(NamedTuple):
    """Horovod's optimizer arguments as the adapters receive them."""

    named_parameters: Optional[List[Tuple[str, Any]]]
    backward_passes_per_step: int
    op: Any
    gradient_predivide_factor: float
    sparse_as_dense: bool
    process_set: Any
    #: hvdx's communicator for ``process_set`` (``None`` on a rank outside it).
    comm: Any
    #: ``named_buffers=``: the model's buffers that parameter mixing averages too.
    named_buffers: Optional[List[Tuple[str, Any]]]


def job(compression, process_set, op=None, gradient_predivide_factor=1.0,
        backward_passes_per_step=1) -> Job:
    """The :class:`~hvdx.strategy_contract.Job` a torch entry point resolves strategies for."""
    return Job(size=_hvd.size(), rank=_hvd.rank(), horovod=_hvd, compression=compression,
               no_compression=_hvd.Compression.none, process_set=process_set,
               framework="torch", op=op, gradient_predivide_factor=gradient_predivide_factor,
               backward_passes_per_step=backward_passes_per_step)


def outside_the_set(optimizer, args: OptimizerArguments):
    """A compression strategy's optimizer on a rank outside ``process_set``: it
    synchronizes nothing and steps on its own gradients, as Horovod's optimizer does
    there; that is Horovod's optimizer (the compression adapters return it)."""
    return _hvd.DistributedOptimizer(
        optimizer, named_parameters=args.named_parameters,
        backward_passes_per_step=args.backward_passes_per_step, op=args.op,
        gradient_predivide_factor=args.gradient_predivide_factor,
        sparse_as_dense=args.sparse_as_dense, process_set=args.process_set)


#: Strategy name -> ``adapter(optimizer, strategy, setup, arguments)``: a live view of
#: the catalogue's ``torch_adapter`` entries (a registered compressor's included).
ADAPTERS: Mapping[str, Callable] = catalogue.field_table("torch_adapter")


#: Strategy name -> ``fit(spec, optimizer)``: the spec as it runs with the optimizer (a
#: view of the catalogue's ``torch_fit`` entries).
FITS: Mapping[str, Callable] = catalogue.field_table("torch_fit")


def fit(strategy: Strategy, optimizer) -> Strategy:
    """``strategy`` as it runs with ``optimizer``, before the cross-rank check.

    A strategy whose settings depend on the optimizer (a TopK preset's momentum
    correction) resolves them here; the decision reads the optimizer's class and
    ``param_groups`` only, the same on every rank, so the ranks still compare equal
    settings. A spec whose constructor failed is returned as it is (its error is
    raised after the check).
    """
    if strategy.error is not None or strategy.name not in FITS:
        return strategy
    return FITS[strategy.name](strategy, optimizer)


def build(optimizer, strategy: Strategy, setup, args: OptimizerArguments):
    """The optimizer that runs ``strategy`` (after the cross-rank check)."""
    adapter = adapter_for(ADAPTERS, strategy, "hvdx.torch.DistributedOptimizer")
    return adapter(optimizer, strategy, setup, args)
