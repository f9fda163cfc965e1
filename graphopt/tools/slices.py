"""The worst slice of an output along axis 1, and the warning when the whole-tensor cosine hides
it (a detector's class-score channels beside its box coordinates)."""

from __future__ import annotations

import numpy as np

from graphopt.tools import metrics

# A slice of an output agreeing less than this is named when the whole-tensor cosine hides it:
# the class-score channels of a detector read 0.82-0.95 while the box coordinates, up to ~500
# against scores of ~0.005, held the whole output at 0.9989.
WORST_SLICE_WARNING = 0.99


def worst_slice(ref, cand) -> tuple[float, int] | None:
    """(cosine, index) of the [:, i] slice agreeing least, for float tensors of rank 3 or more
    with at least 2 slices and only finite values; None otherwise."""
    ref, cand = np.asarray(ref), np.asarray(cand)
    if ref.ndim < 3 or ref.shape != cand.shape or ref.shape[1] < 2 or ref.size == 0 \
            or ref.dtype.kind != "f" or cand.dtype.kind != "f" \
            or not (np.isfinite(ref).all() and np.isfinite(cand).all()):
        return None
    cosines = metrics.slice_cosines(ref, cand, axis=1)
    index = int(np.argmin(cosines))
    return float(cosines[index]), index


def hidden_slice_warning(name: str, ref, cosine: float, worst: tuple[float, int]) -> str | None:
    """The warning for output `name` when its worst slice lies under WORST_SLICE_WARNING and
    ten times further from 1 than the whole-tensor `cosine`; None when it does not."""
    value, index = worst
    if value >= WORST_SLICE_WARNING or 1.0 - value <= 10 * (1.0 - cosine):
        return None
    ref = np.asarray(ref)
    largest = float(np.abs(ref).max())
    within = float(np.abs(np.take(ref, index, axis=1)).max())
    return (f"{name}: cosine {cosine:.6f} over the whole tensor but {value:.6f} over "
            f"[:,{index}] alone, whose values reach {within:.3g} against {largest:.3g} in the "
            "whole tensor: the whole-tensor cosine mostly measures the largest slices")
