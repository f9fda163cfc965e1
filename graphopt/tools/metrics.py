"""Accuracy metrics between a reference and a candidate tensor (numpy only, msaccucmp's set).

Every function takes two arrays of the same shape, `reference` first, and computes in float64.
They assume finite values; the caller reports NaN/Inf separately (see `nonfinite_counts`).

- cosine similarity of the flattened tensors. Two all-zero tensors are identical (1.0); exactly
  one all-zero tensor has no direction to agree with (0.0), so a --min-cosine rule fails it.
  A one-element tensor (a wake word's or a voice detector's probability) has no direction but
  its sign, so its cosine would read 1.0 for 0.028 against 0.492: it scores 1/√(1 + e²), e
  its relative error, the cosine a vector has with an error of that relative size across it
  (0.999 is an error of 4.5%, 0.98 one of 20%), negated where the sign flips.
- norm agreement (norm_agreement): a cosine does not see a change of scale, so a MOS model's
  [1,3] scores all 30% high read cosine 1.0; 1/√(1 + e²) of the norms' relative difference e
  puts the scale on the cosine's own footing (0.999: 4.5%), which a cosine rule checks too.
- per-slice cosine along an axis (slice_cosines): the worst channel of a detector's output,
  whose whole-tensor cosine the large box coordinates decide while its class scores are tiny.
- absolute error |c - r|: max and mean.
- relative error |c - r| / |r| over the elements where r != 0 (an element with r == 0 has no
  scale; absolute error covers it); None when every reference element is zero.
- RMSE: sqrt(mean((c - r)^2)).
- KL(reference || candidate), only where both tensors are probability distributions along the
  last axis (see `is_distribution`): the mean over rows of sum p·log(p/q), a p == 0 term counting
  0 and a q == 0 under p > 0 making it inf. Logits are not softmaxed first: that would score a
  distribution the model never computes, and cosine/abs errors already judge logits.
"""

from __future__ import annotations

import numpy as np

# How far a row sum may stray from 1 and still be a distribution: float32 softmax rows of a few
# thousand classes sum to 1 within ~1e-6, so 1e-3 separates them clearly from other tensors.
DISTRIBUTION_SUM_TOLERANCE = 1e-3


def _f64(array) -> np.ndarray:
    return np.asarray(array, dtype=np.float64).reshape(-1)


def cosine_similarity(reference, candidate) -> float:
    r, c = _f64(reference), _f64(candidate)
    if np.array_equal(r, c):
        return 1.0  # exactly: rounding in the norms made identical tensors fail "cosine >= 1"
    # Scaled by the largest magnitude first, so squares of huge values cannot overflow.
    scale = max(float(np.max(np.abs(r), initial=0.0)), float(np.max(np.abs(c), initial=0.0)))
    if scale == 0.0:
        return 1.0
    r, c = r / scale, c / scale
    if r.size == 1:
        if r[0] == 0.0:
            return 0.0
        agreement = float(1.0 / np.hypot(1.0, (c[0] - r[0]) / r[0]))
        return agreement if c[0] * r[0] >= 0.0 else -agreement  # a flipped sign, as a vector's
    norm_r, norm_c = float(np.linalg.norm(r)), float(np.linalg.norm(c))
    if norm_r == 0.0 or norm_c == 0.0:
        return 0.0
    # Rounding can push |cos| a hair past 1; clip so "cosine >= 1" style checks stay sane.
    return float(np.clip(np.dot(r, c) / (norm_r * norm_c), -1.0, 1.0))


def norm_agreement(reference, candidate) -> tuple[float, float] | None:
    """(1/√(1 + e²), ‖c‖/‖r‖) for e = ‖c‖/‖r‖ - 1: how far the candidate's scale strays from
    the reference's, on cosine_similarity's scale; None for an all-zero reference."""
    r, c = _f64(reference), _f64(candidate)
    scale = max(float(np.max(np.abs(r), initial=0.0)), float(np.max(np.abs(c), initial=0.0)))
    if scale == 0.0:
        return None
    norm_r = float(np.linalg.norm(r / scale))
    if norm_r == 0.0:
        return None
    ratio = float(np.linalg.norm(c / scale)) / norm_r
    return float(1.0 / np.hypot(1.0, ratio - 1.0)), ratio


