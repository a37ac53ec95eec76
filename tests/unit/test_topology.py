"""A topology gives every rank a host and a rack, whatever the numbering; on a regular one
its coordinates are mixed-radix digits; bandwidth matrices split ranks into fast groups."""

import numpy as np
import pytest

from hvdx.core.topology import (
    Topology,
    canonical,
    digit_groups,
    groups_from_bandwidth,
    mixed_radix,
    slow_links,
)


def test_from_counts_numbers_ranks_rack_by_rack_host_by_host():
    t = Topology.from_counts(racks=2, hosts_per_rack=2, ranks_per_host=2)
    assert t.size == 8 and t.n_racks == 2 and t.n_hosts == 4
    assert t.hosts == (0, 0, 1, 1, 2, 2, 3, 3)
    assert t.racks == (0, 0, 0, 0, 1, 1, 1, 1)
    assert t.rack_groups() == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert t.host_groups() == ((0, 1), (2, 3), (4, 5), (6, 7))


@pytest.mark.parametrize("racks, hosts, per_host", [(1, 1, 1), (2, 2, 1), (3, 2, 2), (2, 3, 4)])
def test_coordinates_of_a_regular_topology_are_the_mixed_radix_digits_of_the_rank(
        racks, hosts, per_host):
    t = Topology.from_counts(racks, hosts, per_host)
    assert mixed_radix(t) == (per_host, hosts, racks)
    for rank, (local, host, rack) in enumerate(t.coordinates()):
        assert rank == local + per_host * (host + hosts * rack)


def test_labels_of_any_kind_are_renumbered_by_first_appearance():
    t = Topology.from_ranks(["b", "a", "b", "c"], racks=["r2", "r2", "r2", "r1"])
    assert t == Topology(hosts=(0, 1, 0, 2), racks=(0, 0, 0, 1))
    assert t.digest() == Topology((7, 3, 7, 9), (5, 5, 5, 0)).digest()


def test_an_arbitrary_numbering_has_the_same_groups_as_the_ranks_it_names():
    # Ranks of two racks interleaved: 0, 2 on host A (rack 0); 1, 3 on host B (rack 1).
    t = Topology.from_ranks(["A", "B", "A", "B"], ["x", "y", "x", "y"])
    assert t.rack_groups() == ((0, 2), (1, 3))
    assert digit_groups(t, "rack") == ((0, 1), (2, 3))
    assert mixed_radix(t) == (2, 1, 2)


def test_the_digest_changes_with_the_hierarchy():
    a = Topology.from_counts(2, 2)
    assert a.digest() == Topology.from_counts(2, 2).digest()
    assert a.digest() != Topology.from_counts(1, 4).digest()
    assert a.digest() != Topology.from_counts(4, 1).digest()


@pytest.mark.parametrize("racks, hosts, per_host", [(2, 2, 2), (3, 2, 2), (2, 3, 1)])
def test_digit_groups_hold_ranks_that_differ_only_in_that_digit(racks, hosts, per_host):
    t = Topology.from_counts(racks, hosts, per_host)
    radices = dict(zip(("local", "host", "rack"), mixed_radix(t)))
    coords = t.coordinates()
    for i, digit in enumerate(("local", "host", "rack")):
        groups = digit_groups(t, digit)
        assert sorted(r for g in groups for r in g) == list(range(t.size))
        for g in groups:
            assert len(g) == radices[digit]
            others = {tuple(c for j, c in enumerate(coords[r]) if j != i) for r in g}
            assert len(others) == 1


def test_an_irregular_topology_has_no_radices_and_falls_back_to_groups_by_level():
    # Rack 0: host 0 with 2 ranks, host 1 with 1 rank. Rack 1: host 2 with 1 rank.
    t = Topology(hosts=(0, 0, 1, 2), racks=(0, 0, 0, 1))
    assert mixed_radix(t) is None and not t.is_regular()
    assert digit_groups(t, "local") == ((0, 1), (2,), (3,))
    assert digit_groups(t, "host") == ((0, 2), (1,), (3,))
    assert digit_groups(t, "rack") == ((0, 3), (1,), (2,))


