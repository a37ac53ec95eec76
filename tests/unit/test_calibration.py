"""The calibrated cost model: measured round times, MPICH's allreduce round by round, and
the calibration job's pairs (hvdx.core.calibration, hvdx.core.cost_model,
hvdx.mpi.calibration_pairs.pair_sets). Expected values are written out here, not computed by the
code under test."""

import json
import re

import numpy as np

import pytest

from hvdx.core.calibration import Calibration
from hvdx.core.cost_model import Cluster, Workload, predict

pytestmark = [pytest.mark.topk, pytest.mark.dssync, pytest.mark.decentralized, pytest.mark.stanza]

MB = 1e6
#: One flow: 10 ms + 1 ms per 100 KB; two flows on a link: 10 ms + 1.6 ms per 100 KB.
LINEAR = {"uplink": {1: [(0, 0.010), (1e6, 0.020), (4e6, 0.050)],
                     2: [(0, 0.010), (1e6, 0.026), (4e6, 0.074)]},
          "nic": {1: [(1e3, 0.002), (1e6, 0.004)]}}


def cal(**kwargs):
    return Calibration(tables=LINEAR, **kwargs)


def test_a_round_is_interpolated_linearly_in_bytes_between_measured_sizes():
    assert cal().round_s("uplink", 1, 0.5e6) == pytest.approx(0.015)
    assert cal().round_s("uplink", 1, 2.5e6) == pytest.approx(0.035)


def test_beyond_the_largest_size_the_last_slope_continues_and_below_the_smallest_it_is_flat():
    assert cal().round_s("uplink", 1, 10e6) == pytest.approx(0.050 + 6 * 0.010)
    assert cal().round_s("nic", 1, 10) == pytest.approx(0.002)


def test_flow_counts_between_two_measured_ones_are_interpolated():
    # 1.5 flows of 1 MB: halfway between 20 ms and 26 ms.
    assert cal().round_s("uplink", 1.5, 1e6) == pytest.approx(0.023)


def test_more_flows_than_measured_share_the_link_evenly():
    # 4 flows of 1 MB move 4 MB at the rate 2 flows reached: 2 flows of 2 MB.
    assert cal().round_s("uplink", 4, 1e6) == pytest.approx(0.026 + (0.074 - 0.026) / 3)


def test_a_link_class_not_measured_is_named():
    with pytest.raises(KeyError, match="intra-host"):
        cal().round_s("intra-host", 1, 1e6)


def test_it_round_trips_through_json(tmp_path):
    path = str(tmp_path / "c.json")
    cal(source="here").save(path)
    assert Calibration.load(path) == cal(source="here")
    assert json.load(open(path))["allreduce"] == "recursive_halving"


@pytest.mark.parametrize("tables, word", [
    ({"wan": {1: [(0, 1.0)]}}, "wan"),
    ({"uplink": {1: [(0, -1.0)]}}, "seconds > 0"),
    ({}, "no link class"),
])
def test_bad_tables_are_refused_naming_what_is_wrong(tables, word):
    with pytest.raises(ValueError, match=word):
        Calibration(tables=tables)


def test_a_file_that_is_not_a_calibration_is_refused_naming_it(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="x.json.*hvdx plan --calibrate"):
        Calibration.load(str(path))
    with pytest.raises(ValueError, match="allreduce='tree'"):
        Calibration(tables=LINEAR, allreduce="tree")


# --- MPICH's allreduce, round by round ---------------------------------------------

def rounds(cluster, nbytes):
    from hvdx.core.cost_model import _recursive_halving

    everyone = np.arange(cluster.ranks)[None, :]
    out = []
    for t in _recursive_halving("allreduce", everyone, nbytes):
        (src, dst, size), = t.flows
        out.append((sorted(zip(src.tolist(), dst.tolist())), size))
    return out


def test_four_ranks_halve_at_distance_one_then_two_and_gather_back_in_reverse():
    c = Cluster(racks=2, hosts_per_rack=2, nic_bps="1gbit", uplink_bps="100mbit")
    near = [(0, 1), (1, 0), (2, 3), (3, 2)]
    far = [(0, 2), (1, 3), (2, 0), (3, 1)]
    assert rounds(c, 8 * MB) == [(near, 4 * MB), (far, 2 * MB), (far, 2 * MB), (near, 4 * MB)]


def test_three_ranks_fold_one_in_then_halve_then_send_the_result_back():
    c = Cluster(racks=1, hosts_per_rack=3, nic_bps="1gbit", uplink_bps="1gbit")
    assert rounds(c, 8 * MB) == [([(0, 1)], 8 * MB), ([(1, 2), (2, 1)], 4 * MB),
                                 ([(1, 2), (2, 1)], 4 * MB), ([(1, 0)], 8 * MB)]


def test_short_messages_double_the_whole_buffer_each_round():
    c = Cluster(racks=1, hosts_per_rack=4, nic_bps="1gbit", uplink_bps="1gbit")
    assert [size for _, size in rounds(c, 2048)] == [2048, 2048]


def test_a_calibrated_horovod_step_is_the_sum_of_its_measured_rounds():
    c = Cluster(racks=2, hosts_per_rack=2, nic_bps="1gbit", uplink_bps="100mbit",
                calibration=cal())
    w = Workload(conv_params=2_000_000, fc_params=0, compute_s=0.1)  # 8 MB of float32
    # Horovod's negotiation first: 8 bytes doubled at distance 1 (NIC table's smallest
    # round, 2 ms) and at distance 2 (two flows per uplink, 10 ms + 8 bytes' worth). Then the rounds:
    # 4 MB between the hosts of a rack (one flow per NIC), 2 MB across with two flows
    # on each uplink, each twice (reduce-scatter, allgather); from LINEAR:
    nic_4mb = 0.004 + (4e6 - 1e6) * (0.004 - 0.002) / (1e6 - 1e3)
    uplink_2mb_two_flows = 0.026 + (0.074 - 0.026) / 3
    expected = 0.002 + (0.010 + 8 * 0.016 / 1e6) + 2 * nic_4mb + 2 * uplink_2mb_two_flows
    assert predict("horovod", c, w).comm_s == pytest.approx(expected)


