"""examples/torch_digits.py with Horovod's allreduce, TopK and Stanza, run briefly in
this job (:mod:`example_runs`); DS-Sync and decentralized SGD run in torch_mixing."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from example_runs import TWO_RANKS, run_and_resume  # noqa: E402
from mpi4py import MPI  # noqa: E402

# What this module proves does not depend on the size of the job; at 4 ranks on the
# suite's 2 cores every collective waits for a descheduled rank, so the 4-rank job's
# time goes to the tests that need 4 ranks (groups, graphs, shards, roles).
pytestmark = [pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 2,
                                 reason="the examples: checked at 1 and 2 ranks"),
              pytest.mark.topk, pytest.mark.decentralized, pytest.mark.stanza]


@TWO_RANKS
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("strategy", ["none", "topk", "stanza"])
def test_torch_example_trains_checkpoints_and_resumes(strategy, tmp_path, capsys):
    run_and_resume("torch_digits", strategy, tmp_path, capsys)
