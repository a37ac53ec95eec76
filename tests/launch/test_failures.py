"""A rank that fails ends the whole job, promptly, under mpirun and under horovodrun:
an uncaught exception within 10 s (non-zero exit, that rank's traceback in the output)
under every strategy, and a SIGKILL within 30 s. The times are measured from the moment
the failing rank fails (it writes the time to a file first)."""

import os
import pathlib
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.topk, pytest.mark.dssync, pytest.mark.decentralized]

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent
JOB = pathlib.Path(__file__).with_name("failing_job.py")
STRATEGIES = ["horovod", "topk", "dssync", "decentralized"]
LIMITS = {"raise": 10.0, "kill": 30.0}
#: Measured times, reported at the end of the run (the README quotes them).
MEASURED = {}


def launch(launcher, strategy, how, stamp):
    command = [sys.executable, str(JOB), strategy, how, str(stamp)]
    if launcher == "mpirun":
        command = ["mpirun", "-n", "2"] + command
    else:
        command = [str(BIN / "horovodrun"), "-np", "2"] + command
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180)
    return proc, time.time()


# What the survivors wait in is the strategy's: Horovod's and TopK's collectives, DS-Sync's
# process sets, the graph's point-to-point. So every strategy meets an exception under
# mpirun. The launcher's part (forwarding the abort, noticing a dead rank) does not depend
# on what they wait in: horovodrun meets an exception in a collective and in the graph's
# point-to-point; a SIGKILL, under mpirun in a process set's collective and in
# point-to-point, under horovodrun in point-to-point (the suite's time is shared).
CASES = [("mpirun", strategy, "raise") for strategy in STRATEGIES] + \
    [("horovodrun", strategy, "raise") for strategy in ("topk", "decentralized")] + \
    [("mpirun", strategy, "kill") for strategy in ("dssync", "decentralized")] + \
    [("horovodrun", "decentralized", "kill")]


@pytest.mark.parametrize("launcher,strategy,how", CASES)
def test_a_failing_rank_ends_the_whole_job_promptly(launcher, strategy, how, tmp_path):
    stamp = tmp_path / "failed_at"
    proc, ended = launch(launcher, strategy, how, stamp)
    output = proc.stdout + proc.stderr
    assert stamp.exists(), f"the failing rank never got to fail:\n{output}"
    after = ended - float(stamp.read_text())
    MEASURED[(launcher, strategy, how)] = after
    assert proc.returncode != 0, output
    assert after < LIMITS[how], f"the job took {after:.1f} s to end:\n{output}"
    if how == "raise":
        assert "[hvdx rank 1] RuntimeError: rank one fails at step 3" in output, output
        assert "[hvdx rank 1] Traceback" in output, output


def teardown_module(module):
    if MEASURED:
        print("\nseconds from the failure to the end of the job:")
        for (launcher, strategy, how), seconds in sorted(MEASURED.items()):
            print(f"  {launcher:10s} {strategy:13s} {how:5s} {seconds:5.1f}")
