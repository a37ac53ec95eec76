"""What a plan may claim: ties within its error, and the wire's share of a step."""

import pytest

from hvdx.core.cost.verdict import PLAN_TOLERANCE, tied, wire_share


def test_ties_are_the_times_within_the_tolerance_of_the_least_fastest_first():
    times = {"a": 1.30, "b": 1.00, "c": 1.19, "d": 1.21}
    assert tied(times, 0.2) == ["b", "c"]
    assert tied(times, 0.0) == ["b"]
    assert tied(times, 0.31) == ["b", "c", "d", "a"]


def test_the_plans_tolerance_is_its_measured_error_bar():
    assert PLAN_TOLERANCE == 0.20


@pytest.mark.parametrize("times, match", [({}, "no strategy"),
                                          ({"a": 0.0}, r"per_batch\['a'\]=0.0"),
                                          ({"a": -1.0}, r"per_batch\['a'\]=-1.0")])
def test_bad_times_are_refused_naming_the_value(times, match):
    with pytest.raises(ValueError, match=match):
        tied(times)


def test_a_negative_tolerance_is_refused():
    with pytest.raises(ValueError, match="tolerance=-0.1"):
        tied({"a": 1.0}, -0.1)


@pytest.mark.parametrize("step, compute, share", [(100.0, 75.0, 0.25), (100.0, 100.0, 0.0),
                                                  (100.0, 0.0, 1.0), (50.0, 60.0, 0.0)])
def test_the_wire_share_is_the_step_less_its_compute_over_the_step(step, compute, share):
    assert wire_share(step, compute) == pytest.approx(share)


def test_a_step_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match="step_s=0"):
        wire_share(0, 0)
