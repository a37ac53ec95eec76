"""examples/keras_digits.py (fit) and examples/tf_tape_digits.py (a tape) with Horovod's
allreduce, TopK and (tape) Stanza, run briefly in this job (:mod:`example_runs`);
DS-Sync and decentralized SGD run in tensorflow_mixing."""

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
@pytest.mark.parametrize("strategy", ["none", "topk"])
def test_keras_example_trains_checkpoints_and_resumes(strategy, tmp_path, capsys):
    run_and_resume("keras_digits", strategy, tmp_path, capsys)


@TWO_RANKS
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("strategy", ["none", "topk", "stanza"])
def test_tape_example_trains_checkpoints_and_resumes(strategy, tmp_path, capsys):
    run_and_resume("tf_tape_digits", strategy, tmp_path, capsys)


@TWO_RANKS
@pytest.mark.mpi(min_size=2)
def test_tf2_synthetic_benchmark_example_runs_as_horovods_does(capsys, monkeypatch):
    # A script at module level, as Horovod's own: run as __main__ with brief flags.
    import runpy

    from example_runs import EXAMPLES
    from mpi4py import MPI

    path = str(EXAMPLES / "tensorflow2_synthetic_benchmark.py")
    monkeypatch.setattr(sys, "argv", [path, "--batch-size", "8", "--num-warmup-batches",
                                      "1", "--num-batches-per-iter", "1", "--num-iters", "2"])
    runpy.run_path(path, run_name="__main__")
    out = capsys.readouterr().out
    if MPI.COMM_WORLD.Get_rank() == 0:
        assert out.count("img/sec per") >= 2, out
