"""onnxruntime's CPU GroupQueryAttention against the MultiHeadAttention over repeated K/V heads
that it replaces (FuseAttention's GroupQueryCausalAttention).

Per shape (B×S×N×G×H: batch, tokens, query heads, K/V heads, head size), two models run
interleaved in onnxruntime's CPU provider at 1 thread and ORT_DISABLE_ALL, medians of the
per-call wall time, with their outputs compared: GroupQueryAttention(q, k, v), causal by
itself, against MultiHeadAttention(q, repeat(k), repeat(v)) with the constant causal bias a
pinned export's mask folds to, each K/V head repeated for its group by a Reshape, an Expand and
a Reshape (the cheapest form of transformers' repeat_kv; an export's has Transposes too).

    python bench/group_query.py
    python bench/group_query.py --shapes 1x512x32x8x128 --runs 50
"""

from __future__ import annotations

import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _fused_kernel import compare, table_main  # noqa: E402

# Llama-style groupings: 4 query heads per K/V head (Llama 3 8B's 32/8, at 128 tokens and 64
# dims too), 2 per head, one K/V head (multi-query), and as many as Q (kv = N).
SHAPES = ((1, 128, 8, 2, 32), (1, 128, 32, 8, 64), (1, 512, 32, 8, 128), (2, 256, 16, 4, 64),
          (1, 512, 12, 1, 64), (1, 512, 12, 12, 64))
MS = "com.microsoft"


def _model(fused: bool, shape: tuple[int, ...]) -> bytes:
    batch, length, heads, groups, size = shape
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [batch, length, width])
              for name, width in (("q", heads * size), ("k", groups * size),
                                  ("v", groups * size))]
    output = helper.make_tensor_value_info("o", TensorProto.FLOAT, [batch, length, heads * size])
    if fused:
        nodes = [helper.make_node("GroupQueryAttention", ["q", "k", "v", "", "", "seqlens",
                                                          "total"], ["o"], domain=MS,
                                  num_heads=heads, kv_num_heads=groups)]
        inits = [numpy_helper.from_array(np.full([batch], length - 1, np.int32), "seqlens"),
                 numpy_helper.from_array(np.array(length, np.int32), "total")]
    else:
        causal = np.tril(np.ones((length, length), bool))
        bias = np.where(causal, 0, np.finfo(np.float32).min).astype(np.float32)[None, None]
        nodes = [node for name in ("k", "v") for node in (
            helper.make_node("Reshape", [name, "split"], [f"{name}_split"]),
            helper.make_node("Expand", [f"{name}_split", "spread"], [f"{name}_spread"]),
            helper.make_node("Reshape", [f"{name}_spread", "merge"], [f"{name}_repeated"]))]
        nodes.append(helper.make_node("MultiHeadAttention", ["q", "k_repeated", "v_repeated",
                                                             "", "", "bias"], ["o"], domain=MS,
                                      num_heads=heads))
        inits = [numpy_helper.from_array(np.array(values, np.int64), name) for name, values in (
            ("split", [batch, length, groups, 1, size]),
            ("spread", [batch, length, groups, heads // groups, size]),
            ("merge", [batch, length, heads * size]))] + [numpy_helper.from_array(bias, "bias")]
    graph = helper.make_graph(nodes, "g", inputs, [output], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8).SerializeToString()


def row(shape: tuple[int, ...], runs: int) -> list[str]:
    batch, length, heads, groups, size = shape
    rng = np.random.default_rng(1)
    feeds = {name: rng.standard_normal((batch, length, width)).astype(np.float32)
             for name, width in (("q", heads * size), ("k", groups * size),
                                 ("v", groups * size))}
    return compare(shape, {"GroupQueryAttention": _model(True, shape),
                           "MultiHeadAttention": _model(False, shape)}, feeds, runs)


if __name__ == "__main__":
    COLUMNS = ["shape", "GroupQueryAttention µs", "MHA over repeated K/V µs", "×", "max abs Δ"]
    sys.exit(table_main(__doc__, COLUMNS, SHAPES, "BxSxNxGxH", "1x128x8x2x32,1x512x32x8x128",
                        lambda shape, runs: [row(shape, runs)], runs=30))
