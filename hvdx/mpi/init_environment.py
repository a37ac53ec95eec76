"""What ``hvd.init()`` does with ``HVDX_COMPRESSION`` and ``HVDX_SYNC``.

The variables choose a strategy for an unchanged Horovod script
(:mod:`hvdx.environment`); ``init`` is the one point where every rank of a script
arrives together, so hvdx's ``init`` does, before Horovod's:

1. the ranks compare the two variables (one small allgather over the communicator
   ``hvd.init`` is given, ``MPI.COMM_WORLD`` by default); unset, empty and ``none``
   are the same. If a rank was launched with another value, every rank raises the same
   :class:`~hvdx.environment_variables.VariableError` naming the variable and each
   rank's value: the ranks would otherwise take different paths, and one may wait in a
   collective the others never enter;
2. every rank reads the values as the entry points will
   (:func:`hvdx.environment.check_at_init`, which the framework's ``init`` hands in:
   :mod:`hvdx.mpi` does not import the spec modules, which import it) and raises the
   same ``VariableError`` for one that is refused, so that a misspelt value ends the job
   at ``init``, before the script loads its data, rather than at its first optimizer;
3. if ``HVDX_SYNC`` names DS-Sync and the script passes no ``process_sets=``, Horovod's
   dynamic process sets are switched on (``process_sets="dynamic"``, which DS-Sync's
   groups need; static sets or ``"dynamic"`` given by the code are kept), and rank 0
   says so.

A list of world ranks as ``comm`` (which hvdx does not support, see
:mod:`hvdx.mpi.comm`) skips the comparison: the ranks outside it may not call init.
"""

from __future__ import annotations

import os
from typing import Callable, Optional, Sequence, Tuple

from mpi4py import MPI

from hvdx import log
from hvdx.environment_variables import (COMPRESSION_VARIABLE, NONE_VALUES, SYNC_VARIABLE,
                                        VariableError, asks_for_dssync)

__all__ = ["VARIABLES", "init_arguments", "launch_difference"]

VARIABLES = (COMPRESSION_VARIABLE, SYNC_VARIABLE)


def init_arguments(args: tuple, kwargs: dict,
                   check: Optional[Callable[[str, Optional[str]], None]] = None
                   ) -> Tuple[tuple, dict]:
    """``hvd.init``'s ``(args, kwargs)`` (``comm``, ``process_sets``) after the steps
    of the module docstring (collective over the init communicator); ``check(variable,
    value)`` is step 2 (``None``: skipped).

    Raises:
        VariableError: a variable differs between ranks, or its value is refused, on
            every rank alike.
    """
    comm = args[0] if args else kwargs.get("comm")
    values = tuple(os.environ.get(name) for name in VARIABLES)
    if comm is None or isinstance(comm, MPI.Comm):
        comm = MPI.COMM_WORLD if comm is None else comm
        everyone = comm.allgather(values)
        problem = launch_difference(everyone)
        if problem is not None:
            raise VariableError(problem)
        rank = comm.Get_rank()
    else:
        rank = MPI.COMM_WORLD.Get_rank()
    for name, raw in zip(VARIABLES, values):
        if check is not None:
            check(name, raw)
    process_sets = args[1] if len(args) > 1 else kwargs.get("process_sets")
    sync = values[VARIABLES.index(SYNC_VARIABLE)]
    if process_sets is not None or not asks_for_dssync(sync):
        return args, kwargs
    log.say(f"{SYNC_VARIABLE}={sync!r}: hvd.init(process_sets=\"dynamic\"), for "
            "DS-Sync's groups", rank=rank)
    return args[:1], dict(kwargs, process_sets="dynamic")


def launch_difference(everyone: Sequence[Tuple[Optional[str], ...]]) -> Optional[str]:
    """The message for the first of :data:`VARIABLES` whose value differs between
    ranks (``everyone[rank]``: that rank's values), or ``None``."""
    for i, name in enumerate(VARIABLES):
        normal = {_normal(values[i]) for values in everyone}
        if len(normal) > 1:
            by_rank = ", ".join(f"rank {rank}: {'unset' if v[i] is None else repr(v[i])}"
                                for rank, v in enumerate(everyone))
            return (f"hvdx init: {name} differs between ranks ({by_rank}); launch every "
                    f"rank with the same value (mpirun -genv {name} ..., mpirun -x "
                    f"{name}=..., or set it before horovodrun)")
    return None


def _normal(value: Optional[str]) -> Optional[str]:
    if value is None or value.strip() in NONE_VALUES:
        return None
    return value.strip()
