"""Sparsity warm-up: TopK's ratio decays exponentially over the first steps.

Deep Gradient Compression (Lin, Han, Mao, Wang & Dally, ICLR 2018, arXiv 1712.01887,
section 3.3) starts training at a low sparsity and raises it exponentially, 75%,
93.75%, 98.4375%, 99.6%, 99.9% over the first epochs: early gradients change fast, and
at a 1% ratio most of what they say would wait in the residuals for many steps while
the model barely moves. hvdx does the same per step:

1. for ``step < warmup_steps`` the ratio is
   ``start * (ratio / start) ** (step / warmup_steps)``, ``start`` being DGC's first
   density 0.25 (or ``ratio`` itself when it is larger): a geometric path from 0.25 to
   ``ratio``, one factor per step;
2. from ``step = warmup_steps`` on the configured ratio holds;
3. the downlink ratio follows the same path to its own value.

A pure function of the step, which every rank counts alike, so every rank keeps the
same ``k`` at every step.
"""

from __future__ import annotations

import dataclasses

from hvdx.strategies.topk.core_bidirectional import TopKConfig

__all__ = ["DGC_START_RATIO", "config_at", "warmup_ratio"]

#: DGC's first density (75% sparsity).
DGC_START_RATIO = 0.25


def warmup_ratio(ratio: float, step: int, warmup_steps: int,
                 start: float = DGC_START_RATIO) -> float:
    """The ratio in force at ``step`` (steps 1 and 2 of the module docstring); a step
    before compression starts (negative) gets the first compressed step's."""
    if step >= warmup_steps or ratio >= start:
        return ratio
    return start * (ratio / start) ** (max(step, 0) / warmup_steps)


def config_at(config: TopKConfig, step: int, warmup_steps: int) -> TopKConfig:
    """``config`` with the uplink and downlink ratios of ``step`` (step 3)."""
    if step >= warmup_steps or warmup_steps <= 0:
        return config
    down = config.downlink_ratio
    return dataclasses.replace(
        config, ratio=warmup_ratio(config.ratio, step, warmup_steps),
        downlink_ratio=None if down is None else warmup_ratio(down, step, warmup_steps))