def test_positions_in_rack_spread_the_first_places_over_hosts():
    t = Topology.from_counts(2, 2, 2)
    places = t.positions_in_rack()
    assert places == (0, 2, 1, 3, 0, 2, 1, 3)
    for rack in t.rack_groups():
        first_two = [r for r in rack if places[r] < 2]
        assert len({t.hosts[r] for r in first_two}) == 2


@pytest.mark.parametrize("kwargs, name", [
    (dict(hosts=(), racks=()), "hosts"),
    (dict(hosts=(0, 1), racks=(0,)), "racks"),
    (dict(hosts=(0, 0), racks=(0, 1)), "racks"),
    (dict(hosts=(0, -1), racks=(0, 0)), r"hosts\[1\]"),
    (dict(hosts=(0, "a"), racks=(0, 0)), r"hosts\[1\]"),
    (dict(hosts=(0, 1), racks=(0, 1.5)), r"racks\[1\]"),
])
def test_an_invalid_topology_is_a_value_error_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}"):
        Topology(**kwargs)


@pytest.mark.parametrize("args, name", [((0, 1, 1), "racks=0"), ((1, 0, 1), "hosts_per_rack=0"),
                                        ((1, 1, 2.0), "ranks_per_host=2.0"),
                                        ((True, 1, 1), "racks=True")])
def test_from_counts_names_the_bad_count(args, name):
    with pytest.raises(ValueError, match=f"^{name}"):
        Topology.from_counts(*args)


def test_from_ranks_with_mismatched_lengths_names_racks():
    with pytest.raises(ValueError, match="^racks has 1 entries but hosts has 2"):
        Topology.from_ranks(["a", "b"], ["x"])


# --- bandwidth ----------------------------------------------------------------------

def two_racks_matrix(fast=100.0, slow=10.0, noise=0.0, seed=0):
    """4 ranks, racks {0, 1} and {2, 3}; asymmetric noise on every entry."""
    rng = np.random.default_rng(seed)
    m = np.full((4, 4), slow)
    m[:2, :2] = m[2:, 2:] = fast
    m *= 1 + noise * rng.standard_normal((4, 4))
    np.fill_diagonal(m, 0.0)
    return m


def test_groups_from_bandwidth_joins_ranks_behind_fast_links():
    assert groups_from_bandwidth(two_racks_matrix(noise=0.05), 0.5) == ((0, 1), (2, 3))
    assert slow_links(two_racks_matrix(), 0.5) == ((0, 2), (0, 3), (1, 2), (1, 3))


def test_groups_from_bandwidth_is_transitive_over_fast_paths():
    m = two_racks_matrix()
    m[0, 1] = m[1, 0] = 5.0  # one slow measurement inside a 3-rank rack
    m = np.pad(m, ((0, 1), (0, 1)), constant_values=10.0)
    m[4, :2] = m[:2, 4] = 100.0
    assert groups_from_bandwidth(m, 0.5) == ((0, 1, 4), (2, 3))


def test_a_link_is_as_fast_as_its_slower_direction():
    m = two_racks_matrix()
    m[0, 2] = 100.0  # one direction fast only
    assert groups_from_bandwidth(m, 0.5) == ((0, 1), (2, 3))


def test_uniform_bandwidth_is_one_group_and_has_no_slow_links():
    m = np.full((3, 3), 7.0)
    assert groups_from_bandwidth(m, 0.9) == ((0, 1, 2),)
    assert slow_links(m) == ()
    assert groups_from_bandwidth([[0.0]]) == ((0,),)


@pytest.mark.parametrize("matrix, ratio, match", [
    (np.ones((2, 3)), 0.5, "matrix has shape"),
    (np.array([[0, -1], [1, 0]]), 0.5, "matrix must hold"),
    (np.array([[0, np.nan], [1, 0]]), 0.5, "matrix must hold"),
    (np.ones((2, 2)), 0.0, "threshold_ratio=0.0"),
    (np.ones((2, 2)), 1.5, "threshold_ratio=1.5"),
])
def test_bad_bandwidth_inputs_are_value_errors_naming_the_argument(matrix, ratio, match):
    with pytest.raises(ValueError, match=f"^{match}"):
        groups_from_bandwidth(matrix, ratio)


def test_canonical_orders_groups_by_smallest_rank():
    assert canonical([[3, 1], [2], [0, 4]]) == ((0, 4), (1, 3), (2,))
