"""A measured bandwidth matrix gives back the racks, the slow links and who should cross;
the probe's schedule measures every pair once in O(n) rounds of disjoint pairs."""

import itertools

import numpy as np
import pytest

from hvdx.core.bandwidth import (
    adapted_rotation,
    cross_places,
    fill_same_host,
    measured_topology,
    pair_rounds,
    rotation_changed,
)
from hvdx.core.topology import Topology
from hvdx.strategies.dssync.core_schedule import RotationSchedule

pytestmark = [pytest.mark.dssync]

GBIT, MBIT = 1e9 / 8, 1e6 / 8  # bytes per second


def cluster_matrix(racks, hosts_per_rack, nic=GBIT, uplink=100 * MBIT, noise=0.0, seed=0):
    """Rates of a racks x hosts cluster, one rank per host: NIC in a rack, uplink across."""
    n = racks * hosts_per_rack
    rack = np.arange(n) // hosts_per_rack
    m = np.where(rack[:, None] == rack[None, :], nic, uplink).astype(float)
    m *= 1 + noise * np.random.default_rng(seed).uniform(-1, 1, size=(n, n))
    np.fill_diagonal(m, 0)
    return m


def slow_nic(m, rank, rate):
    m = m.copy()
    m[rank, :] = np.minimum(m[rank, :], rate)
    m[:, rank] = np.minimum(m[:, rank], rate)
    np.fill_diagonal(m, 0)
    return m


@pytest.mark.parametrize("n", range(1, 12))
def test_rounds_cover_every_pair_once_with_disjoint_pairs_in_n_rounds(n):
    rounds = pair_rounds(n)
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == list(itertools.combinations(range(n), 2))
    for r in rounds:
        ranks = [x for p in r for x in p]
        assert len(ranks) == len(set(ranks)), r
    assert len(rounds) == (0 if n == 1 else n - 1 if n % 2 == 0 else n)


def test_two_racks_behind_a_slow_uplink_are_recovered_without_labels():
    m = cluster_matrix(2, 2, noise=0.3)
    measured = measured_topology(m, hosts=[0, 1, 2, 3])
    assert measured.topology.rack_groups() == ((0, 1), (2, 3))
    assert measured.slow_links == ((0, 2), (0, 3), (1, 2), (1, 3))


def test_three_racks_of_three_hosts_in_any_rank_order():
    m = cluster_matrix(3, 3, noise=0.2, seed=3)
    order = np.random.default_rng(1).permutation(9)
    shuffled = m[np.ix_(order, order)]
    measured = measured_topology(shuffled, hosts=list(range(9)))
    expected = {tuple(sorted(int(np.flatnonzero(order == r)[0]) for r in range(k, k + 3)))
                for k in (0, 3, 6)}
    assert set(measured.topology.rack_groups()) == expected


def test_ranks_of_one_host_are_never_measured_and_never_split():
    m = cluster_matrix(2, 2)
    m[0, 1] = m[1, 0] = np.nan  # ranks 0 and 1 share a host: no measurement
    measured = measured_topology(m, hosts=["a", "a", "b", "c"])
    assert measured.topology.rack_groups() == ((0, 1), (2, 3))
    assert measured.topology.host_groups() == ((0, 1), (2,), (3,))
    assert fill_same_host(m, ["a", "a", "b", "c"])[0, 1] == GBIT


def test_a_missing_measurement_between_hosts_is_an_error():
    m = cluster_matrix(2, 2)
    m[0, 2] = np.nan
    with pytest.raises(ValueError, match="finite"):
        measured_topology(m, hosts=[0, 1, 2, 3])


def test_one_slowed_link_is_found_and_is_the_only_one():
    m = cluster_matrix(1, 4, noise=0.2)
    m[1, 3] = 10 * MBIT  # one direction is enough: a link is as fast as its slower way
    measured = measured_topology(m, hosts=[0, 1, 2, 3])
    assert measured.slow_links == ((1, 3),)
    assert measured.topology.rack_groups() == ((0, 1, 2, 3),)  # still connected


def test_a_rank_with_a_slow_nic_stops_crossing_and_labels_keep_the_racks():
    m = slow_nic(cluster_matrix(2, 2, noise=0.2), rank=0, rate=20 * MBIT)
    measured = measured_topology(m, hosts=[0, 1, 2, 3], racks=[0, 0, 1, 1])
    assert measured.topology.rack_groups() == ((0, 1), (2, 3))
    assert measured.crossing(1) == ((1,), (2,))
    assert measured.places == (1, 0, 0, 1)


