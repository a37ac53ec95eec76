"""The example ring strategy (tests/mpi/ring_strategy.py) as one more catalogue line, and
its mixing matrix written out for the numpy references of the tests that run it."""

import sys

import numpy as np

import ring_strategy
from hvdx.strategies import catalogue


def add_the_ring(monkeypatch) -> None:
    """The example's module stands in for hvdx/strategies/ring/spec.py, and its entry is
    one more line of the catalogue (undone when the test ends)."""
    monkeypatch.setitem(sys.modules, "hvdx.strategies.ring.spec", ring_strategy)
    monkeypatch.setattr(catalogue, "BUILT_IN", catalogue.BUILT_IN + (ring_strategy.RING,))


def ring_matrix(n: int) -> np.ndarray:
    """``x_i <- mean(x_{i-1}, x_i, x_{i+1})`` (two ranks: the mean of both; one: 1)."""
    w = np.zeros((n, n))
    for i in range(n):
        for j in {(i - 1) % n, i, (i + 1) % n}:
            w[i, j] = 1.0
    return w / w.sum(axis=1, keepdims=True)