def test_without_a_calibration_horovod_is_still_priced_as_a_ring():
    c = Cluster(racks=2, hosts_per_rack=2, nic_bps="1gbit", uplink_bps="100mbit",
                latency_s=0)
    w = Workload(conv_params=2_000_000, fc_params=0, compute_s=0.1)
    # A rack-ordered ring: 2(n-1)/n * 8 MB through each uplink at 100 Mbit.
    assert predict("horovod", c, w).comm_s == pytest.approx(1.5 * 8 * MB * 8 / 100e6)


def test_a_calibrated_ring_calibration_keeps_the_ring():
    c = Cluster(racks=1, hosts_per_rack=2, nic_bps="1gbit", uplink_bps="1gbit",
                calibration=cal(allreduce="ring"))
    w = Workload(conv_params=2_000_000, fc_params=0, compute_s=0.1)
    # Two ranks: the negotiation's 2 rounds of 4 bytes (2 ms each), then 2 rounds of
    # 4 MB, one flow per NIC each way.
    nic_4mb = 0.004 + (4e6 - 1e6) * (0.004 - 0.002) / (1e6 - 1e3)
    assert predict("horovod", c, w).comm_s == pytest.approx(2 * 0.002 + 2 * nic_4mb)


# --- the calibration job's pairs -------------------------------------------------------

def test_two_racks_of_two_hosts_pair_across_with_one_and_two_flows_and_inside_each_rack():
    from hvdx.mpi.calibration_pairs import pair_sets

    sets = pair_sets([0, 1, 2, 3], ["a", "a", "b", "b"])
    assert sets == [("uplink", 1, [(0, 2)]), ("uplink", 2, [(0, 2), (1, 3)]),
                    ("nic", 1, [(0, 1), (2, 3)])]


def test_a_flat_cluster_measures_nics_only_and_two_ranks_per_host_add_shared_nics():
    from hvdx.mpi.calibration_pairs import pair_sets

    assert pair_sets([0, 1, 2, 3], ["r"] * 4) == [("nic", 1, [(0, 1), (2, 3)])]
    # Ranks 0,1 on host 0 and 2,3 on host 2 (host labels are first ranks).
    assert pair_sets([0, 0, 2, 2], ["r"] * 4) == [
        ("nic", 1, [(0, 2)]), ("nic", 2, [(0, 2), (1, 3)]),
        ("intra-host", 1, [(0, 1), (2, 3)])]


# --- hvdx plan --calibration ------------------------------------------------------------

def plan_figures(*argv):
    import argparse

    from hvdx import plan
    from hvdx.planning import figures

    parser = argparse.ArgumentParser()
    plan.add_arguments(parser)
    return figures.report(parser.parse_args(list(argv)))


def test_plan_prices_from_the_calibration_file_and_says_where_it_was_measured(tmp_path):
    path = str(tmp_path / "c.json")
    cal(source="4 ranks here").save(path)
    flags = ["--preset", "emulated", "--params", "2e6", "--fc-fraction", "0",
             "--compute-ms", "100"]
    with_file = plan_figures(*flags, "--calibration", path)
    without = plan_figures(*flags)
    assert with_file["cluster"]["calibration"] == "4 ranks here"
    assert without["cluster"]["calibration"] is None
    horovod = next(r for r in with_file["strategies"] if r["strategy"] == "horovod")
    nic_4mb = 0.004 + (4e6 - 1e6) * (0.004 - 0.002) / (1e6 - 1e3)
    negotiation = 0.002 + (0.010 + 8 * 0.016 / 1e6)
    assert horovod["comm_ms"] == pytest.approx(
        1e3 * (negotiation + 2 * nic_4mb + 2 * (0.026 + 0.048 / 3)))


def test_plan_refuses_a_sweep_with_a_calibration_and_names_a_bad_file(tmp_path):
    path = str(tmp_path / "c.json")
    cal().save(path)
    with pytest.raises(ValueError, match="--sweep=.*--calibration"):
        plan_figures("--preset", "emulated", "--calibration", path, "--sweep")
    with pytest.raises(ValueError, match="--calibration=.*nothing.json"):
        plan_figures("--calibration", str(tmp_path / "nothing.json"))


# --- allreduces timed as a whole ----------------------------------------------------------

def test_a_timed_allreduce_on_the_same_groups_replaces_the_sum_of_rounds():
    timed = Calibration(tables=LINEAR, allreduce_times={
        "world": [(1e3, 0.005), (8e6, 0.805)], "rack": [(1e3, 0.001), (8e6, 0.081)]})
    c = Cluster(racks=2, hosts_per_rack=2, nic_bps="1gbit", uplink_bps="100mbit",
                calibration=timed)
    w = Workload(conv_params=2_000_000, fc_params=0, compute_s=0.1)
    # The negotiation (8 bytes: below the smallest size, 5 ms) and the 8 MB allreduce.
    assert predict("horovod", c, w).comm_s == pytest.approx(0.005 + 0.805)
    # DS-Sync's intra-rack groups are the timed "rack" groups; its crossing groups were
    # not timed here, so they are laid out in rounds: both crossing groups at once, two
    # flows per uplink, 4 MB each way, then back.
    p = predict("dssync", c, w, intra_phases=1)
    intra = next(ph for ph in p.phases if ph.name.startswith("intra-rack group allreduce"))
    assert intra.bottleneck == "measured" and intra.seconds == pytest.approx(0.081)
    crossing = [ph for ph in p.phases if ph.name.startswith("cross-rack group allreduce")]
    assert [ph.seconds for ph in crossing] == pytest.approx([0.074, 0.074])


