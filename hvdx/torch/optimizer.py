"""``hvdx.torch.DistributedOptimizer``: Horovod's, plus a cross-rank consistency check
and hvdx's strategies (looked up in :mod:`hvdx.torch.registry`)."""

from __future__ import annotations

import horovod.torch as _hvd

from hvdx import environment, step_log
from hvdx.mpi import communicator_for
from hvdx.mpi.consistency import resolve_checked
from hvdx.settings import group_sizes, horovod_settings
from hvdx.strategy_contract import strategy_or_error
from hvdx.torch import registry
from hvdx.torch.join import track
from hvdx.torch.compression import Compression
from hvdx.torch.parameter_names import parameter_names, positional_name

__all__ = ["DistributedOptimizer"]


def DistributedOptimizer(optimizer, named_parameters=None,
                         compression=_hvd.Compression.none,
                         backward_passes_per_step=1,
                         op=_hvd.Average,
                         gradient_predivide_factor=1.0,
                         num_groups=0, groups=None,
                         sparse_as_dense=False,
                         process_set=_hvd.global_process_set,
                         sync=None, named_buffers=None):
    """Wrap a ``torch.optim.Optimizer`` for distributed training.

    Takes exactly the arguments of ``horovod.torch.DistributedOptimizer`` (same order,
    same defaults), plus:

    Args:
        sync: an hvdx synchronization strategy, or ``None`` for Horovod's gradient
            allreduce. ``hvdx.DSSync(...)`` (group averaging, see
            :mod:`hvdx.strategies.dssync.mixer`) and ``hvdx.Decentralized(...)``
            (neighbour averaging over a graph, see
            :mod:`hvdx.strategies.decentralized.mixer`) average parameters after a local
            step instead of averaging gradients: ``compression`` must then be
            ``Compression.none`` and ``process_set`` the global set, and the other
            gradient arguments are unused.
        named_buffers: with ``sync=``, the model's buffers (``model.named_buffers()``:
            BatchNorm running statistics), averaged with the parameters, so that every
            rank evaluates with the same statistics after ``synchronize_parameters()``.
            Ignored otherwise (Horovod averages gradients only; broadcast buffers as
            usual).

    ``compression`` also takes ``hvdx.torch.Compression.topk(...)``: bidirectional TopK
    with error feedback, synchronized by hvdx itself (see
    :mod:`hvdx.torch.compression_driver`); ``op`` must then be ``Average`` or ``Sum``.

    Before anything is sent, every rank of ``process_set`` compares the parameter names,
    shapes and dtypes and the settings; a mismatch raises the same ``ValueError`` on
    every rank instead of hanging in an allreduce. Under every hvdx strategy
    ``named_parameters`` is checked as Horovod checks it, with its messages, and
    ``optimizer._parameter_names`` names every parameter
    (:mod:`hvdx.torch.parameter_names`); a TopK preset keeps DGC's momentum correction
    only with ``torch.optim.SGD`` with plain momentum (:mod:`hvdx.strategies.topk.presets`).

    ``compression`` left at Horovod's ``Compression.none`` and ``sync=None`` are taken
    from ``HVDX_COMPRESSION`` and ``HVDX_SYNC`` where set (:mod:`hvdx.environment`).

    Returns:
        With no hvdx feature switched on, Horovod's own optimizer object; with an hvdx
        strategy, an instance of a class made from the optimizer's class
        (``isinstance`` holds).
    """
    # A preset's settings may depend on the optimizer's class and param_groups (the same
    # on every rank, so the fingerprint below compares what runs): fitted before rank 0
    # describes the strategy, so that it describes what runs.
    compression, sync, from_environment = environment.choose(
        compression, sync, _hvd.Compression.none, Compression, "DistributedOptimizer",
        fit=lambda strategy: registry.fit(strategy, optimizer))
    strategy, problem = strategy_or_error(compression, sync)
    problem = problem or from_environment
    if named_parameters is not None:
        # Often a generator (model.named_parameters()): read it once, hand Horovod a list.
        named_parameters = list(named_parameters)
    names = None
    if strategy is not None:
        # Horovod's checks of named_parameters, which its own optimizer makes in its
        # constructor; the same script on every rank: every rank raises alike.
        names = parameter_names(optimizer.param_groups, named_parameters)
    if named_buffers is not None:
        named_buffers = list(named_buffers)
    settings = horovod_settings(
        compression=compression, backward_passes_per_step=backward_passes_per_step,
        op=op, gradient_predivide_factor=gradient_predivide_factor,
        num_groups=num_groups, groups=group_sizes(groups),
        sparse_as_dense=sparse_as_dense, process_set=process_set, sync=sync)
    comm = None
    if process_set.included():
        comm = communicator_for(process_set, _hvd.global_process_set, _hvd.size())
    resolved, _ = resolve_checked(
        strategy, registry.job(compression, process_set, op, gradient_predivide_factor,
                               backward_passes_per_step), settings, comm,
        "DistributedOptimizer", parameters=_parameter_entries(optimizer, named_parameters),
        more_settings=_buffer_entries(sync, named_buffers), kept=problem)
    if strategy is None:
        distributed = _hvd.DistributedOptimizer(
            optimizer, named_parameters=named_parameters, compression=compression,
            backward_passes_per_step=backward_passes_per_step, op=op,
            gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
            groups=groups, sparse_as_dense=sparse_as_dense, process_set=process_set)
    else:
        distributed = registry.build(
            optimizer, strategy, resolved.setup, registry.OptimizerArguments(
                named_parameters, backward_passes_per_step, op, gradient_predivide_factor,
                sparse_as_dense, process_set, comm,
                named_buffers if sync is not None else None))
        if not hasattr(distributed, "_parameter_names"):  # (Horovod's optimizer has its own)
            distributed._parameter_names = names
        track(distributed, strategy)
    # HVDX_BENCH_STEP_LOG (hvdx bench --script): step times; unset, nothing is added.
    return step_log.watch_torch(distributed, _hvd.rank)


def _buffer_entries(sync, named_buffers):
    """``(name, dtype and shape)`` of the buffers a mixing strategy averages."""
    if sync is None or not named_buffers:
        return []
    return [(f"buffer.{name}", f"{str(b.dtype).replace('torch.', '')}{list(b.shape)}")
            for name, b in named_buffers]


def _parameter_entries(optimizer, named_parameters):
    """``(name, dtype, shape)`` for every parameter, in the optimizer's iteration order."""
    names = {}
    if named_parameters is not None:
        names = {id(p): n for n, p in named_parameters}
    for g, group in enumerate(optimizer.param_groups):
        for i, p in enumerate(group["params"]):
            name = names.get(id(p), positional_name(g, i))
            yield name, str(p.dtype).replace("torch.", ""), tuple(p.shape)
