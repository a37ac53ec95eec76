"""``hvdx.tensorflow.keras.DistributedOptimizer``: Horovod's, checked across ranks."""

import horovod.tensorflow.keras as _hvd_keras
from horovod.tensorflow import Average, Compression, global_process_set

from hvdx import environment, step_log
from hvdx.settings import group_sizes, horovod_settings
from hvdx.strategy_contract import strategy_or_error
from hvdx.tensorflow import registry
from hvdx.tensorflow.compression import Compression as _Compression
from hvdx.tensorflow.runtime import check_variables_once

__all__ = ["DistributedOptimizer"]


def DistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='',
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set,
                         scale_local_gradients=True, sync=None,
                         non_trainable_variables=None):
    """Wrap a Keras optimizer for distributed training.

    Takes exactly the arguments of ``horovod.tensorflow.keras.DistributedOptimizer``,
    plus ``sync=`` (an hvdx strategy; ``None`` keeps Horovod's gradient allreduce). The
    first gradient aggregation (inside ``fit``'s traced step, or eagerly) checks that
    every rank trains the same variables with the same settings.

    ``sync=hvdx.DSSync(...)``: ``apply_gradients`` applies the local gradients, then
    averages the variables in the step's group (see
    :mod:`hvdx.strategies.dssync.mixer`); ``compression`` and ``process_set`` must
    keep their defaults; ``op``, ``gradient_predivide_factor``, ``groups`` and the devices are
    unused (no gradient is sent). ``sync=hvdx.Decentralized(...)``: the local step and the mix with
    the graph's neighbours, in either order (see
    :mod:`hvdx.strategies.decentralized.mixer`). Both keep Horovod's Keras optimizer
    API: ``backward_passes_per_step=N`` sums N passes' gradients locally
    (``average_aggregated_gradients``, ``sparse_as_dense`` as in Horovod), then takes one local step
    and one mix; ``register_local_var(v)`` keeps ``v`` out of the mix, its gradient scaled as
    Horovod scales it (``scale_local_gradients``); see :class:`hvdx.tensorflow.mixing_keras._KerasMixing`.
    ``non_trainable_variables=model.non_trainable_variables`` (hvdx's; a list or a
    callable returning one): with ``sync=``, also mix these (BatchNorm moving
    statistics). Ignored otherwise.

    ``compression=hvd.Compression.topk(...)``: bidirectional TopK with error feedback,
    synchronized by hvdx (see :mod:`hvdx.tensorflow.compression_driver`); ``op`` must be
    ``Average`` or ``Sum``; ``backward_passes_per_step > 1`` works (Horovod's local aggregation
    hands the summed gradients to TopK every N passes). The residuals are the tracked
    ``optimizer.hvdx_topk`` (saved with the optimizer), the bytes ``optimizer.hvdx_stats``.

    ``compression`` left at Horovod's ``Compression.none`` and ``sync=None`` are taken
    from ``HVDX_COMPRESSION`` and ``HVDX_SYNC`` where set (:mod:`hvdx.environment`).
    """
    compression, sync, from_environment = environment.choose(
        compression, sync, Compression.none, _Compression,
        "keras DistributedOptimizer")
    strategy, problem = strategy_or_error(compression, sync)
    problem = problem or from_environment

    def horovod(compression=compression, gradient_predivide_factor=gradient_predivide_factor,
                op=op):
        return _hvd_keras.DistributedOptimizer(
            optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
            compression=compression, sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor, op=op,
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients,
            num_groups=num_groups, groups=groups, process_set=process_set,
            scale_local_gradients=scale_local_gradients)

    arguments = registry.GradientArguments(
        compression, op, gradient_predivide_factor, process_set, non_trainable_variables,
        backward_passes_per_step, average_aggregated_gradients, sparse_as_dense,
        scale_local_gradients)
    # The stand-in for a rank whose arguments were refused only carries the check (it
    # raises before synchronizing): Horovod's defaults, which its constructor accepts.
    opt, resolved = registry.keras(horovod, strategy, arguments, optimizer,
                                   lambda: horovod(Compression.none, 1.0, Average))
    error = resolved.error or problem
    # HVDX_BENCH_STEP_LOG (hvdx bench --script): step times; unset, nothing is added.
    opt = step_log.watch_tensorflow(opt, _hvd_keras.rank)
    if registry.checks_its_own_variables(strategy):
        return opt
    settings = horovod_settings(
        optimizer=type(optimizer).__name__, compression=compression,
        sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups,
        groups=group_sizes(groups),
        process_set=process_set, scale_local_gradients=scale_local_gradients,
        sync=sync) + resolved.settings
    # Every Horovod code path (compute_gradients, get_gradients, legacy optimizers)
    # funnels the gradients through _allreduce(grads, vars) before any collective.
    return check_variables_once(
        opt, "_allreduce", lambda args, kwargs: list(args[1]), settings,
        "keras DistributedOptimizer", error)
