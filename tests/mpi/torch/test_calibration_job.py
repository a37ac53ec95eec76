"""The calibration job (hvdx.mpi.calibrate) as an MPI job: every rank returns the same
calibration, measured on the link classes the job actually has (on one host: ranks of
one host), and a job of one rank is refused on its rank."""

import pytest
from mpi4py import MPI

from hvdx.mpi.calibrate import calibrate


@pytest.mark.mpi(min_size=2)
def test_every_rank_returns_the_same_calibration_of_the_links_it_has():
    world = MPI.COMM_WORLD
    cal = calibrate(sizes=(1024, 8192), repeats=1)
    everyone = world.allgather(cal.to_dict())
    assert all(d == everyone[0] for d in everyone)
    # One host, no racks: pairs of ranks on the host, and the allreduce on all ranks.
    assert set(cal.tables) == {"intra-host"}
    assert [b for b, _ in cal.tables["intra-host"][1]] == [1024, 8192]
    assert set(cal.allreduce_times) == {"world"}
    # hvdx's sparse collectives, timed for every size (none of them near a second here).
    from hvdx.mpi.calibrate import SPARSE_SIZES
    assert [b for b, _ in cal.allgather_times] == list(SPARSE_SIZES)
    assert [b for b, _ in cal.alltoall_times] == list(SPARSE_SIZES)
    # And sharded TopK's step, the alltoall then the allgather, for each downlink timed.
    from hvdx.mpi.calibrate import SHARDED_DOWNLINK_MULTIPLES
    assert sorted(cal.sharded_topk_times) == [float(m) for m in SHARDED_DOWNLINK_MULTIPLES]
    assert all([b for b, _ in points] == list(SPARSE_SIZES)
               for points in cal.sharded_topk_times.values())
    assert cal.oneway_tables == {}  # one way is timed between hosts only
    assert cal.allreduce == "recursive_halving"  # the library is MPICH


@pytest.mark.mpi(min_size=1)
def test_one_rank_has_no_link_to_time():
    if MPI.COMM_WORLD.Get_size() > 1:
        pytest.skip("a job of one rank")
    with pytest.raises(ValueError, match="at least 2 ranks"):
        calibrate(sizes=(1024,), repeats=1)
