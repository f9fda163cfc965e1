r"""FoldInputAffine: per-channel Mul/Div/Add/Sub on a Conv's input folded into that Conv
(FuseConvBatchNorm folds those that follow a Conv into it).

    h · s ─ Conv(W, b)         →  h ─ Conv(W · s, b)          (any pads; h / s as h · 1/s)
    h + t ─ Conv(W, b)         →  h ─ Conv(W, b + Σ W · t)    (no padding; h − t as h + −t)
    h · s + t ─ Conv(W, b)     →  h + t/s ─ Conv(W · s, b)    (padded, s ≠ 0 in every channel)
    h[:, p] ─ Conv(W, b)       →  h ─ Conv(W[:, argsort(p)], b) (a Gather permuting channels)

s and t run along the input's channel axis (scalar, [C] as [1, C, 1, 1] or [C, 1, 1]), so W is
scaled along its axis 1, within each group. A shift cannot enter the bias where the Conv pads:
the padding is 0, not t, so the border outputs would gain what their padded taps read. The
scale can (0 · s is 0), which is why the padded form keeps the Add and moves the Mul past it.

PaddleOCR's PP-LCNetV3 backbones (the v4 text detector and recognizer) follow every activation
with a learned scale and shift (x · s + t, scalars), a 1×1 or a depthwise Conv next:
onnxruntime runs both ops over the whole activation, blocked or not.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir.dtypes import DType
from graphopt.ir.pattern import Optional, Var
from graphopt.passes.fusion.conv_bn import _f64, _not_constant, _unsafe_scaling
from graphopt.passes.base import register
from graphopt.passes.rules import Rule, RulePass


def _channel_vector(c, w, group: int) -> np.ndarray | str:
    """c as a float64 [C_in] vector when it broadcasts along axis 1 of the Conv's input only."""
    if not c.is_constant or c.dtype != w.dtype:
        return f"%{c.name} is not a constant of the weight's type"
    if w.shape is None or not all(isinstance(d, int) for d in w.shape):
        return f"the shape of weight %{w.name} is unknown"
    data, rank, channels = c.constant(), len(w.shape), w.shape[1] * group
    if data.ndim > rank:
        return f"constant {list(data.shape)} has more axes than the Conv's input"
    shape = (1,) * (rank - data.ndim) + data.shape
    if shape[:1] + shape[2:] != (1,) * (rank - 1) or shape[1] not in (1, channels):
        return f"constant {list(data.shape)} is not [1, {channels}, 1…] over the Conv's input"
    return np.broadcast_to(data.astype(np.float64).reshape(-1), (channels,))


def _input_reason(h, w, group: int) -> str | None:
    """Why the Conv's input `h` may not be what the constant broadcasts against: its rank and
    channel count must be the Conv's own, or the constant widens it (h [N, 1, H, W] · s [1, C,
    1, 1] feeds a C-channel Conv that h alone cannot)."""
    channels = w.shape[1] * group
    if h.shape is None or len(h.shape) != len(w.shape) or h.shape[1] != channels:
        shape = "unknown" if h.shape is None else list(h.shape)
        return f"%{h.name} ({shape}) is not the Conv's {channels}-channel input by itself"
    return None


def _per_weight(vector: np.ndarray, w, group: int) -> np.ndarray:
    """The input-channel vector laid out as W's first two axes [C_out, C_in/group]: output
    channel m of group g reads input channels g·C_in/group …"""
    out_channels, per_group = w.shape[0], w.shape[1]
    groups_of_outputs = np.arange(out_channels) // (out_channels // group)
    return vector.reshape(group, per_group)[groups_of_outputs]


def _scaled(w, s: np.ndarray, group: int) -> np.ndarray:
    weight = _f64(w)
    return weight * _per_weight(s, w, group).reshape(weight.shape[:2] + (1,) * (weight.ndim - 2))


def _unpadded(conv) -> str | None:
    if conv.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return f"the Conv pads ({conv.attr('auto_pad')}): its border taps read 0, not h + t"
    if any(conv.attr("pads") or ()):
        return "the Conv pads: its border taps read 0, not h + t"
    return None


def _conv_of(op, producer):
    return op.Conv(producer, Var("w"), Optional(Var("b")), _name="conv")


# Folded into 16-bit weights, W · s and Σ W · t round once where the original rounds h · s
# per element: a float16 model's outputs would move by an ulp in a fifth of their elements.
_FOLDED_TYPES = (DType.FLOAT, DType.DOUBLE)


