"""Horovod's allreduce on rack process sets, timed for the calibration (step 8 of
hvdx.core.calibration): every rank gets the same times, the sets it added are gone
afterwards, and there is nothing to time without two racks of two ranks."""

import horovod.torch as hvd
import pytest
from mpi4py import MPI

from hvdx.mpi.dssync_groups import registered_sets
from hvdx.torch.horovod_timing import horovod_allreduce_times

pytestmark = pytest.mark.mpi(min_size=1)


def test_two_racks_of_two_ranks_time_every_size_and_leave_no_set_behind(horovod):
    world = MPI.COMM_WORLD
    n = world.Get_size()
    racks = ["a" if r < n // 2 else "b" for r in range(n)]
    before = set(registered_sets(hvd))
    times = horovod_allreduce_times(world, racks, repeats=1, max_round_s=1.0,
                                    sizes=(1024, 8192))
    if n < 4:  # racks of one rank: no process set of two to time
        assert times == {}
        return
    assert list(times) == ["rack"]
    assert [b for b, _ in times["rack"]] == [1024, 8192]
    assert all(s > 0 for _, s in times["rack"])
    everyone = world.allgather(times)
    assert all(t == everyone[0] for t in everyone)
    assert set(registered_sets(hvd)) == before


def test_one_rack_has_nothing_to_time(horovod):
    world = MPI.COMM_WORLD
    assert horovod_allreduce_times(world, ["r"] * world.Get_size(), repeats=1,
                                   max_round_s=1.0, sizes=(1024,)) == {}
