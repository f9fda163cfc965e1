"""ExpandForDevice: an op the device that would run it has no kernel for, written as other ops
it has, so it stays on the device instead of sending its neighbourhood to the host.

    Mish(x)  →  x · Tanh(Softplus(x))        (ONNX's own definition of Mish, opset 18)
    Swish(x) →  x · Sigmoid(α · x)           (ONNX's Swish, opset 24; α = 1: x · Sigmoid(x))
    SwiGLU(a, b) → a · Sigmoid(α · a) · b    (ONNX's SwiGLU, opset 28: Swish(a) · b)

The dynamo exporter writes `nn.Mish` as the one ONNX op (TorchScript writes the three): CANN's
ONNX operator list has Softplus, Tanh and Mul but no Mish, and a YOLOv4-style backbone on
`ascend310` went to the host whole, each Mish an island boundary. The expansion is the
operator's definition, computed by other kernels: on the CPU stand-in within float32
rounding of onnxruntime's Mish kernel. A target whose NPU has the op, a CPU target, and a
compile without a target keep it. GroupNormalization (group_norm.py) is expanded for the CPU
too, whose onnxruntime has no kernel for it; onnxruntime's BERT ops (device_expand_bert.py)
for an NPU without them. So is SwiGLU: onnxruntime 1.32 expands its function, whose body's
Swish-24 it then finds no kernel for, and a model with one did not load at all.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import DType
from graphopt.passes.base import register
from graphopt.passes.fusion.device_expand_bert import (AttentionAsMatMuls, EmbedLayerNormAsGathers,
                                                       MaskIndexCounted)
from graphopt.passes.fusion.device_kernels import npu_lacks
from graphopt.passes.fusion.group_norm import GroupNormAsInstanceNorm
from graphopt.passes.fusion.onnx_attention import OnnxAttentionAsMatMuls
from graphopt.codegen.om_manifest import dtype_name
from graphopt.passes.rules import Rule, RulePass, placed_device


class MishAsSoftplusTanh(Rule):
    """Mish(x) → x · Tanh(Softplus(x)) on an NPU with Softplus and Tanh but no Mish."""

    dtypes = (DType.FLOAT, DType.FLOAT16)

    def pattern(self, op, x):
        return op.Mish(x)

    def unsupported(self, root, target=None):
        return npu_lacks(target, root, "Mish", ("Softplus", "Tanh", "Mul")) \
            or super().unsupported(root, target)

    def rewrite(self, op, x, **_):
        return op.Mul(x, op.Tanh(op.Softplus(x)))


class SwishAsSigmoid(Rule):
    """Swish(x) → x · Sigmoid(α·x) on an NPU with Sigmoid but no Swish: opset 24's op had sent
    the Conv before it to the host with it."""

    dtypes = (DType.FLOAT, DType.FLOAT16)

    def pattern(self, op, x):
        return op.Swish(x, _name="swish")

    def unsupported(self, root, target=None):
        return npu_lacks(target, root, "Swish", ("Sigmoid", "Mul")) \
            or super().unsupported(root, target)

    def rewrite(self, op, x, swish, **_):
        alpha = float(swish.attr("alpha", 1.0))
        scaled = x if alpha == 1.0 else op.Mul(x, op.const(np.array(alpha, x.dtype.numpy)))
        return op.Mul(x, op.Sigmoid(scaled))


class SwiGLUAsSigmoid(Rule):
    """SwiGLU(a, b) → a · Sigmoid(α·a) · b wherever the device running it has no SwiGLU kernel:
    the CPU provider of onnxruntime 1.32 too, which cannot load the op."""

    dtypes = (DType.FLOAT, DType.FLOAT16)

    def pattern(self, op, a, b):
        return op.SwiGLU(a, b, _name="swiglu")

    def unsupported(self, root, target=None):
        return _runs_swiglu(target, root) or super().unsupported(root, target)

    def rewrite(self, op, a, b, swiglu, **_):
        alpha = float(swiglu.attr("alpha", 1.0))
        scaled = a if alpha == 1.0 else op.Mul(a, op.const(np.array(alpha, a.dtype.numpy)))
        return op.Mul(op.Mul(a, op.Sigmoid(scaled)), b)


def _runs_swiglu(target, root) -> str | None:
    """Why the device that would run the SwiGLU at `root` keeps it (None: it has no kernel for
    it, but Sigmoid and Mul): onnxruntime's CPU kernel registry for a compile without a target."""
    if target is None:
        from graphopt.partition.target import load_target

        target = load_target("cpu")
    device = placed_device(target, root)
    dtype = dtype_name(int(root.dtype)) if root.dtype is not None else None
    if device.has_kernel("SwiGLU", "", dtype):
        return f"target {target.shown}: its {device.name} runs SwiGLU"
    missing = [op for op in ("Sigmoid", "Mul") if not device.has_kernel(op, "", dtype)]
    if missing:
        return f"target {target.shown}: its {device.name} has no kernel for " \
               f"{', '.join(missing)} either"
    return None


@register
class ExpandForDevice(RulePass):
    name = "ExpandForDevice"
    description = ("rewrite ops the device running them lacks (Mish, Swish, SwiGLU, "
                   "GroupNormalization, Attention; onnxruntime's Attention and "
                   "EmbedLayerNormalization) in ONNX ops it has")
    rules = (MishAsSoftplusTanh, SwishAsSigmoid, SwiGLUAsSigmoid, AttentionAsMatMuls,
             MaskIndexCounted,
             EmbedLayerNormAsGathers, GroupNormAsInstanceNorm, OnnxAttentionAsMatMuls)


__all__ = ["ExpandForDevice"]
