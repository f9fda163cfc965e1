"""onnxruntime's CPU QuickGelu(alpha=1) against the Mul(x, Sigmoid(x)) it replaces (SiLU).

Why FuseGelu's Silu rule fuses: per shape (Llama-style MLP activations, [B, S, intermediate]),
two one-op-deep models run interleaved in onnxruntime's CPU provider at 1 thread and
ORT_DISABLE_ALL (so neither is rewritten; at ORT_ENABLE_ALL onnxruntime's QuickGeluFusion
makes the unfused one a QuickGelu itself), medians of the per-call wall time, with their
outputs compared.

    python bench/silu.py
    python bench/silu.py --shapes 1x128x11008,1x1x11008 --runs 500
"""

from __future__ import annotations

import os
import sys

import numpy as np
from onnx import TensorProto, helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _fused_kernel import compare, main  # noqa: E402

SHAPES = ((1, 1, 11008), (1, 16, 11008), (1, 128, 11008), (1, 64, 14336), (2, 16, 172))


def _model(fused: bool, shape: tuple[int, ...]):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    if fused:
        nodes = [helper.make_node("QuickGelu", ["x"], ["y"], domain="com.microsoft", alpha=1.0)]
    else:
        nodes = [helper.make_node("Sigmoid", ["x"], ["s"]),
                 helper.make_node("Mul", ["x", "s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8).SerializeToString()


def row(shape: tuple[int, ...], runs: int) -> list[str]:
    feeds = {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
    return compare(shape, {"QuickGelu": _model(True, shape),
                           "Sigmoid + Mul": _model(False, shape)}, feeds, runs)


if __name__ == "__main__":
    sys.exit(main(__doc__, ("QuickGelu(alpha=1)", "Sigmoid + Mul"), SHAPES,
                  "1x128x11008,1x1x11008", row))
