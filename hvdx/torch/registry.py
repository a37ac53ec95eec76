"""Which PyTorch adapter runs which hvdx strategy: the one place that names them.

:func:`hvdx.torch.DistributedOptimizer` resolves the strategy it was given
(:mod:`hvdx.strategy`), checks it across ranks, then calls :func:`build`, which looks
the strategy's name up in :data:`ADAPTERS`. A new strategy is one entry here and one
adapter module; the entry point does not change.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import horovod.torch as _hvd

from hvdx.strategy import Job, Strategy, adapter_for

__all__ = ["ADAPTERS", "OptimizerArguments", "build", "job"]


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


def job(compression, process_set) -> Job:
    """The :class:`~hvdx.strategy.Job` a torch entry point resolves strategies for."""
    return Job(size=_hvd.size(), rank=_hvd.rank(), horovod=_hvd, compression=compression,
               no_compression=_hvd.Compression.none, process_set=process_set,
               framework="torch")


def _topk(optimizer, strategy, plan, args: OptimizerArguments):
    from hvdx.torch.topk_optimizer import make_topk_optimizer

    if args.comm is None:
        # Outside process_set a rank synchronizes nothing and steps on its own gradients,
        # as Horovod's optimizer does there: that is Horovod's optimizer.
        return _hvd.DistributedOptimizer(
            optimizer, named_parameters=args.named_parameters,
            backward_passes_per_step=args.backward_passes_per_step, op=args.op,
            gradient_predivide_factor=args.gradient_predivide_factor,
            sparse_as_dense=args.sparse_as_dense, process_set=args.process_set)
    return make_topk_optimizer(
        optimizer, args.named_parameters, strategy, args.backward_passes_per_step,
        args.op, args.gradient_predivide_factor, args.sparse_as_dense, args.process_set,
        args.comm)


def _dssync(optimizer, strategy, plan, args: OptimizerArguments):
    from hvdx.torch.dssync_optimizer import make_dssync_optimizer

    return make_dssync_optimizer(optimizer, args.named_parameters, strategy, plan.schedule,
                                 args.named_buffers)


def _decentralized(optimizer, strategy, plan, args: OptimizerArguments):
    from hvdx.torch.decentralized_optimizer import make_decentralized_optimizer

    return make_decentralized_optimizer(optimizer, args.named_parameters, strategy, plan,
                                        args.named_buffers)


#: Strategy name -> ``adapter(optimizer, strategy, plan, arguments)``.
ADAPTERS: Dict[str, Callable] = {
    "topk": _topk,
    "dssync": _dssync,
    "decentralized": _decentralized,
}


def build(optimizer, strategy: Strategy, plan, args: OptimizerArguments):
    """The optimizer that runs ``strategy`` (after the cross-rank check)."""
    adapter = adapter_for(ADAPTERS, strategy, "hvdx.torch.DistributedOptimizer")
    return adapter(optimizer, strategy, plan, args)