def test_without_labels_a_host_with_a_slow_nic_looks_like_a_rack_of_its_own():
    # Why labelled racks are kept when given: the probe alone cannot tell a slow NIC
    # from a rack of one host.
    m = slow_nic(cluster_matrix(2, 2), rank=0, rate=20 * MBIT)
    assert measured_topology(m, hosts=[0, 1, 2, 3]).topology.rack_groups() == \
        ((0,), (1,), (2, 3))


def test_noise_below_the_threshold_keeps_the_topologys_own_places():
    t = Topology.from_counts(2, 3)
    for seed in range(20):
        m = cluster_matrix(2, 3, noise=0.3, seed=seed)
        assert cross_places(t, m) == t.positions_in_rack()


def test_the_rotation_changes_only_when_the_crossing_ranks_do():
    t = Topology.from_counts(2, 2)
    running = RotationSchedule(t, cross_ranks=1)
    cycle = [running.partition(s) for s in range(running.period)]

    def proposed(matrix):
        measured = measured_topology(matrix, hosts=range(4), racks=t.racks)
        schedule = RotationSchedule(measured.topology, cross_ranks=1, places=measured.places)
        return [schedule.partition(s) for s in range(schedule.period)]

    assert not rotation_changed(cycle, proposed(cluster_matrix(2, 2, noise=0.3)))
    # A slow link that no cross phase uses changes nothing either.
    assert not rotation_changed(cycle, proposed(slow_nic(cluster_matrix(2, 2), 3, 20 * MBIT)))
    adapted = proposed(slow_nic(cluster_matrix(2, 2), 0, 20 * MBIT))
    assert rotation_changed(cycle, adapted)
    assert adapted[1] == ((0,), (1, 2), (3,))  # rank 1 crosses for rack 0 now


def test_places_must_number_each_rack_from_zero():
    t = Topology.from_counts(2, 2)
    with pytest.raises(ValueError, match="places: rack 0"):
        RotationSchedule(t, places=(0, 0, 0, 1))
    with pytest.raises(ValueError, match="places has 3 entries"):
        RotationSchedule(t, places=(0, 1, 0))
    assert ("dssync.places", (1, 0, 0, 1)) in RotationSchedule(t, places=(1, 0, 0, 1)).settings()


def test_adaptation_is_a_pure_decision_on_the_shared_matrix():
    t = Topology.from_counts(2, 2)
    running = RotationSchedule(t, cross_ranks=1)
    calm = cluster_matrix(2, 2, noise=0.3)
    assert adapted_rotation(running, calm, keep_racks=True, cross_ranks=1)[1] is None
    contended = slow_nic(cluster_matrix(2, 2, noise=0.3), 0, 20 * MBIT)
    measured, new = adapted_rotation(running, contended, keep_racks=True, cross_ranks=1)
    again = adapted_rotation(running, contended.copy(), keep_racks=True, cross_ranks=1)[1]
    assert new is not None and again.settings() == new.settings()
    assert new.partition(1) == ((0,), (1, 2), (3,)) and new.partition(0) == ((0, 1), (2, 3))
    assert measured.slow_links[:3] == ((0, 1), (0, 2), (0, 3))


def test_the_rotation_switches_only_when_a_crossing_rank_is_slow():
    # Hysteresis: a probe that no longer sees rank 0 slowed keeps the adapted
    # rotation (rank 1 crossing does not hurt); switching back would cost process sets
    # and invite flapping between probes. Only a slow crossing rank moves it again.
    t = Topology.from_counts(2, 2)
    running = RotationSchedule(t, cross_ranks=1)
    contended = slow_nic(cluster_matrix(2, 2, noise=0.3), 0, 20 * MBIT)
    _, adapted = adapted_rotation(running, contended, keep_racks=True, cross_ranks=1)
    for seed in range(10):
        calm = cluster_matrix(2, 2, noise=0.3, seed=seed)
        assert adapted_rotation(adapted, calm, keep_racks=True, cross_ranks=1)[1] is None
    now_rank_1 = slow_nic(cluster_matrix(2, 2), 1, 20 * MBIT)
    measured, again = adapted_rotation(adapted, now_rank_1, keep_racks=True, cross_ranks=1)
    assert measured.slow_out == (False, True, False, False)
    assert again is not None and again.partition(1) == running.partition(1)


def test_without_labels_the_adaptation_takes_the_probes_racks():
    hosts_as_racks = RotationSchedule(Topology.from_ranks([0, 1, 2, 3], [0, 1, 2, 3]))
    measured, new = adapted_rotation(hosts_as_racks, cluster_matrix(2, 2), keep_racks=False)
    assert measured.topology.rack_groups() == ((0, 1), (2, 3))
    assert [new.partition(s) for s in range(new.period)] == \
        [((0, 1), (2, 3)), ((0, 2), (1, 3))]
