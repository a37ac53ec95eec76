"""`hvdx topology --probe` on an emulated 2 x 2 cluster finds what was built: two racks
joined by a slow uplink, the same racks as the labels, and every cross-rack link slow."""

import re
import subprocess
import sys

import pytest

from cluster_helpers import NIC, UPLINK, child_env
from test_cluster_mpi import _mpi_skip_reason

pytestmark = pytest.mark.skipif(_mpi_skip_reason() is not None,
                                reason=str(_mpi_skip_reason()))


@pytest.fixture(scope="module")
def output():
    proc = subprocess.run(
        [sys.executable, "-m", "hvdx.cli", "topology", "--racks", "2", "--hosts-per-rack",
         "2", "--nic", NIC, "--uplink", UPLINK, "--probe",
         "--timeout", "60"], capture_output=True, text=True, timeout=90, env=child_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_the_probe_recovers_the_two_racks(output):
    assert "4 ranks on 4 hosts (shared-memory split), 2 racks (from HVDX_CLUSTER_RACK)" \
        in output
    assert "racks from the probe: rack 0: ranks 0 1; rack 1: ranks 2 3 (agree with the " \
           "labels)" in output


def test_every_link_across_the_uplink_is_slow_and_no_other(output):
    line = re.search(r"^slow links .*: (.*)$", output, re.M).group(1)
    assert re.findall(r"(\d)-(\d)", line) == [("0", "2"), ("0", "3"), ("1", "2"), ("1", "3")]


def test_the_rotation_alternates_racks_and_crossings(output):
    assert "  step 0 intra: (0 1) (2 3)" in output
    assert "  step 1 cross: (0 2) (1 3)" in output
