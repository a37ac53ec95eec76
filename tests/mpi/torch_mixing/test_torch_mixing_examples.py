"""examples/torch_digits.py with DS-Sync and decentralized SGD, run briefly in this job
of dynamic process sets (:mod:`example_runs`)."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from example_runs import TWO_RANKS, run_and_resume  # noqa: E402

pytestmark = [pytest.mark.dssync, pytest.mark.decentralized]


@TWO_RANKS
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("strategy", ["dssync", "decentralized"])
def test_torch_example_trains_checkpoints_and_resumes(strategy, tmp_path, capsys):
    run_and_resume("torch_digits", strategy, tmp_path, capsys)
