"""``hvdx.tensorflow.DistributedGradientTape``: Horovod's tape, checked across ranks."""

import horovod.tensorflow as _hvd
import tensorflow as tf

from hvdx import environment, step_log
from hvdx.settings import group_sizes, horovod_settings
from hvdx.strategy_contract import strategy_or_error
from hvdx.tensorflow import registry
from hvdx.tensorflow.compression import Compression
from hvdx.tensorflow.runtime import check_variables_once, flat_variables

__all__ = ["DistributedGradientTape"]


@tf.autograph.experimental.do_not_convert  # builds objects at trace time: nothing to convert
def DistributedGradientTape(gradtape, device_dense='', device_sparse='',
                            compression=_hvd.Compression.none, sparse_as_dense=False,
                            op=_hvd.Average, gradient_predivide_factor=1.0,
                            num_groups=0, groups=None,
                            process_set=_hvd.global_process_set,
                            scale_local_gradients=True, sync=None,
                            non_trainable_variables=None):
    """A ``tf.GradientTape`` whose ``gradient()`` averages across ranks.

    Takes exactly the arguments of ``horovod.tensorflow.DistributedGradientTape``, plus
    ``sync=`` (an hvdx strategy; ``None`` keeps Horovod's gradient allreduce). The first
    ``gradient()`` call checks that every rank has the same variables (shape, dtype, in
    order) and settings, and raises the same ``ValueError`` on every rank otherwise.

    ``sync=hvdx.DSSync(...)``: ``gradient()`` returns the local gradients and replaces
    the variables by their group average (see :mod:`hvdx.strategies.dssync.mixer`).
    ``sync=hvdx.Decentralized(..., order="combine_then_adapt")``: likewise, with the
    graph's neighbours (see :mod:`hvdx.strategies.decentralized.mixer`);
    ``HVDX_SYNC="Decentralized(...)"`` without an ``order`` runs that order here.
    ``non_trainable_variables=model.non_trainable_variables`` (hvdx's; a list or a
    callable returning one): with ``sync=``, also mix these (BatchNorm moving
    statistics), so that every rank evaluates alike after ``synchronize_parameters()``.
    Ignored otherwise (Horovod averages gradients only).

    ``compression=hvd.Compression.topk(...)``: bidirectional TopK with error feedback,
    synchronized by hvdx (see :mod:`hvdx.tensorflow.compression_driver`); ``op`` must be
    ``Average`` or ``Sum``, and :func:`hvdx.tensorflow.topk_state` gives the residuals to
    checkpoint.

    ``compression`` left at Horovod's ``Compression.none`` and ``sync=None`` are taken
    from ``HVDX_COMPRESSION`` and ``HVDX_SYNC`` where set (:mod:`hvdx.environment`).
    """
    # fit_tape: HVDX_SYNC's Decentralized in the order a tape runs, before rank 0 says it.
    compression, sync, from_environment = environment.choose(
        compression, sync, _hvd.Compression.none, Compression,
        "DistributedGradientTape", fit=registry.fit_tape)
    strategy, problem = strategy_or_error(compression, sync)
    problem = problem or from_environment

    def horovod():
        return _hvd.DistributedGradientTape(
            gradtape, device_dense=device_dense, device_sparse=device_sparse,
            compression=compression, sparse_as_dense=sparse_as_dense, op=op,
            gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
            groups=groups, process_set=process_set,
            scale_local_gradients=scale_local_gradients)

    arguments = registry.GradientArguments(compression, op, gradient_predivide_factor,
                                           process_set, non_trainable_variables,
                                           scale_local_gradients=scale_local_gradients)
    tape, resolved = registry.tape(horovod, strategy, arguments, gradtape)
    error = resolved.error or problem
    # HVDX_BENCH_STEP_LOG (hvdx bench --script): step times; unset, nothing is added.
    tape = step_log.watch_tensorflow(tape, _hvd.rank, registry.tape_counters(strategy))
    if registry.checks_its_own_variables(strategy):
        return tape
    settings = horovod_settings(
        compression=compression, sparse_as_dense=sparse_as_dense, op=op,
        gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
        groups=group_sizes(groups),
        process_set=process_set, scale_local_gradients=scale_local_gradients,
        sync=sync) + resolved.settings
    return check_variables_once(
        tape, "gradient",
        lambda args, kwargs: flat_variables(kwargs.get("sources", args[1] if len(args) > 1 else None)),
        settings, "DistributedGradientTape", error)