def slice_cosines(reference, candidate, axis: int = 1) -> np.ndarray:
    """The cosine similarity of each slice along `axis` (a detector's channel, a token's
    position), by cosine_similarity's conventions: one float64 value per index."""
    r = np.moveaxis(np.asarray(reference, dtype=np.float64), axis, 0)
    c = np.moveaxis(np.asarray(candidate, dtype=np.float64), axis, 0)
    r, c = r.reshape(r.shape[0], -1), c.reshape(c.shape[0], -1)
    scale = np.maximum(np.abs(r).max(axis=1, initial=0.0), np.abs(c).max(axis=1, initial=0.0))
    both_zero = scale == 0.0
    scale = np.where(both_zero, 1.0, scale)[:, None]
    r, c = r / scale, c / scale
    norms = np.linalg.norm(r, axis=1) * np.linalg.norm(c, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        cosines = np.clip(np.einsum("ij,ij->i", r, c) / norms, -1.0, 1.0)
    return np.where(both_zero, 1.0, np.where(norms == 0.0, 0.0, cosines))


def absolute_errors(reference, candidate) -> tuple[float, float]:
    """(max, mean) of |c - r|; (0, 0) for empty tensors."""
    diff = _abs_diff(reference, candidate)
    if diff.size == 0:
        return 0.0, 0.0
    return float(diff.max()), float(diff.mean())


# Past 2**53 float64 no longer holds every integer: ids or hashes that far up differ by 1 in
# int64 and not at all as floats, which would report a mismatch with a max error of 0.
_EXACT_IN_FLOAT64 = 2 ** 53


def _abs_diff(reference, candidate) -> np.ndarray:
    r, c = np.asarray(reference).reshape(-1), np.asarray(candidate).reshape(-1)
    if r.dtype.kind in "iu" and c.dtype.kind in "iu" and r.size and max(
            int(np.abs(r.astype(object)).max()), int(np.abs(c.astype(object)).max())
    ) > _EXACT_IN_FLOAT64:
        # Python integers: exact, and no int64 overflow in the difference.
        return np.array([float(abs(int(x) - int(y))) for x, y in zip(c, r)], np.float64)
    with np.errstate(over="ignore"):  # 1e308 - (-1e308) is inf: that is the difference
        return np.abs(_f64(candidate) - _f64(reference))


def relative_errors(reference, candidate) -> tuple[float, float] | None:
    """(max, mean) of |c - r| / |r| over the elements where r != 0; None if there are none."""
    r, c = _f64(reference), _f64(candidate)
    nonzero = r != 0
    if not nonzero.any():
        return None
    r, c = r[nonzero], c[nonzero]
    with np.errstate(over="ignore", invalid="ignore"):
        rel = np.abs(c - r) / np.abs(r)
        # Where c - r overflows (both near the float64 limit), |c/r - 1| is the same ratio.
        overflowed = np.isinf(rel)
        if overflowed.any():
            rel[overflowed] = np.abs(c[overflowed] / r[overflowed] - 1.0)
    return float(rel.max()), float(rel.mean())


def rmse(reference, candidate) -> float:
    diff = _abs_diff(reference, candidate)
    largest = float(diff.max(initial=0.0))
    if largest == 0.0 or largest == float("inf"):  # an overflowed difference: inf, not inf/inf
        return largest
    # Scaled by the largest error first, so squares of huge ones (near 1e300) cannot overflow.
    scaled = diff / largest
    return float(largest * np.sqrt(np.mean(scaled * scaled)))


def is_distribution(array, tolerance: float = DISTRIBUTION_SUM_TOLERANCE) -> bool:
    """Whether `array` holds probability distributions along its last axis: a float tensor of
    rank >= 1 with at least 2 entries per row, no negative entry, every row summing to 1."""
    array = np.asarray(array)
    if array.dtype.kind != "f" or array.ndim == 0 or array.shape[-1] < 2 or array.size == 0:
        return False
    values = array.astype(np.float64)
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        return False
    return bool(np.all(np.abs(values.sum(axis=-1) - 1.0) <= tolerance))


def kl_divergence(reference, candidate) -> float | None:
    """Mean over rows of KL(reference row || candidate row) in nats; None unless both tensors
    are distributions along the last axis."""
    if not (is_distribution(reference) and is_distribution(candidate)):
        return None
    p = np.asarray(reference, dtype=np.float64)
    q = np.asarray(candidate, dtype=np.float64)
    p, q = p.reshape(-1, p.shape[-1]), q.reshape(-1, q.shape[-1])
    # Rows count as distributions within 1e-3 of a unit sum (float16 softmax); the divergence
    # is ≥ 0 only between distributions that each sum to one, so the rows are renormalized,
    # and what rounding leaves below zero is zero.
    p, q = p / p.sum(axis=-1, keepdims=True), q / q.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * (np.log(p) - np.log(q)), 0.0)
    return float(np.maximum(terms.sum(axis=-1), 0.0).mean())


# float16 keeps 11 significant bits: a sum taken in another order may round to the neighbouring
# float16, a step of up to 2⁻¹⁰ of the value that no finer rtol can tell from agreement.
FLOAT16_STEP = 2.0 ** -10


def effective_rtol(reference, candidate, rtol: float) -> float:
    """`rtol`, or float16's step where both tensors are float16 and it is finer than that."""
    if np.asarray(reference).dtype == np.float16 and np.asarray(candidate).dtype == np.float16:
        return max(rtol, FLOAT16_STEP)
    return rtol


def beyond_tolerance(reference, candidate, rtol: float, atol: float) -> np.ndarray:
    """Where |c - r| <= atol + rtol·|r| fails, as a flat bool mask (numpy.allclose's bound;
    between float16 tensors rtol is at least float16's step, effective_rtol).

    An infinity is close to itself alone (rtol·|inf| would take -inf for +inf), and NaN to NaN:
    `compare` reports non-finite values on their own, `--verify` wants a NaN kept a NaN."""
    rtol = effective_rtol(reference, candidate, rtol)
    r, c = _f64(reference), _f64(candidate)
    with np.errstate(over="ignore", invalid="ignore"):  # an overflowed difference is beyond
        close = (np.abs(c - r) <= atol + rtol * np.abs(r)) | (c == r)
    close |= np.isnan(r) & np.isnan(c)
    return ~close | ((np.isinf(r) | np.isinf(c)) & (c != r))


def allclose_mismatches(reference, candidate, rtol: float, atol: float) -> int:
    """How many elements lie beyond the tolerance (see `beyond_tolerance`)."""
    return int(np.count_nonzero(beyond_tolerance(reference, candidate, rtol, atol)))


def nonfinite_counts(array) -> tuple[int, int]:
    """(NaN count, ±Inf count) of a numeric array; (0, 0) for integer and boolean ones."""
    array = np.asarray(array)
    if array.dtype.kind not in "fc":
        return 0, 0
    return int(np.count_nonzero(np.isnan(array))), int(np.count_nonzero(np.isinf(array)))
