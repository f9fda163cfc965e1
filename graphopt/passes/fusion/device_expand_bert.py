"""onnxruntime's BERT ops, as its transformer optimizer writes them, in ONNX ops for an NPU that
has no kernel for them (ExpandForDevice):

    EmbedLayerNormalization(ids, segments, word, position, segment, γ, β, mask)
        →  LayerNormalization(word[ids] + position[0..S) + segment[segments], γ, β)
    Attention(x, W, b, mask_index)   (packed Q|K|V projection, N heads)
        →  softmax(q·kᵀ/√H + mask) · v, the heads split and merged by Reshape and Transpose

as onnxruntime's CPU kernels compute them: a mask_index of one length per sequence (what
EmbedLayerNormalization makes: the count of ones in each mask row) masks the keys from that
length on, a raw [B, T] mask the keys where it is 0 or less, each by adding mask_filter_value
(-10000 unless set) to their scores. A BERT saved by the optimizer had gone to the host whole
on ascend310 and ascend910b (no kernel for EmbedLayerNormalization, and on the 310 none for
Attention either, and the islands they cut returned the rest).
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import DType, Value
from graphopt.ir.pattern import Optional, Var
from graphopt.passes.fusion.device_kernels import npu_lacks
from graphopt.passes.fusion.layernorm import opset_17_blocker
from graphopt.passes.opset_raise import raise_opset
from graphopt.passes.rules import Rule

MS = "com.microsoft"
_EMBED_BODY = ("Gather", "Add", "LayerNormalization")
_ATTENTION_BODY = ("MatMul", "Add", "Split", "Reshape", "Transpose", "Mul", "Softmax", "Where",
                   "Less", "Greater", "Cast", "Equal", "ReduceSum")
_MASK_OPS = ("Cast",)  # from the mask's integers


class EmbedLayerNormAsGathers(Rule):
    """EmbedLayerNormalization → Gathers of the three tables, their sum, LayerNormalization."""

    dtypes = (DType.FLOAT, DType.FLOAT16)

    def unsupported(self, root, target=None):
        return npu_lacks(target, root, "EmbedLayerNormalization", _EMBED_BODY, MS) \
            or super().unsupported(root, target)

    def pattern(self, op, ids):
        return op.EmbedLayerNormalization(
            ids, Optional(Var("segments")), Var("words", const=True),
            Var("positions", const=True), Optional(Var("segment_table", const=True)),
            Var("gamma", const=True), Var("beta", const=True), Optional(Var("mask")),
            _domain=MS, _name="embed")

    def check(self, ids, embed, model, segments=None, segment_table=None, **_):
        blocker = opset_17_blocker(model)
        if blocker:
            return blocker
        if len(embed.inputs) > 8 and embed.input(8) is not None:
            return "position_ids given: the positions are not 0 .. S-1"
        if (segments is None) != (segment_table is None):
            return "segment ids without a segment table, or the other way round"
        if ids.static_shape is None or len(ids.shape) != 2:
            return f"%{ids.name} has no static [B, S] shape"
        if any(v is not None and v.uses for v in embed.outputs[1:]):
            return "its mask index or embedding sum is read (by an Attention not expanded)"
        return None

    def rewrite(self, op, ids, words, positions, gamma, beta, embed, segments=None,
                segment_table=None, **_):
        raise_opset(op.model, 17)  # checked: every node means the same at 17
        length = ids.shape[1]
        total = op.Add(op.Gather(words, ids), op.Gather(
            positions, op.const(np.arange(length, dtype=np.int64))))
        if segments is not None:
            total = op.Add(total, op.Gather(segment_table, segments))
        return op.LayerNormalization(total, gamma, beta, axis=-1,
                                     epsilon=float(embed.attr("epsilon", 1e-12)))


class AttentionAsMatMuls(Rule):
    """Attention (packed projection, optional 1-D or raw 2-D mask) → MatMul, Softmax, MatMul."""

    dtypes = (DType.FLOAT,)  # (its scale and mask are written as float32 constants)

    def unsupported(self, root, target=None):
        return npu_lacks(target, root, "Attention", _ATTENTION_BODY, MS, _MASK_OPS) \
            or super().unsupported(root, target)

    def pattern(self, op, x):
        return op.Attention(x, Var("weights", const=True), Optional(Var("bias", const=True)),
                            Optional(Var("mask_index")), _domain=MS, _name="attention")

    def check(self, x, weights, attention, mask_index=None, **_):
        if len([v for v in attention.inputs if v is not None]) > 4:
            return "it reads past keys or an attention bias"
        if int(attention.attr("unidirectional", 0)) or attention.attr("qkv_hidden_sizes"):
            return "a causal or unevenly packed Attention"
        if x.static_shape is None or len(x.shape) != 3 or weights.shape is None \
                or len(weights.shape) != 2 or weights.shape[1] % 3:
            return "the input or the packed weights have no static [B, S, D] / [D, 3H] shape"
        heads = int(attention.attr("num_heads", 0))
        if heads <= 0 or (weights.shape[1] // 3) % heads:
            return "the width does not split into num_heads heads"
        if mask_index is not None and (mask_index.shape is None or len(mask_index.shape) not in (
                1, 2) or mask_index.shape[0] != x.shape[0]
                or len(mask_index.shape) == 2 and mask_index.shape[1] != x.shape[1]):
            return "its mask_index is neither one length per sequence nor a [B, S] mask"
        return None

    def rewrite(self, op, x, weights, attention, bias=None, mask_index=None, **_):
        batch, length, _ = x.shape
        width = weights.shape[1] // 3
        heads = int(attention.attr("num_heads"))
        size = width // heads
        qkv = op.MatMul(x, weights)
        if bias is not None:
            qkv = op.Add(qkv, bias)
        q, k, v = op.Split(qkv, op.const(np.array([width] * 3, np.int64)), axis=-1, _outputs=3)
        split = op.const(np.array([0, 0, heads, size], np.int64))
        q4 = op.Transpose(op.Reshape(q, split), perm=[0, 2, 1, 3])
        kt = op.Transpose(op.Reshape(k, split), perm=[0, 2, 3, 1])
        v4 = op.Transpose(op.Reshape(v, split), perm=[0, 2, 1, 3])
        scale = attention.attr("scale") or 1.0 / np.sqrt(size)
        scores = op.Mul(op.MatMul(q4, kt), op.const(np.array(scale, np.float32)))
        if mask_index is not None:
            scores = op.Add(scores, _key_bias(op, mask_index, batch, length,
                                              float(attention.attr("mask_filter_value", -10000.0))))
        probs = op.Softmax(scores, axis=-1)
        merged = op.Transpose(op.MatMul(probs, v4), perm=[0, 2, 1, 3])
        return op.Reshape(merged, op.const(np.array([0, 0, width], np.int64)))


class MaskIndexCounted(Rule):
    """Attention(…, mask_index) whose mask_index an EmbedLayerNormalization the NPU lacks makes:
    the same Attention, the lengths counted from the mask by ONNX ops, so that the
    EmbedLayerNormalization expands too (its other output was all that held it)."""

    emits = ((MS, "Attention"),)

    def pattern(self, op, x, mask_index):
        return op.Attention(x, Var("weights"), Optional(Var("bias")), mask_index,
                            _domain=MS, _name="attention")

    def unsupported(self, root, target=None):
        return npu_lacks(target, root, "EmbedLayerNormalization", _EMBED_BODY, MS) \
            or super().unsupported(root, target)

    def check(self, attention, mask_index, **_):
        if len([v for v in attention.inputs if v is not None]) > 4:
            return "it reads past keys or an attention bias"
        if _embedded_mask(mask_index) is None:
            return "its mask_index is not an EmbedLayerNormalization's count of a mask"
        return None

    def rewrite(self, op, x, weights, attention, mask_index, bias=None, **_):
        lengths = op.Cast(_counted(op, _embedded_mask(mask_index)), to=6)  # int32
        return op.Attention(x, weights, bias, lengths, _domain=MS, **attention.attrs)


def _embedded_mask(mask_index: Value) -> Value | None:
    """The mask whose ones EmbedLayerNormalization counted into `mask_index`, else None."""
    source = mask_index.producer
    if source is None or source.op_type != "EmbedLayerNormalization" or source.domain != MS \
            or len(source.outputs) < 2 or source.outputs[1] is not mask_index:
        return None
    return source.input(7)


def _counted(op, mask: Value) -> Value:
    """[B] float32: the ones in each row of `mask`, as EmbedLayerNormalization counts them."""
    one = op.const(np.array(1.0, np.float32))
    ones = op.Cast(op.Equal(op.Cast(mask, to=1), one), to=1)
    return op.ReduceSum(ones, op.const(np.array([1], np.int64)), keepdims=0)


def _key_bias(op, mask_index: Value, batch: int, length: int, fill: float) -> Value:
    """[B, 1, 1, S]: 0 on the keys a row attends to, `fill` on the others. A length per
    sequence made by EmbedLayerNormalization is counted from its mask here, as the kernel
    counts it (the ones in each row), so that the EmbedLayerNormalization can go too."""
    zero, filled = op.const(np.array(0.0, np.float32)), op.const(np.array(fill, np.float32))
    # Every op but the Casts on float32: an NPU's Equal, ReduceSum and Less may take no int32.
    if len(mask_index.shape) == 2:  # a raw mask: a key is kept where it is above 0
        keep = op.Greater(op.Cast(mask_index, to=1), zero)
    else:
        mask = _embedded_mask(mask_index)
        lengths = op.Cast(mask_index, to=1) if mask is None else _counted(op, mask)
        positions = op.const(np.arange(length, dtype=np.float32).reshape(1, length))
        keep = op.Less(positions, op.Reshape(lengths, op.const(np.array([batch, 1], np.int64))))
    bias = op.Where(keep, zero, filled)
    return op.Reshape(bias, op.const(np.array([batch, 1, 1, length], np.int64)))

