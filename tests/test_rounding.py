"""The rounding allowances of --verify and compare judge a detector's output slice by slice
along axis 1: class scores (up to 0.006) beside box coordinates (up to 545) are held to their
own scale, so an error the coordinates' rounding would excuse is not excused on the scores."""

from __future__ import annotations

import numpy as np
import pytest

from graphopt import rounding

JUDGE = {"rtol": 1e-4, "atol": 1e-5, "min_cosine": None}


def _detections() -> np.ndarray:
    """[1, 12, 525]: 4 box coordinates up to 545, then 8 class scores up to 0.006."""
    rng = np.random.default_rng(0)
    out = np.empty((1, 12, 525), np.float32)
    out[0, :4] = rng.uniform(0, 545, (4, 525))
    out[0, 4:] = rng.uniform(0, 0.006, (8, 525))
    out[0, 0, 7] = 0.01  # a coordinate near 0, from terms of hundreds
    return out


def test_the_scale_allowance_takes_each_slice_at_its_own_scale():
    expected = _detections()
    rounded = expected.copy()
    rounded[0, 0, 7] += 0.0166  # a reordered sum's rounding on the coordinate near 0
    assert rounding._rounding_at_scale(expected, rounded, JUDGE) == pytest.approx(
        (0.0166, float(expected.max())), rel=1e-3)
    corrupted = rounded.copy()
    corrupted[0, 9, 100] += 0.05  # a score: 8x its slice's largest value
    assert rounding._rounding_at_scale(expected, corrupted, JUDGE) is None
    # Rank 2 has no slices: the whole tensor's scale, as before.
    assert rounding._rounding_at_scale(expected[0], corrupted[0], JUDGE) is not None


@pytest.mark.parametrize("shifted, excused", [("coordinates", True), ("scores", False)])
def test_onnxruntimes_own_rounding_excuses_only_the_slices_it_moves(monkeypatch, shifted,
                                                                     excused):
    expected = _detections()
    own = expected.copy()
    own[0, :4] += 0.0027  # onnxruntime's optimizer moves the coordinates, not the scores
    monkeypatch.setattr(rounding.numerics, "run", lambda *args, **kwargs: {"y": own})
    actual = expected.copy()
    if shifted == "coordinates":
        actual[0, :4] += 0.004  # within twice onnxruntime's own
    else:
        actual[0, 4:] += 0.005  # every score: under 2 x 0.0027, but at 1x the scores' scale
    note = rounding._within_onnxruntimes_own(None, {}, {"y": expected}, {"y": actual}, ["y"],
                                             JUDGE)
    assert (note is not None) == excused