def test_an_op_on_smaller_process_sets_also_pays_horovods_cycle_over_all_ranks():
    timed = Calibration(tables=LINEAR, allreduce_times={
        "world": [(1e3, 0.005), (8e6, 0.805)], "rack": [(1e3, 0.001), (8e6, 0.081)],
        "cross": [(1e3, 0.002), (8e6, 0.402)]})
    c = Cluster(racks=2, hosts_per_rack=2, nic_bps="1gbit", uplink_bps="100mbit",
                calibration=timed)
    w = Workload(conv_params=2_000_000, fc_params=0, compute_s=0.1)  # 8 MB
    # A period of two steps: the racks average, then the crossing pairs. Each step's op
    # is negotiated in its sets (8 bytes, below the smallest size: rack 1 ms, cross 2 ms)
    # and, in each background cycle, twice over all ranks (world: 5 ms each).
    p = predict("dssync", c, w, intra_phases=1)
    negotiation = sum(ph.weight * ph.seconds for ph in p.phases if "Horovod" in ph.name)
    assert negotiation == pytest.approx(0.5 * 0.001 + 0.5 * 0.002 + 2 * 0.005)
    assert p.comm_s == pytest.approx(negotiation + 0.5 * 0.081 + 0.5 * 0.402)
    # One rack: DS-Sync's group is everyone, Horovod's global set: Horovod's own step.
    flat = Cluster(racks=1, hosts_per_rack=4, nic_bps="1gbit", uplink_bps="1gbit",
                   calibration=timed)
    assert predict("dssync", flat, w).comm_s == pytest.approx(0.005 + 0.805)
    assert predict("horovod", flat, w).comm_s == pytest.approx(0.005 + 0.805)


def test_dssyncs_averages_are_priced_as_horovod_timed_them_on_its_sets():
    # Horovod's average on the rack sets timed at 30 ms + 15 ms per MB (negotiation and
    # background cycles inside); MPI's allreduce on the same ranks at 81 ms for 8 MB.
    timed = Calibration(tables=LINEAR, allreduce_times={
        "world": [(1e3, 0.005), (8e6, 0.805)], "rack": [(1e3, 0.001), (8e6, 0.081)],
        "cross": [(1e3, 0.002), (8e6, 0.402)]},
        set_allreduce_times={"rack": [(0, 0.030), (8e6, 0.150)]})
    c = Cluster(racks=2, hosts_per_rack=2, nic_bps="1gbit", uplink_bps="100mbit",
                calibration=timed)
    w = Workload(conv_params=2_000_000, fc_params=0, compute_s=0.1)  # 8 MB
    p = predict("dssync", c, w, intra_phases=1)
    # The intra-rack step is the timed average alone (150 ms); the crossing step, whose
    # sets were not timed through Horovod, is MPI's allreduce (402 ms) plus its set's
    # negotiation (2 ms) and two collectives over all ranks (5 ms each).
    intra = [ph for ph in p.phases if ph.name.startswith("intra-rack")]
    assert [(ph.bottleneck, ph.seconds) for ph in intra] == [("measured", pytest.approx(0.150))]
    assert p.comm_s == pytest.approx(0.5 * 0.150 + 0.5 * (0.402 + 0.002 + 2 * 0.005))
    # Horovod's own step is not on process sets: still MPI's allreduce and negotiation.
    assert predict("horovod", c, w).comm_s == pytest.approx(0.005 + 0.805)
    # One rack: DS-Sync's group is everyone, timed through Horovod as "world".
    flat = Cluster(racks=1, hosts_per_rack=4, nic_bps="1gbit", uplink_bps="1gbit",
                   calibration=Calibration(tables=LINEAR, allreduce_times={
                       "world": [(1e3, 0.005), (8e6, 0.805)]},
                       set_allreduce_times={"world": [(0, 0.100), (8e6, 0.900)]}))
    assert predict("dssync", flat, w).comm_s == pytest.approx(0.900)
    assert predict("horovod", flat, w).comm_s == pytest.approx(0.005 + 0.805)


def test_horovods_set_averages_round_trip_and_bad_groups_are_refused(tmp_path):
    timed = Calibration(tables=LINEAR, set_allreduce_times={"rack": [(1e3, 0.03)]})
    path = str(tmp_path / "c.json")
    timed.save(path)
    assert Calibration.load(path).set_allreduce_s("rack", 10) == pytest.approx(0.03)
    assert Calibration.load(path).set_allreduce_s("world", 10) is None
    assert Calibration(tables=LINEAR).set_allreduce_times == {}
    with pytest.raises(ValueError, match="set_allreduce_times\\['tree'\\]"):
        Calibration(tables=LINEAR, set_allreduce_times={"tree": [(1e3, 0.002)]})


# --- the part of Horovod's averages that a local step already holds -------------------

# Horovod's averages timed on the 2x2 cluster and with every rank on one host: 150 KB
# took 74 ms on all ranks on the cluster and 50 on one host, 24 and 25 on the rack sets.
BEYOND = dict(set_allreduce_times={"world": [(1e3, 0.034), (150e3, 0.074), (1e6, 0.180)],
                                   "rack": [(1e3, 0.025), (150e3, 0.024), (8e6, 0.150)]},
              local_set_allreduce_times={"world": [(1e3, 0.029), (150e3, 0.050),
                                                   (1e6, 0.060)],
                                         "rack": [(1e3, 0.023), (150e3, 0.025),
                                                  (8e6, 0.030)]})