def _checked_weights(conv, w, b=None) -> int | str:
    """The Conv's group, or why its weights cannot take a fold."""
    reason = _not_constant(weight=w, bias=b)
    group = conv.attr("group", 1)
    if reason is None and w.dtype not in _FOLDED_TYPES:
        reason = f"weight %{w.name} is {w.dtype.short if w.dtype else 'of unknown type'}: " \
                 "folded, it would round otherwise than the original (float32 and 64 only)"
    if reason is None and (w.shape is None or len(w.shape) < 3 or w.shape[0] % group):
        reason = f"the shape of weight %{w.name} does not divide into {group} groups"
    return reason or group


class ScaleIntoConv(Rule):
    """h · s → Conv: W scaled along its input channels (0 · s is 0, so padding is no matter)."""

    def pattern(self, op, h, s):
        return _conv_of(op, op.Mul(h, s))

    def scale(self, s, w, group: int) -> np.ndarray | str:
        return _channel_vector(s, w, group)

    def check(self, conv, h, w, s, b=None, **_):
        group = _checked_weights(conv, w, b)
        if isinstance(group, str):
            return group
        scale = self.scale(s, w, group)
        if isinstance(scale, str):
            return scale
        return _input_reason(h, w, group) or _unsafe_scaling(w, scale, np.zeros(1))

    def rewrite(self, op, conv, h, w, s, b=None):
        group = conv.attr("group", 1)
        weight = _scaled(w, self.scale(s, w, group), group)
        return op.Conv(h, op.const(weight.astype(w.constant().dtype), f"{w.name}_scaled"), b,
                       **conv.attrs)


def _shifted_bias(w, t: np.ndarray, group: int, b=None) -> np.ndarray:
    weight = _f64(w)
    per_output = (weight.reshape(weight.shape[:2] + (-1,)).sum(axis=2)
                  * _per_weight(t, w, group)).sum(axis=1)
    return (_f64(b) if b is not None else 0.0) + per_output


def _unsafe_shift(w, t: np.ndarray, group: int, b=None) -> str | None:
    if not np.isfinite(t).all():
        return "the shift is not finite"
    with np.errstate(all="ignore"):
        bias = _shifted_bias(w, t, group, b)
    largest = np.finfo(w.constant().dtype).max
    if not np.isfinite(bias).all() or np.abs(bias).max(initial=0) > largest:
        return "the folded bias would overflow"
    return None


class ShiftIntoConv(Rule):
    """h + t → Conv without padding: Σ W · t per output channel joins the bias."""

    def pattern(self, op, h, t):
        return _conv_of(op, op.Add(h, t))

    def shift(self, t, w, group: int) -> np.ndarray | str:
        return _channel_vector(t, w, group)

    def check(self, conv, h, w, t, b=None, **_):
        group = _checked_weights(conv, w, b)
        if isinstance(group, str):
            return group
        shift = self.shift(t, w, group)
        if isinstance(shift, str):
            return shift
        return _input_reason(h, w, group) or _unpadded(conv) or _unsafe_shift(w, shift, group, b)

    def rewrite(self, op, conv, h, w, t, b=None):
        group = conv.attr("group", 1)
        bias = _shifted_bias(w, self.shift(t, w, group), group, b)
        dtype = w.constant().dtype
        return op.Conv(h, w, op.const(bias.astype(dtype), f"{w.name}_b"), **conv.attrs)


class ShiftSubtractedIntoConv(ShiftIntoConv):
    """h − t → Conv without padding: the bias takes −Σ W · t (an input less its mean, before
    a patch embedding's unpadded Conv)."""

    def pattern(self, op, h, t):
        return _conv_of(op, op.Sub(h, t))

    def shift(self, t, w, group: int) -> np.ndarray | str:
        shift = _channel_vector(t, w, group)
        return shift if isinstance(shift, str) else -shift


class ScaleDividedIntoConv(ScaleIntoConv):
    """h / s → Conv: W scaled by 1/s (an input normalized by its standard deviation)."""

    def pattern(self, op, h, s):
        return _conv_of(op, op.Div(h, s))

    def scale(self, s, w, group: int) -> np.ndarray | str:
        divisor = _channel_vector(s, w, group)
        if isinstance(divisor, str) or not divisor.all():
            return divisor if isinstance(divisor, str) else "the divisor is 0 in a channel"
        return 1.0 / divisor


