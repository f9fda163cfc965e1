"""FuseGelu: GELU as exporters decompose it, into onnxruntime's Gelu/FastGelu/BiasGelu/QuickGelu.

    erf form    y = x · ½ · (1 + erf(x / √2))                         → com.microsoft::Gelu
                Div(x, √2) → Erf → Add 1 → Mul x → Mul ½   (½ may come first: (x·½)·(1+erf),
                or inside: x·(½·(1+erf)) as the dynamo exporter writes it; the Div may be a Mul
                by 1/√2, as TensorFlow writes it)
    tanh form   y = ½ · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))   → com.microsoft::FastGelu
                (½ first, last or inside, as for erf; x³ as Pow(x, 3) or x·x·x; the argument
                also as BLOOM factors it, (√(2/π)·x) · (1 + 0.044715·x·x))
    QuickGelu   y = x · sigmoid(1.702 · x)                             → com.microsoft::QuickGelu
    SiLU        y = x · sigmoid(x)                                     → QuickGelu(alpha=1)
    bias        Gelu(Add(x, b)) with b a 1-D constant over the last axis → BiasGelu(x, b)
                FastGelu(Add(x, b)) likewise → FastGelu(x, b), its optional bias input; ONNX's
                own Gelu (opset 20, which the dynamo exporter writes for nn.GELU) too, its
                `approximate="tanh"` into FastGelu(x, b)
"""

from __future__ import annotations

import math

import numpy as np

from graphopt.ir import DType
from graphopt.ir.pattern import Attr, Const, OneOf
from graphopt.passes.base import register
from graphopt.passes.rules import Rule, RulePass, placed_device

MS = "com.microsoft"
SQRT2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
EXACT_3 = Const(3.0, rtol=0.0)  # x³: any other exponent is NaN for a negative x


def _erf_part(op, x):
    """1 + erf(x/√2), with the division written as a multiplication by 1/√2 too."""
    scaled = op.Div(x, SQRT2)
    return op.Add(op.Erf(scaled), 1.0)


def _erf_part_mul(op, x):
    return op.Add(op.Erf(op.Mul(x, 1.0 / SQRT2)), 1.0)


def _erf_part_either(op, x):
    return op.Add(op.Erf(OneOf(op.Div(x, SQRT2), op.Mul(x, 1.0 / SQRT2))), 1.0)


class _ToGelu(Rule):
    emits = ((MS, "Gelu"),)
    dtypes = (DType.FLOAT,)
    device_dtypes = (DType.FLOAT16,)

    def rewrite(self, op, x):
        return op.Gelu(x, _domain=MS)


class GeluErf(_ToGelu):
    """(x · (1 + erf(x/√2))) · ½"""

    def pattern(self, op, x):
        return op.Mul(op.Mul(x, _erf_part(op, x)), 0.5)


class GeluErfHalfFirst(_ToGelu):
    """(x · ½) · (1 + erf(x/√2)), as `x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))` exports."""

    def pattern(self, op, x):
        return op.Mul(op.Mul(x, 0.5), _erf_part(op, x))


class GeluErfMulForm(_ToGelu):
    """(x · (1 + erf(x · 1/√2))) · ½"""

    def pattern(self, op, x):
        return op.Mul(op.Mul(x, _erf_part_mul(op, x)), 0.5)


class GeluErfHalfFirstMulForm(_ToGelu):
    """(x · ½) · (1 + erf(x · 1/√2)), as tf2onnx writes Keras's `gelu` (TensorFlow folds the
    division into a multiplication by its reciprocal)."""

    def pattern(self, op, x):
        return op.Mul(op.Mul(x, 0.5), _erf_part_mul(op, x))


class GeluErfHalfInside(_ToGelu):
    """x · (½ · (1 + erf(x/√2))), as the dynamo exporter writes `gelu` (onnxscript's
    aten_gelu); x/√2 also as x · 1/√2."""

    def pattern(self, op, x):
        return op.Mul(x, op.Mul(_erf_part_either(op, x), 0.5))