MPI_TIMES = {"world": [(1e3, 0.005), (8e6, 0.805)], "rack": [(1e3, 0.001), (8e6, 0.081)],
             "cross": [(1e3, 0.002), (8e6, 0.402)]}


def test_what_the_cluster_adds_to_one_hosts_average_is_their_difference_never_below_zero():
    timed = Calibration(tables=LINEAR, **BEYOND)
    assert timed.set_allreduce_beyond_local_s("world", 150e3) == pytest.approx(0.024)
    # Halfway between two timed sizes on both: (127 - 55) ms halfway from 150 KB to 1 MB.
    assert timed.set_allreduce_beyond_local_s("world", 575e3) == \
        pytest.approx((0.074 + 0.180) / 2 - (0.050 + 0.060) / 2)
    assert timed.set_allreduce_beyond_local_s("rack", 150e3) == 0.0  # 24 ms < 25 ms
    # Beyond the sizes both timed, or a group one of them did not time: not known.
    assert timed.set_allreduce_beyond_local_s("world", 2e6) is None
    assert timed.set_allreduce_beyond_local_s("cross", 1e3) is None
    alone = Calibration(tables=LINEAR, set_allreduce_times=BEYOND["set_allreduce_times"])
    assert alone.set_allreduce_beyond_local_s("world", 150e3) is None


def test_the_local_averages_round_trip_and_bad_groups_are_refused(tmp_path):
    path = str(tmp_path / "c.json")
    Calibration(tables=LINEAR, **BEYOND).save(path)
    assert Calibration.load(path) == Calibration(tables=LINEAR, **BEYOND)
    with pytest.raises(ValueError, match="local_set_allreduce_times\\['tree'\\]"):
        Calibration(tables=LINEAR, local_set_allreduce_times={"tree": [(1e3, 0.002)]})


def test_a_plan_on_a_local_step_adds_only_what_the_cluster_adds_to_horovods_averages():
    c = Cluster(racks=2, hosts_per_rack=2, nic_bps="1gbit", uplink_bps="100mbit",
                calibration=Calibration(tables=LINEAR, allreduce_times=MPI_TIMES, **BEYOND))
    small = Workload(conv_params=37_500, fc_params=0, compute_s=0.007)  # 150 KB
    # Horovod: the local step (47 ms) holds the one-host average (50 ms); the cluster
    # adds 74 - 50 ms.
    assert predict("horovod", c, small, local_step_s=0.047).step_s == \
        pytest.approx(0.047 + 0.024)
    # DS-Sync, racks then crossings: the cluster adds nothing to the rack average (24 ms
    # against 25 on one host); the crossing sets, not timed through Horovod, are MPI's
    # allreduce plus their set's negotiation (2 ms) and two collectives on all ranks.
    assert predict("dssync", c, small, local_step_s=0.037, intra_phases=1).comm_s == \
        pytest.approx(0.5 * 0.0 + 0.5 * (_mpi_cross(150e3) + 0.002 + 2 * 0.005))


def _mpi_cross(nbytes):
    (b0, t0), (b1, t1) = MPI_TIMES["cross"]
    return t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0)


def test_without_a_local_step_or_beyond_the_timed_sizes_the_averages_are_priced_whole():
    c = Cluster(racks=2, hosts_per_rack=2, nic_bps="1gbit", uplink_bps="100mbit",
                calibration=Calibration(tables=LINEAR, allreduce_times=MPI_TIMES, **BEYOND))
    small = Workload(conv_params=37_500, fc_params=0, compute_s=0.007)
    world_mpi = 0.005 + (0.805 - 0.005) * (150e3 - 1e3) / (8e6 - 1e3)
    # No local step holds the one-host part: Horovod's negotiation and MPI's allreduce.
    assert predict("horovod", c, small).comm_s == pytest.approx(0.005 + world_mpi)
    # DS-Sync's rack average as Horovod timed it on the cluster, whole.
    intra = [ph for ph in predict("dssync", c, small, intra_phases=1).phases
             if ph.name.startswith("intra-rack")]
    assert [ph.seconds for ph in intra] == [pytest.approx(0.024)]
    # 5.5 MB is beyond the sizes Horovod's average on all ranks was timed at.
    big = Workload(conv_params=1_371_000, fc_params=0, compute_s=0.1)
    world_big = 0.005 + (0.805 - 0.005) * (5.484e6 - 1e3) / (8e6 - 1e3)
    assert predict("horovod", c, big, local_step_s=0.1).comm_s == \
        pytest.approx(0.005 + world_big)


def test_timed_allreduces_round_trip_and_bad_groups_are_refused(tmp_path):
    timed = Calibration(tables=LINEAR, allreduce_times={"cross": [(1e3, 0.002)]})
    path = str(tmp_path / "c.json")
    timed.save(path)
    assert Calibration.load(path).allreduce_s("cross", 10) == pytest.approx(0.002)
    assert Calibration.load(path).allreduce_s("world", 10) is None
    with pytest.raises(ValueError, match="allreduce_times\\['tree'\\]"):
        Calibration(tables=LINEAR, allreduce_times={"tree": [(1e3, 0.002)]})


# --- shifts --------------------------------------------------------------------------------

def test_shift_rings_alternate_racks_over_the_uplink_and_go_round_each_racks_hosts():
    from hvdx.mpi.calibration_pairs import shift_sets

    assert shift_sets([0, 1, 2, 3], ["a", "a", "b", "b"]) == [
        ("uplink", 2, [(0, 2), (2, 1), (1, 3), (3, 0)])]
    assert shift_sets([0, 1, 2, 3], ["r"] * 4) == [
        ("nic", 1, [(0, 1), (1, 2), (2, 3), (3, 0)])]