class AffineIntoPaddedConv(Rule):
    """h · s + t → Conv that pads: h + t/s → Conv(W · s); the shift stays outside (see above),
    the scale goes in."""

    def pattern(self, op, h, s, t):
        return _conv_of(op, op.Add(op.Mul(h, s), t))

    def check(self, conv, w, s, t, b=None, **_):
        group = _checked_weights(conv, w, b)
        if isinstance(group, str):
            return group
        scale, shift = _channel_vector(s, w, group), _channel_vector(t, w, group)
        if isinstance(scale, str) or isinstance(shift, str):
            return scale if isinstance(scale, str) else shift
        if _unpadded(conv) is None:
            return "the Conv does not pad: ShiftIntoConv and ScaleIntoConv take both"
        if not scale.all():
            return "the scale is 0 in a channel (t/s)"
        with np.errstate(all="ignore"):
            moved = shift / scale
        if not np.isfinite(moved).all() or np.abs(moved).max() > np.finfo(w.constant().dtype).max:
            return "the shift over the scale is not finite"
        return _unsafe_scaling(w, scale, np.zeros(1))

    def rewrite(self, op, conv, h, w, s, t, b=None):
        group = conv.attr("group", 1)
        scale, shift = _channel_vector(s, w, group), _channel_vector(t, w, group)
        dtype = w.constant().dtype
        moved = shift / scale
        if s.constant().size == 1 and t.constant().size == 1:
            moved = moved[:1].reshape(())
        else:
            moved = moved.reshape((1, -1) + (1,) * (len(w.shape) - 2))
        shifted = op.Add(h, op.const(moved.astype(dtype), f"{t.name}_over_scale"))
        weight = _scaled(w, scale, group)
        return op.Conv(shifted, op.const(weight.astype(dtype), f"{w.name}_scaled"), b,
                       **conv.attrs)


class PermutationIntoConv(Rule):
    """Gather(h, p, axis=1) → Conv, p a permutation of the input channels (an RGB image read
    as BGR): the Conv reads h, its weights' input channels permuted (W[:, argsort(p)]), exact."""

    def pattern(self, op, h, p):
        return _conv_of(op, op.Gather(h, p, _name="gather"))

    def check(self, conv, gather, h, w, p, b=None, **_):
        reason = _not_constant(weight=w, bias=b)
        if reason:
            return reason
        if conv.attr("group", 1) != 1:
            return "the Conv is grouped: a permutation may cross its groups"
        if w.shape is None or len(w.shape) < 3 or not isinstance(w.shape[1], int):
            return f"the shape of weight %{w.name} is unknown"
        channels = w.shape[1]
        if h.shape is None or len(h.shape) != len(w.shape) or h.shape[1] != channels:
            return f"%{h.name} is not the Conv's {channels}-channel input"
        if gather.attr("axis", 0) not in (1, 1 - len(h.shape)):
            return "the Gather does not index the channel axis"
        return None if _permutation(p, channels) is not None else \
            f"%{p.name} is not a constant permutation of the {channels} input channels"

    def rewrite(self, op, conv, gather, h, w, p, b=None):
        order = np.argsort(_permutation(p, w.shape[1]))
        return op.Conv(h, op.const(np.ascontiguousarray(w.constant()[:, order]),
                                   f"{w.name}_permuted"), b, **conv.attrs)


def _permutation(p, channels: int) -> np.ndarray | None:
    """`p`'s indices into `channels` channels, when they are a permutation of them."""
    indices = p.constant() if p.is_constant else None
    if indices is None or indices.ndim != 1 or indices.size != channels \
            or indices.dtype.kind not in "iu":
        return None
    indices = indices.astype(np.int64)
    if (indices < -channels).any() or (indices >= channels).any():  # onnxruntime refuses them
        return None
    indices %= channels  # negative ones count from the end
    return indices if np.array_equal(np.sort(indices), np.arange(channels)) else None


@register
class FoldInputAffine(RulePass):
    name = "FoldInputAffine"
    description = ("fold per-channel Mul/Div/Add/Sub and channel permutations (Gather) on a "
                   "Conv's input into the Conv's weights and bias")
    rules = (PermutationIntoConv, ShiftIntoConv, ShiftSubtractedIntoConv, ScaleIntoConv,
             ScaleDividedIntoConv, AffineIntoPaddedConv)


__all__ = ["FoldInputAffine"]
