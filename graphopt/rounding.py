"""Outputs off by rounding alone: what --verify and compare accept beyond rtol/atol, saying so."""

from __future__ import annotations

import numpy as np
from onnx import ModelProto

from graphopt import numerics


def within_rounding(original: ModelProto, feeds, expected: dict, actual: dict,
                    failing: list[str], judge: dict) -> str | None:
    """A note when rounding explains every output in `failing` (outside rtol/atol), None
    otherwise: they differ from the original no more than twice as much as onnxruntime's
    optimizer makes the original itself differ (the NCHWc convolutions of a cpu compile
    accumulate in onnxruntime's order at ORT_ENABLE_ALL, and through a detector's box decoding
    that can pass 1e-4: YOLO's 0.035 on 900-pixel coordinates), or, where that optimizer
    changes nothing, they are off at the output's scale only (_rounding_at_scale)."""
    return _within_onnxruntimes_own(original, feeds, expected, actual, failing) \
        or _within_output_scale(expected, actual, failing, judge)


def _within_onnxruntimes_own(original: ModelProto, feeds, expected: dict, actual: dict,
                             failing: list[str]) -> str | None:
    try:
        own = numerics.run(original, feeds, "all")
    except Exception:  # noqa: BLE001 - no baseline to measure against
        return None
    worst, baseline = 0.0, 0.0
    for name in failing:
        ours = numerics.max_abs_error(expected[name], actual[name])
        theirs = numerics.max_abs_error(expected[name], own[name])
        if not theirs or ours > 2 * theirs:
            return None
        worst, baseline = max(worst, ours), max(baseline, theirs)
    return (f"outputs differ from the original at ORT_DISABLE_ALL by up to {worst:.3g}, "
            "beyond rtol/atol but within what onnxruntime's own optimizer gives the original "
            f"({baseline:.3g} at ORT_ENABLE_ALL): the same kernels' rounding")


def _within_output_scale(expected: dict, actual: dict, failing: list[str],
                         judge: dict) -> str | None:
    scaled = [_rounding_at_scale(expected[name], actual[name], judge) for name in failing]
    if not scaled or not all(scaled):
        return None
    worst = max(error for error, _ in scaled)
    scale = max(largest for _, largest in scaled)
    return (f"outputs differ from the original at ORT_DISABLE_ALL by up to {worst:.3g}, "
            "beyond rtol/atol in under 1% of their elements, and within rtol of the output's "
            f"largest magnitude ({scale:.3g}): sums taken in another order (NCHWc blocks, "
            "BatchNorm as a depthwise conv) round so")


def _rounding_at_scale(expected, actual, judge: dict) -> tuple[float, float] | None:
    """(largest error, largest |expected|) when an output fails allclose in under 1% of its
    elements, each off by no more than rtol times the output's largest magnitude: how the
    rounding of a sum reordered shows through a detector's box decoding, where elements near
    0 come from terms of hundreds (YOLO's 0.017 on 896-pixel coordinates, where onnxruntime's
    own optimizer changes nothing). None otherwise, a miscompile's systematic error included."""
    error, largest, beyond, total = 0.0, 0.0, 0, 0
    for pair in numerics.paired("", expected, actual):
        if isinstance(pair, numerics.Mismatch):
            return None
        _, exp, got = pair
        exp, got = numerics.widened(exp), numerics.widened(got)
        if exp.dtype.kind != "f" or exp.shape != got.shape:
            if not np.array_equal(exp, got):
                return None
            continue
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(got.astype(np.float64) - exp)
            ok = (diff <= judge["atol"] + judge["rtol"] * np.abs(exp)) | (
                np.isnan(exp) & np.isnan(got))
        if not np.isfinite(exp).all() and not ok[~np.isfinite(exp)].all():
            return None
        finite = np.isfinite(exp)
        if not np.isfinite(diff[finite]).all():  # a NaN or inf where the original has a number
            return None
        if finite.any():
            largest = max(largest, float(np.abs(exp[finite]).max()))
            error = max(error, float(diff[finite].max()))
        beyond += int((~ok).sum())
        total += exp.size
    if not total or beyond > total // 100 or error > judge["rtol"] * largest:
        return None
    return error, largest
