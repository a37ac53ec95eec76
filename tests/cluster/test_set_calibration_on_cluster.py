"""The calibration's timing of Horovod's average on process sets (hvdx.mpi.calibrate,
module step 9) across emulated racks: with two racks of two hosts, it times the average
on each rack's set, all racks at once, the same groups on every rank, and removes the
sets it registered. (Its own job: inside the shared MPI test jobs, whose Horovod
already holds DS-Sync's sets, it hung.)"""

import json
import subprocess
import sys

import pytest

from cluster_helpers import HERE, child_env
from test_cluster_mpi import _mpi_skip_reason
from hvdx.cluster import mpiexec_command

pytestmark = pytest.mark.skipif(_mpi_skip_reason() is not None,
                                reason=str(_mpi_skip_reason()))


@pytest.fixture(scope="module")
def report(cluster):
    pytest.importorskip("horovod.torch")
    command = mpiexec_command(cluster, [sys.executable, str(HERE / "set_calibration_job.py")])
    # A hang fails the test (subprocess.run kills the job at the timeout), with the
    # job's whole output.
    try:
        proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=child_env(), timeout=180)
    except subprocess.TimeoutExpired as error:
        output = error.output.decode(errors="replace") if isinstance(error.output, bytes) \
            else (error.output or "")
        pytest.fail(f"the job ran past 180 s; its output:\n{output[-6000:]}")
    reports = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert reports, proc.stdout[-3000:]
    return json.loads(reports[-1])


def test_two_racks_time_the_average_on_the_rack_sets_and_on_all_ranks_for_every_size(report):
    # Horovod's own average on all ranks too (below 1 MiB: its machinery, not the wire).
    assert list(report["times"]) == ["rack", "world"]
    for group in ("rack", "world"):
        assert [b for b, _ in report["times"][group]] == [1024, 65536]
        assert all(seconds > 0 for _, seconds in report["times"][group])


def test_every_rank_times_the_same_groups_and_the_sets_it_added_are_gone(report):
    assert report["same"]
    assert report["left"] == []
