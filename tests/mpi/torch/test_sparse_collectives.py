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
