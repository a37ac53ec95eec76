"""Selecting the k entries of largest magnitude of a flat vector.

Two selectors, both returning ``(indices, values)`` with ``indices`` int64 sorted
ascending and ``values = x[indices]`` in the dtype of ``x``:

- :func:`select_exact`: exactly the k largest ``|x|``, ties broken deterministically
  (larger ``|x|`` first, then smaller index), so every rank that selects from the same
  vector selects the same entries. Cost: one ``np.partition`` over the vector.
- :func:`select_threshold`: Deep Gradient Compression's sampled threshold (Lin, Han, Mao,
  Wang & Dally, "Deep Gradient Compression", ICLR 2018): estimate the threshold from a
  random sample, keep the entries at or above it in one pass, then take the exact top-k
  among the few survivors. Cost: about one ``np.abs`` over the vector.

Inputs must be finite (:meth:`hvdx.strategies.topk.core_error_feedback.ResidualMemory.check_finite`
guards gradients before they reach a selector).
"""

from __future__ import annotations

import math
import time
from fractions import Fraction
from typing import Dict, Tuple

import numpy as np

from hvdx.core.validation import check_integer

__all__ = [
    "DEFAULT_SAMPLE_SIZE",
    "benchmark_selection",
    "check_ratio",
    "k_for",
    "recall",
    "select_exact",
    "select_threshold",
]

#: The most entries sampled to estimate the threshold (DGC samples 0.1% to 1% of a
#: tensor).
DEFAULT_SAMPLE_SIZE = 65_536
#: The threshold targets this many times k survivors, so that fewer than k survive only
#: when the sample is far off.
_OVERSAMPLE = 1.25
#: Sampled entries expected above the threshold. The relative error of the number of
#: survivors is about ``1 / sqrt(_SAMPLE_ABOVE)`` (6%), so fewer than k survive (20%
#: short of the 1.25 k aimed at) about once in 1500 selections. A sample larger than
#: ``_SAMPLE_ABOVE n / (1.25 k)`` (20480 entries at a 1% ratio) costs time and buys little.
_SAMPLE_ABOVE = 256
#: The smallest sample drawn (unless ``sample_size`` is smaller).
_MIN_SAMPLE = 1024
#: Entries compared per block: keeps ``|x|`` of one block in cache instead of writing the
#: whole ``|x|`` to memory and reading it back (about twice as fast on 10M floats).
_BLOCK = 1 << 18

Selection = Tuple[np.ndarray, np.ndarray]


def k_for(ratio: float, n: int) -> int:
    """Number of entries kept of ``n`` at ``ratio``: ``max(1, ceil(ratio * n))`` (0 if n = 0).

    The product is taken on the decimal the ratio is written as, so ``k_for(0.07, 100)``
    is 7, not the 8 that ``ceil(0.07 * 100)`` gives in binary floating point.

    Raises:
        ValueError: ``ratio`` is not a number in (0, 1], or ``n`` is not an integer >= 0.
    """
    ratio = check_ratio(ratio)
    n = check_integer("n", n, 0, at_least=">=")
    if n == 0:
        return 0
    return min(int(n), max(1, math.ceil(Fraction(str(ratio)) * int(n))))


