"""The calibration's timing of Horovod's averages on process sets (hvdx.mpi.calibrate,
module step 9) as an MPI job: every rank returns the same times, for the group DS-Sync
averages in. The rack sets' path registers process sets and is left to the emulated
cluster's calibration (hvdx bench): in this shared job it hung at 4 ranks."""

import horovod.torch
import pytest
import torch
from mpi4py import MPI

from hvdx.mpi.calibrate import set_allreduce_times


def ones(nbytes):
    return torch.ones(max(1, nbytes // 4))


def timed(racks):
    return set_allreduce_times(MPI.COMM_WORLD, racks, horovod.torch, ones, repeats=1,
                               sizes=(1024, 8192))


@pytest.mark.mpi(min_size=1)
def test_one_rack_times_the_average_over_everyone_the_same_on_every_rank():
    times = timed(["one rack"] * MPI.COMM_WORLD.Get_size())
    assert set(times) == {"world"}
    assert [b for b, _ in times["world"]] == [1024, 8192]
    assert all(s > 0 for _, s in times["world"])
    everyone = MPI.COMM_WORLD.allgather(times)
    assert all(t == everyone[0] for t in everyone)


@pytest.mark.mpi(min_size=2)
def test_one_rank_per_rack_has_no_rack_set_to_time():
    n = MPI.COMM_WORLD.Get_size()
    assert timed([f"rack {r}" for r in range(n)]) == {}