def test_a_shift_is_priced_from_the_timed_shifts_and_a_collectives_swap_from_the_swaps():
    shifted = Calibration(tables=LINEAR, shift_tables={"nic": {1: [(0, 0.001), (1e6, 0.009)]}})
    c = Cluster(racks=1, hosts_per_rack=4, nic_bps="1gbit", uplink_bps="1gbit",
                calibration=shifted)
    w = Workload(conv_params=250_000, fc_params=0, compute_s=0.1)  # 1 MB of float32
    # The one-peer graph on 4 ranks: i -> i+1, then i -> i+2 (a swap: 0<->2, 1<->3). hvdx's
    # exchange posts its sends first, and its swap moves as a shift: both from the shifts.
    p = predict("decentralized", c, w, graph="one-peer-exp")
    assert [ph.seconds for ph in p.phases] == pytest.approx([0.009, 0.009])
    # MPI's allreduce on two hosts swaps halves as its rounds: from the timed swaps,
    # 0.5 MB each way per round, 0.002 + (0.004 - 0.002) * (0.5e6 - 1e3) / (1e6 - 1e3).
    two = Cluster(racks=1, hosts_per_rack=2, nic_bps="1gbit", uplink_bps="1gbit",
                  calibration=shifted)
    swap_half = 0.002 + 0.002 * (0.5e6 - 1e3) / (1e6 - 1e3)
    assert [ph.seconds for ph in predict("horovod", two, w).phases
            if "negotiation" not in ph.name] == pytest.approx([swap_half, swap_half])


def test_topk_prices_its_allgather_and_alltoall_as_the_calibration_timed_them():
    timed = Calibration(tables=LINEAR, allgather_times=[(0, 0.001), (1e5, 0.011)],
                        alltoall_times=[(0, 0.002), (1e5, 0.012)])
    c = Cluster(racks=1, hosts_per_rack=4, nic_bps="1gbit", uplink_bps="1gbit",
                calibration=timed)
    w = Workload(conv_params=1_000_000, fc_params=0, compute_s=0.1)
    # 1% of 1M parameters: 10,000 pairs of 8 bytes per rank up; 2% down, a quarter each.
    sharded = predict("topk", c, w, ratio=0.01, downlink_ratio=0.02, mode="sharded")
    assert [ph.seconds for ph in sharded.phases] == pytest.approx(
        [0.002 + 0.010 * 80_000 / 1e5, 0.001 + 0.010 * 40_000 / 1e5])
    assert all(ph.bottleneck == "measured" for ph in sharded.phases)
    gathered = predict("topk", c, w, ratio=0.01, mode="gathered")
    assert [ph.seconds for ph in gathered.phases] == pytest.approx([0.001 + 0.010 * 0.8])
    # Not timed: from the rounds, as before.
    untimed = Cluster(racks=1, hosts_per_rack=4, nic_bps="1gbit", uplink_bps="1gbit",
                      calibration=Calibration(tables=LINEAR))
    assert "measured" not in {ph.bottleneck for ph in
                              predict("topk", untimed, w, mode="sharded").phases}


def test_sharded_topk_takes_its_two_collectives_as_timed_one_after_the_other():
    # As dense as the uplink: 10 ms + 1 ms per 10 KB; twice as dense: 20 ms + 2 ms.
    step = {1: [(0, 0.010), (1e5, 0.020)], 2: [(0, 0.020), (1e5, 0.040)]}
    timed = Calibration(tables=LINEAR, allgather_times=[(0, 0.001), (1e5, 0.011)],
                        alltoall_times=[(0, 0.002), (1e5, 0.012)], sharded_topk_times=step)
    c = Cluster(racks=1, hosts_per_rack=4, nic_bps="1gbit", uplink_bps="1gbit",
                calibration=timed)
    w = Workload(conv_params=1_000_000, fc_params=0, compute_s=0.1)
    # 10,000 pairs of 8 bytes up per rank: 80 KB.
    for downlink, seconds in ((0.01, 0.010 + 0.010 * 0.8), (0.02, 0.020 + 0.020 * 0.8),
                              (0.015, (0.018 + 0.036) / 2)):  # halfway between the two
        plan = predict("topk", c, w, ratio=0.01, downlink_ratio=downlink, mode="sharded")
        assert [ph.seconds for ph in plan.phases] == pytest.approx([seconds])
        assert plan.phases[0].bottleneck == "measured"
        # Its bytes are the alltoall's and the allgather's: 3/4 of 80 KB up, 3/4 of the
        # downlink's pairs down.
        assert plan.bytes_per_rank == pytest.approx(0.75 * 80_000 + 0.75 * downlink *
                                                         8_000_000)
    # A downlink outside the timed ones: the two collectives' own times, added.
    dense = predict("topk", c, w, ratio=0.01, downlink_ratio=0.04, mode="sharded")
    assert [ph.seconds for ph in dense.phases] == pytest.approx(
        [0.002 + 0.010 * 0.8, 0.001 + 0.010 * 80_000 / 1e5 * 0.04 / 0.01 / 4])


def test_the_sharded_topk_times_survive_a_save_and_are_checked(tmp_path):
    path = str(tmp_path / "cal.json")
    Calibration(tables=LINEAR, sharded_topk_times={2: [(1e3, 0.004)], 1: [(1e3, 0.002)]}
                ).save(path)
    loaded = Calibration.load(path)
    assert loaded.sharded_topk_times == {1.0: [(1e3, 0.002)], 2.0: [(1e3, 0.004)]}
    assert loaded.sharded_topk_s(1e3, 1.5) == pytest.approx(0.003)
    assert loaded.sharded_topk_s(1e3, 3) is None
    assert Calibration(tables=LINEAR).sharded_topk_s(1e3, 1) is None
    for bad, word in (({0: [(1e3, 0.002)]}, "sharded_topk_times\\[0\\]: a key"),
                      ({"x": [(1e3, 0.002)]}, "sharded_topk_times\\['x'\\]: a key"),
                      ({1: [(1e3, -1.0)]}, "sharded_topk_times\\[1\\] must hold")):
        with pytest.raises(ValueError, match=word):
            Calibration(tables=LINEAR, sharded_topk_times=bad)


