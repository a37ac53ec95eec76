"""How TensorFlow's entry points resolve a strategy: the :class:`~hvdx.strategy_contract.Job`
they describe, and the resolution of a synchronization strategy (collective).

Both entry points (:func:`hvdx.tensorflow.DistributedGradientTape`, Keras'
``DistributedOptimizer``) resolve through :mod:`hvdx.tensorflow.registry`, which calls
these, then hand the adapter the setup: the same (strategy, setup, arguments) as
PyTorch's entry point (:mod:`hvdx.torch.registry`).
"""

from typing import Any, Mapping, Optional

import horovod.tensorflow as _hvd

from hvdx.mpi import communicator_for
from hvdx.mpi.consistency import resolve_checked
from hvdx.settings import horovod_settings
from hvdx.strategy_contract import Job, Resolved, Strategy

__all__ = ["job", "resolve_sync"]

#: Where a synchronization spec keeps its tapes' resolution: a tape lives one step, and
#: every tape given the same spec shares one schedule and one state.
_RESOLVED = "_hvdx_tensorflow_resolution"


def job(compression, process_set, op=None, gradient_predivide_factor=1.0,
        backward_passes_per_step=1) -> Job:
    """This rank's job as Horovod's TensorFlow module sees it."""
    return Job(size=_hvd.size(), rank=_hvd.rank(), horovod=_hvd, compression=compression,
               no_compression=_hvd.Compression.none, process_set=process_set,
               framework="tensorflow", op=op,
               gradient_predivide_factor=gradient_predivide_factor,
               backward_passes_per_step=backward_passes_per_step)


def resolve_sync(sync: Strategy, this_job: Job, what: str,
                 settings: Optional[Mapping[str, Any]] = None,
                 once: bool = False) -> Resolved:
    """``sync`` resolved for ``this_job`` between two checks across all ranks
    (collective, :func:`hvdx.mpi.consistency.resolve_checked`); a refusal raises on
    every rank alike.

    Args:
        settings: more of the entry point's arguments that every rank must share
            (Keras' aggregation arguments), as keywords of
            :func:`hvdx.settings.horovod_settings`.
        once: a tape's resolution: the first resolves and keeps the result on ``sync``;
            later tapes given the same spec only check their own gradient arguments
            (not collective: the first tape's check covered the spec).

    Returns:
        the resolution, its ``settings`` every setting the ranks compared (the mixing
        state compares them again with its variables, when it first sees them).
    """
    if once:
        kept = getattr(sync, _RESOLVED, None)
        if kept is not None:
            check = getattr(sync, "check_gradient_arguments", None)
            if check is not None:
                check(this_job, f"hvdx.{type(sync).__name__}")
            return kept
    comm = communicator_for(_hvd.global_process_set, _hvd.global_process_set, _hvd.size())
    resolved, checked = resolve_checked(sync, this_job,
                                        horovod_settings(sync=sync, **(settings or {})),
                                        comm, what)
    result = Resolved(checked, resolved.setup)
    if once:
        setattr(sync, _RESOLVED, result)
    return result

