"""Bring the whole MPI job down when one rank dies of an uncaught exception.

Without this, a rank that raises before a collective exits alone while its peers wait
in that collective forever (the job hangs until a wall-clock limit). mpi4py's
``python -m mpi4py`` runner does the same thing; hvdx installs it from ``hvd.init()`` so
that users need not change how they launch.

A refused value of ``HVDX_COMPRESSION`` or ``HVDX_SYNC``
(:class:`~hvdx.environment_variables.VariableError`) is raised on every rank alike, and
its message says all there is to fix: the hook prints that message alone, once, on
rank 0, and ends every rank with status 1 (the other ranks stay silent unless rank 0
has not ended the job within :data:`_SILENT_S`).
"""

from __future__ import annotations

import functools
import os
import sys
import time
import traceback

from hvdx.environment_variables import VariableError
from hvdx.mpi import timeline
from hvdx.mpi.init_environment import init_arguments
from hvdx.mpi.launch_hint import say_if_alone

__all__ = ["install_abort_on_error", "wrap_init"]

_installed = False
#: Seconds between writing the traceback and aborting (see the hook).
_FORWARD_S = 0.5
#: Seconds a rank other than 0 waits, silent, for rank 0 to end the job on a
#: VariableError, before it prints the message itself and aborts.
_SILENT_S = 5.0


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
        if isinstance(exc, VariableError):
            _end_on_variable_error(MPI, exc)
            return
        if MPI.Is_finalized() or MPI.COMM_WORLD.Get_size() == 1 or exc_type is KeyboardInterrupt:
            previous(exc_type, exc, tb)
            return
        rank = MPI.COMM_WORLD.Get_rank()
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        lines = "".join(f"[hvdx rank {rank}] {line}\n" for line in text.splitlines())
        lines += f"[hvdx rank {rank}] uncaught exception: aborting all ranks\n"
        _write(lines)
        # The launcher forwards this rank's output asynchronously and stops forwarding
        # once the abort kills the job: without a pause the traceback was sometimes lost.
        time.sleep(_FORWARD_S)
        MPI.COMM_WORLD.Abort(1)

    sys.excepthook = hook
    _installed = True


def _end_on_variable_error(MPI, error: VariableError) -> None:
    """Print ``error``'s message once and end this rank with status 1.

    One rank (or MPI finalized): the message, then Python exits as after any uncaught
    exception. Several: rank 0 prints it and leaves at once (``os._exit``: the other
    ranks are not waited for, and the launcher ends them); every other rank waits
    :data:`_SILENT_S`, silent, for that, then prints it itself and aborts the job, so
    that a rank which raised alone (whatever rank 0 does) still ends it.
    """
    if MPI.Is_finalized() or MPI.COMM_WORLD.Get_size() == 1:
        _write(f"[hvdx] {error}\n")
        return
    rank = MPI.COMM_WORLD.Get_rank()
    if rank == 0:
        _write(f"[hvdx] {error}\n")
        try:
            sys.stdout.flush()  # (os._exit would drop what the script printed)
        except (OSError, ValueError):
            pass
        os._exit(1)
    time.sleep(_SILENT_S)
    _write(f"[hvdx rank {rank}] {error}\n")
    time.sleep(_FORWARD_S)
    MPI.COMM_WORLD.Abort(1)


def _write(text: str) -> None:
    """``text`` on stderr, unbuffered and in one piece."""
    try:
        sys.stderr.flush()
        os.write(2, text.encode(errors="replace"))
    except OSError:
        pass


def wrap_init(horovod_init, check=None):
    """Horovod's ``init`` (same arguments), after abort-on-uncaught-exception for the
    job and the ranks' check of ``HVDX_COMPRESSION`` and ``HVDX_SYNC`` (each value by
    ``check``, :func:`hvdx.environment.check_at_init`; dynamic process sets where DS-Sync
    is asked for: :mod:`hvdx.mpi.init_environment`), then hvdx's own communicator
    (:func:`hvdx.mpi.comm.world`), on the rank that writes ``HOROVOD_TIMELINE``, the
    recording of hvdx's exchanges for it (:mod:`hvdx.mpi.timeline`), and, in a job of
    one rank that no launcher started, the hint to start several
    (:mod:`hvdx.mpi.launch_hint`)."""

    @functools.wraps(horovod_init)
    def init(*args, **kwargs):
        # First: a refused HVDX_* value ends the job from init_arguments, through the hook.
        install_abort_on_error()
        args, kwargs = init_arguments(args, kwargs, check)
        # Before Horovod registers its shutdown at exit, so that hvdx's merge into the
        # timeline file runs after it (hvdx.mpi.timeline).
        timeline.install_exit_hook()
        result = horovod_init(*args, **kwargs)
        # hvdx's duplicate of Horovod's communicator, made here where every rank calls:
        # its first user may be a process set's members alone (an optimizer with
        # process_set=), and duplicating is collective over every rank.
        from horovod.common.process_sets import global_process_set

        from hvdx.mpi.comm import world

        comm = world(global_process_set)
        timeline.after_init(comm.Get_rank())
        # A script started as `python train.py` trains alone, silently: say how to
        # start several ranks (hvdx.mpi.launch_hint; a launched single rank is not told).
        say_if_alone(comm.Get_size())
        return result

    return init