def test_the_sparse_collective_times_survive_a_save_and_are_checked(tmp_path):
    path = str(tmp_path / "cal.json")
    Calibration(tables=LINEAR, allgather_times=[(1e3, 0.002)]).save(path)
    loaded = Calibration.load(path)
    assert loaded.allgather_s(10) == pytest.approx(0.002)
    assert loaded.alltoall_s(10) is None
    with pytest.raises(ValueError, match="alltoall_times"):
        Calibration(tables=LINEAR, alltoall_times=[(1e3, 0.0)])


# --- one-way rounds and the strategy's local step ---------------------------------------

ONE_WAY = {"uplink": {1: [(0, 0.001), (1e6, 0.011)], 2: [(0, 0.001), (1e6, 0.021)]}}


def test_one_way_pairs_send_from_the_first_rank_of_each_swap_pair_and_skip_intra_host():
    from hvdx.mpi.calibration_pairs import oneway_sets

    assert oneway_sets([0, 1, 2, 3], ["a", "a", "b", "b"]) == [
        ("uplink", 1, [(0, 2)]), ("uplink", 2, [(0, 2), (1, 3)]),
        ("nic", 1, [(0, 1), (2, 3)])]
    assert oneway_sets([0, 0, 2, 2], ["r"] * 4) == [("nic", 1, [(0, 2)]),
                                                   ("nic", 2, [(0, 2), (1, 3)])]


def test_a_round_that_loads_a_link_one_way_is_priced_from_the_one_way_table():
    c = cal(oneway_tables=ONE_WAY)
    assert c.round_s("uplink", 2, 0.5e6, oneway=True) == pytest.approx(0.011)
    assert c.round_s("uplink", 2, 0.5e6, shift=True, oneway=True) == pytest.approx(0.011)
    # Not one way: the swaps; a class without one-way times: the swaps too.
    assert c.round_s("uplink", 2, 0.5e6) == pytest.approx(0.018)
    assert c.round_s("nic", 1, 1e6, oneway=True) == pytest.approx(0.004)


def test_one_way_tables_round_trip_through_json(tmp_path):
    path = str(tmp_path / "c.json")
    cal(oneway_tables=ONE_WAY).save(path)
    assert Calibration.load(path).oneway_tables == {
        "uplink": {1: [(0.0, 0.001), (1e6, 0.011)], 2: [(0.0, 0.001), (1e6, 0.021)]}}
    # A file written before one-way rounds were timed still loads, without them.
    data = json.load(open(path))
    del data["oneway_tables"]
    assert Calibration.from_dict(data).oneway_tables == {}


def test_stanzas_activations_cross_the_uplink_one_way_and_its_allreduce_both_ways():
    # 2 x 2 hosts, one FC worker (rank 3): conv workers 0 and 1 (rack a) send their
    # activations across the uplink, nothing comes back in that phase.
    one_way = Calibration(tables=LINEAR, oneway_tables=ONE_WAY)
    c = Cluster(racks=2, hosts_per_rack=2, nic_bps="1gbit", uplink_bps="100mbit",
                calibration=one_way)
    w = Workload(conv_params=1000, fc_params=1000, compute_s=0.1, batch_size=10,
                 activation_size=12_500)  # 500 KB of activations per conv worker
    phases = {ph.name: ph.seconds for ph in predict("stanza", c, w).phases}
    # Two flows of 0.5 MB one way: 1 ms + 0.5 * 20 ms, from ONE_WAY.
    assert phases["activations to FC workers"] == pytest.approx(0.011)
    assert phases["activation gradients to conv workers"] == pytest.approx(0.011)


def test_a_measured_local_step_replaces_the_compute_and_the_phases_are_added_whole():
    c = Cluster(racks=2, hosts_per_rack=2, nic_bps="1gbit", uplink_bps="100mbit",
                calibration=cal())
    w = Workload(conv_params=2_000_000, fc_params=0, compute_s=0.1)
    plain = predict("horovod", c, w)
    local = predict("horovod", c, w, local_step_s=0.25)
    assert local.compute_s == 0.25
    assert local.comm_s == plain.comm_s
    assert local.step_s == pytest.approx(0.25 + plain.comm_s)
    # Stanza's modelled compute (its head for every conv worker) is replaced too.
    s = Workload(conv_params=1000, fc_params=1000, compute_s=0.1, activation_size=10,
                 fc_compute_fraction=0.5)
    assert predict("stanza", c, s, local_step_s="40ms").compute_s == pytest.approx(0.040)


