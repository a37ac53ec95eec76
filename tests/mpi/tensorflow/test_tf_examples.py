"""examples/keras_digits.py (fit) and examples/tf_tape_digits.py (a tape) with Horovod's
allreduce, TopK and (tape) Stanza, run briefly in this job (:mod:`example_runs`);
DS-Sync and decentralized SGD run in tensorflow_mixing."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from example_runs import TWO_RANKS, run_and_resume  # noqa: E402


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
