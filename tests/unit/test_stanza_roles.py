"""Stanza's roles: the last F ranks train the head, every conv rank has exactly one FC
worker, the groups are contiguous and balanced, and bad fc_workers fail naming the
argument, its value and the world size. The scaling turns per-worker mean losses into
the global mean."""

import numpy as np
import pytest

from hvdx.strategies.stanza.core_roles import (CONV, FC, auto_fc_workers, loss_weights,
                                               median_probe, probe_counts, stanza_roles)

pytestmark = [pytest.mark.stanza]

LAYOUTS = [(2, 1), (3, 1), (4, 1), (4, 2), (5, 2), (7, 3), (8, 4), (10, 3), (16, 5)]


@pytest.mark.parametrize("size, f", LAYOUTS)
def test_the_last_f_ranks_are_fc_workers_and_rank_0_is_a_conv_worker(size, f):
    roles = stanza_roles(size, f)
    assert roles.fc_ranks == tuple(range(size - f, size))
    assert roles.conv_ranks == tuple(range(size - f))
    assert [roles.role(r) for r in range(size)] == [CONV] * (size - f) + [FC] * f
    assert roles.role(0) == CONV
    assert roles.layout() == {"size": size, "fc_workers": f}


@pytest.mark.parametrize("size, f", LAYOUTS)
def test_every_conv_rank_has_one_fc_worker_and_the_groups_are_contiguous_and_balanced(size, f):
    roles = stanza_roles(size, f)
    s = size - f
    served = [roles.conv_workers(r) for r in roles.fc_ranks]
    # Contiguous and in order: the groups, concatenated, are the conv ranks.
    assert [r for group in served for r in group] == list(range(s))
    lengths = [len(group) for group in served]
    assert min(lengths) >= 1 and max(lengths) - min(lengths) <= 1 and sum(lengths) == s
    for fc_rank, group in zip(roles.fc_ranks, served):
        assert all(roles.fc_worker(c) == fc_rank for c in group)


def test_known_layouts():
    assert stanza_roles(4, 1).groups == ((0, 1, 2),)
    assert stanza_roles(4, 2).groups == ((0,), (1,))
    assert stanza_roles(5, 2).groups == ((0,), (1, 2))
    assert stanza_roles(10, 3).groups == ((0, 1), (2, 3), (4, 5, 6))


def test_asking_a_rank_of_the_other_role_is_an_error():
    roles = stanza_roles(4, 1)
    with pytest.raises(ValueError, match="rank 3 is an FC worker"):
        roles.fc_worker(3)
    with pytest.raises(ValueError, match="rank 0 is a conv worker"):
        roles.conv_workers(0)
    with pytest.raises(ValueError, match="rank=4 is not a rank of a world of 4"):
        roles.role(4)


@pytest.mark.parametrize("size, f, reason", [
    (4, 0, "at least one FC worker"),
    (4, -1, "at least one FC worker"),
    (4, 4, "no conv worker"),
    (4, 5, "no conv worker"),
    (4, 3, "1 conv workers cannot feed 3 FC workers"),
    (4, 1.0, "the number of FC workers"),
    (4, "1", "the number of FC workers"),
    (4, True, "the number of FC workers"),
    (4, None, "the number of FC workers"),
    (1, 1, "Stanza needs at least 2 ranks"),
])
def test_bad_fc_workers_name_the_argument_its_value_and_the_world_size(size, f, reason):
    with pytest.raises(ValueError) as error:
        stanza_roles(size, f)
    message = str(error.value)
    assert f"fc_workers={f!r}" in message
    assert f"world of {size} ranks" in message
    assert reason in message


def test_numpy_integers_are_accepted():
    assert stanza_roles(np.int64(6), np.int32(2)) == stanza_roles(6, 2)


def test_weighted_mean_losses_sum_to_the_global_mean_and_gradients_are_summed():
    # Per-sample losses of a global batch of 2 + 3 + 4 = 9 samples, split over three
    # conv workers; two FC workers serve (0, 1) and (2,).
    losses = np.random.default_rng(0).random(9)
    parts = [losses[:2], losses[2:5], losses[5:]]
    sizes = [len(p) for p in parts]
    first = loss_weights(sizes[:2], 9) @ [p.mean() for p in parts[:2]]
    second = loss_weights(sizes[2:], 9) @ [parts[2].mean()]
    # Summed over FC workers (not averaged), the weighted means are the global mean.
    assert first + second == pytest.approx(losses.mean(), rel=1e-15)
    np.testing.assert_array_equal(loss_weights([2, 3], 9), [2 / 9, 3 / 9])


def test_loss_weights_refuse_a_global_batch_smaller_than_the_local_one():
    with pytest.raises(ValueError, match="global_batch=4 must be an integer of at least 5"):
        loss_weights([2, 3], 4)
    with pytest.raises(ValueError, match="batch_sizes"):
        loss_weights([-1, 3], 4)


# --- fc_workers="auto" -------------------------------------------------------------------

def test_the_probe_times_the_busiest_fc_workers_batch_for_every_allowed_f():
    # 8 ranks, batch 4: F=1 feeds 7 conv workers, F=2 ceil(6/2)=3, F=3 ceil(5/3)=2,
    # F=4 one each.
    assert probe_counts(8, 4) == (4, 8, 12, 28)
    assert probe_counts(2, 32) == (32,)


def test_auto_takes_the_smallest_f_whose_head_keeps_up_with_the_features():
    # A head costing 1 ms per sample against features costing 10 ms per batch of 4.
    head = {count: 0.001 * count for count in probe_counts(8, 4)}
    assert auto_fc_workers(8, 4, conv_seconds=0.030, head_seconds=head) == 1   # 28 ms
    assert auto_fc_workers(8, 4, conv_seconds=0.012, head_seconds=head) == 2   # 12 ms
    assert auto_fc_workers(8, 4, conv_seconds=0.010, head_seconds=head) == 3   # 8 ms
    assert auto_fc_workers(8, 4, conv_seconds=0.005, head_seconds=head) == 4   # 4 ms
    # Even one sample per conv worker's batch is slower: as many as allowed.
    assert auto_fc_workers(8, 4, conv_seconds=0.001, head_seconds=head) == 4


def test_auto_needs_every_probed_count_and_two_ranks():
    with pytest.raises(ValueError, match="no time for 28 samples"):
        auto_fc_workers(8, 4, 1.0, {4: 0.1})
    with pytest.raises(ValueError, match="at least 2 ranks"):
        auto_fc_workers(1, 4, 1.0, {})


def test_the_ranks_agree_on_the_median_of_each_probed_figure():
    figures = [(0.010, {4: 0.001, 8: 0.004}), (0.030, {4: 0.002, 8: 0.002}),
               (0.020, {4: 0.009, 8: 0.003})]
    assert median_probe(figures) == (0.020, {4: 0.002, 8: 0.003})
    with pytest.raises(ValueError, match="different sample counts"):
        median_probe([(0.1, {4: 0.1}), (0.1, {8: 0.1})])