def test_the_wire_the_earlier_waves_send_during_the_local_wait_is_not_added_again():
    # Four ranks on two cores reach the exchange in two waves: the first wave's half of
    # the wire crosses while it waits for the second, as far as its wait goes.
    # Sharded TopK's step timed at 100 ms at every size: the whole wire, 100 ms.
    timed = cal(sharded_topk_times={1.0: [(0, 0.1), (1e9, 0.1)]})
    c = Cluster(racks=2, hosts_per_rack=2, nic_bps="1gbit", uplink_bps="100mbit",
                calibration=timed)
    w = Workload(conv_params=2_000_000, fc_params=0, compute_s=0.1)
    # (wait, cores, hidden): half the wire on two cores, three quarters on one.
    cases = [(0.0, 2, 0.0), (0.005, 2, 0.005), (0.2, 2, 0.05), (0.2, 1, 0.075),
             (0.2, 4, 0.0), (0.2, 8, 0.0)]
    for wait_s, cores, hidden in cases:
        p = predict("topk", c, w, local_step_s=0.25, local_wait_s=wait_s, local_cores=cores,
                    mode="sharded")
        assert p.comm_s == pytest.approx(0.1)  # the wire is priced whole, then hidden
        assert p.hidden_s == pytest.approx(hidden)
        assert p.step_s == pytest.approx(0.35 - hidden)
    # Combine-then-adapt already overlaps the wire with the step: max(), nothing hidden.
    cta = dict(graph="one-peer-exp", order="combine_then_adapt")
    overlapped = predict("decentralized", c, w, local_step_s=0.25, **cta)
    waited = predict("decentralized", c, w, local_step_s=0.25, local_wait_s=0.1,
                     local_cores=2, **cta)
    assert waited.hidden_s == 0.0 and waited.step_s == overlapped.step_s


@pytest.mark.parametrize("wait, step, cores, words", [
    ("10ms", None, 2, "local_wait_s='10ms' needs local_step_s"),
    (0.3, 0.25, 2, "local_wait_s=0.3 is longer than local_step_s=0.25"),
    (-0.01, 0.25, 2, "local_wait_s=-0.01"), ("soon", 0.25, 2, "local_wait_s='soon'"),
    (0.01, 0.25, None, "local_cores=None must be the number of cores"),
    (0.01, 0.25, 0, "local_cores=0 must be"), (0.01, 0.25, 1.5, "local_cores=1.5 must be")])
def test_a_bad_local_wait_is_refused_naming_it(wait, step, cores, words):
    c = Cluster(racks=1, hosts_per_rack=2, nic_bps="1gbit", uplink_bps="1gbit")
    w = Workload(conv_params=1000, fc_params=0, compute_s=0.1)
    with pytest.raises(ValueError, match=re.escape(words)):
        predict("topk", c, w, local_step_s=step, local_wait_s=wait, local_cores=cores)


@pytest.mark.parametrize("bad", [-1.0, "soon", float("nan")])
def test_a_bad_local_step_is_refused_naming_it(bad):
    c = Cluster(racks=1, hosts_per_rack=2, nic_bps="1gbit", uplink_bps="1gbit")
    w = Workload(conv_params=1000, fc_params=0, compute_s=0.1)
    with pytest.raises(ValueError, match="local_step_s"):
        predict("horovod", c, w, local_step_s=bad)


def test_plan_adds_the_phases_to_each_strategys_local_step_where_one_is_given(tmp_path):
    path = str(tmp_path / "c.json")
    cal().save(path)
    flags = ["--preset", "emulated", "--params", "2e6", "--fc-fraction", "0",
             "--compute-ms", "100", "--calibration", path]
    plain = {r["label"]: r for r in plan_figures(*flags)["strategies"]}
    local = {r["label"]: r for r in
             plan_figures(*flags, "--local-steps", "horovod=250ms, topk=0.04")["strategies"]}
    assert local.keys() == plain.keys()
    for label, row in local.items():
        assert row["comm_ms"] == pytest.approx(plain[label]["comm_ms"])
        if "cta" in label:
            continue  # combine-then-adapt overlaps: its step is not compute + comm
        compute = plain[label]["step_ms"] - plain[label]["comm_ms"]
        expected = {"horovod": 250.0, "topk": 40.0}.get(row["strategy"], compute)
        assert row["step_ms"] - row["comm_ms"] == pytest.approx(expected)


@pytest.mark.parametrize("text, word", [("horovod", "horovod"), ("ring=1ms", "ring"),
                                        ("topk=fast", "topk")])
def test_plan_refuses_a_local_step_that_is_not_a_strategy_and_a_time(text, word):
    with pytest.raises(ValueError, match=f"--local-steps.*{word}"):
        plan_figures("--preset", "emulated", "--local-steps", text)


def test_plan_adds_only_the_wire_longer_than_each_strategys_local_wait():
    flags = ["--preset", "emulated", "--params", "2e6", "--fc-fraction", "0",
             "--compute-ms", "100", "--local-steps", "horovod=250ms,topk=120ms"]
    plain = {r["label"]: r for r in plan_figures(*flags)["strategies"]}
    waited = {r["label"]: r for r in plan_figures(
        *flags, "--local-waits", "topk=1ms", "--local-cores", "2")["strategies"]}
    for label, row in waited.items():
        assert row["comm_ms"] == pytest.approx(plain[label]["comm_ms"])
        # Half the wire (4 ranks on 2 cores) is more than the 1 ms wait: 1 ms hidden.
        hidden = 1.0 if row["strategy"] == "topk" else 0.0
        assert row["comm_ms"] / 2 > 1.0
        assert row["hidden_ms"] == pytest.approx(hidden)
        assert row["step_ms"] == pytest.approx(plain[label]["step_ms"] - hidden)


def test_plan_takes_this_machines_cores_unless_told_and_hides_nothing_with_a_core_per_rank(
        monkeypatch):
    import hvdx.info

    flags = ["--preset", "emulated", "--params", "2e6", "--fc-fraction", "0",
             "--compute-ms", "100", "--local-steps", "topk=120ms", "--local-waits",
             "topk=100ms"]

    def topk_hidden(*extra):
        rows = plan_figures(*flags, *extra)["strategies"]
        return {r["label"]: (r["hidden_ms"], r["comm_ms"]) for r in rows
                if r["strategy"] == "topk"}

    monkeypatch.setattr(hvdx.info, "usable_cores", lambda: 1)
    for hidden, comm in topk_hidden().values():  # 4 ranks on 1 core: three waves early
        assert hidden == pytest.approx(min(100.0, comm * 3 / 4))
    for hidden, _ in topk_hidden("--local-cores", "4").values():
        assert hidden == 0.0


