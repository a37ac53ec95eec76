"""hvdx's sleep-waited collectives (hvdx.mpi.sparse): every rank gets every rank's
array, in rank order, whatever its length (empty included)."""

import numpy as np
import pytest
from mpi4py import MPI

from hvdx.mpi.sparse import allgatherv_floats


@pytest.mark.mpi(min_size=1)
def test_allgatherv_floats_returns_every_ranks_array_in_rank_order():
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    # Rank r sends r + 1 values r + 0.5, r + 1.5, ...; the last rank sends nothing.
    mine = [] if rank == size - 1 and size > 1 else [r + 0.5 + rank for r in range(rank + 1)]
    got = allgatherv_floats(comm, np.array(mine, np.float32))
    assert len(got) == size
    for r, array in enumerate(got):
        expected = [] if r == size - 1 and size > 1 else [i + 0.5 + r for i in range(r + 1)]
        assert array.dtype == np.float64 and array.tolist() == expected


@pytest.mark.mpi(min_size=1)
def test_the_time_spent_waiting_for_a_late_rank_is_counted_on_the_ranks_that_waited():
    import time

    from hvdx.mpi.sparse import wait, wait_all, waited_s

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    late_s = 0.3
    comm.Barrier()
    before = waited_s()
    if rank == 0:
        time.sleep(late_s)  # every other rank waits for rank 0 in both waits below
    out = np.empty(size, np.int64)
    wait(comm.Iallgather(np.array([rank], np.int64), out))
    peer = (rank + 1) % size, (rank - 1) % size
    received = np.empty(1, np.int64)
    comm.Barrier()
    if rank == 0:
        time.sleep(late_s)
    wait_all([comm.Isend(np.array([rank], np.int64), dest=peer[0], tag=7),
              comm.Irecv(received, source=peer[1], tag=7)])
    waited = waited_s() - before
    assert out.tolist() == list(range(size)) and received[0] == peer[1]
    assert waited >= 0
    if rank != 0:
        # The first wait holds rank 0's sleep; the second the sleep of rank 0, which
        # sends to rank 1 and receives from the last rank: rank 1 waits for it.
        assert waited >= (2 if rank == 1 else 1) * late_s * 0.9
    if size > 1 and rank == 0:
        assert waited < late_s  # the late rank itself hardly waits
