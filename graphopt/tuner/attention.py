r"""A fused attention kernel's work, as both cost models price it.

For the fused attention ops (onnxruntime's Attention, MultiHeadAttention and
GroupQueryAttention, ONNX's Attention of opset 23), from static shapes and attributes:

    pairs = B · heads · Sq · T          query-key pairs scored (T: keys, past ones included)
    macs  = pairs · (H + Hv)            Q·Kᵀ and P·V, H and Hv the head sizes of Q/K and V
            + B · Sq · H_in · W         onnxruntime's Attention also projects Q, K and V

A causal kernel (GroupQueryAttention always; the others with `unidirectional`, ONNX's with
`is_causal`) scores only the pairs whose key is not after the query: query i of Sq, after P past
keys, sees P + i + 1 of them, Σ = Sq·P + Sq·(Sq+1)/2 per head (`causal_pairs`). A flash
attention kernel, which CANN's FusedInferAttentionScore is, skips the masked blocks; onnxruntime's
CPU kernels score the whole rectangle and mask it.

T comes from the present key output where its shape is known ([B, N, T, H]), else from the keys
and the past ones given. Priced per output element, as an elementwise op, a 4096-token layer's
attention had cost what an Add over its output does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from graphopt.ir import Node, Value

ATTENTION_OPS = frozenset({"Attention", "MultiHeadAttention", "GroupQueryAttention"})


@dataclass(frozen=True)
class AttentionWork:
    batch: int
    heads: int
    queries: int         # Sq
    keys: int            # T, past keys included
    head_size: int       # H, of Q and K
    value_head_size: int  # Hv
    causal: bool
    projection_macs: int = 0  # onnxruntime's Attention: its packed QKV GEMM

    @property
    def pairs(self) -> int:
        return self.batch * self.heads * self.queries * self.keys

    @property
    def causal_pairs(self) -> int:
        """The pairs a kernel that skips masked blocks scores (all of them when not causal)."""
        if not self.causal or self.keys < self.queries:
            return self.pairs
        past = self.keys - self.queries
        seen = self.queries * past + self.queries * (self.queries + 1) // 2
        return self.batch * self.heads * seen

    def macs(self, skip_masked: bool = False) -> int:
        pairs = self.causal_pairs if skip_masked else self.pairs
        return pairs * (self.head_size + self.value_head_size) + self.projection_macs


def attention_work(node: Node) -> AttentionWork | None:
    """The work of a fused attention node; None for another op or shapes not all static."""
    if node.op_type not in ATTENTION_OPS:
        return None
    if node.is_onnx:
        return _onnx_attention(node) if node.op_type == "Attention" else None
    if node.domain != "com.microsoft":
        return None
    try:
        if node.op_type == "Attention":
            return _packed_attention(node)
        if node.op_type == "MultiHeadAttention":
            return _multi_head(node)
        return _group_query(node)
    except (TypeError, ZeroDivisionError, IndexError):  # a shape the op's spec does not allow
        return None


def _shape(node: Node, index: int, outputs: bool = False) -> tuple[int, ...] | None:
    values = node.outputs if outputs else node.inputs
    value: Value | None = values[index] if index < len(values) else None
    return value.static_shape if value is not None else None


def _given(node: Node, index: int) -> bool:
    return index < len(node.inputs) and node.inputs[index] is not None


def _present_keys(node: Node) -> int | None:
    present = _shape(node, 1, outputs=True)  # [B, N, T, H]
    return present[2] if present is not None and len(present) == 4 else None


def _packed_attention(node: Node) -> AttentionWork | None:
    """com.microsoft Attention: input [B, S, H_in] · weights [H_in, Wq + Wk + Wv]; its past and
    present pack K and V as [2, B, N, T, H]."""
    x, w = _shape(node, 0), _shape(node, 1)
    heads = node.attr("num_heads")
    if x is None or w is None or len(x) != 3 or not heads:
        return None
    sizes = node.attr("qkv_hidden_sizes") or [w[1] // 3] * 3
    batch, seq, _ = x
    present = _shape(node, 1, outputs=True)
    past = _shape(node, 4)
    if present is not None and len(present) == 5:
        keys = present[3]
    else:
        keys = seq + (past[3] if past is not None and len(past) == 5 else 0)
    return AttentionWork(batch, heads, seq, keys, sizes[0] // heads, sizes[2] // heads,
                         bool(node.attr("unidirectional", 0)),
                         projection_macs=batch * seq * w[0] * w[1])


def _multi_head(node: Node) -> AttentionWork | None:
    """com.microsoft MultiHeadAttention: query [B, S, N·H] (or Q, K, V packed [B, S, N, 3, H]);
    key [B, L, N·H], [B, N, L, H] (a cross-attention cache) or K, V packed [B, L, N, 2, H];
    value [B, L, N·Hv] or [B, N, L, Hv]."""
    query = _shape(node, 0)
    heads = node.attr("num_heads")
    if query is None or len(query) not in (3, 5) or not heads:
        return None
    batch, seq = query[0], query[1]
    head_size = query[4] if len(query) == 5 else query[2] // heads
    key = _shape(node, 1) if _given(node, 1) else None
    value = _shape(node, 2) if _given(node, 2) else None
    if _given(node, 1) and key is None or _given(node, 2) and value is None:
        return None
    value_head_size = (value[3] if len(value) == 4 else value[2] // heads) \
        if value is not None else head_size  # packed: V's heads are Q's size
    keys = _present_keys(node)
    if keys is None:
        past = _shape(node, 6)
        if key is not None and len(key) == 4:  # BNSH: the keys as they are, no past added
            keys = key[2]
        else:
            keys = (key[1] if key is not None else seq) \
                + (past[2] if past is not None and len(past) == 4 else 0)
    return AttentionWork(batch, heads, seq, keys, head_size, value_head_size,
                         bool(node.attr("unidirectional", 0)))


def _group_query(node: Node) -> AttentionWork | None:
    """com.microsoft GroupQueryAttention: query [B, S, N·H] (or Q, K, V packed
    [B, S, (N + 2·N_kv)·H] without key and value), past and present keys [B, N_kv, T, H];
    always causal."""
    query = _shape(node, 0)
    heads, kv_heads = node.attr("num_heads"), node.attr("kv_num_heads")
    if query is None or len(query) != 3 or not heads or not kv_heads:
        return None
    batch, seq, width = query
    head_size = width // heads if _given(node, 1) else width // (heads + 2 * kv_heads)
    keys = _present_keys(node)
    if keys is None:
        past = _shape(node, 3)
        keys = seq + (past[2] if past is not None and len(past) == 4 else 0)
    return AttentionWork(batch, heads, seq, keys, head_size, head_size, True)


def _onnx_attention(node: Node) -> AttentionWork | None:
    """ONNX Attention (opset 23): Q [B, N, S, H] or [B, S, N·H] with `q_num_heads`; K and V
    likewise ([B, N_kv, L, Hv] or [B, L, N_kv·Hv] with `kv_num_heads`); past and present keys
    [B, N_kv, T, H]."""
    query, key, value = _shape(node, 0), _shape(node, 1), _shape(node, 2)
    if query is None or key is None or value is None:
        return None
    if len(query) == 4:
        batch, heads, seq, head_size = query
    else:
        heads = node.attr("q_num_heads")
        if not heads or len(query) != 3:
            return None
        batch, seq = query[0], query[1]
        head_size = query[2] // heads
    if len(value) == 4:
        value_head_size = value[3]
    else:
        kv_heads = node.attr("kv_num_heads")
        if not kv_heads:
            return None
        value_head_size = value[2] // kv_heads
    keys = _present_keys(node)
    if keys is None:
        past = _shape(node, 4)
        keys = (key[2] if len(key) == 4 else key[1]) \
            + (past[2] if past is not None and len(past) == 4 else 0)
    return AttentionWork(batch, heads, seq, keys, head_size, value_head_size,
                         bool(node.attr("is_causal", 0)))