def _tanh_inner(op, x):
    """1 + tanh(√(2/π) · (x + 0.044715 · x³)), x³ as Pow(x, 3) or x·(x·x) (`x * x * x`, either
    association, through the commuted Mul), or the term as ((0.044715 · x) · x) · x
    (`0.044715 * x * x * x`); or with the argument factored as BLOOM writes it,
    (x · √(2/π)) · (1 + 0.044715·x·x): the same polynomial, c·x + c·k·x³."""
    cube = OneOf(op.Pow(x, EXACT_3), op.Mul(x, op.Mul(x, x)))
    term = OneOf(op.Mul(cube, 0.044715), op.Mul(op.Mul(op.Mul(x, 0.044715), x), x))
    polynomial = op.Mul(op.Add(x, term), SQRT_2_OVER_PI)
    square = OneOf(op.Mul(op.Mul(x, 0.044715), x), op.Mul(op.Mul(x, x), 0.044715))
    factored = op.Mul(op.Mul(x, SQRT_2_OVER_PI), op.Add(square, 1.0))
    return op.Add(op.Tanh(OneOf(polynomial, factored)), 1.0)


class _ToFastGelu(Rule):
    emits = ((MS, "FastGelu"),)
    dtypes = (DType.FLOAT,)
    device_dtypes = (DType.FLOAT16,)

    def rewrite(self, op, x, **_):
        return op.FastGelu(x, _domain=MS)


class GeluTanh(_ToFastGelu):
    """(x · ½) · (1 + tanh(√(2/π) · (x + 0.044715 · x³))), also BLOOM's
    (x · ½) · (1 + tanh((x · √(2/π)) · (1 + (0.044715 · x) · x)))."""

    def pattern(self, op, x):
        return op.Mul(op.Mul(x, 0.5), _tanh_inner(op, x))


class GeluTanhHalfLast(_ToFastGelu):
    """(x · (1 + tanh(…))) · ½, also ½ · (x · (1 + tanh(…))) through the commuted Mul."""

    def pattern(self, op, x):
        return op.Mul(op.Mul(x, _tanh_inner(op, x)), 0.5)


class GeluTanhHalfInside(_ToFastGelu):
    """x · (½ · (1 + tanh(…))), as the dynamo exporter writes `gelu(approximate="tanh")`
    (Gemma's gelu_pytorch_tanh)."""

    def pattern(self, op, x):
        return op.Mul(x, op.Mul(_tanh_inner(op, x), 0.5))


class QuickGelu(Rule):
    """x · sigmoid(α · x), α ≈ 1.702 (CLIP's approximation)."""

    emits = ((MS, "QuickGelu"),)
    dtypes = (DType.FLOAT,)
    device_dtypes = (DType.FLOAT16,)

    def pattern(self, op, x):
        return op.Mul(x, op.Sigmoid(op.Mul(x, Const(pred=_scalar, name="alpha"))))

    def check(self, alpha):
        value = float(np.asarray(alpha).reshape(-1)[0])
        return None if abs(value - 1.702) < 1e-3 else f"sigmoid scale {value} is not 1.702"

    def rewrite(self, op, x, alpha):
        return op.QuickGelu(x, _domain=MS, alpha=float(np.asarray(alpha).reshape(-1)[0]))


def _scalar(data: np.ndarray) -> bool:
    return data.size == 1


# The convs whose output a SiLU stays decomposed after (see Silu).
CONVS = ("Conv", "FusedConv", "ConvTranspose")


