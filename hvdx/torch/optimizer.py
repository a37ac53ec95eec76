"""``hvdx.torch.DistributedOptimizer``: Horovod's, plus a cross-rank consistency check."""

from __future__ import annotations

import horovod.torch as _hvd

from hvdx.compression import TopKCompression
from hvdx.core.fingerprint import Fingerprint
from hvdx.dssync import DSSync
from hvdx.mpi import check_consistent, communicator_for
from hvdx.mpi.dssync_groups import resolve_dssync
from hvdx.settings import group_sizes, horovod_settings, validate_sync
from hvdx.torch.dssync_optimizer import make_dssync_optimizer
from hvdx.torch.topk_optimizer import make_topk_optimizer

__all__ = ["DistributedOptimizer"]


def DistributedOptimizer(optimizer, named_parameters=None,
                         compression=_hvd.Compression.none,
                         backward_passes_per_step=1,
                         op=_hvd.Average,
                         gradient_predivide_factor=1.0,
                         num_groups=0, groups=None,
                         sparse_as_dense=False,
                         process_set=_hvd.global_process_set,
                         sync=None):
    """Wrap a ``torch.optim.Optimizer`` for distributed training.

    Takes exactly the arguments of ``horovod.torch.DistributedOptimizer`` (same order,
    same defaults), plus:

    Args:
        sync: an hvdx synchronization strategy, or ``None`` for Horovod's gradient
            allreduce. ``hvdx.DSSync(...)``: no gradient allreduce; local steps, then
            parameter averaging inside groups (see :mod:`hvdx.torch.dssync_optimizer`);
            ``compression`` must then be ``Compression.none`` and ``process_set`` the
            global set, and the other gradient arguments are unused.

    ``compression`` also takes ``hvdx.torch.Compression.topk(...)``: bidirectional TopK
    with error feedback, synchronized by hvdx itself (see
    :mod:`hvdx.torch.topk_optimizer`); ``op`` must then be ``Average`` or ``Sum``.

    Before anything is sent, every rank of ``process_set`` compares the parameter names,
    shapes and dtypes and the settings; a mismatch raises the same ``ValueError`` on
    every rank instead of hanging in an allreduce.

    Returns:
        With no hvdx feature switched on, Horovod's own optimizer object; with TopK, an
        instance of a class made from the optimizer's class (``isinstance`` holds).
    """
    validate_sync(sync)
    if named_parameters is not None:
        # Often a generator (model.named_parameters()): read it once, hand Horovod a list.
        named_parameters = list(named_parameters)
    topk = isinstance(compression, TopKCompression)
    dssync = isinstance(sync, DSSync)
    sync_settings, sync_error, schedule = [], None, None
    if dssync:
        sync_settings, sync_error, schedule = _resolve_dssync(sync, compression, process_set)
    fingerprint = Fingerprint.build(
        parameters=_parameter_entries(optimizer, named_parameters),
        settings=horovod_settings(
            compression=compression.describe() if topk else compression,
            backward_passes_per_step=backward_passes_per_step,
            op=op, gradient_predivide_factor=gradient_predivide_factor,
            num_groups=num_groups, groups=group_sizes(groups),
            sparse_as_dense=sparse_as_dense, process_set=process_set,
            sync="dssync" if dssync else sync) + sync_settings)
    comm = None
    if process_set.included():
        comm = communicator_for(process_set, _hvd.global_process_set, _hvd.size())
        check_consistent(fingerprint, comm, "DistributedOptimizer")
    if dssync:
        if sync_error is not None:
            # Every rank failed the same way (else the fingerprints would differ).
            raise sync_error
        return make_dssync_optimizer(optimizer, named_parameters, sync, schedule)
    if topk:
        if comm is None:
            raise ValueError("TopK compression: this rank is not in process_set")
        return make_topk_optimizer(
            optimizer, named_parameters, compression, backward_passes_per_step, op,
            gradient_predivide_factor, sparse_as_dense, process_set, comm)
    return _hvd.DistributedOptimizer(
        optimizer, named_parameters=named_parameters, compression=compression,
        backward_passes_per_step=backward_passes_per_step, op=op,
        gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
        groups=groups, sparse_as_dense=sparse_as_dense, process_set=process_set)


def _resolve_dssync(sync, compression, process_set):
    """``(fingerprint settings, error or None, schedule)``: see
    :func:`hvdx.mpi.dssync_groups.resolve_dssync` (shared with TensorFlow)."""
    return resolve_dssync(sync, _hvd, compression, _hvd.Compression.none, process_set)


def _parameter_entries(optimizer, named_parameters):
    """``(name, dtype, shape)`` for every parameter, in the optimizer's iteration order."""
    names = {}
    if named_parameters is not None:
        names = {id(p): n for n, p in named_parameters}
    for g, group in enumerate(optimizer.param_groups):
        for i, p in enumerate(group["params"]):
            name = names.get(id(p), f"param_groups[{g}][{i}]")
            yield name, str(p.dtype).replace("torch.", ""), tuple(p.shape)
