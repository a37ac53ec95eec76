"""Stanza's framework-neutral protocol pieces: micro-batch bounds, the first step's
agreement, the weighted loss, and the messages every rank raises alike. Expectations are
written out from the definitions (numpy's array_split for the bounds)."""

import numpy as np
import pytest

from hvdx.strategies.stanza.core_roles import mean_loss, weighted_loss
from hvdx.strategies.stanza.core_checks import (Samples, agreed_samples, check_micro_batches,
                                                check_settings, layout_error, micro_batch_bounds,
                                                samples_error, target_error)

pytestmark = [pytest.mark.stanza]

A = Samples((6,), "float64", (), "int64")
B = Samples((7,), "float64", (), "int64")


@pytest.mark.parametrize("samples, count", [(11, 1), (11, 3), (9, 5), (3, 5), (0, 2)])
def test_micro_batch_bounds_are_numpys_array_split(samples, count):
    parts = np.array_split(np.arange(samples), count)
    assert [list(range(lo, hi)) for lo, hi in micro_batch_bounds(samples, count)] == \
        [list(p) for p in parts]


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2", None])
def test_bad_micro_batches_name_the_value(value):
    with pytest.raises(ValueError, match=rf"micro_batches={value!r} must be an integer"):
        check_micro_batches(value)


def test_settings_give_roles_or_none_for_auto_with_an_example():
    assert check_settings(4, 2, 1, False, "None", "loader").fc_ranks == (2, 3)
    assert check_settings(4, "auto", 3, True, "a batch", "loader") is None
    with pytest.raises(ValueError, match="first batch of your dataset"):
        check_settings(4, "auto", 1, False, "None", "dataset")
    with pytest.raises(ValueError, match="at least 2 ranks"):
        check_settings(1, "auto", 1, True, "a batch", "loader")


def test_the_first_step_agrees_on_the_first_conv_workers_samples_or_the_first_error():
    assert agreed_samples([(A, None, (5,)), (A, None, (4,)), (None, None, None)]) == \
        (A, None, (5,))
    _, message, _ = agreed_samples([(A, None, None), (B, None, None), (None, None, None)])
    assert message == ("Stanza.step: the conv workers' batches differ: rank 0's gives "
                       f"{A.describe()}, rank 1's gives {B.describe()}")
    assert agreed_samples([(A, None, None), (None, "late", None), (None, "x", None)]) == \
        (None, "late", None)
    assert samples_error(3, A, A) is None
    assert "rank 3's batch gives activations [*, 7]" in samples_error(3, B, A)


def test_the_weighted_loss_is_the_mean_over_the_global_batch():
    values = np.array([0.5, 2.0, 7.0, 1.0, 4.0])
    sizes, global_batch = [2, 0, 3], 10
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    objective, losses = weighted_loss(sizes, bounds, global_batch,
                                      lambda lo, hi: (values[lo:hi].mean(),) * 2,
                                      lambda part, weight: part * weight)
    # A source without samples is skipped; the others weigh b_k / B.
    assert np.isnan(losses[1]) and losses[0] == 1.25 and losses[2] == 4.0
    assert objective == pytest.approx(values.sum() / global_batch)
    total, count = mean_loss(sizes, losses)
    assert (total, count) == (pytest.approx(values.sum()), 5)
    assert weighted_loss([0, 0], [0, 0, 0], 0, None, None)[0] is None


def test_a_checkpoint_of_another_layout_and_a_bad_full_model_rank_are_named():
    mine = {"size": 4, "fc_workers": 1, "rank": 3, "role": "fc"}
    assert layout_error("Stanza.state", 3, dict(mine), mine) is None
    message = layout_error("Stanza.state", 3, dict(mine, fc_workers=2), mine)
    assert message.startswith("Stanza.state: rank 3's state was saved as a fc worker "
                              "(rank 3) of 4 ranks with fc_workers=2; this trainer runs")
    assert target_error([0, 0], 2) is None
    assert target_error([0, 1], 2) == \
        "Stanza.full_model: the ranks asked for different ranks: [0, 1]"
    assert "rank=2 is not a rank of this job of 2 ranks" in target_error([2, 2], 2)
    assert "rank='a' is not a rank" in target_error(["'a'"] * 2, 2)
