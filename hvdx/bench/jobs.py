"""Small MPI measurement jobs: one JSON line from rank 0, collected by the driver.

``hvdx bench --process-sets`` and ``--topk-bytes`` run a module of
:mod:`hvdx.bench` under ``mpirun`` once per case; its ranks measure, rank 0 prints one
JSON object (:func:`report`), and the driver reads it back (:func:`run_job`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Dict, List, Mapping, Optional

__all__ = ["report", "run_job"]


def report(result: Dict) -> None:
    """Print ``result`` as one JSON line on rank 0 of ``MPI.COMM_WORLD``, then end the
    process on every rank.

    The ranks leave through a barrier and ``os._exit``, not ``MPI_Finalize``: MPICH's
    finalize over UCX's TCP transport was seen to spin forever on the emulated hosts (as
    :mod:`hvdx.bench.runner` found); nothing is in flight after the barrier.
    """
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(result), flush=True)
    MPI.COMM_WORLD.Barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_job(command: List[str], what: str, timeout: float = 900.0,
            env: Optional[Mapping[str, str]] = None) -> Dict:
    """Run ``command`` (an MPI launch) and return the last JSON line rank 0 printed.

    ``env``: variables added to this process's environment for the job (``mpirun``
    hands its environment to the ranks).

    Raises:
        RuntimeError: naming ``what``, with the end of the job's error output, when the
            job fails or prints no result.
    """
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env=None if env is None else dict(os.environ, **env))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(lines[-1])
