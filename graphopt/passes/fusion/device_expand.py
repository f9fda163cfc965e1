"""ExpandForDevice: an op the device that would run it has no kernel for, written as other ops
it has, so it stays on the device instead of sending its neighbourhood to the host.

    Mish(x)  →  x · Tanh(Softplus(x))        (ONNX's own definition of Mish, opset 18)

The dynamo exporter writes `nn.Mish` as the one ONNX op (TorchScript writes the three): CANN's
ONNX operator list has Softplus, Tanh and Mul but no Mish, and a YOLOv4-style backbone on
`ascend310` went to the host whole, each Mish an island boundary. The expansion is the
operator's definition, computed by other kernels: on the CPU stand-in within float32
rounding of onnxruntime's Mish kernel. A target whose NPU has the op, a CPU target, and a
compile without a target keep it. GroupNormalization (group_norm.py) is expanded for the CPU
too, whose onnxruntime has no kernel for it; onnxruntime's BERT ops (device_expand_bert.py)
for an NPU without them.
"""

from __future__ import annotations

from graphopt.ir import DType
from graphopt.passes.base import register
from graphopt.passes.fusion.device_expand_bert import (AttentionAsMatMuls, EmbedLayerNormAsGathers,
                                                       MaskIndexCounted)
from graphopt.passes.fusion.device_kernels import npu_lacks
from graphopt.passes.fusion.group_norm import GroupNormAsInstanceNorm
from graphopt.passes.fusion.onnx_attention import OnnxAttentionAsMatMuls
from graphopt.passes.rules import Rule, RulePass


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


@register
class ExpandForDevice(RulePass):
    name = "ExpandForDevice"
    description = ("rewrite ops the device running them lacks (Mish, GroupNormalization, "
                   "Attention; onnxruntime's Attention and EmbedLayerNormalization) in ONNX ops "
                   "it has")
    rules = (MishAsSoftplusTanh, AttentionAsMatMuls, MaskIndexCounted, EmbedLayerNormAsGathers,
             GroupNormAsInstanceNorm, OnnxAttentionAsMatMuls)


__all__ = ["ExpandForDevice"]
