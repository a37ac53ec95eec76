"""Horovod's rank-0 resume recipe in a new job (``resume_job.py``), under every
strategy and preset, at 2 ranks: rank 0 alone loads what rank 0 alone saved, the
broadcasts give every rank the root's parameters, and the ranks that average gradients
(every strategy at 2 ranks, where a group or a peer is everyone) train one model on. No
job hangs. Two launches serve every strategy. The same recipe within one job runs at 4
ranks too (tests/mpi/torch_mixing/test_horovod_recipes.py); a 4-rank pair of launches
here took a minute of the suite's 2 cores."""

import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.topk, pytest.mark.dssync, pytest.mark.decentralized]

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent
JOB = pathlib.Path(__file__).with_name("resume_job.py")
STRATEGIES = ["horovod", "topk", "fast", "safe", "topk-momentum-sharded", "dssync",
              "decentralized"]


def job(ranks, phase, directory):
    env = dict(os.environ, OMP_NUM_THREADS="1", HVDX_LOG_LEVEL="warning",
               PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(["mpirun", "-n", str(ranks), sys.executable, str(JOB), phase,
                           str(directory)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    return proc.stdout


@pytest.mark.parametrize("ranks", [2])
def test_every_rank_holds_the_roots_state_and_trains_one_model_after_a_new_job(
        ranks, tmp_path):
    job(ranks, "save", tmp_path)
    lines = [line.split() for line in job(ranks, "resume", tmp_path).splitlines()
             if line.startswith("RESUMED ")]
    assert [line[1] for line in lines] == STRATEGIES
    for _, strategy, roots, one_model in lines:
        assert roots == "yes", f"{strategy}: the resumed parameters are not the root's"
        mixing = strategy in ("dssync", "decentralized")
        assert one_model == ("n/a" if mixing and ranks > 2 else "yes"), \
            f"{strategy}: the ranks' parameters differ after resuming"
