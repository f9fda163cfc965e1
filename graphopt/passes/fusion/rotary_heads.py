"""RotaryOnMergedHeads: a RotaryEmbedding over split heads whose result is merged straight back
reads and writes the merged [B, S, N·H] tensor instead, with its heads counted by `num_heads`.

    p [B,S,N·H] ─ Reshape [B,S,N,H] ─ Transpose(0,2,1,3) ─ RotaryEmbedding ─ Transpose(0,2,1,3)
                ─ Reshape [B,S,N·H]                ⇒   p ─ RotaryEmbedding(num_heads=N)

FuseAttention leaves this form where a rotated Q or K (a Llama block's) feeds an attention op
that reads merged heads (MultiHeadAttention, GroupQueryAttention): the fused attention merges
the heads the rotary embedding read split. onnxruntime's kernel rotates each head of a 3-D input
alike, with the same position ids and caches; at [1, 128, 8·32] it takes 17 µs where the four
layout ops and the 4-D kernel took 42 µs (1 thread, a one-off interleaved timing).
"""

from __future__ import annotations

from graphopt.ir.pattern import Attr
from graphopt.passes.fusion.group_query import MS, SPLIT
from graphopt.passes.fusion.group_query import const_list as _target
from graphopt.passes.rules import Rule


def _split_heads(target: list[int], width: int) -> int:
    """The head count of a head split's target [B, S, N, H] of a [B, S, width] tensor: N, or
    width / H where N is -1 (transformers' `view(B, S, -1, head_dim)`); 0 when it has none."""
    heads, size = target[2], target[3]
    if heads == -1 and size > 0 and width % size == 0:
        return width // size
    return heads


class RotaryOnMergedHeads(Rule):
    """Reshape(Transpose(RotaryEmbedding(Transpose(Reshape(p))))) → RotaryEmbedding(p) over
    the merged heads (module docstring)."""

    emits = ((MS, "RotaryEmbedding"),)

    def pattern(self, op, p, split, ids, cos, sin, merge):
        rotated = op.RotaryEmbedding(
            op.Transpose(op.Reshape(p, split, allowzero=Attr("zero_in", 0)), perm=SPLIT),
            ids, cos, sin, _domain=MS, interleaved=Attr("interleaved", 0),
            num_heads=Attr("heads", 0), rotary_embedding_dim=Attr("dim", 0),
            scale=Attr("scale", 1.0), is_packed_batching=Attr("packed", 0, pred=lambda v: not v))
        return op.Reshape(op.Transpose(rotated, perm=SPLIT), merge,
                          allowzero=Attr("zero_out", 0))

    def check(self, p, split, merge, zero_in=0, zero_out=0):
        shape = p.shape
        if shape is None or len(shape) != 3 or not isinstance(shape[2], int):
            return f"%{p.name} is not [B, S, N·H] with a static width"
        heads_of = _target(split)
        if heads_of is None or len(heads_of) != 4 or zero_in and 0 in heads_of:
            return "the head split is not a constant [B, S, N, H]"
        heads, size = _split_heads(heads_of, shape[2]), heads_of[3]
        if heads <= 0 or size <= 0 or heads * size != shape[2] \
                or heads_of[0] not in (0, -1, shape[0]) or heads_of[1] not in (0, -1, shape[1]) \
                or heads_of[2] == -1 and -1 in heads_of[:2]:
            return f"the head split {heads_of} does not part %{p.name}'s width into heads"
        back = _target(merge)
        if back is None or len(back) != 3 or back[2] != shape[2] or zero_out and 0 in back \
                or back[0] not in (0, -1, shape[0]) or back[1] not in (0, -1, shape[1]):
            return f"the merge {back} does not restore %{p.name}'s shape"
        return None

    def rewrite(self, op, p, split, ids, cos, sin, interleaved=0, dim=0, scale=1.0, **_):
        heads = _split_heads(_target(split), p.shape[2])
        return op.RotaryEmbedding(p, ids, cos, sin, _domain=MS, interleaved=interleaved,
                                  num_heads=heads, rotary_embedding_dim=dim, scale=scale)


__all__ = ["RotaryOnMergedHeads"]
