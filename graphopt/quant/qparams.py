"""Quantization parameters: activation scale/zero point from a float range, symmetric int8
weights (per tensor or per output channel), int32 biases at scale = input scale × weight scale.

    q = saturate(round(x / scale) + zero_point)        x ≈ (q - zero_point) · scale
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INT32_MAX = np.iinfo(np.int32).max


@dataclass(frozen=True)
class QParams:
    scale: np.float32
    zero_point: np.uint8 | np.int8

    @property
    def dtype(self) -> np.dtype:
        return np.asarray(self.zero_point).dtype


def activation_params(lo: float, hi: float, symmetric: bool, as_uint8: bool = False) -> QParams:
    """uint8 over [min(lo, 0), max(hi, 0)] (0 stays exact, so zero padding is), or int8
    symmetric over ±max(|lo|, |hi|). `as_uint8` writes the symmetric range as uint8 with zero
    point 128, the same values (code + 128, clipped alike to [-128, 127] steps): onnxruntime's
    CPU optimizer turns int8 Q/DQ pairs into that form, but not every pair of a conv whose
    input another op reads too, and a conv left with one int8 and one uint8 side runs in float
    between them (timm regnetx_002: 18 of 44 convs, no faster than FP32)."""
    if symmetric:
        bound = max(abs(lo), abs(hi))
        scale = bound / 127.0 if bound > 0 else 1.0
        return QParams(np.float32(scale), np.uint8(128) if as_uint8 else np.int8(0))
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / 255.0 if hi > lo else 1.0
    zero_point = int(np.clip(round(-lo / scale), 0, 255))
    return QParams(np.float32(scale), np.uint8(zero_point))


def quantize_weight(w: np.ndarray, axis: int | None, limit: int = 127,
                    min_scale: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 in [-limit, limit] (±127 by default, which keeps zero point 0 exact on
    both sides): the quantized weight and its scale, one per index of `axis` (None: one
    scalar), at least `min_scale` (bias_fitting_scale; per index of `axis`)."""
    w = w.astype(np.float32)
    if axis is None:
        bound = np.float32(np.max(np.abs(w))) if w.size else np.float32(0)
        scale = np.float32(bound / limit) if bound > 0 else np.float32(1.0)
        if min_scale is not None:
            scale = np.float32(max(scale, np.max(min_scale, initial=0.0)))
        q = np.clip(np.round(w / scale), -limit, limit).astype(np.int8)
        return q, np.asarray(scale, np.float32)
    others = tuple(i for i in range(w.ndim) if i != axis)
    bound = np.max(np.abs(w), axis=others) if w.size else np.zeros(w.shape[axis], np.float32)
    # An all-zero channel quantizes to zeros under any scale; 1 avoids dividing by zero.
    scale = np.where(bound > 0, bound / limit, 1.0).astype(np.float32)
    if min_scale is not None:
        scale = np.maximum(scale, min_scale).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.round(w / scale.reshape(shape)), -limit, limit).astype(np.int8)
    return q, scale


def dequantize_weight(q: np.ndarray, scale: np.ndarray, axis: int | None) -> np.ndarray:
    """The float weight `quantize_weight`'s result stands for."""
    if axis is None or np.ndim(scale) == 0:
        return q.astype(np.float32) * np.float32(scale)
    shape = [1] * q.ndim
    shape[axis] = -1
    return q.astype(np.float32) * scale.reshape(shape)


def bias_fitting_scale(b: np.ndarray, input_scale: np.float32) -> np.ndarray:
    """The smallest weight scale per output channel at which the bias `b` fits int32 at scale
    input_scale × weight scale, with room for twice its size (bias correction moves it). An
    input of tiny range (activations near 1e-10) otherwise gives a bias scale near 1e-15, at
    which the clipped int32 bias loses its value; a wider weight scale costs only weight
    precision, whose products with such inputs are as tiny. onnxruntime's quantizer widens
    the weight scale alike."""
    if not float(input_scale) > 0 or not np.isfinite(input_scale):  # quantize_bias's scale 1
        return np.zeros(b.shape, np.float32)
    need = 2.0 * np.abs(np.nan_to_num(b.astype(np.float64))) / (float(input_scale) * INT32_MAX)
    return need.astype(np.float32)


def quantize_bias(b: np.ndarray, input_scale: np.float32, weight_scale: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """int32 bias at scale input_scale × weight_scale (per channel when the weight is), what
    QLinearConv and QGemm add to their int32 accumulators."""
    scale = (np.float32(input_scale) * weight_scale.astype(np.float32)).astype(np.float32)
    scale = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)
    q = np.clip(np.round(b.astype(np.float64) / scale), -INT32_MAX, INT32_MAX).astype(np.int32)
    return q, np.broadcast_to(scale, b.shape).astype(np.float32) if scale.ndim else scale
