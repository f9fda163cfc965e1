"""Per-tensor activation statistics streamed over samples, and the clipping range each
calibration method derives from them: min-max, percentile, entropy (KL divergence) and mse (the
range of least quantization mean squared error).

Histogram methods need a fixed bin range before the first sample is binned, so they take two
sweeps over the data: the first finds each tensor's min and max, the second fills a histogram of
BINS bins over [min, max] (see calibrate.py). The entropy search is TensorRT's: over a histogram of
|x|, for each candidate threshold i (in bins) compare the clipped distribution P (outliers folded
into its last bin) with Q, P merged into the quantized levels and spread back over P's non-empty
bins; the threshold with the least KL(P‖Q) wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

METHODS = ("minmax", "percentile", "entropy", "mse")
BINS = 2048          # histogram bins, TensorRT's and onnxruntime's choice
MIN_ENTROPY_BINS = 128  # the smallest candidate threshold, in bins
ENTROPY_STEP = 8        # bins between candidate thresholds


@dataclass
class TensorStats:
    """What one tensor showed over the calibration samples."""

    lo: float = np.inf
    hi: float = -np.inf
    hist: np.ndarray | None = None   # counts over [hist_lo, hist_hi] in BINS equal bins
    hist_lo: float = 0.0
    hist_hi: float = 0.0
    count: int = 0
    samples: int = field(default=0)
    channels: bool = False              # also track the mean of each index of axis 1
    channel_sum: np.ndarray | None = None
    channel_count: int | np.ndarray = 0   # values summed per channel (an array after a NaN)
    nonfinite_samples: int = 0          # samples in which the tensor held a NaN or Inf

    def observe_range(self, x: np.ndarray) -> None:
        if x.size:
            finite = np.isfinite(x)
            seen = x
            if not finite.all():
                # A NaN or Inf is a missing value (an Imputer's input) or a sample the float
                # model cannot compute: the range covers the finite values, the count tells.
                self.nonfinite_samples += 1
                seen, x = x[finite], np.where(finite, x, 0)
            if seen.size:
                self.lo = min(self.lo, float(np.min(seen)))
                self.hi = max(self.hi, float(np.max(seen)))
            if self.channels and x.ndim >= 2:
                axes = (0, *range(2, x.ndim))
                sums = np.sum(x, axis=axes, dtype=np.float64)
                self.channel_sum = sums if self.channel_sum is None else self.channel_sum + sums
                # per channel, the finite values the sums hold (a NaN was summed as 0)
                self.channel_count = self.channel_count + (
                    x.size // x.shape[1] if seen is x else np.sum(finite, axis=axes))
        self.samples += 1

    @property
    def channel_mean(self) -> np.ndarray | None:
        """The mean of each channel (axis 1) over every sample, when `channels` tracked it."""
        if self.channel_sum is None:
            return None
        return self.channel_sum / np.maximum(self.channel_count, 1)

    def start_histogram(self) -> None:
        self.hist_lo, self.hist_hi = self.lo, self.hi
        if not self.hist_hi > self.hist_lo:
            self.hist_hi = self.hist_lo + 1e-12  # a constant tensor: one bin holds it all
        # Bins float64 tells apart at the range's magnitude (a constant 1.0 got none).
        least = BINS * 4 * float(np.spacing(max(abs(self.hist_lo), abs(self.hist_hi))))
        self.hist_hi = max(self.hist_hi, self.hist_lo + least)
        self.hist = np.zeros(BINS, np.int64)

    def observe_histogram(self, x: np.ndarray) -> None:
        # The range as float64 scalars: Python floats would let numpy make float32 edges for
        # float32 data, too coarse for a range of a few thousand float32 steps (a conv over a
        # constant image, a sigmoid saturated near 1), and np.histogram refused the tensor.
        counts, _ = np.histogram(x, BINS, (np.float64(self.hist_lo), np.float64(self.hist_hi)))
        self.hist += counts
        self.count += x.size

    def range(self, method: str, percentile: float = 99.999, levels: int = 256
              ) -> tuple[float, float]:
        """The float range [lo, hi] to quantize to, by `method`; `levels` is the number of
        quantized levels covering the positive side (256 for a non-negative tensor in uint8,
        128 for int8)."""
        if not np.isfinite(self.lo):
            raise ValueError("no samples were observed")
        if method == "minmax":
            return self.lo, self.hi
        if self.hist is None:
            raise ValueError(f"{method}: the histogram sweep did not run")
        if method == "percentile":
            return percentile_range(self.hist, self.hist_lo, self.hist_hi, percentile)
        if method == "entropy":
            threshold = entropy_threshold(*abs_histogram(self.hist, self.hist_lo, self.hist_hi),
                                          levels)
            return max(self.lo, -threshold), min(self.hi, threshold)
        if method == "mse":
            return mse_range(self.hist, self.hist_lo, self.hist_hi, levels)
        raise ValueError(f"unknown calibration method {method!r} (use {', '.join(METHODS)})")


def percentile_range(hist: np.ndarray, lo: float, hi: float, percentile: float
                     ) -> tuple[float, float]:
    """[the (100 - p)th, the p-th] percentile of the histogrammed values, each interpolated
    within its bin; a tensor that is never negative keeps 0 as its low end."""
    if not 50.0 < percentile <= 100.0:
        raise ValueError(f"calibration_percentile must be in (50, 100], got {percentile}")
    edges = np.linspace(lo, hi, len(hist) + 1)
    cdf = np.cumsum(hist, dtype=np.float64)
    total = cdf[-1]

    def at(fraction: float) -> float:
        target = fraction * total
        i = int(np.searchsorted(cdf, target, side="left"))
        i = min(i, len(hist) - 1)
        before = cdf[i - 1] if i else 0.0
        inside = (target - before) / hist[i] if hist[i] else 0.0
        return float(edges[i] + inside * (edges[i + 1] - edges[i]))

    # A tensor never negative (a Relu's output) keeps its exact low end.
    return (at(1.0 - percentile / 100.0) if lo < 0 else lo), at(percentile / 100.0)


MSE_STEPS = 100  # candidate ranges, from the full range down to MSE_MIN_FRACTION of it
MSE_MIN_FRACTION = 0.3


def mse_range(hist: np.ndarray, lo: float, hi: float, levels: int = 256
              ) -> tuple[float, float]:
    """The range [f·lo, f·hi] (f ≤ 1) whose quantization has the least mean squared error over
    the histogrammed values: rounding (step²/12 for every value inside the range, none for the
    exact zeros of a non-negative tensor's first bin) plus clipping ((x - bound)² outside).
    `levels` is the number of steps covering the range (255 for uint8, 254 for int8's ±127)."""
    edges = np.linspace(lo, hi, len(hist) + 1)
    centres = (edges[:-1] + edges[1:]) / 2
    counts = hist.astype(np.float64)
    if counts.sum() == 0 or not hi > lo:
        return lo, hi
    exact = np.zeros(len(hist), bool)
    if lo >= 0:
        exact[0] = True  # a Relu's zeros: 0 is on the grid
    steps = levels - 1 if levels == 256 else 2 * (levels - 1)
    best, best_error = (lo, hi), np.inf
    for f in np.linspace(1.0, MSE_MIN_FRACTION, MSE_STEPS):
        a, b = min(lo * f, 0.0), max(hi * f, 0.0)
        step = (b - a) / steps
        rounding = np.where(exact, 0.0, step * step / 12)
        clipped = np.where(centres > b, (centres - b) ** 2, 0.0) \
            + np.where(centres < a, (a - centres) ** 2, 0.0)
        error = float(np.sum(counts * (rounding + clipped)))
        if error < best_error:
            best, best_error = (lo * f, hi * f), error
    return best


def abs_histogram(hist: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, float]:
    """The histogram of |x| over [0, max|x|] in len(hist) bins, rebinned from one over [lo, hi]
    (each source bin's count goes to the bin holding its centre's magnitude)."""
    edges = np.linspace(lo, hi, len(hist) + 1)
    centres = np.abs((edges[:-1] + edges[1:]) / 2)
    top = max(abs(lo), abs(hi))
    index = np.minimum((centres / top * len(hist)).astype(np.int64), len(hist) - 1)
    folded = np.zeros(len(hist), np.int64)
    np.add.at(folded, index, hist)
    return folded, top


def entropy_threshold(hist: np.ndarray, top: float, levels: int = 128) -> float:
    """TensorRT's KL-divergence calibration: the |x| threshold whose clipped, quantized
    distribution loses the least information against the observed one."""
    bins = len(hist)
    width = top / bins
    hist = hist.astype(np.float64)
    if hist.sum() == 0:
        return top
    best_i, best_kl = bins, np.inf
    tail = np.cumsum(hist[::-1])[::-1]  # tail[i] = sum(hist[i:])
    # Every STEP-th candidate: the KL curve is smooth at this resolution, and 240 candidates
    # instead of 1920 keep a ResNet-50's ~60 tensors to seconds.
    for i in list(range(max(levels, MIN_ENTROPY_BINS), bins, ENTROPY_STEP)) + [bins]:
        p = hist[:i].copy()
        if i < bins:
            p[-1] += tail[i]
        nonzero = hist[:i] > 0
        # Merge the i bins into `levels` groups, then spread each group's sum evenly over its
        # non-empty bins: Q is what the quantized tensor can still express of P.
        group = (np.arange(i) * levels) // i
        sums = np.bincount(group, weights=hist[:i], minlength=levels)
        filled = np.bincount(group, weights=nonzero, minlength=levels)
        q = np.where(nonzero, sums[group] / np.maximum(filled[group], 1), 0.0)
        kl = _kl(p, q)
        if kl < best_kl:
            best_i, best_kl = i, kl
    return (best_i + 0.5) * width if best_i < bins else top


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    p = p / p.sum()
    q_sum = q.sum()
    if q_sum == 0:
        return np.inf
    q = q / q_sum
    mask = p > 0
    if np.any(q[mask] == 0):
        return np.inf
    return float(np.sum(p[mask] * np.log(p[mask] / q[mask])))
