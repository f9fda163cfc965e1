"""`gpt2_small`: an HF GPT2LMHeadModel-shaped decoder with causal mask and tanh GELU decomposed."""

from __future__ import annotations

import math

import numpy as np
import onnx

from ._builder import (FLOAT, FLOAT32_MIN, INT64, GraphBuilder, layer_norm, linear, merge_heads,
                       split_heads)

EPS = 1e-5  # GPT-2's layer_norm_epsilon


def _gelu_new(gb: GraphBuilder, x: str) -> str:
    """HF "gelu_new": ½x(1 + tanh(√(2/π)(x + 0.044715x³))), op for op as traced."""
    with gb.scope("act"):
        half = gb.op("Mul", gb.const(0.5), x)
        cube = gb.op("Mul", gb.const(0.044715), gb.op("Pow", x, gb.const(3.0)))
        inner = gb.op("Mul", gb.const(math.sqrt(2.0 / math.pi)), gb.op("Add", x, cube))
        return gb.op("Mul", half, gb.op("Add", gb.const(1.0), gb.op("Tanh", inner)))


def _attention(gb: GraphBuilder, x: str, p: str, hidden: int, heads: int, positions: int) -> str:
    hd = hidden // heads
    qkv = linear(gb, x, "c_attn", f"{p}.c_attn", hidden, 3 * hidden, weight_is_in_out=True)
    q, k, v = gb.op("Split", qkv, gb.const([hidden] * 3), outputs=3, axis=2)
    q, k, v = (split_heads(gb, t, heads, hd) for t in (q, k, v))
    # key.transpose(-1, -2) stays separate from the head permute: with use_cache the permuted key
    # is also a graph output, so the exporter cannot fuse the two Transposes as it does in BERT.
    scores = gb.op("MatMul", q, gb.op("Transpose", k, perm=[0, 1, 3, 2]))
    scores = gb.op("Div", scores, gb.const(math.sqrt(hd)))
    # causal_mask = self.bias[:, :, key_len - query_len : key_len, :key_len]
    q_len = gb.op("Gather", gb.op("Shape", q), gb.const(2), axis=0)
    k_len = gb.op("Gather", gb.op("Shape", k), gb.const(2), axis=0)
    start = gb.op("Unsqueeze", gb.op("Sub", k_len, q_len), gb.const([0]))
    end = gb.op("Unsqueeze", k_len, gb.const([0]))
    tril = gb.buffer(f"{p}.bias", np.tril(np.ones((positions, positions), np.bool_))[None, None])
    causal = gb.op("Slice", tril, start, end, gb.const([2]), gb.const([1]))
    causal = gb.op("Slice", causal, gb.const([0]), end, gb.const([3]), gb.const([1]))
    scores = gb.op("Where", causal, scores, gb.const(FLOAT32_MIN))
    ctx = gb.op("MatMul", gb.op("Softmax", scores, axis=-1), v)
    ctx = merge_heads(gb, ctx, hidden)
    return linear(gb, ctx, "c_proj", f"{p}.c_proj", hidden, hidden, weight_is_in_out=True)


def _block(gb: GraphBuilder, x: str, i: int, hidden: int, heads: int, inner: int,
           positions: int) -> str:
    p = f"transformer.h.{i}"
    with gb.scope("transformer", f"h.{i}"):
        h = layer_norm(gb, x, "ln_1", f"{p}.ln_1", hidden, EPS)
        with gb.scope("attn"):
            h = _attention(gb, h, f"{p}.attn", hidden, heads, positions)
        x = gb.op("Add", h, x)
        h = layer_norm(gb, x, "ln_2", f"{p}.ln_2", hidden, EPS)
        with gb.scope("mlp"):
            h = linear(gb, h, "c_fc", f"{p}.mlp.c_fc", hidden, inner, weight_is_in_out=True)
            h = _gelu_new(gb, h)
            h = linear(gb, h, "c_proj", f"{p}.mlp.c_proj", inner, hidden, weight_is_in_out=True)
        return gb.op("Add", x, h)


def build_gpt2_small(*, layers: int = 2, hidden: int = 256, heads: int = 4, vocab: int = 1000,
                     positions: int = 128, intermediate: int | None = None) -> onnx.ModelProto:
    """A small GPT-2 by default (1,868,800 parameters); real GPT-2 small is layers=12, hidden=768,
    heads=12, vocab=50257, positions=1024. `intermediate` defaults to 4 * hidden."""
    if hidden % heads:
        raise ValueError(f"hidden {hidden} is not divisible by heads {heads}")
    inner = intermediate or 4 * hidden
    gb = GraphBuilder(seed=124)
    ids = gb.input("input_ids", INT64, ["batch_size", "sequence_length"])
    with gb.scope("transformer"):
        # position_ids = torch.arange(0, seq_len).unsqueeze(0)
        seq = gb.op("Gather", gb.op("Shape", ids), gb.const(1), axis=0)
        pos = gb.op("Unsqueeze", gb.op("Range", gb.const(0), seq, gb.const(1)), gb.const([0]))
        with gb.scope("wte"):
            wte = gb.param("transformer.wte.weight", [vocab, hidden])
            tok = gb.op("Gather", wte, ids)
        with gb.scope("wpe"):
            wpe = gb.param("transformer.wpe.weight", [positions, hidden], std=0.01)
            posemb = gb.op("Gather", wpe, pos)
        x = gb.op("Add", tok, posemb)
    for i in range(layers):
        x = _block(gb, x, i, hidden, heads, inner, positions)
    with gb.scope("transformer"):
        x = layer_norm(gb, x, "ln_f", "transformer.ln_f", hidden, EPS)
    with gb.scope("lm_head"):
        # lm_head.weight is tied to wte: transposing the shared tensor keeps one copy of it.
        gb.op("MatMul", x, gb.op("Transpose", wte, perm=[1, 0]), out="logits")
    gb.output("logits", FLOAT, ["batch_size", "sequence_length", vocab])
    return gb.model("gpt2_small", f"GPT-2 decoder, {layers} layers, hidden {hidden}, {heads} heads",
                    {"graphopt.zoo.vocab": str(vocab),
                     "graphopt.zoo.max_positions": str(positions)})
