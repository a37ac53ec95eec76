"""MPI job for the cluster tests: the calibration's timing of Horovod's average on each
rack's process set (hvdx.mpi.calibrate, module step 9), on the emulated racks.

Rank 0 prints one JSON line with

- ``times``: what :func:`~hvdx.mpi.calibration_set_averages.set_allreduce_times`
  returned on rank 0;
- ``same``: whether every rank returned the same groups and sizes;
- ``left``: the process sets still registered afterwards (those it added are removed).
"""

import json

import horovod.torch as hvd
import torch
from mpi4py import MPI

from hvdx.mpi.abort import install_abort_on_error
from hvdx.mpi.calibration_set_averages import set_allreduce_times
from hvdx.mpi.finalize import finalize
from hvdx.mpi.topology import rack_labels
from hvdx.strategies.dssync.mpi_groups import registered_sets


def main() -> None:
    world = MPI.COMM_WORLD
    # A rank that fails prints its traceback and ends the job, rather than leaving the
    # others waiting in a collective until the test's timeout.
    install_abort_on_error()
    hvd.init(comm=world, process_sets="dynamic")
    try:
        times = set_allreduce_times(world, rack_labels(world), hvd,
                                    lambda nbytes: torch.ones(max(1, nbytes // 4)),
                                    repeats=1, sizes=(1024, 65536))
        left = sorted(registered_sets(hvd))
    finally:
        hvd.shutdown()
    shapes = world.allgather({g: [b for b, _ in points] for g, points in times.items()})
    if world.Get_rank() == 0:
        print(json.dumps({"times": times, "same": all(s == shapes[0] for s in shapes),
                          "left": left}), flush=True)
    # After Horovod's shutdown, the last MPI call: MPICH's own MPI_Finalize over TCP can
    # deadlock when ranks reach it apart (hvdx.mpi.finalize).
    finalize()


if __name__ == "__main__":
    main()
