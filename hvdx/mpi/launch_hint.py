"""The hint ``hvd.init()`` gives a script started without a launcher.

``python train.py`` initialises MPI as a singleton: Horovod runs one rank, and the
script trains alone, as fast as one process can, with no error to say why. A launcher
always leaves its mark in the environment, even for one rank (``mpirun -n 1`` is a
deliberate single rank), so one rank without any of :data:`LAUNCHER_VARIABLES` was
almost certainly meant to be several: rank 0 says how to start them, once per process.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, Optional

from hvdx import log

__all__ = ["LAUNCHER_VARIABLES", "hint", "launched", "say_if_alone"]

#: What each launcher sets in every rank's environment:
#: MPICH's Hydra (and Intel MPI, MVAPICH's Hydra): PMI_RANK, PMI_SIZE, PMI_FD and
#: MPI_LOCALNRANKS (all set under ``mpirun -n 1`` too); Open MPI: OMPI_COMM_WORLD_SIZE;
#: PMIx (Open MPI 5, ``srun --mpi=pmix``): PMIX_RANK; MVAPICH's mpirun_rsh:
#: MV2_COMM_WORLD_SIZE; ``horovodrun`` with Gloo: HOROVOD_RANK, HOROVOD_SIZE (with MPI
#: it runs ``mpirun``, which sets its own).
LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMI_FD", "MPI_LOCALNRANKS",
                      "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE",
                      "HOROVOD_RANK", "HOROVOD_SIZE")

_said = False


def launched(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether a launcher started this process (one of :data:`LAUNCHER_VARIABLES` is
    set in ``environ``, default ``os.environ``)."""
    environ = os.environ if environ is None else environ
    return any(name in environ for name in LAUNCHER_VARIABLES)


def hint(script: Optional[str] = None) -> str:
    """The line for a job of one rank that no launcher started, naming ``script``
    (default: this process's, ``sys.argv[0]``, where it is a file)."""
    script = sys.argv[0] if script is None else script
    if not script or script.startswith("-") or not os.path.isfile(script):
        script = "script.py"  # python -c, an interactive session, a notebook
    return (f"1 rank: launched without mpirun or horovodrun? Start N ranks with "
            f"`horovodrun -np N python {script}` (or `mpirun -n N python {script}`)")


def say_if_alone(size: int) -> None:
    """After Horovod's init: rank 0 says :func:`hint` once per process where the job
    has one rank and no launcher started it; nothing otherwise (a warning: silenced
    by ``HVDX_LOG_LEVEL=error`` only)."""
    global _said
    if _said or size != 1 or launched():
        return
    _said = True
    log.say(hint(), "warning")
