"""ONNX's own Attention (opset 23), as the dynamo exporter writes scaled_dot_product_attention
from opset 23 on, in MatMul and Softmax for an NPU without a kernel for it (ExpandForDevice):

    Attention(Q, K, V, M)  →  Softmax(Q · Kᵀ · scale + M) · V        Q, K, V [B, N, S, H]

for the form without past keys, soft-capping or a second output, with K and V of Q's heads,
and with no mask, an additive float mask, or `is_causal` or opset 25's sliding window
(`left_window_size`, `right_window_size`) over as many keys as queries (a constant -inf above
the diagonal, or outside the band, as the spec's upper-left alignment gives). A row a mask
masks whole gives 0, as onnxruntime's kernel gives it, where Softmax gives NaN (a mask value
of float32's lowest counts as -inf there, as in the kernel); such a row is told from the mask
and the bands, so a NaN the data brings (a NaN query, a NaN or +inf mask entry) stays NaN, as
in the kernel (the expansion had made every NaN 0). A boolean mask
stays: a row it masks whole comes out as onnxruntime's kernel decides. A diffusers VAE
decoder exported at opset 23 kept its attention block and 33 of its 124 nodes on the host.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import DType
from graphopt.ir.pattern import Optional, Var
from graphopt.passes.fusion.device_kernels import npu_lacks
from graphopt.passes.rules import Rule

_BODY = ("MatMul", "Transpose", "Mul", "Add", "Softmax", "IsNaN", "Where", "Equal", "ReduceMax")


class OnnxAttentionAsMatMuls(Rule):
    """Attention-23 over [B, N, S, H] heads → MatMul, scale, mask, Softmax, MatMul."""

    # float32 only: on float16 heads the expanded ops differed from onnxruntime's kernel by
    # 0.58 where a large finite mask value dominated a row (a differential fuzz's case).
    dtypes = (DType.FLOAT,)

    def pattern(self, op, q, k, v):
        return op.Attention(q, k, v, Optional(Var("mask")), _name="attention")

    def unsupported(self, root, target=None):
        return npu_lacks(target, root, "Attention", _BODY) or super().unsupported(root, target)

    def check(self, q, k, v, attention, mask=None, **_):
        if len([x for x in attention.inputs if x is not None]) > 3 + (mask is not None):
            return "it reads past keys and values"
        if any(x is not None and x.uses for x in attention.outputs[1:]):
            return "its present keys or its scores are read"
        if float(attention.attr("softcap", 0.0)) or int(attention.attr("qk_matmul_output_mode", 0)):
            return "it soft-caps its scores or returns them"
        shapes = [x.shape for x in (q, k, v)]
        if any(s is None or len(s) != 4 for s in shapes):
            return "Q, K and V are not [B, N, S, H] heads"
        if shapes[0][1] != shapes[1][1] or shapes[1][1] != shapes[2][1] \
                or not isinstance(shapes[0][3], int):
            return "K and V have other heads than Q (grouped-query), or the head size is open"
        if mask is not None and mask.dtype != q.dtype:
            return f"its mask %{mask.name} is not additive (a {mask.dtype} mask)"
        if mask is not None and (not mask.shape or mask.shape[-1] != shapes[1][2]):
            # From opset 24 a mask shorter than the keys is padded with -inf, which the Add
            # of the expansion would broadcast instead (or fail on).
            return f"its mask %{mask.name} does not span every key"
        if float(attention.attr("scale", 1.0)) < 0:
            # The op scales Q and K by its square root each: onnxruntime gives NaN.
            return "its scale is negative"
        if (int(attention.attr("is_causal", 0)) or _windowed(attention)) and not (
                isinstance(shapes[0][2], int) and shapes[0][2] == shapes[1][2]):
            return ("causal or windowed over another number of keys than queries, or at an open "
                    "length")
        return None

    def rewrite(self, op, q, k, v, attention, mask=None, **_):
        size = q.shape[3]
        scale = attention.attr("scale")
        if scale is None:  # 0.0 is a scale (every key weighs the same), not the default
            scale = 1.0 / np.sqrt(size)
        dtype = np.float32
        scores = op.Mul(op.MatMul(q, op.Transpose(k, perm=[0, 1, 3, 2])),
                        op.const(np.array(scale, dtype)))
        if mask is not None:
            # onnxruntime's kernel takes float32's lowest (what transformers writes) as -inf: a
            # row of it gives 0, where Softmax of the finite sum averaged V over the row
            lowest = op.const(np.array(np.finfo(dtype).min, dtype))
            mask = op.Where(op.Equal(mask, lowest), op.const(np.array(-np.inf, dtype)), mask)
            scores = op.Add(scores, mask)
        if int(attention.attr("is_causal", 0)):
            length = q.shape[2]
            above = np.triu(np.full((length, length), -np.inf, dtype), 1)
            scores = op.Add(scores, op.const(above))
        if _windowed(attention):
            scores = op.Add(scores, op.const(_outside_window(attention, q.shape[2])))
        probs = op.Softmax(scores, axis=-1)
        if mask is not None:  # a row masked whole: onnxruntime's kernel gives 0, Softmax NaN
            # Decided from the mask (with the causal and window bands), not from the NaN
            # itself: a NaN the data brings (a NaN query, a NaN or +inf mask entry) stays NaN.
            bias = mask
            if int(attention.attr("is_causal", 0)):
                bias = op.Add(bias, op.const(above))
            if _windowed(attention):
                bias = op.Add(bias, op.const(_outside_window(attention, q.shape[2])))
            whole = op.Equal(op.ReduceMax(bias, op.const(np.array([-1], np.int64)), keepdims=1),
                             op.const(np.array(-np.inf, dtype)))
            probs = op.Where(whole, op.const(np.array(0.0, dtype)), probs)
        return op.MatMul(probs, v)


def _windowed(attention) -> bool:
    """Whether an opset-25 Attention bounds the keys a query sees (-1: that side unbounded).
    Dropped, the expansion computed full attention (ONNX's bidirectional-window test case)."""
    return int(attention.attr("left_window_size", -1)) >= 0 \
        or int(attention.attr("right_window_size", -1)) >= 0


def _outside_window(attention, length: int) -> np.ndarray:
    """[length, length] -inf where query i may not see key j: below i - left or above
    i + right (the diagonal always in, so no row is masked whole)."""
    behind = np.arange(length)[:, None] - np.arange(length)[None, :]  # i - j
    left = int(attention.attr("left_window_size", -1))
    right = int(attention.attr("right_window_size", -1))
    outside = np.zeros((length, length), bool)
    if left >= 0:
        outside |= behind > left
    if right >= 0:
        outside |= -behind > right
    return np.where(outside, -np.inf, 0.0).astype(np.float32)
