"""`hvdx topology`: bad flags give one line naming the flag; the report shows hosts,
racks, every measured link in tc's units, the slow links and the rotation."""

import numpy as np
import pytest

from hvdx.cli import main
from hvdx.core.bandwidth import measured_topology
from hvdx.core.dssync_schedule import RotationSchedule
from hvdx.topology_cli import TopologyReport, render

MBIT = 1e6 / 8


def report(matrix, hosts, racks=None, cross_ranks=1):
    measured = measured_topology(matrix, hosts, racks)
    schedule = RotationSchedule(measured.topology, cross_ranks=cross_ranks,
                                places=measured.places)
    return TopologyReport(measured, "probe" if racks is None else "HVDX_RACK", schedule,
                          np.asarray(matrix, dtype=float), 4 * 2**20, 1.25)


def two_racks(h0=1000 * MBIT):
    m = np.full((4, 4), 48 * MBIT)
    m[0, 1] = m[1, 0] = m[2, 3] = m[3, 2] = 941 * MBIT
    m[0, :] = np.minimum(m[0, :], h0)
    m[:, 0] = np.minimum(m[:, 0], h0)
    np.fill_diagonal(m, 0)
    return m


@pytest.mark.parametrize("argv, flag", [
    (["--probe-bytes", "4mbit"], "--probe-bytes='4mbit'"),
    (["--probe-bytes", "0"], "--probe-bytes='0'"),
    (["--intra-phases", "zero"], "--intra-phases='zero'"),
    (["--cross-ranks", "0"], "--cross-ranks='0'"),
    (["--racks", "2", "--uplink", "100"], "uplink='100'"),
])
def test_a_bad_flag_is_one_error_line_naming_it(capsys, argv, flag):
    assert main(["topology"] + argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hvdx topology: error: ") and flag in err[0]


def test_the_report_shows_racks_from_the_probe_the_matrix_and_slow_links():
    text = render(report(two_racks(), hosts=[0, 1, 2, 3]))
    assert "4 ranks on 4 hosts (shared-memory split), 2 racks (from probe)" in text
    assert "racks: rack 0: ranks 0 1; rack 1: ranks 2 3" in text
    assert "    0       - 941mbit  48mbit  48mbit" in text
    assert "slow links (below 0.5 x the fastest): 0-2 (48mbit), 0-3 (48mbit), " \
           "1-2 (48mbit), 1-3 (48mbit)" in text
    assert "cost model suggests DSSync(" in text
    assert "  step 0 intra: (0 1) (2 3)" in text
    assert "  step 1 cross: (0 2) (1) (3)" in text


def test_ranks_of_one_host_show_as_shared_memory():
    m = two_racks()
    m[0, 1] = m[1, 0] = np.nan
    text = render(report(m, hosts=[0, 0, 2, 3]))
    assert "4 ranks on 3 hosts" in text
    assert "    0       -     shm  48mbit  48mbit" in text


def test_a_slow_nic_moves_the_crossing_to_the_other_rank_of_its_rack():
    text = render(report(two_racks(h0=10 * MBIT), hosts=[0, 1, 2, 3], racks=[0, 0, 1, 1]))
    assert "2 racks (from HVDX_RACK)" in text
    assert "  step 1 cross: (0) (1 2) (3)" in text
    assert "crossing order changed by the probe" in text


def test_with_labels_the_probes_own_racks_are_shown_against_them():
    measured = measured_topology(two_racks(), [0, 1, 2, 3], racks=["a", "a", "b", "b"])
    text = render(TopologyReport(
        measured, "HVDX_CLUSTER_RACK", RotationSchedule(measured.topology), two_racks(),
        2**20, 0.5, probe_racks=((0, 1), (2, 3))))
    assert "racks from the probe: rack 0: ranks 0 1; rack 1: ranks 2 3 (agree with the " \
           "labels)" in text
