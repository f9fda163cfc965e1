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
    note = rounding._within_onnxruntimes_own(_own_outputs, {"y": expected}, {"y": actual}, ["y"],
                                             JUDGE)
    assert (note is not None) == excused


def _own_outputs() -> dict:
    """The original at ORT_ENABLE_ALL, as within_rounding runs it (the tests stub the run)."""
    return rounding.numerics.run(None, {}, "all")


def _own_run(monkeypatch, own: np.ndarray) -> None:
    monkeypatch.setattr(rounding.numerics, "run", lambda *args, **kwargs: {"y": own})


def test_a_slice_near_zero_excuses_no_other_slice(monkeypatch):
    # Channel 0 holds values near 0 that onnxruntime's own optimizer moves by half their size
    # (a Conv + BatchNorm cancelling 1e4): that excuses its own error, not 10% on channel 1.
    rng = np.random.default_rng(1)
    expected = np.stack([rng.uniform(-1e-3, 1e-3, (9, 9)), rng.uniform(-18, 18, (9, 9))])[None]
    expected = expected.astype(np.float32)
    own = expected.copy()
    own[0, 0] += 4.9e-4
    _own_run(monkeypatch, own)
    judged = dict(expected={"y": expected}, failing=["y"], judge=JUDGE)
    near_zero = expected.copy()
    near_zero[0, 0] += 8e-4  # within twice onnxruntime's own error in that channel
    assert rounding._within_onnxruntimes_own(_own_outputs, actual={"y": near_zero}, **judged)
    scaled = expected.copy()
    scaled[0, 1] *= 1.1
    assert rounding._within_onnxruntimes_own(_own_outputs, actual={"y": scaled}, **judged) is None


def test_logits_of_one_element_slices_off_by_a_percent_fail(monkeypatch):
    # [1, 64, 1, 1] logits: each slice is one logit, and one near 0 has a relative error near
    # 1 from onnxruntime's rounding; every logit 1% off is still a miscompile.
    rng = np.random.default_rng(2)
    expected = rng.uniform(-3, 3, (1, 64, 1, 1)).astype(np.float32)
    expected[0, 5] = 2e-8
    own = expected.copy()
    own[0, 5] += 4.8e-7
    _own_run(monkeypatch, own)
    actual = expected * np.float32(1.01)
    assert rounding.within_rounding(None, {}, {"y": expected}, {"y": actual}, ["y"],
                                    JUDGE) is None
