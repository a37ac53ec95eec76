"""MPI job for the cluster tests: rank 0 sends MEGABYTES to every other rank in turn.

Usage: ``mpi_transfer.py MEGABYTES``. Rank 0 prints one JSON line with

- ``transfers``: per peer, ``{"peer", "bytes", "seconds", "tx_bytes"}``, where
  ``tx_bytes`` is what rank 0's data interface sent during that transfer;
- ``hosts``: each rank's ``HVDX_CLUSTER_HOST``;
- ``node_groups``: the sizes of the shared-memory groups MPI sees, per rank.

The ranks leave through :func:`hvdx.mpi.finalize.finalize`: they leave the last gather
at different times, which MPICH's own ``MPI_Finalize`` over TCP sometimes turned into a
job that printed its result and never exited.
"""

import json
import os
import sys
import time

from mpi4py import MPI

from hvdx.mpi.finalize import finalize


def _tx_bytes() -> int:
    # `ip netns exec` mounts the host namespace's own /sys, so this is this host's data0.
    with open("/sys/class/net/data0/statistics/tx_bytes", encoding="ascii") as handle:
        return int(handle.read())


def main() -> None:
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    nbytes = int(float(sys.argv[1]) * 1e6)
    buffer = bytearray(nbytes)
    # A small warm-up exchange first: UCX connects lazily, and the connection set-up
    # should not count as transfer time.
    small = bytearray(8)
    for peer in range(1, size):
        if rank == 0:
            world.Send(small, dest=peer)
            world.Recv(small, source=peer)
        elif rank == peer:
            world.Recv(small, source=0)
            world.Send(small, dest=0)
    transfers = []
    for peer in range(1, size):
        world.Barrier()
        tx_before = _tx_bytes() if rank == 0 else 0
        start = time.perf_counter()
        if rank == 0:
            world.Send(buffer, dest=peer)
            world.Recv(small, source=peer)  # acknowledgment: all bytes have arrived
        elif rank == peer:
            world.Recv(buffer, source=0)
            world.Send(small, dest=0)
        seconds = time.perf_counter() - start
        transfers.append({"peer": peer, "bytes": nbytes, "seconds": seconds,
                          "tx_bytes": _tx_bytes() - tx_before if rank == 0 else None})
    hosts = world.gather(os.environ.get("HVDX_CLUSTER_HOST"), root=0)
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    groups = world.gather(node.Get_size(), root=0)
    if rank == 0:
        print(json.dumps({"transfers": transfers, "hosts": hosts, "node_groups": groups}),
              flush=True)
    finalize()


if __name__ == "__main__":
    main()
