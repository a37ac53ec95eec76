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
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional

__all__ = ["DigitsJob", "digits_job", "digits_setup", "report", "run_job"]


class DigitsJob(NamedTuple):
    """What :func:`digits_job` set up on this rank."""

    hvd: Any        # hvdx.torch, initialised
    workload: Any   # hvdx.bench.workloads.Workload
    data: Any       # this rank's shard of the digits (hvdx.datasets)
    x: Any          # its training inputs and labels, as tensors
    y: Any
    model: Any
    opt: Any        # hvdx's DistributedOptimizer
    rank: int
    size: int


def digits_setup(workload: str, seed: int = 0, process_sets=None) -> DigitsJob:
    """Steps 1 and 2 of :func:`digits_job` (``opt`` is ``None``)."""
    import torch

    import hvdx.torch as hvd
    from hvdx.bench.workloads import WORKLOADS
    from hvdx.datasets import digits

    hvd.init(process_sets=process_sets)
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    rank, size = hvd.rank(), hvd.size()
    spec = WORKLOADS[workload]
    data = digits().shard(rank, size)
    x, y = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    model = spec.make_model()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return DigitsJob(hvd, spec, data, x, y, model, None, rank, size)


def digits_job(workload: str, options: Callable[[Any], Dict], seed: int = 0,
               process_sets=None) -> DigitsJob:
    """The set-up the measurement jobs share (on every rank, collective).

    1. ``hvd.init(process_sets=process_sets)`` (hvdx.torch), one torch thread,
       ``torch.manual_seed(seed)``;
    2. this rank's shard of the digits and the workload's model, broadcast from rank 0;
    3. SGD with momentum 0.9 at the workload's rate times the ranks, wrapped by
       ``hvd.DistributedOptimizer(..., **options(hvd))``.
    """
    import torch

    job = digits_setup(workload, seed, process_sets)
    hvd, spec, size, model = job.hvd, job.workload, job.size, job.model
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=spec.lr * size, momentum=0.9),
        named_parameters=model.named_parameters(), **options(hvd))
    return job._replace(opt=opt)


def report(result: Dict) -> None:
    """Print ``result`` as one JSON line on rank 0 of ``MPI.COMM_WORLD``, then end the
    process on every rank.

    The ranks shut Horovod down (hvdx.torch's, if the job started it) and finalize MPI
    through :func:`hvdx.mpi.finalize.finalize`: MPICH's own ``MPI_Finalize`` over UCX's
    TCP transport deadlocks when the ranks reach it apart, as on the emulated hosts.
    Then ``os._exit``, which skips the interpreter's slow teardown.
    """
    from mpi4py import MPI

    from hvdx.mpi.finalize import finalize

    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(result), flush=True)
    hvd = sys.modules.get("hvdx.torch")
    if hvd is not None:
        hvd.shutdown()  # its background thread communicates until it stops
    finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_job(command: List[str], what: str, timeout: float = 900.0,
            env: Optional[Mapping[str, str]] = None) -> Dict:
    """Run ``command`` (an MPI launch) and return the last JSON line rank 0 printed.

    ``env``: variables added to this process's environment for the job (``mpirun``
    hands its environment to the ranks).

    Raises:
        RuntimeError: naming ``what``, with the end of the job's output, when the job
            prints no result. A job that printed its result and then exited non-zero
            (the launcher's teardown) keeps its result, with a note on stderr.
    """
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env=None if env is None else dict(os.environ, **env))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        # Hydra prints its "BAD TERMINATION" banner on stdout, the ranks' errors go to
        # stderr: the end of both.
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-2000:]}{proc.stdout[-1000:]}")
    if proc.returncode != 0:
        # Rank 0 prints the result only after the job's last collective, so the
        # measurement is whole. What failed is the teardown (before :func:`report`
        # finalized MPI, ranks left without it and Hydra killed the stragglers, exit 9).
        # Kept, and said.
        print(f"hvdx: {what} exited with code {proc.returncode} after rank 0 printed its "
              "result (the launcher's teardown); result kept", file=sys.stderr)
    return json.loads(lines[-1])