@pytest.mark.parametrize("waits, words", [
    ("dssync=10ms", "--local-waits dssync=0.01s needs --local-steps dssync"),
    ("topk=130ms", "--local-waits topk=0.13s is longer than --local-steps topk=0.12s"),
    ("ring=1ms", "--local-waits='ring=1ms': 'ring=1ms' is not KEY=TIME"),
    ("topk=later", "--local-waits topk='later'"),
    ("topk=10ms --local-cores 0", "--local-cores=0 must be at least 1")])
def test_plan_refuses_a_local_wait_it_cannot_price_naming_the_flag(waits, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        plan_figures("--preset", "emulated", "--local-steps", "topk=120ms",
                     "--local-waits", *waits.split())


def test_a_sweep_adds_the_phases_to_the_local_steps_at_every_uplink_rate():
    flags = ["--preset", "emulated", "--params", "2e6", "--fc-fraction", "0",
             "--compute-ms", "100", "--sweep", "10mbit,1gbit"]
    plain = plan_figures(*flags)["sweep"]
    local = plan_figures(*flags, "--local-steps", "horovod=250ms")["sweep"]
    for before, after in zip(plain, local):
        rows = {r["label"]: r for r in before["strategies"]}
        horovod = next(r for r in after["strategies"] if r["strategy"] == "horovod")
        assert horovod["comm_ms"] == pytest.approx(rows[horovod["label"]]["comm_ms"])
        assert horovod["step_ms"] == pytest.approx(250.0 + horovod["comm_ms"])


def test_small_sizes_are_timed_in_three_times_as_many_batches(monkeypatch):
    # A small round takes milliseconds and one descheduled rank stretches its batch
    # tenfold: with 3 batches, 128 KiB across a NIC once read 19 ms where it takes 2.
    # 9 batches at 16 KiB (8 rounds each) and 3 at 1 MiB (2 rounds each), each after
    # one warm-up round; the median is kept.
    import hvdx.mpi.calibration_timing as timing

    batches = []
    noisy = iter([0.0, 0.002, 0.002, 0.019, 0.002, 0.020, 0.002, 0.002, 0.002, 0.002,
                  0.0, 0.010, 0.013, 0.011])

    def batch_s(comm, count, one_round):
        batches.append((one_round, count))
        return next(noisy)

    monkeypatch.setattr(timing, "batch_s", batch_s)
    points = timing.timed_points(None, [16 * 1024, 1 << 20], repeats=3, max_round_s=1.0,
                                 round_of=lambda nbytes: nbytes)
    assert batches == [(16 * 1024, 1)] + [(16 * 1024, 8)] * 9 + [(1 << 20, 1)] + \
        [(1 << 20, 2)] * 3
    assert points == [(16384.0, 0.002), (1048576.0, 0.011)]


@pytest.mark.parametrize("value", ["2", "0", "-8"])
def test_the_calibration_job_refuses_a_size_under_one_float_by_name(value, capsys):
    from hvdx.mpi.calibrate import main

    with pytest.raises(SystemExit) as exit_:
        main(["--out", "unused.json", "--set-average-bytes", value])
    assert exit_.value.code == 2
    assert f"--set-average-bytes={value} must be at least 4" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--sharded-topk-of", "c.json", "--sharded-topk-bytes", "4"],
     "--sharded-topk-bytes=4 must be at least 8"),
    (["--sharded-topk-of", "c.json", "--downlink-multiple", "0"],
     "--downlink-multiple=0 must be positive"),
    (["--sharded-topk-bytes", "1024"], "--sharded-topk-bytes needs --sharded-topk-of"),
    (["--downlink-multiple", "2"], "--downlink-multiple needs --sharded-topk-of"),
    (["--sharded-topk-of", "c.json", "--set-average-bytes", "1024"],
     "--set-average-bytes sizes Horovod's averages"),
    (["--sharded-topk-of", "c.json", "--set-averages-of", "c.json"], "not allowed with"),
    (["--racks", "0,0,1,1"], "--racks needs --local-set-averages-of"),
    (["--local-set-averages-of", "c.json", "--racks", "0,1,1"],
     "--racks='0,1,1' must give one rack label per rank (1)"),
    (["--local-set-averages-of", "c.json", "--set-averages-of", "c.json"],
     "not allowed with"),
])
def test_the_calibration_job_refuses_a_timing_it_cannot_do_by_name(argv, message, capsys):
    # Refused by argparse on every rank before any collective: no rank waits in one.
    from hvdx.mpi.calibrate import main

    with pytest.raises(SystemExit) as exit_:
        main(["--out", "unused.json"] + argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_sizes_stop_after_a_slow_round_but_not_before_the_size_asked_through(monkeypatch):
    # Past 4 MiB a round over max_round_s ends the sizes (the slope is known), but the
    # model's own size, asked for with through=, is timed however long it takes.
    import hvdx.mpi.calibration_timing as timing

    monkeypatch.setattr(timing, "batch_s", lambda comm, count, one_round: 2.0)
    sizes = [1 << 20, 4 << 20, 5 << 20, 8 << 20]
    stopped = timing.timed_points(None, sizes, repeats=1, max_round_s=1.0,
                                  round_of=lambda nbytes: nbytes)
    through = timing.timed_points(None, sizes, repeats=1, max_round_s=1.0,
                                  round_of=lambda nbytes: nbytes, through=5 << 20)
    assert [b for b, _ in stopped] == [1 << 20, 4 << 20]
    assert [b for b, _ in through] == [1 << 20, 4 << 20, 5 << 20]
