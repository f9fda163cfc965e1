"""onnxruntime's CPU SkipLayerNormalization against the Add + LayerNormalization it replaces.

Why graphopt leaves the residual Add and LayerNormalization apart on the CPU: per shape, two
one-op-deep models (com.microsoft::SkipLayerNormalization; Add then LayerNormalization) run
interleaved in onnxruntime's CPU provider at 1 thread and ORT_DISABLE_ALL (so neither is
rewritten), medians of the per-call wall time, with their outputs compared.

    python bench/skip_layernorm.py
    python bench/skip_layernorm.py --shapes 1x128x768,8x128x768 --runs 500
"""

from __future__ import annotations

import os
import sys

import numpy as np
from onnx import TensorProto, helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _fused_kernel import compare, main  # noqa: E402

SHAPES = ((1, 128, 768), (1, 64, 768), (1, 128, 256))


def _model(fused: bool, shape: tuple[int, ...]):
    hidden = shape[-1]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)) for n in "xs"]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    rng = np.random.default_rng(0)
    weights = [helper.make_tensor(name, TensorProto.FLOAT, [hidden],
                                  rng.standard_normal(hidden).astype(np.float32).tolist())
               for name in ("gamma", "beta")]
    if fused:
        nodes = [helper.make_node("SkipLayerNormalization", ["x", "s", "gamma", "beta"], ["y"],
                                  domain="com.microsoft", epsilon=1e-5)]
    else:
        nodes = [helper.make_node("Add", ["x", "s"], ["sum"]),
                 helper.make_node("LayerNormalization", ["sum", "gamma", "beta"], ["y"],
                                  axis=-1, epsilon=1e-5)]
    graph = helper.make_graph(nodes, "g", inputs, [output], weights)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def row(shape: tuple[int, ...], runs: int) -> list[str]:
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in "xs"}
    return compare(shape, {"SkipLayerNormalization": _model(True, shape),
                           "Add + LayerNormalization": _model(False, shape)}, feeds, runs)


if __name__ == "__main__":
    sys.exit(main(__doc__, ("SkipLayerNormalization", "Add + LayerNormalization"), SHAPES,
                  "1x128x768,1x64x768", row))
