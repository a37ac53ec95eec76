"""Group averaging keeps the global mean, reaches it exactly under the rotation schedule,
never moves ranks apart under shuffling, and reduces to local SGD (groups of one) or
synchronous SGD (one group of everyone); the uplink carries what ring allreduce puts there."""

import numpy as np
import pytest

from hvdx.core.group_averaging import (
    average_in_groups,
    consensus_distance,
    mean_uplink_bytes,
    simulate_dssync,
    uplink_bytes,
)
from hvdx.core.topology import Topology
from hvdx.strategies.dssync.core_schedule import ListSchedule, RotationSchedule, ShuffleSchedule

pytestmark = [pytest.mark.dssync]


def values(n, d=5, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal((n, d)).astype(dtype)


def regular_topologies():
    shapes = [(1, 1, 1), (2, 1, 1), (1, 3, 1), (2, 2, 1), (2, 4, 1), (3, 2, 2), (4, 2, 2),
              (2, 3, 2)]
    return [Topology.from_counts(r, h, p) for r, h, p in shapes]


@pytest.mark.parametrize("n", [1, 2, 5, 8, 16])
def test_group_averaging_preserves_the_global_mean_of_every_parameter(n):
    x = values(n, d=7, seed=n)
    for schedule in (ShuffleSchedule(n, min(3, n), seed=1),
                     RotationSchedule(Topology.from_counts(1, n))):
        for step in range(10):
            y = average_in_groups(x, schedule.partition(step))
            np.testing.assert_allclose(y.mean(axis=0), x.mean(axis=0), rtol=0, atol=1e-14)
            x = y


def test_each_rank_gets_the_mean_of_its_group_and_the_input_is_not_changed():
    x = np.array([[0.0], [2.0], [10.0], [20.0]])
    y = average_in_groups(x, ((0, 1), (2,), (3,)))
    np.testing.assert_array_equal(y, [[1.0], [1.0], [10.0], [20.0]])
    np.testing.assert_array_equal(x, [[0.0], [2.0], [10.0], [20.0]])
    assert average_in_groups(x.astype(np.float32), ((0, 1, 2, 3),)).dtype == np.float32


@pytest.mark.parametrize("topology", regular_topologies())
@pytest.mark.parametrize("split_hosts", [False, True])
def test_rotation_without_learning_reaches_the_global_mean_in_one_period_from_any_step(
        topology, split_hosts):
    intra_digits = 2 if split_hosts else 1
    schedule = RotationSchedule(topology, intra_phases=intra_digits, split_hosts=split_hosts)
    x = values(topology.size, seed=topology.size)
    d = schedule.period  # D phases: one per non-trivial digit
    assert d <= intra_digits + 1
    for start in range(2 * d + 1):
        y = simulate_dssync(x, lambda v, t: np.zeros_like(v), 0.0, schedule, d, start=start)
        np.testing.assert_allclose(y, np.broadcast_to(x.mean(axis=0), y.shape),
                                   rtol=0, atol=1e-12)


def test_rotation_with_one_crossing_rank_still_converges_to_the_global_mean():
    t = Topology.from_counts(2, 2, 2)
    x = values(t.size)
    # Not exact in one period: the racks' means approach each other by 3/4 per period.
    schedule = RotationSchedule(t, intra_phases=2, cross_ranks=1)
    y = simulate_dssync(x, lambda v, s: np.zeros_like(v), 0.0, schedule, 120 * schedule.period)
    np.testing.assert_allclose(y, np.broadcast_to(x.mean(axis=0), y.shape), atol=1e-10)
    assert consensus_distance(y) < 1e-10 * consensus_distance(x) + 1e-12


@pytest.mark.parametrize("n, g", [(2, 2), (5, 2), (8, 3), (16, 4), (16, 16), (7, 1)])
def test_random_shuffle_never_increases_the_consensus_distance(n, g):
    schedule = ShuffleSchedule(n, g, seed=n * g)
    x = values(n, d=9, seed=g)
    distance = consensus_distance(x)
    for step in range(50):
        x = average_in_groups(x, schedule.partition(step))
        now = consensus_distance(x)
        assert now <= distance + 1e-12
        distance = now
    if g > 1:
        assert distance < 1e-3


def test_consensus_distance_is_the_root_mean_squared_distance_to_the_mean():
    assert consensus_distance([[1.0, 0.0], [-1.0, 0.0]]) == pytest.approx(1.0)
    assert consensus_distance(np.ones((4, 3, 2))) == 0.0
    assert consensus_distance([[3.0], [3.0], [0.0]]) == pytest.approx(np.sqrt(2.0))


# --- identity settings ----------------------------------------------------------------

def quadratic(n, d, seed=0):
    """Rank i minimises 0.5 * x' A_i x - b_i' x: gradient A_i x - b_i, differs per rank."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, d, d)) / np.sqrt(d)
    a = np.einsum("nij,nkj->nik", a, a) + np.eye(d)
    b = rng.standard_normal((n, d))

    def grads(x, step):
        return np.einsum("nij,nj->ni", a, x) - b + 0.01 * np.sin(step)

    return grads


def test_group_size_one_is_independent_local_sgd():
    n, d, lr = 6, 4, 0.05
    grads, x0 = quadratic(n, d), values(n, d, seed=3)
    got = simulate_dssync(x0, grads, lr, ShuffleSchedule(n, 1, seed=0), 30)
    want = x0.copy()
    for step in range(30):
        want = want - lr * grads(want, step)
    np.testing.assert_array_equal(got, want)


def test_one_group_of_all_ranks_is_synchronous_sgd_on_the_averaged_gradient():
    n, d, lr = 5, 4, 0.05
    grads = quadratic(n, d, seed=1)
    start = values(1, d, seed=4)[0]
    x0 = np.broadcast_to(start, (n, d))
    got = simulate_dssync(x0, grads, lr, ListSchedule([[list(range(n))]]), 30)
    w = start.copy()
    for step in range(30):
        w = w - lr * grads(np.broadcast_to(w, (n, d)), step).mean(axis=0)
    np.testing.assert_allclose(got, np.broadcast_to(w, (n, d)), rtol=0, atol=1e-12)
    # ... and the same as a shuffle whose one group holds everyone.
    np.testing.assert_array_equal(got, simulate_dssync(x0, grads, lr, ShuffleSchedule(n, n), 30))


def test_one_group_of_all_ranks_is_full_parameter_averaging_from_any_weights():
    n, d, lr = 4, 3, 0.1
    grads, x0 = quadratic(n, d, seed=2), values(n, d, seed=5)
    got = simulate_dssync(x0, grads, lr, RotationSchedule(Topology.from_counts(1, n)), 1)
    want = (x0 - lr * grads(x0, 0)).mean(axis=0)
    np.testing.assert_allclose(got, np.broadcast_to(want, (n, d)), rtol=0, atol=1e-14)


# --- uplink bytes ---------------------------------------------------------------------

def test_a_ring_over_two_racks_of_two_puts_one_and_a_half_models_on_each_uplink():
    t = Topology.from_counts(2, 2)
    np.testing.assert_allclose(uplink_bytes(((0, 1, 2, 3),), t, 1.0), [1.5, 1.5])
    np.testing.assert_allclose(uplink_bytes(((0, 2), (1, 3)), t, 1.0), [2.0, 2.0])
    np.testing.assert_allclose(uplink_bytes(((0, 1), (2, 3)), t, 1.0), [0.0, 0.0])


@pytest.mark.parametrize("racks, hosts", [(2, 2), (2, 4), (4, 4), (3, 2)])
def test_a_ring_over_ranks_numbered_by_rack_leaves_each_rack_once(racks, hosts):
    t = Topology.from_counts(racks, hosts)
    n = t.size
    np.testing.assert_allclose(uplink_bytes((tuple(range(n)),), t, 8.0),
                               np.full(racks, 2 * (n - 1) / n * 8.0))


def test_a_ring_in_an_interleaved_numbering_crosses_at_every_hop():
    t = Topology.from_ranks(["a", "b", "a", "b"], ["x", "y", "x", "y"])
    np.testing.assert_allclose(uplink_bytes(((0, 1, 2, 3),), t, 1.0), [3.0, 3.0])


@pytest.mark.parametrize("racks, hosts, per_host", [(2, 2, 1), (2, 4, 1), (4, 2, 2)])
def test_one_crossing_rank_puts_fewer_models_on_the_uplink_than_full_crossing(
        racks, hosts, per_host):
    t = Topology.from_counts(racks, hosts, per_host)
    full = RotationSchedule(t)
    one = RotationSchedule(t, cross_ranks=1)
    assert mean_uplink_bytes(one, t, 1.0) < mean_uplink_bytes(full, t, 1.0)
    width = hosts * per_host
    assert mean_uplink_bytes(full, t, 1.0) == pytest.approx(width * mean_uplink_bytes(one, t, 1.0))
    for step in range(full.period):
        if full.phase_kind(step) == "intra":
            assert uplink_bytes(full.partition(step), t, 1.0).max() == 0.0


def test_strict_alternation_on_two_by_two_gains_little_over_a_ring():
    t = Topology.from_counts(2, 2)
    ring = uplink_bytes(((0, 1, 2, 3),), t, 1.0).max()
    assert mean_uplink_bytes(RotationSchedule(t), t, 1.0) == pytest.approx(1.0)
    assert mean_uplink_bytes(RotationSchedule(t, cross_ranks=1), t, 1.0) == pytest.approx(0.5)
    assert mean_uplink_bytes(RotationSchedule(t, intra_phases=3, cross_ranks=1), t, 1.0) == \
        pytest.approx(ring / 6)
