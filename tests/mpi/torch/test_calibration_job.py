"""The calibration job (hvdx.mpi.calibrate) as an MPI job: every rank returns the same
calibration, measured on the link classes the job actually has (on one host: ranks of
one host), and a job of one rank is refused on its rank."""

import pytest
from mpi4py import MPI

from hvdx.mpi.calibrate import calibrate

pytestmark = [pytest.mark.topk]


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
    from hvdx.mpi.calibration_collectives import SPARSE_SIZES
    assert [b for b, _ in cal.allgather_times] == list(SPARSE_SIZES)
    assert [b for b, _ in cal.alltoall_times] == list(SPARSE_SIZES)
    # And sharded TopK's step, the alltoall then the allgather, for each downlink timed.
    from hvdx.mpi.calibration_collectives import SHARDED_DOWNLINK_MULTIPLES
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


@pytest.mark.mpi(min_size=2)
def test_timing_sharded_topk_again_replaces_only_its_step_at_the_size_asked(tmp_path_factory):
    # What hvdx bench runs around each TopK run: one size, one downlink multiple.
    import json
    import os

    from hvdx.core.calibration import Calibration
    from hvdx.mpi.calibrate import main

    world = MPI.COMM_WORLD
    folder = world.bcast(str(tmp_path_factory.mktemp("again")) if world.rank == 0 else None)
    base, out = os.path.join(folder, "base.json"), os.path.join(folder, "again.json")
    if world.rank == 0:
        Calibration(tables={"intra-host": {1: [(1024, 0.001)]}},
                    allgather_times=[(1024, 0.002)],
                    sharded_topk_times={1: [(1024, 9.0)], 2: [(1024, 9.0)]}).save(base)
    world.Barrier()
    assert main(["--out", out, "--sharded-topk-of", base, "--sharded-topk-bytes", "2048",
                 "--downlink-multiple", "1.5", "--repeats", "1"]) == 0
    with open(out) as f:
        again = Calibration.from_dict(json.load(f))
    (multiple, points), = again.sharded_topk_times.items()
    assert multiple == 1.5 and [b for b, _ in points] == [2048]
    assert 0 < points[0][1] < 9.0  # timed here, not the base's
    assert again.allgather_times == [(1024, 0.002)]  # the rest as it was
    assert again.tables == {"intra-host": {1: [(1024, 0.001)]}}
