"""Bring the whole MPI job down when one rank dies of an uncaught exception.

Without this, a rank that raises before a collective exits alone while its peers wait
in that collective forever (the job hangs until a wall-clock limit). mpi4py's
``python -m mpi4py`` runner does the same thing; hvdx installs it from ``hvd.init()`` so
that users need not change how they launch.
"""

from __future__ import annotations

import functools
import os
import sys
import time
import traceback

from hvdx.mpi.init_environment import init_arguments

__all__ = ["install_abort_on_error", "wrap_init"]

_installed = False
#: Seconds between writing the traceback and aborting (see the hook).
_FORWARD_S = 0.5


def install_abort_on_error() -> None:
    """Print the traceback with the rank, then ``MPI_Abort`` the job (once per process).

    Set ``HVDX_ABORT_ON_ERROR=0`` to keep Python's default behaviour.
    """
    global _installed
    if _installed or os.environ.get("HVDX_ABORT_ON_ERROR", "1") == "0":
        return
    from mpi4py import MPI

    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        if MPI.Is_finalized() or MPI.COMM_WORLD.Get_size() == 1 or exc_type is KeyboardInterrupt:
            previous(exc_type, exc, tb)
            return
        rank = MPI.COMM_WORLD.Get_rank()
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        lines = "".join(f"[hvdx rank {rank}] {line}\n" for line in text.splitlines())
        lines += f"[hvdx rank {rank}] uncaught exception: aborting all ranks\n"
        try:
            sys.stderr.flush()
            os.write(2, lines.encode(errors="replace"))  # unbuffered, in one piece
        except OSError:
            pass
        # The launcher forwards this rank's output asynchronously and stops forwarding
        # once the abort kills the job: without a pause the traceback was sometimes lost.
        time.sleep(_FORWARD_S)
        MPI.COMM_WORLD.Abort(1)

    sys.excepthook = hook
    _installed = True


def wrap_init(horovod_init):
    """Horovod's ``init`` (same arguments), after the ranks compared ``HVDX_COMPRESSION``
    and ``HVDX_SYNC`` (dynamic process sets where DS-Sync is asked for:
    :mod:`hvdx.mpi.init_environment`), then hvdx's own communicator
    (:func:`hvdx.mpi.comm.world`) and abort-on-uncaught-exception for the job."""

    @functools.wraps(horovod_init)
    def init(*args, **kwargs):
        args, kwargs = init_arguments(args, kwargs)
        result = horovod_init(*args, **kwargs)
        # hvdx's duplicate of Horovod's communicator, made here where every rank calls:
        # its first user may be a process set's members alone (an optimizer with
        # process_set=), and duplicating is collective over every rank.
        from horovod.common.process_sets import global_process_set

        from hvdx.mpi.comm import world

        world(global_process_set)
        install_abort_on_error()
        return result

    return init
