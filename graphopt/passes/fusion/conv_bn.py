"""FuseConvBatchNorm: per-channel affine ops folded into the Conv, ConvTranspose, Gemm or MatMul
before them; zero Pads folded into the pads of the Conv or AveragePool after them.

    x ─ Conv(W, b) ─ BatchNormalization(γ, β, μ, σ², ε) ─ y   →   x ─ Conv(W', b') ─ y
    W' = W · γ/√(σ²+ε)               per output channel: s = γ/√(σ²+ε), t = β − μ·s
    b' = (b − μ) · γ/√(σ²+ε) + β     b = 0 when the Conv has none

s runs along axis 0 of a Conv weight (any group), axis 1 of each group's block of a ConvTranspose
weight [C_in, C_out/group, k…], the output columns of Gemm's B and of a MatMul's 2-D weight (for
an [N, C] product only: BN normalizes axis 1). Add c is s = 1, t = c; Sub c is s = 1, t = −c;
Mul c is s = c, t = 0 (c along axis 1 only). A Mul by a constant c along the last axis of a
MatMul with a 2-D float weight (a LayerScale; not a scalar, which FuseMatMul and the attention
fusions take) scales the weight's columns, and a constant bias
between them by c as well: (x·W + b)·c = x·(W·c) + b·c; not where a column would sink below
float16's normal range in a float16 compile, nor in an int8 compile for an NPU. Folds are computed in float64, cast to the
weight's dtype and stored as new initializers: the originals may be shared, and are never
modified.

A BatchNormalization after a Concat along the channels of Convs that only the Concat reads
splits by channel range: each Conv takes its share of s and t. One after an N-D MatMul whose
tokens a Flatten or a Reshape to [·, C] merges into rows folds into the MatMul's columns.

    x ─ Pad(constant 0, spatial axes) ─ Conv / AveragePool  →  pads += Pad's (counted by the pool)
    x ─ Pad(constant −∞) ─ MaxPool  →  pads += Pad's (no window takes a −∞ cell)
"""

from __future__ import annotations

import numpy as np

from graphopt.ir.pattern import Attr, Match, Miss, Optional, Var
from graphopt.passes.base import register
from graphopt.passes.fusion.conv_crop import ConvCropPads
from graphopt.passes.rules import HandMatchedRule, Rule, RulePass


def _f64(value) -> np.ndarray:
    return value.constant().astype(np.float64)


def _not_constant(**values) -> str | None:
    bad = [f"{role} %{v.name}" for role, v in values.items() if v is not None and not v.is_constant]
    return f"{bad[0]} is not a constant" if bad else None


def _conv_channels(node, w) -> int | str:
    """Output channels of Conv/ConvTranspose from the weight's static shape, or a reason."""
    if w.shape is None or len(w.shape) < 3 or not all(isinstance(d, int) for d in w.shape[:2]):
        return f"the shape of weight %{w.name} is unknown"
    return w.shape[1] * node.attr("group", 1) if node.op_type == "ConvTranspose" else w.shape[0]


