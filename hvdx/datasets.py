"""Real data that needs no download: scikit-learn's bundled digits (8x8, 10 classes)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Digits", "digits"]


@dataclass(frozen=True)
class Digits:
    """Train/test split of the digits data set, images as float32 ``N x 1 x 8 x 8``."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    def shard(self, rank: int, size: int) -> "Digits":
        """This rank's disjoint share of the training set (the test set stays whole)."""
        return Digits(self.x_train[rank::size], self.y_train[rank::size],
                      self.x_test, self.y_test)


def digits(test_fraction: float = 0.25, seed: int = 0) -> Digits:
    """Load, scale to [0, 1] and split the 1,797 digits images the same way on every rank."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise ImportError("the digits data set needs scikit-learn: pip install "
                          "'hvdx[test]' or run scripts/setup") from e
    data = load_digits()
    x = (data.images.astype(np.float32) / 16.0)[:, None, :, :]
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(len(y) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return Digits(x[train], y[train], x[test], y[test])
