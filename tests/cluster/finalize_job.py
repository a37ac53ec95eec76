"""MPI job for the cluster tests: two ranks reach ``MPI_Finalize`` in the orders that
deadlock MPICH 4.0's own finalize over UCX's TCP transport (:mod:`hvdx.mpi.finalize`).

Usage: ``finalize_job.py ORDER SECONDS``, on two ranks; they leave through
:func:`hvdx.mpi.finalize.finalize`, and rank 0 prints one line when it has finalized.

- ``busy``: the ranks exchange messages, then rank 0 keeps calling into MPI
  (``Iprobe``) for SECONDS while rank 1 finalizes at once;
- ``late``: only rank 0 sends (rank 1 has nothing to flush towards it), and rank 0
  comes SECONDS late from the PMI barrier to ``MPI_Finalize``.
"""

import sys
import time

from mpi4py import MPI

import hvdx.mpi.finalize as hvdx_finalize


def main() -> None:
    order, seconds = sys.argv[1], float(sys.argv[2])
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    if order == "busy":
        world.Barrier()
        if rank == 0:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                world.Iprobe(source=MPI.ANY_SOURCE, tag=7)
                time.sleep(0.001)
    elif order == "late":
        if rank == 0:
            world.send("one way", dest=1)
            barrier = hvdx_finalize.pmi_barrier

            def late_barrier():
                barrier()
                time.sleep(seconds)  # as if descheduled on a loaded machine
            hvdx_finalize.pmi_barrier = late_barrier
        else:
            world.recv(source=0)
    else:
        raise SystemExit(f"unknown order {order!r}")
    hvdx_finalize.finalize()
    if rank == 0:
        print(f"finalized: {MPI.Is_finalized()}", flush=True)


if __name__ == "__main__":
    main()
