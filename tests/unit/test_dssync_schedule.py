"""DS-Sync schedules are pure functions of (settings, step): every rank computes the same
partition of all ranks into disjoint groups; rotation phases respect racks; bad
arguments are value errors naming the argument."""

import os
import subprocess
import sys

import numpy as np
import pytest

from hvdx.core.fingerprint import Fingerprint
from hvdx.core.group_averaging import mean_uplink_bytes, uplink_bytes
from hvdx.core.topology import Topology
from hvdx.strategies.dssync.core_schedule import (
    ListSchedule,
    RotationSchedule,
    ShuffleSchedule,
    default_rotation_parameters,
    validate_partition,
)

pytestmark = [pytest.mark.dssync]

STEPS = [0, 1, 2, 3, 7, 12, 99, 1000, 2**31 + 5]


def random_partition(n, seed):
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    cuts = np.sort(rng.choice(np.arange(1, n), size=rng.integers(0, n), replace=False)) \
        if n > 1 else []
    return [list(map(int, g)) for g in np.split(order, cuts)]


def topologies(n):
    """Regular and irregular topologies of n ranks."""
    out = [Topology.from_counts(1, n), Topology.from_counts(n, 1)]
    for racks in range(2, n):
        if n % racks == 0:
            per_rack = n // racks
            out.append(Topology.from_counts(racks, per_rack))
            if per_rack % 2 == 0:
                out.append(Topology.from_counts(racks, per_rack // 2, 2))
    rng = np.random.default_rng(n)
    hosts = rng.integers(0, max(n // 2, 1), size=n)
    out.append(Topology.from_ranks(hosts, racks=hosts % 3))  # irregular, shuffled numbering
    return out


def schedules(n):
    for t in topologies(n):
        width = max(len(g) for g in t.rack_groups())
        for kw in ({}, dict(intra_phases=3), dict(cross_ranks=1),
                   dict(intra_phases=2, split_hosts=True, cross_ranks=min(2, width))):
            yield RotationSchedule(t, **kw)
    for g in sorted({1, 2, 3, n}):
        if g <= n:
            yield ShuffleSchedule(n, g, seed=n)
    yield ListSchedule([random_partition(n, s) for s in range(3)])


@pytest.mark.parametrize("n", range(1, 17))
def test_every_partition_is_disjoint_non_empty_and_covers_all_ranks(n):
    rng = np.random.default_rng(n)
    steps = STEPS + [int(s) for s in rng.integers(0, 10**9, size=5)]
    for schedule in schedules(n):
        for step in steps:
            p = schedule.partition(step)
            assert validate_partition(p, n) == p, (schedule, step)
            assert sorted(r for g in p for r in g) == list(range(n))


@pytest.mark.parametrize("n", [5, 8, 16])
def test_all_ranks_compute_the_same_partition_in_any_order_of_calls(n):
    hosts = [r // 2 for r in range(n)]
    topology = Topology.from_ranks(hosts, racks=[h // 2 for h in hosts])
    for make in (lambda: RotationSchedule(topology, cross_ranks=1),
                 lambda: ShuffleSchedule(n, 3, seed=42),
                 lambda: ListSchedule([random_partition(n, s) for s in range(4)])):
        forward = make()
        first = [forward.partition(s) for s in STEPS]
        for rank in range(n):  # a fresh object per "rank", steps visited in another order
            other = make()
            order = np.random.default_rng(rank).permutation(len(STEPS))
            seen = {int(i): other.partition(STEPS[i]) for i in order}
            assert [seen[i] for i in range(len(STEPS))] == first
            assert all(rank in other.group(s, rank) for s in STEPS)


def test_shuffle_partitions_do_not_depend_on_the_process():
    code = ("from hvdx.strategies.dssync.core_schedule import ShuffleSchedule\n"
            "print([ShuffleSchedule(10, 3, 7).partition(s) for s in (0, 5, 10**6)])")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
            for seed in ("1", "2")}
    here = str([ShuffleSchedule(10, 3, 7).partition(s) for s in (0, 5, 10**6)]) + "\n"
    assert outs == {here}


def test_shuffle_partitions_are_pinned_so_a_change_of_stream_is_noticed():
    # Ranks on different hvdx or NumPy versions must agree: these values must never change.
    s = ShuffleSchedule(8, 3, seed=7)
    assert s.partition(0) == ((0, 3, 7), (1, 6), (2, 4, 5))
    assert s.partition(12345) == ((0, 2), (1, 3, 4), (5, 6, 7))


def test_shuffle_changes_groups_between_steps_and_seeds():
    s = ShuffleSchedule(16, 4, seed=1)
    assert len({s.partition(t) for t in range(20)}) > 15
    assert s.partition(3) != ShuffleSchedule(16, 4, seed=2).partition(3)


@pytest.mark.parametrize("n, g, sizes", [(7, 3, [3, 2, 2]), (8, 3, [3, 3, 2]), (9, 3, [3, 3, 3]),
                                         (5, 5, [5]), (4, 1, [1, 1, 1, 1]), (10, 4, [4, 3, 3])])
def test_shuffle_group_sizes_differ_by_at_most_one_and_never_exceed_group_size(n, g, sizes):
    for step in range(10):
        assert sorted(map(len, ShuffleSchedule(n, g, 0).partition(step)), reverse=True) == sizes


def test_groups_used_lists_every_group_of_those_steps():
    s = ShuffleSchedule(8, 3, seed=0)
    used = s.groups_used(range(5))
    assert used == tuple(sorted(used))
    for t in range(5):
        assert all(g in used for g in s.partition(t) if len(g) > 1)


# --- rotation -------------------------------------------------------------------------

@pytest.mark.parametrize("n", range(1, 17))
def test_intra_phases_never_span_racks_and_cross_groups_hold_one_rank_per_rack(n):
    for schedule in schedules(n):
        if not isinstance(schedule, RotationSchedule):
            continue
        racks = schedule.topology.racks
        for step in range(2 * schedule.period + 1):
            for g in schedule.partition(step):
                in_racks = [racks[r] for r in g]
                if schedule.phase_kind(step) == "intra":
                    assert len(set(in_racks)) == 1, (schedule, step, g)
                else:
                    assert len(set(in_racks)) == len(in_racks), (schedule, step, g)


def test_rotation_on_two_racks_of_two_alternates_racks_and_pairs():
    s = RotationSchedule(Topology.from_counts(2, 2))
    assert s.period == 2
    assert [s.partition(t) for t in range(4)] == [((0, 1), (2, 3)), ((0, 2), (1, 3))] * 2
    assert [s.phase_kind(t) for t in range(3)] == ["intra", "cross", "intra"]


def test_intra_phases_k_gives_k_intra_phases_per_cross_phase():
    s = RotationSchedule(Topology.from_counts(2, 4), intra_phases=3)
    assert s.period == 4
    assert [s.phase_kind(t) for t in range(8)] == ["intra"] * 3 + ["cross"] + ["intra"] * 3 + \
        ["cross"]


def test_split_hosts_rotates_through_the_mixed_radix_digits():
    # 2 racks x 2 hosts x 2 ranks: digits local, host, rack, D = 3.
    s = RotationSchedule(Topology.from_counts(2, 2, 2), intra_phases=2, split_hosts=True)
    assert s.period == 3
    assert [s.partition(t) for t in range(3)] == [
        ((0, 1), (2, 3), (4, 5), (6, 7)), ((0, 2), (1, 3), (4, 6), (5, 7)),
        ((0, 4), (1, 5), (2, 6), (3, 7))]
    # One intra phase per cross phase: the two intra digits take turns.
    s1 = RotationSchedule(Topology.from_counts(2, 2, 2), intra_phases=1, split_hosts=True)
    assert s1.period == 4 and s1.partition(0) != s1.partition(2)


def test_cross_ranks_one_lets_one_rank_per_rack_cross_and_leaves_the_others_alone():
    t = Topology.from_counts(2, 2, 2)
    s = RotationSchedule(t, cross_ranks=1)
    cross = s.partition(1)
    assert s.phase_kind(1) == "cross"
    assert cross == ((0, 4), (1,), (2,), (3,), (5,), (6,), (7,))
    s2 = RotationSchedule(t, cross_ranks=2).partition(1)
    crossing = [r for g in s2 if len(g) > 1 for r in g]
    assert len({t.hosts[r] for r in crossing}) == 4  # spread over hosts


@pytest.mark.parametrize("topology", [Topology.from_counts(1, 4), Topology.from_counts(4, 1),
                                      Topology.from_counts(1, 1)])
def test_degenerate_topologies_have_one_phase(topology):
    s = RotationSchedule(topology, intra_phases=5)
    assert s.period == 1
    single_rack = topology.n_racks == 1
    assert s.phase_kind(0) == ("intra" if single_rack else "cross")
    assert s.partition(0) == ((tuple(range(topology.size)),))


@pytest.mark.parametrize("n", [4, 8, 12, 16])
def test_groups_cover_every_group_the_schedule_produces_over_many_steps(n):
    for schedule in schedules(n):
        if isinstance(schedule, ShuffleSchedule):
            continue
        groups, partitions = set(schedule.groups()), set(schedule.partitions())
        assert len(partitions) == len(schedule.partitions()) <= schedule.period
        for step in range(0, 500, 7):
            p = schedule.partition(step)
            assert p in partitions
            assert all(g in groups for g in p if len(g) > 1)


def test_list_schedule_cycles_and_canonicalises():
    s = ListSchedule([[[2, 0], [1]], [[1, 0, 2]]])
    assert s.n == 3 and s.period == 2
    assert [s.partition(t) for t in range(3)] == [((0, 2), (1,)), ((0, 1, 2),), ((0, 2), (1,))]
    assert s.groups() == ((0, 1, 2), (0, 2))


# --- settings and defaults ------------------------------------------------------------

def test_settings_differ_when_seed_schedule_or_topology_differ():
    def digest(schedule):
        return Fingerprint.build(settings=schedule.settings()).digest()

    t = Topology.from_counts(2, 2)
    variants = [ShuffleSchedule(4, 2, 0), ShuffleSchedule(4, 2, 1), ShuffleSchedule(4, 3, 0),
                RotationSchedule(t), RotationSchedule(t, intra_phases=2),
                RotationSchedule(t, cross_ranks=1), RotationSchedule(Topology.from_counts(1, 4)),
                ListSchedule([[[0, 1], [2, 3]]]), ListSchedule([[[0, 2], [1, 3]]])]
    digests = [digest(s) for s in variants]
    assert len(set(digests)) == len(digests)
    assert digest(ShuffleSchedule(4, 2, 0)) == digests[0]
    assert all(name.startswith("dssync.") for s in variants for name, _ in s.settings())


def oversubscribed(racks, hosts, ratio, nic=25e9):
    return nic, hosts * nic / ratio


def test_default_parameters_on_two_by_two_at_ten_to_one_beat_a_ring_on_the_uplink():
    t = Topology.from_counts(2, 2)
    intra, cross = default_rotation_parameters(t, *oversubscribed(2, 2, 10))
    assert cross == 1 and intra > 1
    s = RotationSchedule(t, intra_phases=intra, cross_ranks=cross)
    ring = uplink_bytes(((0, 1, 2, 3),), t, 1.0).max()
    assert ring == pytest.approx(1.5)
    assert mean_uplink_bytes(s, t, 1.0) <= ring


def test_default_parameters_without_oversubscription_alternate_with_everyone_crossing():
    t = Topology.from_counts(2, 2)
    assert default_rotation_parameters(t, "25gbit", "50gbit") == (1, 2)


@pytest.mark.parametrize("racks, hosts, per_host, ratio", [
    (2, 2, 1, 1), (2, 4, 1, 4), (4, 8, 1, 2), (2, 4, 2, 1), (8, 2, 4, 16), (3, 3, 1, 3)])
def test_default_parameters_never_load_the_uplink_more_than_a_ring(racks, hosts, per_host, ratio):
    t = Topology.from_counts(racks, hosts, per_host)
    intra, cross = default_rotation_parameters(t, *oversubscribed(racks, hosts, ratio))
    s = RotationSchedule(t, intra_phases=intra, cross_ranks=cross)
    ring = uplink_bytes((tuple(range(t.size)),), t, 1.0).max()
    assert mean_uplink_bytes(s, t, 1.0) <= ring + 1e-12


def test_default_parameters_on_one_rack_or_one_rank_per_rack():
    assert default_rotation_parameters(Topology.from_counts(1, 4), 1e9, 1e9) == (1, 4)
    assert default_rotation_parameters(Topology.from_counts(4, 1), 1e9, 1e8) == (1, 1)


# --- validation -----------------------------------------------------------------------

@pytest.mark.parametrize("partition, match", [
    ([[0, 1], [1, 2]], "partition: overlapping rank 1 is in groups 0 and 1"),
    ([[0, 1]], "partition: missing rank 2 is in no group"),
    ([[0, 1], [], [2]], "partition: group 1 is empty"),
    ([[0, 1, 2, 3]], "partition: rank 3 in group 0 is outside 0..2"),
    ([[0, -1, 1, 2]], "partition: rank -1 in group 0 is outside 0..2"),
    ([[0, 1.0, 2]], "partition: group 0 holds 1.0, which is not a rank"),
    (5, "partition=5 must be a sequence"),
])
def test_validate_partition_names_what_is_wrong(partition, match):
    with pytest.raises(ValueError, match=f"^{match}"):
        validate_partition(partition, 3)


@pytest.mark.parametrize("make, match", [
    (lambda: ShuffleSchedule(4, 0, 0), "group_size=0"),
    (lambda: ShuffleSchedule(4, 5, 0), "group_size=5"),
    (lambda: ShuffleSchedule(0, 1, 0), "n=0"),
    (lambda: ShuffleSchedule(4, 2, -1), "seed=-1"),
    (lambda: ShuffleSchedule(4, 2, 0).partition(-1), "step=-1"),
    (lambda: RotationSchedule(Topology.from_counts(2, 2), intra_phases=0), "intra_phases=0"),
    (lambda: RotationSchedule(Topology.from_counts(2, 2), cross_ranks=3), "cross_ranks=3"),
    (lambda: RotationSchedule(Topology.from_counts(2, 2)).partition(1.5), "step=1.5"),
    (lambda: RotationSchedule("2x2"), "topology='2x2'"),
    (lambda: ListSchedule([]), r"partitions=\[\]"),
    (lambda: ListSchedule([[[0, 1]], [[0]]]), r"partitions\[1\]: missing rank 1"),
    (lambda: ListSchedule([[[0, 1]]], n=3), r"partitions\[0\]: missing rank 2"),
    (lambda: ShuffleSchedule(4, 2).group(0, 4), "rank=4"),
    (lambda: default_rotation_parameters(Topology.from_counts(2, 2), "fast", 1e9), "nic_bps"),
])
def test_bad_arguments_are_value_errors_naming_the_argument(make, match):
    with pytest.raises(ValueError, match=f"^{match}"):
        make()
