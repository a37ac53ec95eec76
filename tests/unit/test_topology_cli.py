"""`hvdx topology`: bad flags give one line naming the flag; the report shows hosts,
racks, every measured link in tc's units, the slow links and the rotation, then the
HVDX_RACK and HVDX_LINK_RATES that rebuild that topology; --json holds the same figures."""

import json
import re

import numpy as np
import pytest

from hvdx.cli import main
from hvdx.core.bandwidth import MeasuredTopology, measured_topology
from hvdx.core.topology import Topology
from hvdx.core.units import format_rate
from hvdx.strategies.dssync.core_schedule import RotationSchedule
from hvdx.strategies.dssync.spec import parse_link_rates
from hvdx.topology_cli import TopologyReport, _exact_rate, figures, render

pytestmark = [pytest.mark.dssync]

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


def settings_lines(text):
    """``(host, ranks, HVDX_RACK)`` per host line, and the HVDX_LINK_RATES line."""
    hosts = [(int(m[1]), [int(r) for r in m[2].split()], m[3]) for m in re.finditer(
        r"^  host (\d+) \((?:[^;]*; )?ranks ([\d ]+)\): HVDX_RACK=(\S+)$", text, re.M)]
    rates = re.search(r"^  (?:every host: )?HVDX_LINK_RATES.*$", text, re.M)
    return hosts, rates.group(0) if rates else None


@pytest.mark.parametrize("hosts, racks", [
    ([0, 1, 2, 3], None),                       # racks from the probe
    ([0, 0, 2, 3], None),                       # two ranks on one host
    ([0, 1, 2, 3], ["b", "b", "a", "a"]),       # labels, renumbered
])
def test_the_hvdx_rack_lines_rebuild_the_same_racks(hosts, racks):
    m = two_racks()
    if hosts[1] == hosts[0]:
        m[0, 1] = m[1, 0] = np.nan
    r = report(m, hosts=hosts, racks=racks)
    lines, _ = settings_lines(render(r))
    assert [h for h, _, _ in lines] == list(range(r.measured.topology.n_hosts))
    labels = [None] * len(hosts)
    for _, ranks, value in lines:
        for rank in ranks:
            labels[rank] = value                # what each rank's HVDX_RACK would be
    assert Topology.from_ranks(hosts, labels) == r.measured.topology
    assert figures(r)["settings"]["HVDX_RACK"] == [value for _, _, value in lines]


def test_the_probes_link_rates_line_parses_back_to_the_medians_shown():
    r = report(two_racks(), hosts=[0, 1, 2, 3])
    text = render(r)
    _, line = settings_lines(text)
    value = re.match(r"  every host: HVDX_LINK_RATES=(\S+) \(the probe's medians", line)[1]
    nic, uplink = re.search(r"median rates: (\S+) inside a rack, (\S+) across", text).groups()
    assert parse_link_rates(value) == parse_link_rates(f"{nic},{uplink}") \
        == (941_000_000, 48_000_000)
    s = figures(r)["settings"]
    assert (s["HVDX_LINK_RATES"], s["link_rates_source"]) == (value, "probe")
    assert tuple(s["link_rates_bps"]) == parse_link_rates(value)


@pytest.mark.parametrize("rates", [(10**9, 10**8), (25 * 10**9, 1_230_000_000),
                                   (1_234_567_891, 99_999_999), (290_000_000, 8_000)])
def test_rates_read_from_the_environment_are_printed_to_parse_back_exactly(rates):
    measured = measured_topology(two_racks(), [0, 1, 2, 3], racks=[0, 0, 1, 1])
    r = TopologyReport(measured, "HVDX_CLUSTER_RACK", RotationSchedule(measured.topology),
                       environment_rates=("HVDX_CLUSTER_LINK_RATES", rates))
    _, line = settings_lines(render(r))
    value = re.match(r"  every host: HVDX_LINK_RATES=(\S+) \(as read from "
                     r"HVDX_CLUSTER_LINK_RATES\)$", line)[1]
    assert parse_link_rates(value) == rates


def test_printed_rates_parse_back_exactly_across_the_range():
    rng = np.random.default_rng(0)
    shown = [int(float(f"{x:.3g}")) for x in 10 ** rng.uniform(4, 11.5, 2000)]
    raw = [int(x) for x in 10 ** rng.uniform(4, 11.5, 2000)]
    for bps in shown + raw:
        assert parse_link_rates(f"{_exact_rate(bps)},{_exact_rate(bps)}") == (bps, bps)


def test_link_rates_are_not_needed_with_one_rack_and_unknown_without_a_probe():
    one = Topology.from_ranks([0, 1], [0, 0])
    r = TopologyReport(MeasuredTopology(one, one.positions_in_rack(), ()), "HVDX_RACK",
                       RotationSchedule(one))
    assert settings_lines(render(r))[1] == "  HVDX_LINK_RATES: not needed with one rack"
    two = Topology.from_ranks([0, 1, 2, 3], [0, 0, 1, 1])
    r = TopologyReport(MeasuredTopology(two, two.positions_in_rack(), ()), "HVDX_RACK",
                       RotationSchedule(two))
    assert settings_lines(render(r))[1] == "  HVDX_LINK_RATES: not known; --probe measures it"
    assert figures(r)["settings"]["HVDX_LINK_RATES"] is None


def test_json_holds_the_figures_of_the_text():
    r = report(two_racks(h0=10 * MBIT), hosts=[0, 1, 2, 3], racks=[0, 0, 1, 1])
    text, f = render(r), json.loads(json.dumps(figures(r)))
    assert f"{f['ranks']} ranks on {len(f['hosts'])} hosts" in text
    assert "racks: " + "; ".join(f"rack {i}: ranks {' '.join(map(str, g))}"
                                 for i, g in enumerate(f["racks"])) in text
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("bandwidth from row"))
    rows = [line.split()[1:] for line in lines[start + 2:start + 2 + f["ranks"]]]
    assert rows == [["-" if v is None else format_rate(float(f"{v:.3g}")) for v in row]
                    for row in f["probe"]["bps"]]
    assert "slow links (below 0.5 x the fastest): " + ", ".join(
        f"{i}-{j} ({format_rate(float(f'{v:.3g}'))})" for i, j, v in
        f["probe"]["slow_links"]) in text
    k, c = f["probe"]["suggested"]["intra_phases"], f["probe"]["suggested"]["cross_ranks"]
    assert f"suggests DSSync(intra_phases={k}, cross_ranks={c})" in text
    rotation = f["rotation"]
    assert f"DS-Sync rotation (intra_phases={rotation['intra_phases']}, cross_ranks=" \
           f"{rotation['cross_ranks']}), period {rotation['period']}:" in text
    for step in rotation["steps"]:
        groups = " ".join("(" + " ".join(map(str, g)) + ")" for g in step["groups"])
        assert f"  step {step['step']} {step['kind']:>5}: {groups}" in text
    assert rotation["places_changed_by_probe"] and "crossing order changed" in text


def test_json_marks_ranks_of_one_host_as_not_measured():
    m = two_racks()
    m[0, 1] = m[1, 0] = np.nan
    bps = figures(report(m, hosts=[0, 0, 2, 3]))["probe"]["bps"]
    assert bps[0][0] is None and bps[0][1] is None and bps[1][0] is None
    assert bps[0][2] == pytest.approx(48e6)
