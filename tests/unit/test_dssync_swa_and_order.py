"""The numpy reference of DS-Sync's final SWA-style merge and of the tape's
combine-then-adapt order, and the validation of ``swa_start`` / ``swa_every``."""

import numpy as np
import pytest

from hvdx.core.group_averaging import (
    COMBINE_THEN_ADAPT,
    average_in_groups,
    running_mean,
    simulate_dssync,
    swa_due,
)
from hvdx.strategies.dssync.core_schedule import ListSchedule, ShuffleSchedule
from hvdx.strategies.dssync.spec import DSSync

pytestmark = [pytest.mark.dssync]


def setup(n=4, d=3):
    centres = np.random.default_rng(1).normal(size=(n, d))
    initial = np.random.default_rng(2).normal(size=(n, d))
    return centres, initial, (lambda v, t: v - centres)


@pytest.mark.parametrize("kwargs,name", [
    ({"swa_start": -1}, "swa_start=-1"),
    ({"swa_start": 1.5}, "swa_start=1.5"),
    ({"swa_start": True}, "swa_start=True"),
    ({"swa_start": 2, "swa_every": 0}, "swa_every=0"),
    ({"swa_every": 2}, "swa_every=2"),
])
def test_bad_swa_arguments_are_value_errors_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name):
        DSSync("shuffle", group_size=2, **kwargs)


def test_swa_settings_enter_the_fingerprint():
    variants = [DSSync("shuffle", group_size=2).settings(4),
                DSSync("shuffle", group_size=2, swa_start=3).settings(4),
                DSSync("shuffle", group_size=2, swa_start=3, swa_every=2).settings(4)]
    assert len({repr(v) for v in variants}) == 3
    assert "swa_start=3" in repr(DSSync("shuffle", group_size=2, swa_start=3))


def test_swa_due_from_start_every_k_steps():
    assert [t for t in range(12) if swa_due(t, 4, 3)] == [4, 7, 10]
    assert not any(swa_due(t, None) for t in range(5))
    assert [t for t in range(3) if swa_due(t, 0)] == [0, 1, 2]


def test_running_mean_is_the_mean_of_the_samples():
    samples = np.random.default_rng(0).normal(size=(7, 5))
    mean = np.zeros(5)
    for count, sample in enumerate(samples):
        mean = running_mean(mean, count, sample)
    np.testing.assert_allclose(mean, samples.mean(axis=0), rtol=0, atol=1e-14)


@pytest.mark.parametrize("order", ["adapt_then_combine", COMBINE_THEN_ADAPT])
def test_swa_is_the_mean_of_the_averaged_values_at_the_sampled_steps(order):
    centres, initial, grads = setup()
    schedule = ShuffleSchedule(4, 2, seed=3)
    values, swa = simulate_dssync(initial, grads, 0.2, schedule, 9, order=order,
                                  swa_start=2, swa_every=3)
    # By hand: the group-averaged values of steps 2, 5 and 8.
    x, samples = initial.copy(), []
    for t in range(9):
        if order == COMBINE_THEN_ADAPT:
            averaged = average_in_groups(x, schedule.partition(t))
            x = averaged - 0.2 * (x - centres)
        else:
            x = averaged = average_in_groups(x - 0.2 * (x - centres), schedule.partition(t))
        if t in (2, 5, 8):
            samples.append(averaged)
    np.testing.assert_allclose(values, x, rtol=0, atol=1e-15)
    np.testing.assert_allclose(swa, np.mean(samples, axis=0), rtol=0, atol=1e-14)
    # The merge keeps the global mean of the samples.
    np.testing.assert_allclose(swa.mean(axis=0), np.mean(samples, axis=(0, 1)),
                               rtol=0, atol=1e-14)


def test_combine_then_adapt_takes_the_gradient_before_averaging():
    centres, initial, grads = setup(n=2)
    one_group = ListSchedule([[(0, 1)]])
    out = simulate_dssync(initial, grads, 0.5, one_group, 1, order=COMBINE_THEN_ADAPT)
    expected = initial.mean(axis=0) - 0.5 * (initial - centres)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-15)
    # At lr = 0 the two orders are the same averaging.
    a = simulate_dssync(initial, grads, 0.0, one_group, 2)
    b = simulate_dssync(initial, grads, 0.0, one_group, 2, order=COMBINE_THEN_ADAPT)
    np.testing.assert_array_equal(a, b)


def test_unknown_order_is_rejected():
    centres, initial, grads = setup()
    with pytest.raises(ValueError, match="order='sideways'"):
        simulate_dssync(initial, grads, 0.1, ShuffleSchedule(4, 2), 1, order="sideways")