def check_ratio(ratio: float, name: str = "ratio") -> float:
    """``ratio`` as a float if it is a number in (0, 1]; ValueError naming ``name`` if not."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float, np.integer, np.floating)) \
            or not 0 < ratio <= 1:
        raise ValueError(f"{name}={ratio!r} must be in (0, 1]")
    return float(ratio)


def select_exact(x: np.ndarray, k: int) -> Selection:
    """Exactly the ``k`` entries of largest ``|x|``.

    Ties at the boundary go to the smaller index, so the result is a function of ``x``
    and ``k`` only. ``k = 0`` selects nothing, ``k >= len(x)`` selects everything.

    Returns:
        ``(indices, values)``: int64 indices sorted ascending, ``values = x[indices]``.
    """
    x = _vector(x)
    n, k = x.size, check_integer("k", k, 0, at_least=">=")
    if k == 0:
        return np.empty(0, np.int64), x[:0].copy()
    if k >= n:
        return np.arange(n, dtype=np.int64), x.copy()
    a = np.abs(x)
    t = np.partition(a, n - k)[n - k]  # the k-th largest |x|
    # Every entry above t is kept; of those equal to t, the ones with the smallest
    # indices fill the remaining places (a mask, not a sort: O(n) and ascending).
    keep = a > t
    ties = np.flatnonzero(a == t)[:k - int(np.count_nonzero(keep))]
    keep[ties] = True
    indices = np.flatnonzero(keep).astype(np.int64, copy=False)
    return indices, x[indices]


def select_threshold(x: np.ndarray, k: int, rng: np.random.Generator,
                     sample_size: int = DEFAULT_SAMPLE_SIZE) -> Selection:
    """At most ``k`` entries of large ``|x|``, found through a sampled threshold (DGC).

    1. Sample ``s`` entries of ``|x|`` at positions drawn from ``rng`` (the whole vector
       if it is not longer than the sample): ``s`` is ``sample_size`` or, when k is a
       large fraction of ``x``, the fewer that put 256 sampled entries above the
       threshold (at least 1024); sampling costs time, and more entries would not
       change the threshold.
    2. Threshold ``t``: the sample's value ranked so that about ``1.25 k`` entries of
       ``x`` are expected at or above it.
    3. One blocked pass keeps the indices with ``|x| >= t``.
    4. If at least ``k`` survive, return the exact top-k among them: this *is*
       :func:`select_exact` (every entry of the exact top-k is >= t, and ties still go
       to the smaller index).
    5. If fewer than ``k`` survive (the sample was far off), lower the threshold once, to
       the sample value expected to pass ``5 k`` entries, and repeat 3 and 4; if still
       fewer survive, return the survivors: fewer than ``k`` entries, never more. With
       error feedback nothing is lost, the rest stays in the residual.

    The draws from ``rng`` depend only on ``len(x)``, ``k`` and ``sample_size``, never
    on the data, so generators seeded identically on every rank stay in step.

    Returns:
        ``(indices, values)`` as :func:`select_exact`, with ``len(indices) <= k``.
    """
    x = _vector(x)
    n, k = x.size, check_integer("k", k, 0, at_least=">=")
    if k == 0 or k >= n:
        return select_exact(x, k)
    sample_size = check_integer("sample_size", sample_size, 1, at_least=">=")
    needed = math.ceil(_SAMPLE_ABOVE * n / (_OVERSAMPLE * k))
    size = min(int(sample_size), max(_MIN_SAMPLE, needed))
    if n <= size:
        sample = np.abs(x)
    else:
        sample = np.abs(x[rng.integers(0, n, size=size)])
    s = sample.size
    # Sample positions of the thresholds expected to pass ~1.25 k, then ~5 k entries
    # (s - 1 is the sample's largest value); the second is tried only if it is lower.
    positions = [s - 1 - min(s - 1, int(target * s / n))
                 for target in (_OVERSAMPLE * k, 4 * _OVERSAMPLE * k)]
    sample = np.partition(sample, sorted(set(positions)))
    survivors = np.empty(0, np.int64)
    for position in dict.fromkeys(positions):  # distinct, in order
        survivors = _at_least(x, sample[position])
        if survivors.size >= k:
            chosen, values = select_exact(x[survivors], k)
            return survivors[chosen], values
    return survivors, x[survivors]


def recall(x: np.ndarray, approx_indices: np.ndarray, k: int) -> float:
    """Fraction of the exact top-k ``|x|`` mass that an approximate selection captures.

    ``sum |x[approx_indices]| / sum |x[exact top-k]|``, in [0, 1] (1.0 when the exact
    mass is 0). Selecting other entries of equal magnitude costs nothing.

    Raises:
        ValueError: ``approx_indices`` holds more than ``k`` distinct indices.
    """
    x = _vector(x)
    chosen = np.unique(np.asarray(approx_indices, dtype=np.int64))
    if chosen.size > check_integer("k", k, 0, at_least=">="):
        raise ValueError(f"approx_indices holds {chosen.size} distinct indices, more than "
                         f"k={k}")
    best = float(np.abs(select_exact(x, k)[1]).sum(dtype=np.float64))
    if best == 0.0:
        return 1.0
    return min(1.0, float(np.abs(x[chosen]).sum(dtype=np.float64)) / best)


def benchmark_selection(n: int = 10_000_000, ratio: float = 0.01, seed: int = 0,
                        repeat: int = 3) -> Dict[str, float]:
    """Time ``np.abs`` against both selectors on ``n`` Gaussian float32 values.

    Returns:
        ``{"n", "k", "abs_s", "exact_s", "threshold_s", "recall"}``: the best of
        ``repeat`` wall-clock timings in seconds, and the threshold selector's recall.
    """
    x = np.random.default_rng(seed).standard_normal(n, dtype=np.float32)
    k = k_for(ratio, n)
    rng = np.random.default_rng(seed + 1)

    def best(fn):
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    indices = select_threshold(x, k, rng)[0]
    return {"n": n, "k": k,
            "abs_s": best(lambda: np.abs(x)),
            "exact_s": best(lambda: select_exact(x, k)),
            "threshold_s": best(lambda: select_threshold(x, k, rng)),
            "recall": recall(x, indices, k)}


def _at_least(x: np.ndarray, t: np.generic) -> np.ndarray:
    """Indices (int64, ascending) where ``|x| >= t``, one cache-sized block at a time."""
    n = x.size
    if n <= _BLOCK:
        return np.flatnonzero(np.abs(x) >= t).astype(np.int64, copy=False)
    magnitude = np.empty(_BLOCK, x.dtype)
    mask = np.empty(_BLOCK, bool)
    found = []
    for lo in range(0, n, _BLOCK):
        block = x[lo:lo + _BLOCK]
        m, keep = magnitude[:block.size], mask[:block.size]
        np.abs(block, out=m)
        np.greater_equal(m, t, out=keep)
        hits = np.flatnonzero(keep)
        if hits.size:
            found.append(hits + lo)
    if not found:
        return np.empty(0, np.int64)
    return np.concatenate(found).astype(np.int64, copy=False)


def _vector(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 1:
        raise ValueError(f"expected a flat 1-D array, got shape {x.shape}")
    return x
