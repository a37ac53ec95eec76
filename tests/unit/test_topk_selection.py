"""TopK selection keeps the largest magnitudes, deterministically; the sampled threshold
selector keeps at most k of them and reports its recall."""

import numpy as np
import pytest

from hvdx.strategies.topk.core_selection import (
    benchmark_selection,
    k_for,
    recall,
    select_exact,
    select_threshold,
)

pytestmark = [pytest.mark.topk]


def gaussian(n, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(n).astype(dtype)


def by_sort(x, k):
    """Reference: stable sort by descending |x| (ties: smaller index first)."""
    order = np.lexsort((np.arange(x.size), -np.abs(x)))
    return np.sort(order[:k])


# --- k_for ------------------------------------------------------------------------------

def test_k_is_ceil_of_ratio_times_n_and_at_least_one():
    assert k_for(0.01, 10_000) == 100
    assert k_for(0.01, 10_001) == 101
    assert k_for(0.001, 10) == 1
    assert k_for(1.0, 7) == 7
    assert k_for(0.5, 0) == 0


def test_k_is_taken_on_the_decimal_ratio_not_its_binary_rounding():
    # 0.07 * 100 == 7.000000000000001 in binary floating point.
    assert k_for(0.07, 100) == 7


@pytest.mark.parametrize("ratio", [0, -0.1, 1.5, float("nan"), True, "0.1"])
def test_a_ratio_outside_zero_one_is_a_value_error_naming_ratio(ratio):
    with pytest.raises(ValueError, match=r"ratio=.* must be in \(0, 1\]"):
        k_for(ratio, 100)


def test_the_message_shows_the_value():
    with pytest.raises(ValueError, match=r"^ratio=1\.5 must be in \(0, 1\]$"):
        k_for(1.5, 10)


# --- select_exact -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,k", [(1000, 1), (1000, 10), (1000, 999), (7, 3), (300_000, 3000)])
def test_exact_keeps_exactly_the_k_largest_magnitudes(n, k, dtype):
    x = gaussian(n, seed=n + k, dtype=dtype)
    indices, values = select_exact(x, k)
    assert indices.dtype == np.int64 and values.dtype == dtype
    np.testing.assert_array_equal(indices, by_sort(x, k))
    np.testing.assert_array_equal(values, x[indices])
    assert np.all(np.diff(indices) > 0)


def test_exact_on_all_equal_magnitudes_picks_the_smallest_indices():
    x = np.array([1.0, -1.0, 1.0, -1.0, 1.0, -1.0], np.float32)
    indices, values = select_exact(x, 4)
    np.testing.assert_array_equal(indices, [0, 1, 2, 3])
    np.testing.assert_array_equal(values, [1, -1, 1, -1])


def test_exact_breaks_ties_at_the_boundary_by_smaller_index_only():
    x = np.array([0.5, 3.0, 0.5, 2.0, 0.5, 0.5, -3.0], np.float64)
    np.testing.assert_array_equal(select_exact(x, 4)[0], [0, 1, 3, 6])
    # Many ties scattered over a long vector: argpartition's order must not leak through.
    rng = np.random.default_rng(3)
    y = rng.choice(np.array([-2.0, -1.0, 1.0, 2.0, 0.0]), size=100_000)
    for k in (1, 17, 20_000, 50_000, 79_999):
        np.testing.assert_array_equal(select_exact(y, k)[0], by_sort(y, k))


def test_exact_is_a_function_of_its_input():
    x = np.round(gaussian(50_000, seed=4), 1)  # many ties
    first = select_exact(x, 500)
    for _ in range(3):
        again = select_exact(x.copy(), 500)
        np.testing.assert_array_equal(again[0], first[0])


def test_exact_edge_cases_of_k():
    x = gaussian(10)
    indices, values = select_exact(x, 0)
    assert indices.size == 0 and values.size == 0 and values.dtype == np.float32
    for k in (10, 11, 10**9):
        indices, values = select_exact(x, k)
        np.testing.assert_array_equal(indices, np.arange(10))
        np.testing.assert_array_equal(values, x)
    assert select_exact(np.zeros(0, np.float32), 3)[0].size == 0
    with pytest.raises(ValueError, match="k=-1"):
        select_exact(x, -1)
    with pytest.raises(ValueError, match="1-D"):
        select_exact(x.reshape(2, 5), 1)


def test_exact_does_not_modify_its_input():
    x = gaussian(1000)
    kept = x.copy()
    select_exact(x, 10)
    np.testing.assert_array_equal(x, kept)


# --- select_threshold -------------------------------------------------------------------

@pytest.mark.parametrize("n,ratio", [(200_000, 0.01), (1_000_000, 0.001), (50_000, 0.1),
                                     (5_000, 0.01)])
def test_threshold_returns_at_most_k_with_recall_of_at_least_0_9(n, ratio):
    rng = np.random.default_rng(7)
    for seed in range(5):
        x = gaussian(n, seed=seed)
        k = k_for(ratio, n)
        indices, values = select_threshold(x, k, rng)
        assert indices.size <= k
        assert np.all(np.diff(indices) > 0) and indices.dtype == np.int64
        np.testing.assert_array_equal(values, x[indices])
        assert recall(x, indices, k) >= 0.9


def test_threshold_equals_exact_whenever_at_least_k_entries_pass():
    # Step 4 of the docstring: the exact top-k are all above the threshold.
    x = gaussian(300_000, seed=11)
    k = 3000
    indices, _ = select_threshold(x, k, np.random.default_rng(0))
    assert indices.size == k
    np.testing.assert_array_equal(indices, select_exact(x, k)[0])


class FixedSample:
    """A stand-in generator whose sample positions are chosen by the test."""

    def __init__(self, positions):
        self.positions = np.asarray(positions)

    def integers(self, low, high, size):
        assert size == self.positions.size
        return self.positions


def test_threshold_lowers_once_when_the_sample_overestimates_and_then_is_exact():
    x = np.arange(1000, dtype=np.float64)
    # The sample sees only 800, 802, ..., 998: the first threshold (974) passes 26 < 100
    # entries, the lowered one (898) passes 102, of which the exact top 100 are kept.
    rng = FixedSample(np.arange(800, 1000, 2))
    indices, values = select_threshold(x, 100, rng, sample_size=100)
    np.testing.assert_array_equal(indices, np.arange(900, 1000))
    np.testing.assert_array_equal(values, x[900:])


def test_threshold_returns_the_survivors_when_still_fewer_than_k_pass():
    x = np.arange(1000, dtype=np.float64)
    # The sample is the top 100: thresholds 987, then 949; 51 < 100 entries survive.
    rng = FixedSample(np.arange(900, 1000))
    indices, _ = select_threshold(x, 100, rng, sample_size=100)
    np.testing.assert_array_equal(indices, np.arange(949, 1000))
    assert recall(x, indices, 100) == pytest.approx(np.arange(949, 1000).sum()
                                                    / np.arange(900, 1000).sum())


def test_threshold_on_a_sample_of_zeros_keeps_everything_then_selects_exactly():
    x = np.zeros(100_000, np.float32)
    x[123] = 5.0
    indices, _ = select_threshold(x, 10, np.random.default_rng(0), sample_size=100)
    np.testing.assert_array_equal(indices, select_exact(x, 10)[0])


def test_threshold_draws_depend_only_on_the_size_so_seeded_ranks_stay_in_step():
    a, b = gaussian(200_000, seed=1), gaussian(200_000, seed=2) * 1000
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    select_threshold(a, 2000, rng_a)
    select_threshold(b, 2000, rng_b)
    assert rng_a.integers(1 << 30) == rng_b.integers(1 << 30)


class CountingRng:
    """A generator that records how many positions each draw asked for."""

    def __init__(self, seed=0):
        self.rng, self.sizes = np.random.default_rng(seed), []

    def integers(self, low, high, size):
        self.sizes.append(size)
        return self.rng.integers(low, high, size=size)


@pytest.mark.parametrize("n,k,drawn", [
    (1_000_000, 10_000, 20_480),     # 1%: 256 sampled entries above the threshold
    (1_000_000, 1_000, 65_536),      # 0.1% would need 204800: sample_size caps it
    (1_000_000, 400_000, 1_024),     # the smallest sample drawn
    (500, 5, 500 + 1),               # the whole vector, no draw (see below)
])
def test_threshold_samples_what_puts_256_entries_above_the_threshold(n, k, drawn):
    rng = CountingRng()
    select_threshold(gaussian(n, seed=3), k, rng)
    assert rng.sizes == ([] if drawn > n else [drawn])


def test_a_larger_sample_size_than_needed_changes_nothing():
    x = gaussian(1_000_000, seed=4)
    a = select_threshold(x, 10_000, np.random.default_rng(1), sample_size=20_480)
    b = select_threshold(x, 10_000, np.random.default_rng(1), sample_size=10 ** 7)
    np.testing.assert_array_equal(a[0], b[0])


def test_threshold_edge_cases_of_k_and_sample_size():
    x = gaussian(1000)
    rng = np.random.default_rng(0)
    assert select_threshold(x, 0, rng)[0].size == 0
    np.testing.assert_array_equal(select_threshold(x, 1000, rng)[0], np.arange(1000))
    with pytest.raises(ValueError, match="sample_size=0"):
        select_threshold(x, 10, rng, sample_size=0)


# --- recall -----------------------------------------------------------------------------

def test_recall_is_one_for_the_exact_selection_and_less_for_a_worse_one():
    x = gaussian(10_000, seed=2)
    k = 100
    exact = select_exact(x, k)[0]
    assert recall(x, exact, k) == 1.0
    smallest = np.argsort(np.abs(x))[:k]
    assert recall(x, smallest, k) < 0.01
    assert recall(x, exact[:50], k) == pytest.approx(
        np.abs(x[exact[:50]]).sum() / np.abs(x[exact]).sum())


def test_recall_of_equal_magnitudes_elsewhere_is_one_and_too_many_indices_is_an_error():
    x = np.ones(10, np.float32)
    assert recall(x, [7, 8, 9], 3) == 1.0
    assert recall(np.zeros(5), [], 2) == 1.0
    with pytest.raises(ValueError, match="more than k=2"):
        recall(x, [1, 2, 3], 2)


def test_benchmark_selection_reports_timings_and_recall():
    result = benchmark_selection(n=100_000, ratio=0.01, repeat=1)
    assert set(result) == {"n", "k", "abs_s", "exact_s", "threshold_s", "recall"}
    assert result["k"] == 1000 and result["recall"] >= 0.9
    assert all(result[key] > 0 for key in ("abs_s", "exact_s", "threshold_s"))
