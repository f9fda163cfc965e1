"""`bert_base`: HF BertModel's encoder as torch.onnx exports it, LayerNorm and GELU decomposed."""

from __future__ import annotations

import math

import numpy as np
import onnx

from ._builder import (FLOAT, FLOAT32_MIN, INT64, GraphBuilder, layer_norm, linear, merge_heads,
                       split_heads)

EPS = 1e-12  # BERT's layer_norm_eps


def _gelu(gb: GraphBuilder, x: str) -> str:
    """Exact GELU, x·½(1 + erf(x/√2)), in the exporter's op order."""
    with gb.scope("intermediate_act_fn"):
        erf = gb.op("Erf", gb.op("Div", x, gb.const(math.sqrt(2.0))))
        return gb.op("Mul", gb.op("Mul", x, gb.op("Add", erf, gb.const(1.0))), gb.const(0.5))


def _self_attention(gb: GraphBuilder, x: str, mask: str, p: str, hidden: int, heads: int) -> str:
    hd = hidden // heads
    # HF projects and reshapes key, then value, and reshapes the query last.
    q = linear(gb, x, "query", f"{p}.query", hidden, hidden)
    # key.transpose(-1, -2) after the head permute: the exporter fuses both into one Transpose.
    k = split_heads(gb, linear(gb, x, "key", f"{p}.key", hidden, hidden), heads, hd, (0, 2, 3, 1))
    v = split_heads(gb, linear(gb, x, "value", f"{p}.value", hidden, hidden), heads, hd)
    q = split_heads(gb, q, heads, hd)
    scores = gb.op("Div", gb.op("MatMul", q, k), gb.const(math.sqrt(hd)))
    probs = gb.op("Softmax", gb.op("Add", scores, mask), axis=-1)
    return merge_heads(gb, gb.op("MatMul", probs, v), hidden)


def _layer(gb: GraphBuilder, x: str, mask: str, i: int, hidden: int, heads: int, inter: int,
           out: str | None) -> str:
    p = f"encoder.layer.{i}"
    with gb.scope("encoder", f"layer.{i}"):
        with gb.scope("attention"):
            with gb.scope("self"):
                a = _self_attention(gb, x, mask, f"{p}.attention.self", hidden, heads)
            with gb.scope("output"):
                a = linear(gb, a, "dense", f"{p}.attention.output.dense", hidden, hidden)
                a = layer_norm(gb, gb.op("Add", a, x), "LayerNorm",
                               f"{p}.attention.output.LayerNorm", hidden, EPS)
        with gb.scope("intermediate"):
            h = _gelu(gb, linear(gb, a, "dense", f"{p}.intermediate.dense", hidden, inter))
        with gb.scope("output"):
            h = linear(gb, h, "dense", f"{p}.output.dense", inter, hidden)
            return layer_norm(gb, gb.op("Add", h, a), "LayerNorm", f"{p}.output.LayerNorm",
                              hidden, EPS, out=out)


def build_bert_base(*, layers: int = 12, hidden: int = 768, heads: int = 12,
                    intermediate: int = 3072, vocab: int = 30522,
                    max_positions: int = 512) -> onnx.ModelProto:
    """BERT-base encoder without pooler (108,891,648 parameters at defaults)."""
    if hidden % heads:
        raise ValueError(f"hidden {hidden} is not divisible by heads {heads}")
    gb = GraphBuilder(seed=110)
    ids = gb.input("input_ids", INT64, ["batch_size", "sequence_length"])
    attn = gb.input("attention_mask", INT64, ["batch_size", "sequence_length"])
    # get_extended_attention_mask: mask[:, None, None, :], then (1 - m) * finfo.min.
    m = gb.op("Unsqueeze", gb.op("Unsqueeze", attn, gb.const([1])), gb.const([2]))
    m = gb.op("Sub", gb.const(1.0), gb.op("Cast", m, to=FLOAT))
    mask = gb.op("Mul", m, gb.const(FLOAT32_MIN))
    # token_type_ids defaults to the registered zeros buffer, sliced to S and expanded to [B, S].
    batch = gb.op("Gather", gb.op("Shape", ids), gb.const(0), axis=0)
    seq = gb.op("Unsqueeze", gb.op("Gather", gb.op("Shape", ids), gb.const(1), axis=0),
                gb.const([0]))
    zeros = gb.buffer("embeddings.token_type_ids", np.zeros((1, max_positions), np.int64))
    tt = gb.op("Slice", zeros, gb.const([0]), seq, gb.const([1]), gb.const([1]))
    bs = gb.op("Concat", gb.op("Unsqueeze", batch, gb.const([0])), seq, axis=0)
    tt = gb.op("Expand", tt, bs)
    with gb.scope("embeddings"):
        pos = gb.buffer("embeddings.position_ids", np.arange(max_positions, dtype=np.int64)[None])
        pos = gb.op("Slice", pos, gb.const([0]), seq, gb.const([1]), gb.const([1]))
        emb = {}
        for table, rows, index in (("word", vocab, ids), ("token_type", 2, tt),
                                   ("position", max_positions, pos)):
            with gb.scope(f"{table}_embeddings"):
                w = gb.param(f"embeddings.{table}_embeddings.weight", [rows, hidden])
                emb[table] = gb.op("Gather", w, index)
        x = gb.op("Add", gb.op("Add", emb["word"], emb["token_type"]), emb["position"])
        x = layer_norm(gb, x, "LayerNorm", "embeddings.LayerNorm", hidden, EPS,
                       out="last_hidden_state" if layers == 0 else None)
    for i in range(layers):
        x = _layer(gb, x, mask, i, hidden, heads, intermediate,
                   "last_hidden_state" if i == layers - 1 else None)
    gb.output("last_hidden_state", FLOAT, ["batch_size", "sequence_length", hidden])
    return gb.model("bert_base", f"BERT encoder, {layers} layers, hidden {hidden}, {heads} heads",
                    {"graphopt.zoo.vocab": str(vocab),
                     "graphopt.zoo.max_positions": str(max_positions)})
