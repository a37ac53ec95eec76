"""`hvdx topology --probe` on an emulated 2 x 2 cluster finds what was built: two racks
joined by a slow uplink, the same racks as the labels, and every cross-rack link slow;
it prints the HVDX_RACK and HVDX_LINK_RATES that give hvdx that cluster elsewhere."""

import re
import subprocess
import sys

import pytest

from cluster_helpers import NIC, UPLINK, child_env
from test_cluster_mpi import _mpi_skip_reason
from hvdx.cluster import parse_rate
from hvdx.strategies.dssync.spec import parse_link_rates

pytestmark = [pytest.mark.skipif(_mpi_skip_reason() is not None,
                                 reason=str(_mpi_skip_reason())), pytest.mark.dssync]


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


def test_the_settings_lines_give_its_racks_and_its_configured_rates(output):
    hosts = re.findall(r"^  host (\d) \((h\d); ranks (\d)\): HVDX_RACK=(\d)$", output, re.M)
    assert hosts == [("0", "h0", "0", "0"), ("1", "h1", "1", "0"), ("2", "h2", "2", "1"),
                     ("3", "h3", "3", "1")], output
    value = re.search(r"^  every host: HVDX_LINK_RATES=(\S+) \(as read from "
                      r"HVDX_CLUSTER_LINK_RATES; the probe measured \S+\)$", output, re.M)
    assert value, output
    assert parse_link_rates(value.group(1)) == (parse_rate(NIC), parse_rate(UPLINK))