class Silu(Rule):
    """x · sigmoid(x) (SiLU, Swish) → QuickGelu(x, alpha=1), as onnxruntime's QuickGeluFusion
    makes it: one pass over x instead of two, and the same numbers (both run MLAS's logistic).
    A conv's output on the CPU is left alone: LayoutNchwc keeps Sigmoid and Mul in the blocked
    layout, where onnxruntime fuses them itself, and would have to reorder around a QuickGelu.
    On an NPU, whose convs keep their own device format, the pair is one vector kernel (CANN's
    Swish) like any other SiLU."""

    emits = ((MS, "QuickGelu"),)
    dtypes = (DType.FLOAT,)
    device_dtypes = (DType.FLOAT16,)

    def pattern(self, op, x):
        return op.Mul(x, op.Sigmoid(x))

    def check(self, x, target):
        producer = x.producer
        on_npu = target is not None and placed_device(target, x).kind == "npu"
        if producer is not None and producer.op_type in CONVS and not on_npu:
            return f"x comes from {producer.op_type} '{producer.name}', whose SiLU the " \
                   "NCHWc layout keeps blocked"
        return None

    def rewrite(self, op, x):
        return op.QuickGelu(x, _domain=MS, alpha=1.0)


class BiasGelu(Rule):
    """Gelu(x + b), b a constant vector over the last axis → BiasGelu(x, b)."""

    emits = ((MS, "BiasGelu"),)
    dtypes = (DType.FLOAT,)
    device_dtypes = (DType.FLOAT16,)

    def pattern(self, op, x, bias):
        return op.Gelu(op.Add(x, bias), _domain=MS)

    def check(self, x, bias):
        if not bias.is_constant or bias.shape is None or len(bias.shape) != 1:
            return "bias is not a 1-D constant"
        if x.shape is None or not x.shape or x.shape[-1] != bias.shape[0]:
            return "bias does not run along the last axis of x"
        return None

    def rewrite(self, op, x, bias):
        return op.BiasGelu(x, bias, _domain=MS)


class FastGeluBias(BiasGelu):
    """FastGelu(x + b), b a constant vector over the last axis → FastGelu(x, b). onnxruntime's
    FastGeluFusion does this at its extended level, which a CPU partition of fused transformer
    ops skips (it would bring back the slow SkipLayerNormalization): one kernel and one pass
    over the activations fewer per layer."""

    emits = ((MS, "FastGelu"),)

    def pattern(self, op, x, bias):
        return op.FastGelu(op.Add(x, bias), _domain=MS)

    def rewrite(self, op, x, bias):
        return op.FastGelu(x, bias, _domain=MS)


def _approximation(value) -> str:
    return value.decode() if isinstance(value, bytes) else value or "none"


class OnnxBiasGelu(BiasGelu):
    """ONNX's Gelu (opset 20, exact) of x + b → BiasGelu(x, b): onnxruntime fuses neither it
    nor the Add (a 256×1536 MLP activation took 1.14× the BiasGelu's time)."""

    def pattern(self, op, x, bias):
        return op.Gelu(op.Add(x, bias), approximate=Attr(
            "approximate", "none", pred=lambda v: _approximation(v) == "none"))


class OnnxFastGeluBias(FastGeluBias):
    """ONNX's Gelu with approximate="tanh" of x + b → FastGelu(x, b), the same tanh formula."""

    def pattern(self, op, x, bias):
        return op.Gelu(op.Add(x, bias), approximate=Attr(
            "approximate", "none", pred=lambda v: _approximation(v) == "tanh"))


@register
class FuseGelu(RulePass):
    name = "FuseGelu"
    description = ("GELU (erf and tanh forms, QuickGelu, SiLU, with bias) into onnxruntime's "
                   "fused ops")
    rules = (GeluErf, GeluErfHalfFirst, GeluErfMulForm, GeluErfHalfFirstMulForm,
             GeluErfHalfInside, GeluTanh, GeluTanhHalfLast, GeluTanhHalfInside, QuickGelu, Silu,
             BiasGelu, FastGeluBias, OnnxBiasGelu, OnnxFastGeluBias)


__all__ = ["FuseGelu"]
