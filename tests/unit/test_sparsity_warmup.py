"""DGC's sparsity warm-up: the ratio falls geometrically from 0.25 to its value."""

import math

import pytest

from hvdx.strategies.topk.core_bidirectional import TopKConfig
from hvdx.strategies.topk.core_sparsity_warmup import DGC_START_RATIO, config_at, warmup_ratio

pytestmark = [pytest.mark.topk]


def test_four_steps_give_dgcs_densities_from_75_to_99_9_percent_sparsity():
    # DGC (arXiv 1712.01887, 3.3): 75%, 93.75%, 98.4375%, 99.6%, then 99.9% sparsity.
    ratios = [warmup_ratio(0.001, step, 4) for step in range(6)]
    assert ratios[0] == DGC_START_RATIO
    for got, want in zip(ratios, [0.25, 0.0625, 0.015625, 0.00390625, 0.001, 0.001]):
        assert got == pytest.approx(want, rel=0.03)  # 0.004 ** (1/4) is 0.2515, not 1/4


@pytest.mark.parametrize("steps", [1, 3, 10])
def test_the_ratio_falls_by_one_factor_per_step_and_then_holds(steps):
    ratios = [warmup_ratio(0.01, step, steps) for step in range(steps + 3)]
    factors = [b / a for a, b in zip(ratios[:steps], ratios[1:steps + 1])]
    assert factors == pytest.approx([(0.01 / 0.25) ** (1 / steps)] * steps)
    assert ratios[steps:] == [0.01] * 3


def test_no_warm_up_and_ratios_above_the_start_are_left_alone():
    assert warmup_ratio(0.01, 0, 0) == 0.01
    assert [warmup_ratio(0.5, step, 4) for step in range(5)] == [0.5] * 5
    config = TopKConfig(0.01, 0.01)
    assert config_at(config, 7, 4) is config
    assert config_at(config, -2, 0) is config  # dry runs before compression starts
    assert warmup_ratio(0.01, -2, 4) == DGC_START_RATIO


def test_both_directions_follow_the_path_to_their_own_ratio():
    config = TopKConfig(0.01, downlink_ratio=0.04, topk_method="sampled_threshold", seed=3)
    mid = config_at(config, 1, 2)
    assert mid.ratio == pytest.approx(math.sqrt(0.25 * 0.01))
    assert mid.downlink_ratio == pytest.approx(math.sqrt(0.25 * 0.04))
    assert (mid.topk_method, mid.seed) == ("sampled_threshold", 3)
    assert config_at(TopKConfig(0.01), 0, 2).downlink_ratio is None