def _fold_conv(op, node, x, w, b, s, t):
    """Conv/ConvTranspose computing its old output times s plus t, per output channel."""
    weight, dtype = _f64(w), w.constant().dtype
    if node.op_type == "ConvTranspose":
        g = node.attr("group", 1)
        blocks = weight.reshape(g, weight.shape[0] // g, weight.shape[1], -1)
        weight = (blocks * s.reshape(g, 1, -1, 1)).reshape(weight.shape)
    else:
        weight = weight * s.reshape((-1,) + (1,) * (weight.ndim - 1))
    bias = (_f64(b) if b is not None else 0.0) * s + t
    bias = None if b is None and not bias.any() else op.const(bias.astype(dtype), f"{w.name}_b")
    return getattr(op, node.op_type)(x, op.const(weight.astype(dtype), f"{w.name}_fused"), bias,
                                     **node.attrs)


def _unsafe_scaling(w, s: np.ndarray, t: np.ndarray, b=None, beta: float = 1.0) -> str | None:
    """Why folding s and t into the weight w and bias b would change outputs beyond rounding:
    a scale, shift or bias that is not finite (0·∞ in a weight is NaN where the unfused product
    is ±∞), weights or a bias (Gemm's times beta) the scale takes past the dtype's largest
    value, or float32 weights it takes below float32's normal range, where they keep few bits.
    Not float16's range, weight by weight: every large weight holds values near 0, and such a
    bound would refuse nearly every fold (_layer_scale_problem judges a column as a whole).
    Magnitudes only, whatever axis s runs along: extreme scales are rare enough to refuse on
    a bound."""
    dtype = w.constant().dtype
    if not np.issubdtype(dtype, np.floating):
        return None
    info, weight = np.finfo(dtype), np.abs(_f64(w))
    bias = abs(beta) * np.abs(_f64(b)).max(initial=0) if b is not None else 0.0
    scales = np.abs(s[s != 0])
    with np.errstate(all="ignore"):
        folded_bias = bias * np.abs(s).max(initial=0) + np.abs(t).max(initial=0)
    if not (np.isfinite(s).all() and np.isfinite(t).all() and folded_bias <= info.max):
        return "the folded scale, shift or bias is not finite"
    if not scales.size or not weight.size:
        return None
    if weight.max() * scales.max() > info.max:
        return "the scaled weights would overflow"
    smallest = weight[weight >= info.tiny].min(initial=np.inf)  # subnormal ones are already so
    if info.bits >= 32 and smallest < np.inf and smallest * scales.min() < info.tiny:
        return "the scaled weights would fall below the normal range"
    return None


def _training_outputs(bn) -> bool:
    """Whether a BatchNormalization declares more outputs than Y: before opset 14 that puts it
    in training mode (the batch's own statistics), and onnxruntime decides by the count, as the
    spec of 7 and 9 does (old train-mode PyTorch exports declare all five; folded with the
    running statistics, such a Conv + BN was 2.2 off). Left unfolded at any opset."""
    return len([v for v in bn.outputs if v is not None and v.name]) > 1


def _bn(op, producer):
    return op.BatchNormalization(producer, Var("scale"), Var("shift"), Var("mean"), Var("var"),
                                 epsilon=Attr("eps", 1e-5), training_mode=Attr("training", 0),
                                 _name="bn")


class _BatchNormAfter(Rule):
    """`node` → BatchNormalization as y·s + t per channel; subclasses count channels, fold."""

    def channels(self, node, x, w) -> int | str:
        return _conv_channels(node, w)

    def check(self, node, x, w, scale, shift, mean, var, training, eps, b=None, bn=None):
        channels, reason = self.channels(node, x, w), _not_constant(weight=w, bias=b)
        if bn is not None and _training_outputs(bn):
            return "BatchNormalization declares its training outputs (running and saved " \
                   "statistics): before opset 14 it then normalizes by the batch's statistics"
        if reason or isinstance(channels, str):
            return reason or channels
        reason = _not_constant(scale=scale, bias=shift, mean=mean, variance=var)
        if reason:
            return f"BatchNormalization {reason}"
        if training:
            return "BatchNormalization is in training mode (training_mode=1)"
        if any(v.shape != (channels,) for v in (scale, shift, mean, var)):  # or spatial=0 (< v9)
            return f"BatchNormalization parameters are not [{channels}] vectors"
        beta = node.attr("beta", 1.0) if node.op_type == "Gemm" else 1.0
        return _unsafe_scaling(w, *self.affine(scale, shift, mean, var, eps), b, beta)

    @staticmethod
    def affine(scale, shift, mean, var, eps) -> tuple[np.ndarray, np.ndarray]:
        with np.errstate(all="ignore"):  # _unsafe_scaling judges what comes out
            s = _f64(scale) / np.sqrt(_f64(var) + eps)
            return s, _f64(shift) - _f64(mean) * s

    def rewrite(self, op, node, x, w, scale, shift, mean, var, eps, b=None):
        return self.fold(op, node, x, w, b, *self.affine(scale, shift, mean, var, eps))

    fold = staticmethod(_fold_conv)


class ConvBatchNorm(_BatchNormAfter):
    """Conv → BatchNormalization (inference form): W scaled along axis 0, any group."""

    def pattern(self, op, x, w):
        return _bn(op, op.Conv(x, w, Optional(Var("b")), _name="node"))


class ConcatBatchNorm(HandMatchedRule):
    """Concat along the channels of Convs only it reads → BatchNormalization: each Conv takes
    its channels' share of the fold, and the Concat joins the folded Convs. MixNet's mixed
    depthwise convs (kernels of several sizes over slices of the channels) end so: timm's
    mixnet_s had kept all 34 of its BatchNorms."""

    root_op = "BatchNormalization"

    def match(self, node):
        joined = node.inputs[0].producer if node.inputs and node.inputs[0] is not None else None
        if joined is None or joined.op_type != "Concat" or not joined.is_onnx:
            return Miss(node, 0, "the input is not the output of a Concat")
        convs = [v.producer if v is not None else None for v in joined.inputs]
        for index, (value, conv) in enumerate(zip(joined.inputs, convs)):
            if conv is None or conv.op_type != "Conv" or not conv.is_onnx:
                return Miss(node, 1, f"Concat input {index} is not the output of a Conv")
            if len(value.uses) != 1 or value.is_graph_output:
                return Miss(node, 1, f"Conv '{conv.name}' is read by more than the Concat")
        if len(set(map(id, convs))) != len(convs):
            return Miss(node, 1, "the Concat reads one Conv twice")
        bindings = {"joined": joined, "convs": convs, "scale": node.input(1),
                    "shift": node.input(2), "mean": node.input(3), "var": node.input(4),
                    "eps": node.attr("epsilon", 1e-5), "training": node.attr("training_mode", 0),
                    "bn": node}
        return Match(node, bindings, [node, joined, *convs])

    def check(self, joined, convs, scale, shift, mean, var, eps, training, bn=None):
        rank = len(joined.output.shape) if joined.output.shape is not None else None
        axis = joined.attr("axis")
        if axis != 1 and not (rank is not None and axis == 1 - rank):
            return f"the Concat joins axis {axis}, not the channels"
        reason = _not_constant(scale=scale, bias=shift, mean=mean, variance=var)
        if reason:
            return f"BatchNormalization {reason}"
        if training or (bn is not None and _training_outputs(bn)):
            return "BatchNormalization is in training mode (training_mode=1)"
        widths = []
        for conv in convs:
            w, b = conv.inputs[1], conv.input(2)
            width = _conv_channels(conv, w)
            if isinstance(width, str):
                return width
            reason = _not_constant(weight=w, bias=b)
            if reason:
                return f"Conv '{conv.name}': {reason}"
            widths.append(width)
        if any(v.shape != (sum(widths),) for v in (scale, shift, mean, var)):
            return f"BatchNormalization parameters are not [{sum(widths)}] vectors"
        for conv, (s, t) in zip(convs, self._shares(widths, scale, shift, mean, var, eps)):
            reason = _unsafe_scaling(conv.inputs[1], s, t, conv.input(2))
            if reason:
                return f"Conv '{conv.name}': {reason}"
        return None

    @staticmethod
    def _shares(widths, scale, shift, mean, var, eps):
        """Each Conv's slice of the fold's scale and shift."""
        s, t = _BatchNormAfter.affine(scale, shift, mean, var, eps)
        ends = np.cumsum(widths)
        return [(s[end - width:end], t[end - width:end]) for width, end in zip(widths, ends)]

    def rewrite(self, op, joined, convs, scale, shift, mean, var, eps, **_):
        widths = [_conv_channels(conv, conv.inputs[1]) for conv in convs]
        folded = [_fold_conv(op, conv, conv.inputs[0], conv.inputs[1], conv.input(2), s, t)
                  for conv, (s, t) in zip(convs, self._shares(widths, scale, shift, mean, var,
                                                               eps))]
        return op.Concat(*folded, axis=joined.attr("axis"))


class ConvTransposeBatchNorm(_BatchNormAfter):
    """ConvTranspose → BatchNormalization: W is [C_in, C_out/group, k…], scaled along axis 1."""

    def pattern(self, op, x, w):
        return _bn(op, op.ConvTranspose(x, w, Optional(Var("b")), _name="node"))


class GemmBatchNorm(_BatchNormAfter):
    """Gemm → BatchNormalization: B's output columns scaled, C' = beta·C·s + t, beta = 1."""

    def pattern(self, op, x, w):
        return _bn(op, op.Gemm(x, w, Optional(Var("b")), _name="node"))

    def channels(self, node, x, w):
        ok = w.shape is not None and len(w.shape) == 2
        return w.shape[0 if node.attr("transB", 0) else 1] if ok else "Gemm's B is not 2-D"

    def fold(self, op, node, x, w, b, s, t):
        dtype = w.constant().dtype
        weight = _f64(w) * (s[:, None] if node.attr("transB", 0) else s[None, :])
        bias = (node.attr("beta", 1.0) * _f64(b) * s if b is not None else 0.0) + t
        return op.Gemm(x, op.const(weight.astype(dtype), f"{w.name}_fused"),
                       op.const(bias.astype(dtype), f"{w.name}_b"), **{**node.attrs, "beta": 1.0})


class MatMulBatchNorm(_BatchNormAfter):
    """MatMul(x [N, K], W [K, C]) → BatchNormalization  →  MatMul(x, W·s) + t."""

    def pattern(self, op, x, w):
        return _bn(op, op.MatMul(x, w, _name="node"))

    def channels(self, node, x, w):
        if w.shape is None or len(w.shape) != 2 or x.shape is None:
            return "the MatMul weight is not 2-D or the rank of its input is unknown"
        if len(x.shape) != 2:
            return f"BN's axis 1 is not the weight's output axis of a rank-{len(x.shape)} MatMul"
        return w.shape[1]

    def fold(self, op, node, x, w, b, s, t):
        dtype = w.constant().dtype
        product = op.MatMul(x, op.const((_f64(w) * s).astype(dtype), f"{w.name}_fused"))
        return op.Add(product, op.const(t.astype(dtype), f"{w.name}_b"))


class MatMulFlattenBatchNorm(MatMulBatchNorm):
    """MatMul(x [B, N, K], W [K, C]) → Flatten to [B·N, C] → BatchNormalization: LeViT's
    Linear + BatchNorm1d, which flattens the tokens into the batch to normalize the features
    (46 of levit_128s's BatchNorms) →  Flatten(MatMul(x, W·s) + t)."""

    def pattern(self, op, x, w):
        return _bn(op, op.Flatten(op.MatMul(x, w, _name="node"), axis=Attr("flat_axis", 1),
                                  _name="flat"))

    def channels(self, node, x, w):
        if w.shape is None or len(w.shape) != 2 or x.shape is None or len(x.shape) < 2:
            return "the MatMul weight is not 2-D or the rank of its input is unknown"
        return w.shape[1]

    def check(self, node, x, w, scale, shift, mean, var, training, eps, flat_axis):
        rank = len(x.shape) if x.shape is not None else None
        if rank is not None and flat_axis % rank != rank - 1:
            return f"the Flatten at axis {flat_axis} does not keep the MatMul's last axis alone"
        return super().check(node, x, w, scale, shift, mean, var, training, eps)

    def rewrite(self, op, node, x, w, scale, shift, mean, var, eps, flat_axis, **_):
        s, t = self.affine(scale, shift, mean, var, eps)
        return op.Flatten(self.fold(op, node, x, w, None, s, t), axis=flat_axis)


class MatMulReshapeBatchNorm(MatMulFlattenBatchNorm):
    """MatMul(x [B, N, K], W [K, C]) → Reshape to [B·N, C] → BatchNormalization: LeViT's
    Linear + BatchNorm1d as the dynamo exporter writes `x.flatten(0, 1)` (a Reshape with a
    constant target where TorchScript writes a Flatten) →  Reshape(MatMul(x, W·s) + t)."""

    def pattern(self, op, x, w):
        return _bn(op, op.Reshape(op.MatMul(x, w, _name="node"), Var("newshape"), _name="flat"))

    def check(self, node, x, w, scale, shift, mean, var, training, eps, newshape):
        shape = newshape.constant()
        if shape is None or shape.ndim != 1 or len(shape) != 2 or (shape == 0).any() \
                or w.shape is None or len(w.shape) != 2 or int(shape[1]) != w.shape[1]:
            return "the Reshape does not merge the MatMul's leading axes into [·, C]"
        return _BatchNormAfter.check(self, node, x, w, scale, shift, mean, var, training, eps)

    def rewrite(self, op, node, x, w, scale, shift, mean, var, eps, newshape, **_):
        s, t = self.affine(scale, shift, mean, var, eps)
        return op.Reshape(self.fold(op, node, x, w, None, s, t), newshape)


def _per_channel(c, node, w) -> np.ndarray | str:
    """c as a [C] float64 vector when it broadcasts along the Conv output's axis 1 only."""
    channels = _conv_channels(node, w)
    if isinstance(channels, str) or not c.is_constant:
        return channels if isinstance(channels, str) else f"%{c.name} is not a constant"
    data, rank = c.constant(), len(w.shape)
    shape = (1,) * (rank - data.ndim) + data.shape
    if shape[:1] + shape[2:] != (1,) * (rank - 1) or shape[1] not in (1, channels):
        return f"constant {list(data.shape)} is not [1, {channels}, 1…] over the rank-{rank} output"
    return np.broadcast_to(data.astype(np.float64).reshape(-1), (channels,))


class ConvAddBias(Rule):
    """Conv + constant [1, C, 1, 1] / [C, 1, 1] / scalar → the constant added to Conv's bias."""

    def pattern(self, op, x, w, c):
        return op.Add(op.Conv(x, w, Optional(Var("b")), _name="node"), c)

    def check(self, node, w, c, b=None):
        vector = _per_channel(c, node, w)
        return vector if isinstance(vector, str) else _not_constant(bias=b)

    def rewrite(self, op, node, x, w, c, b=None):
        bias = (_f64(b) if b is not None else 0.0) + _per_channel(c, node, w)
        return op.Conv(x, w, op.const(bias.astype(c.constant().dtype), f"{w.name}_b"),
                       **node.attrs)


class ConvTransposeAddBias(ConvAddBias):
    """ConvTranspose + constant [1, C, 1, 1] / [C, 1, 1] / scalar → the constant added to its
    bias (jax2onnx writes Flax's ConvTranspose bias-less, then adds the bias)."""

    def pattern(self, op, x, w, c):
        return op.Add(op.ConvTranspose(x, w, Optional(Var("b")), _name="node"), c)

    def rewrite(self, op, node, x, w, c, b=None):
        bias = (_f64(b) if b is not None else 0.0) + _per_channel(c, node, w)
        return op.ConvTranspose(x, w, op.const(bias.astype(c.constant().dtype), f"{w.name}_b"),
                                **node.attrs)


class ConvSubBias(ConvAddBias):
    """Conv − constant [1, C, 1, 1] / [C, 1, 1] / scalar → the constant taken from Conv's bias
    (a BatchNorm's mean as NHWC exporters spell it: Sub, then Mul, then Add)."""

    def pattern(self, op, x, w, c):
        return op.Sub(op.Conv(x, w, Optional(Var("b")), _name="node"), c)

    def rewrite(self, op, node, x, w, c, b=None):
        bias = (_f64(b) if b is not None else 0.0) - _per_channel(c, node, w)
        return op.Conv(x, w, op.const(bias.astype(c.constant().dtype), f"{w.name}_b"),
                       **node.attrs)


class ConvMulScale(ConvAddBias):
    """Conv · constant [1, C, 1, 1] / [C, 1, 1] / scalar → W and b scaled per output channel."""

    def pattern(self, op, x, w, c):
        return op.Mul(op.Conv(x, w, Optional(Var("b")), _name="node"), c)

    def check(self, node, w, c, b=None):
        return super().check(node, w, c, b) or _not_constant(weight=w) \
            or _unsafe_scaling(w, _per_channel(c, node, w), np.zeros(1), b)

    def rewrite(self, op, node, x, w, c, b=None):
        return _fold_conv(op, node, x, w, b, _per_channel(c, node, w), 0.0)


def _per_column(c, w, rank: int | None) -> np.ndarray | str:
    """c as an [N] float64 vector when it scales the columns of a product with the 2-D
    constant float weight w [K, N] one by one ([N], [1…, N]; N > 1) and, given the product's
    `rank`, adds no axes to it; else a reason."""
    if w.shape is None or len(w.shape) != 2 or not isinstance(w.shape[1], int):
        return "the MatMul weight is not 2-D"
    reason = _not_constant(weight=w) or (f"%{c.name} is not a constant" if not c.is_constant
                                         else None)
    if reason:
        return reason
    if not np.issubdtype(w.constant().dtype, np.floating):  # W·c would round integers
        return "the MatMul is not a float one"
    data, columns = c.constant(), w.shape[1]
    if data.size == 1:  # a scalar: attention's scaling of q, which its fusions take
        return f"constant {list(data.shape)} is a scalar, not a scale per column"
    if any(d != 1 for d in data.shape[:-1]) or data.shape[-1] != columns:
        return f"constant {list(data.shape)} does not scale the product's {columns} columns alone"
    if rank is not None and data.ndim > rank:
        return f"constant {list(data.shape)} has more axes than the rank-{rank} product"
    return np.broadcast_to(data.astype(np.float64).reshape(-1), (columns,))


def _layer_scale_problem(w, scale: np.ndarray, b=None, options=None, target=None) -> str | None:
    """Why folding the per-column `scale` into the MatMul weight `w` (and bias `b`) would lose
    accuracy the unfused Mul keeps: _unsafe_scaling's reasons; in float16 (the weight's own, or
    what --precision fp16/mixed-fp16 makes of it after this pass), a column whose scaled
    weights sit below float16's normal range as a whole (a LayerScale γ of 1e-6, ConvNeXt's
    initial one: the folded weights kept few bits or flushed to 0, 0.79 off where onnxruntime
    is 6e-3 off, while the product (x·W)·γ, larger than each weight, rounds finely); and an
    int8 compile for an NPU, whose MatMul weights take one scale per tensor (AMCT), which a γ
    spanning decades across the columns coarsens."""
    problem = _unsafe_scaling(w, scale, np.zeros(1), b)
    if problem:
        return problem
    precision = getattr(options, "precision", "keep")
    if w.constant().dtype == np.float16 or precision in ("fp16", "mixed-fp16"):
        with np.errstate(all="ignore"):
            rms = np.sqrt(np.mean(np.square(_f64(w) * scale), axis=0))
        if (rms[scale != 0] < np.finfo(np.float16).tiny).any():
            return "a column of the scaled weights would fall below float16's normal range"
    if getattr(options, "quantize", "none") == "int8" and target is not None \
            and target.device(target.primary).kind == "npu":
        return "an int8 compile for the NPU quantizes a MatMul weight per tensor, which " \
               "the per-column scale would coarsen"
    return None


class MatMulMulScale(Rule):
    """MatMul(x, W [K, N]) · c, c a constant [N] / [1…, N] → MatMul(x, W·c): a LayerScale
    (ConvNeXt, CaiT, DINOv2). A scalar stays: FuseMatMul and the attention fusions take it."""

    def pattern(self, op, x, w, c):
        return op.Mul(op.MatMul(x, w, _name="node"), c)

    def check(self, node, x, w, c, options, target):
        if x.shape is None:
            return "the rank of the MatMul's input is unknown"
        scale = _per_column(c, w, max(len(x.shape), 1))  # [K] · [K, N] is [N]
        return scale if isinstance(scale, str) else _layer_scale_problem(w, scale, None,
                                                                         options, target)

    def rewrite(self, op, node, x, w, c):
        weight = (_f64(w) * _per_column(c, w, None)).astype(w.constant().dtype)
        return op.MatMul(x, op.const(weight, f"{w.name}_fused"))


class MatMulAddMulScale(Rule):
    """(MatMul(x, W [K, N]) + b) · c, b and c constants, c [N] / [1…, N] →
    MatMul(x, W·c) + b·c: a Linear's bias before its LayerScale."""

    def pattern(self, op, x, w, b, c):
        return op.Mul(op.Add(op.MatMul(x, w, _name="node"), b), c)

    def check(self, node, x, w, b, c, options, target):
        # No rank check: b·c keeps every axis that b and c bring to the output.
        scale = _per_column(c, w, None)
        if isinstance(scale, str):
            return scale
        if not b.is_constant:
            return f"bias %{b.name} is not a constant"
        return _layer_scale_problem(w, scale, b, options, target)

    def rewrite(self, op, node, x, w, b, c):
        dtype = w.constant().dtype
        weight = (_f64(w) * _per_column(c, w, None)).astype(dtype)
        bias = (_f64(b) * c.constant().astype(np.float64)).astype(dtype)
        return op.Add(op.MatMul(x, op.const(weight, f"{w.name}_fused")),
                      op.const(bias, f"{w.name}_b"))


def _padded(op):
    return op.Pad(Var("x"), Optional(Var("pads")), Optional(Var("value")),
                  Optional(Var("axes")), _name="pad")


class PadConv(Rule):
    """Pad → Conv: Conv's own zero padding takes the Pad's amounts."""

    def pattern(self, op, w):
        return op.Conv(_padded(op), w, Optional(Var("b")), _name="node")

    def merged(self, node, pad, x, pads=None, value=None, axes=None) -> list[int] | str:
        """node's pads plus the Pad's spatial amounts, or why the Pad cannot fold into node."""
        if node.attr("auto_pad", "NOTSET") != "NOTSET":
            return f"{node.op_type} uses auto_pad"
        if pad.attr("mode", "constant") != "constant":
            return f"Pad mode is {pad.attr('mode')!r}, not constant"
        reason = _not_constant(pads=pads, value=value, axes=axes)
        if reason or x.shape is None:
            return f"Pad {reason}" if reason else f"the rank of %{x.name} is unknown"
        fill = value.constant() if value is not None else pad.attr("value", 0.0)
        problem = self.fill_problem(np.asarray(fill))
        if problem:
            return problem
        rank = len(x.shape)
        amounts = pads.constant() if pads is not None else np.array(pad.attr("pads") or [])
        axes = axes.constant() if axes is not None else np.arange(rank)
        if amounts.size != 2 * axes.size:
            return "Pad's pads do not match its input's rank"
        full = np.zeros((2, rank), np.int64)  # [begins; ends]
        full[:, axes % rank] = amounts.reshape(2, -1)
        if full[:, :2].any() or full.min() < 0:
            return "Pad touches the batch or channel axis, or crops"
        extra = full[:, 2:].ravel().tolist()
        return [a + e for a, e in zip(node.attr("pads") or [0] * len(extra), extra)]

    def fill_problem(self, fill: np.ndarray) -> str | None:
        """Why the Pad's value is not the one the node's own padding stands for (+0.0)."""
        if np.any(fill != 0) or np.any(np.signbit(fill)):
            return f"Pad value is {np.ravel(fill)[0]}, not 0"
        return None

    def check(self, node, pad, x, pads=None, value=None, axes=None):
        merged = self.merged(node, pad, x, pads, value, axes)
        return merged if isinstance(merged, str) else None

    def rewrite(self, op, node, pad, x, pads=None, value=None, axes=None):
        merged = self.merged(node, pad, x, pads, value, axes)
        attrs = {**node.attrs, "pads": merged}
        if node.op_type == "AveragePool":  # the Pad's zeros were counted: so are the pads
            attrs["count_include_pad"] = 1
        return getattr(op, node.op_type)(x, *node.inputs[1:], **attrs)


class PadAveragePool(PadConv):
    """Pad → AveragePool(ceil_mode=0): into the pool's pads, counted (count_include_pad=1), as
    the Pad's zeros are. A pool that does not count its own pads takes the Pad only when it has
    none (old exports pad explicitly before a count_include_pad=0 pool)."""

    def pattern(self, op):
        return op.AveragePool(_padded(op), _name="node")

    def merged(self, node, pad, x, pads=None, value=None, axes=None):
        if node.attr("ceil_mode", 0):
            return "AveragePool has ceil_mode"
        if node.attr("count_include_pad", 0) != 1 and any(node.attr("pads") or []):
            return "AveragePool pads itself without counting those pads (count_include_pad=0), " \
                   "where the Pad's zeros count"
        merged, kernel = super().merged(node, pad, x, pads, value, axes), node.attr("kernel_shape")
        if not isinstance(merged, str) and any(p >= k for p, k in zip(merged, list(kernel) * 2)):
            return f"pads {merged} would reach the kernel {kernel} (onnxruntime needs pad < kernel)"
        return merged


class PadMaxPool(PadConv):
    """Pad(-inf) → MaxPool(ceil_mode=0): into the pool's pads, which no window's max takes.
    timm's MaxPool2dSame exports so: the Pad copied a 1×64×112×112 map (0.96× the export's time
    against 0.63× folded). The same on finite data; onnxruntime's padded 2-D MaxPool starts
    from float32's lowest, so a window of -inf cells alone gives -3.4e38 where it gave -inf."""

    def pattern(self, op):
        return op.MaxPool(_padded(op), _name="node")

    def fill_problem(self, fill: np.ndarray) -> str | None:
        if not np.all(np.isneginf(fill)):
            return f"Pad value is {np.ravel(fill)[0]}, not -inf"
        return None

    def merged(self, node, pad, x, pads=None, value=None, axes=None):
        if node.attr("ceil_mode", 0) or any(d != 1 for d in node.attr("dilations") or []) \
                or any(o is not None and o.uses for o in node.outputs[1:]):
            # ceil_mode: onnxruntime drops a last window that starts in the pool's own padding,
            # not in a Pad's data; a dilated window may hold padding alone; Indices count pads
            return "MaxPool has ceil_mode, dilations or a read Indices output"
        merged, kernel = super().merged(node, pad, x, pads, value, axes), node.attr("kernel_shape")
        if not isinstance(merged, str) and any(p >= k for p, k in zip(merged, list(kernel) * 2)):
            return f"pads {merged} would reach the kernel {kernel} (onnxruntime needs pad < kernel)"
        return merged


@register
class FuseConvBatchNorm(RulePass):
    name = "FuseConvBatchNorm"
    description = "fold BatchNorm, per-channel Add/Mul and Pads into Conv/Gemm/MatMul/pools"
    # Pads first, so that a Conv they rebuild is still seen by the BatchNorm rules in this run.
    rules = (PadConv, PadAveragePool, PadMaxPool, ConvCropPads, ConvBatchNorm, ConcatBatchNorm,
             ConvTransposeBatchNorm, GemmBatchNorm, MatMulBatchNorm, MatMulFlattenBatchNorm,
             MatMulReshapeBatchNorm, ConvAddBias, ConvTransposeAddBias, ConvSubBias, ConvMulScale,
             MatMulMulScale, MatMulAddMulScale)


__all__ = ["FuseConvBatchNorm"]
