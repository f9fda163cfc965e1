"""Attention → its packed QKV GEMM, a Split and MultiHeadAttention: the form in which the int8
and int4 passes quantize an Attention's weights.

    x ─ Attention(Wqkv, b) ─ y          x ─ GEMM(Wqkv, b) ─ Split ─ MultiHeadAttention ─ y
          └─ present ─ Gather(1) ─ …  ⇒                        └─ present_value ─ …

onnxruntime's CPU Attention has no form that reads quantized weights, and its
MultiHeadAttention no packed-QKV one ("Packed QKV of shape (B, L, N, 3, H) not implemented for
CPU"), hence the Split. An Attention whose `present` (K and V, [2, B, N, S, H]) is read, as
PackedGuardedSelfAttention's guard reads V from it, keeps those readers: MultiHeadAttention
returns K and V as present_key and present_value, in the same [B, N, S, H] layout.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from graphopt.ir import Node, Value
from graphopt.passes.edit import replace_value

MS = "com.microsoft"


def refusal(node: Node) -> str | None:
    """Why Attention `node` cannot be split (None when it can): past state, rotary, a causal
    or unequal-width form, or a `present` read other than by a Gather of K or V."""
    if any(node.input(i) is not None for i in (3, 4, 6)):
        return "it reads a mask index, past state or past sequence length"
    if node.attr("unidirectional", 0) or node.attr("do_rotary", 0) \
            or node.attr("past_present_share_buffer", 0):
        return "it is causal, rotary or shares past and present buffers"
    if node.attr("qkv_hidden_sizes") is not None:
        return "its Q, K and V differ in width"
    if len(node.outputs) > 2 or (len(node.outputs) == 2
                                 and _present_reads(node.outputs[1]) is None):
        return "its present output is read other than as K or V"
    return None


def _present_reads(present: Value) -> list[tuple[Node, int]] | None:
    """(reader, 0 for K or 1 for V) for each reader of `present`, when each is a Gather of a
    constant scalar index on axis 0; None otherwise (a present the model returns too)."""
    if present.is_graph_output:
        return None
    reads = []
    for reader, slot in present.uses:
        index = reader.input(1)
        data = index.constant() if reader.op_type == "Gather" and reader.is_onnx and slot == 0 \
            and index is not None and index.is_constant else None
        if data is None or np.ndim(data) != 0 or int(data) not in (0, 1, -1, -2) \
                or reader.attr("axis", 0) != 0:
            return None
        reads.append((reader, int(data) % 2))
    return reads


def split_attention(graph, node: Node, gemm: Callable[[Value], Node]) -> None:
    """Replace Attention `node` (refusal(node) is None) by gemm(qkv), a node the caller makes
    that computes x·Wqkv + b into `qkv`; a Split of qkv into q, k and v; and a float
    MultiHeadAttention over them with `node`'s heads, scale and attention bias."""
    x, w_value = node.inputs[0], node.inputs[1]
    out = node.outputs[0]
    width = w_value.shape[1] // 3
    shape = None if x.shape is None else (*x.shape[:-1], 3 * width)
    dtype = out.dtype or x.dtype
    qkv = Value(graph.fresh_name(f"{out.name}_qkv"), dtype, shape)
    graph.insert_before(node, gemm(qkv))
    parts = [Value(graph.fresh_name(f"{out.name}_{p}"), dtype,
                   None if shape is None else (*shape[:-1], width)) for p in "qkv"]
    sizes = graph.make_initializer(f"{out.name}_qkv_sizes", np.array([width] * 3, np.int64))
    graph.insert_before(node, Node("Split", [qkv, sizes], {"axis": -1}, outputs=parts,
                                   name=graph.fresh_node_name(f"{node.name or out.name}/Split")))
    attrs = {k: a.value for k, a in node.attrs.items()
             if k in ("num_heads", "scale", "mask_filter_value")}
    attention_bias = node.input(5)
    inputs = [*parts] + ([None, None, attention_bias] if attention_bias is not None else [])
    outputs = [Value(graph.fresh_name(f"{out.name}_mha"), dtype, out.shape)]
    reads = _present_reads(node.outputs[1]) if len(node.outputs) > 1 else []
    if reads:
        present = node.outputs[1]
        kv_shape = None if present.shape is None else present.shape[1:]
        outputs += [Value(graph.fresh_name(f"{out.name}_present_{p}"), present.dtype, kv_shape)
                    for p in ("key", "value")]
    mha = Node("MultiHeadAttention", inputs, attrs, domain=MS, name=node.name, outputs=outputs)
    graph.insert_before(node, mha)
    replace_value(out, mha.outputs[0])
    for reader, which in reads:
        replace_value(reader.outputs[0], mha.outputs[1 + which])
        graph.remove(reader)
    graph.remove(node)


__all__ = ["refusal", "split_attention"]
