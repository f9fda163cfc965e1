"""graphopt.tools.metrics on hand-computed vectors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from graphopt.tools import metrics


def test_cosine_of_parallel_orthogonal_and_45_degree_vectors():
    assert metrics.cosine_similarity([1, 2, 3], [1, 2, 3]) == pytest.approx(1.0)
    assert metrics.cosine_similarity([1, 2], [2, 4]) == pytest.approx(1.0)
    assert metrics.cosine_similarity([1, 2], [-1, -2]) == pytest.approx(-1.0)
    assert metrics.cosine_similarity([1, 0], [0, 1]) == 0.0
    assert metrics.cosine_similarity([1, 0], [1, 1]) == pytest.approx(1 / math.sqrt(2))
    # 2-D inputs are flattened: [[1,0],[0,0]]·[[1,0],[0,1]] = 1, norms 1 and √2.
    assert metrics.cosine_similarity([[1, 0], [0, 0]], [[1, 0], [0, 1]]) == pytest.approx(1 / math.sqrt(2))


def test_cosine_of_zero_vectors_and_huge_values():
    assert metrics.cosine_similarity([0, 0], [0, 0]) == 1.0
    assert metrics.cosine_similarity([0, 0], [0, 1e-30]) == 0.0
    assert metrics.cosine_similarity([3, 4], [0, 0]) == 0.0
    # 1e200 squared overflows float64; the scaled computation does not.
    assert metrics.cosine_similarity([1e200, 1e200], [1e200, 0]) == pytest.approx(1 / math.sqrt(2))


def test_a_one_element_tensor_is_judged_by_its_relative_error():
    # Its cosine is only its sign: a probability of 0.028 read as 0.492 scored 1.0, and an
    # int4 compile of such a model passed --verify. It scores what a vector with an error of
    # that relative size across it would: 1/sqrt(1 + e^2).
    assert metrics.cosine_similarity([0.028], [0.492]) == pytest.approx(
        1 / math.hypot(1, 0.464 / 0.028))
    assert metrics.cosine_similarity([[0.5]], [[0.52]]) == pytest.approx(1 / math.hypot(1, 0.04))
    assert metrics.cosine_similarity([0.5], [0.52]) > 0.999 > metrics.cosine_similarity(
        [0.5], [0.53])
    assert metrics.cosine_similarity([-2.0], [-2.0]) == 1.0
    assert metrics.cosine_similarity([2.0], [-2.0]) == pytest.approx(-1 / math.sqrt(5))
    assert metrics.cosine_similarity([0.0], [1e-9]) == 0.0
    assert metrics.cosine_similarity([3e300], [-3e300]) == pytest.approx(-1 / math.sqrt(5))


def test_slice_cosines_take_each_index_of_the_axis_alone():
    rng = np.random.default_rng(3)
    ref = rng.standard_normal((2, 4, 5))
    cand = ref + rng.standard_normal((2, 4, 5)) * np.array([0.0, 0.1, 1.0, 3.0])[None, :, None]
    got = metrics.slice_cosines(ref, cand, axis=1)
    expected = [metrics.cosine_similarity(ref[:, i], cand[:, i]) for i in range(4)]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert got[0] == pytest.approx(1.0) and got[3] < got[2] < got[1] < 1.0
    # The whole-tensor conventions hold per slice: two zero slices agree, one does not.
    zeros = metrics.slice_cosines([[0.0, 0.0], [0.0, 0.0], [1e200, 1e200]],
                                  [[0.0, 0.0], [0.0, 1.0], [1e200, 0.0]], axis=0)
    np.testing.assert_allclose(zeros, [1.0, 0.0, 1 / math.sqrt(2)])


def test_absolute_errors_and_rmse():
    assert metrics.absolute_errors([1, 2, 3], [1.5, 2, 2]) == (1.0, 0.5)
    assert metrics.absolute_errors(np.zeros(0), np.zeros(0)) == (0.0, 0.0)
    assert metrics.rmse([0, 0], [3, 4]) == pytest.approx(math.sqrt(12.5))
    assert metrics.rmse([1, 2], [1, 2]) == 0.0


def test_relative_errors_skip_zero_reference_elements():
    # |3-2|/2 = 0.5, the 0 is skipped, |3-4|/4 = 0.25.
    assert metrics.relative_errors([2, 0, 4], [3, 1, 3]) == (0.5, 0.375)
    assert metrics.relative_errors([-2], [-1]) == (0.5, 0.5)
    assert metrics.relative_errors([0, 0], [1, 1]) is None


def test_kl_divergence_of_distributions():
    p, q = [0.5, 0.5], [0.25, 0.75]
    one_row = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)  # 0.143841…
    assert metrics.kl_divergence(p, q) == pytest.approx(one_row)
    assert metrics.kl_divergence(p, p) == 0.0
    # Rows along the last axis are averaged: the second row is identical, so half of one_row.
    assert metrics.kl_divergence([p, p], [q, p]) == pytest.approx(one_row / 2)
    assert metrics.kl_divergence([1.0, 0.0], [0.5, 0.5]) == pytest.approx(math.log(2))  # p=0 adds 0
    assert metrics.kl_divergence([0.5, 0.5], [1.0, 0.0]) == math.inf


def test_kl_of_rows_off_a_unit_sum_is_never_negative():
    # Rows within 1e-3 of summing to one count as distributions; unnormalized, a candidate
    # row of 1.0008 made the divergence -0.0008.
    assert metrics.kl_divergence([[0.5, 0.5]], [[0.5004, 0.5004]]) == 0.0
    p, q = np.array([0.7, 0.3]), np.array([0.6, 0.4])
    exact = float(np.sum(p * np.log(p / q)))
    assert metrics.kl_divergence(p, q * 1.0009) == pytest.approx(exact)


def test_kl_is_none_unless_both_sides_are_distributions():
    assert metrics.kl_divergence([0.5, 0.6], [0.5, 0.5]) is None   # row sums 1.1
    assert metrics.kl_divergence([1.5, -0.5], [0.5, 0.5]) is None  # a negative entry
    assert metrics.kl_divergence([0.5, 0.5], [1.5, -0.5]) is None
    assert metrics.kl_divergence([[1.0]], [[1.0]]) is None         # one class is no distribution
    assert metrics.kl_divergence(np.float32(1.0), np.float32(1.0)) is None
    assert metrics.kl_divergence(np.array([1, 0]), np.array([1, 0])) is None  # integers


def test_is_distribution_tolerates_float32_rounding_only():
    logits = np.random.default_rng(0).standard_normal((4, 1000)).astype(np.float32)
    softmax = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    assert metrics.is_distribution(softmax.astype(np.float32))
    assert not metrics.is_distribution(softmax * 1.01)
    assert not metrics.is_distribution(logits)


def test_allclose_mismatches_uses_atol_plus_rtol_times_reference():
    # Bounds: 1e-5 + 1e-4·1 = 1.1e-4 and 1e-5 + 1e-4·100 = 0.01001.
    assert metrics.allclose_mismatches([1, 100], [1 + 1e-4, 100.01], 1e-4, 1e-5) == 0
    assert metrics.allclose_mismatches([1, 100], [1 + 2e-4, 100.02], 1e-4, 1e-5) == 2
    assert metrics.allclose_mismatches([0, 0], [1e-5, 2e-5], 0, 1e-5) == 1


def test_nonfinite_counts():
    assert metrics.nonfinite_counts([1.0, np.nan, np.inf, -np.inf, np.nan]) == (2, 2)
    assert metrics.nonfinite_counts(np.array([1, 2])) == (0, 0)


def test_integers_past_float64_precision_keep_their_differences():
    a = np.array([2 ** 60, 5], np.int64)
    b = a.copy()
    b[0] += 1  # the same float64, a different int64
    assert metrics.absolute_errors(a, b) == (1.0, 0.5)
    assert metrics.rmse(a, b) == pytest.approx(math.sqrt(0.5))


def test_rmse_of_huge_values_does_not_overflow(recwarn):
    x = np.array([1e300, -1e300])
    assert metrics.rmse(x, -x) == pytest.approx(2e300)
    assert metrics.rmse([], []) == 0.0
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_identical_tensors_have_a_cosine_of_exactly_one():
    # The norms' rounding made this 0.9999999999999999, failing "--min-cosine 1".
    x = np.random.default_rng(2).standard_normal(1000).astype(np.float32) * 3
    assert metrics.cosine_similarity(x, x.copy()) == 1.0


def test_differences_past_the_float64_limit_are_inf_not_nan(recwarn):
    ref, cand = np.array([1e308, 1.0]), np.array([-1e308, 1.0])
    assert metrics.absolute_errors(ref, cand)[0] == math.inf
    assert metrics.rmse(ref, cand) == math.inf
    assert metrics.relative_errors(ref, cand) == (2.0, 1.0)  # |c - r| / |r| = 2 and 0
    assert metrics.allclose_mismatches(ref, cand, 1e-4, 1e-5) == 1
    # An infinity is close to itself alone, though rtol·|inf| is inf.
    assert metrics.allclose_mismatches([np.inf, np.inf], [np.inf, -np.inf], 1e-4, 1e-5) == 1
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_numerics_judge_infinities_without_warnings(recwarn):
    from graphopt import numerics

    expected = {"y": np.array([np.inf, -np.inf, 1.0], np.float32)}
    assert numerics.compare(expected, {"y": expected["y"].copy()}, 1e-4, 1e-5) == []
    (problem,) = numerics.compare(expected, {"y": np.array([-np.inf, -np.inf, 1.0],
                                                           np.float32)}, 1e-4, 1e-5)
    assert "1/3 element(s) beyond" in str(problem)
    assert numerics.max_abs_error(expected, expected) == 0.0
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_verify_and_compare_share_one_tolerance_rule():
    from graphopt import numerics

    ref = np.array([1.0, np.nan, np.inf, 100.0, 0.0], np.float32)
    cand = np.array([1.00005, np.nan, np.inf, 100.2, 2e-5], np.float32)
    assert metrics.beyond_tolerance(ref, cand, 1e-4, 1e-5).tolist() == [
        False, False, False, True, True]  # NaN is close to NaN, inf to itself
    (problem,) = numerics.compare({"y": ref}, {"y": cand}, 1e-4, 1e-5)
    assert "2/5 element(s) beyond" in str(problem) and problem.max_abs == pytest.approx(0.2, 1e-4)
