"""onnxruntime's CPU LRN against the ops graphopt's LowerLRN puts in its place.

Per shape, an LRN model (AlexNet's and Inception-v1's size 5, alpha 1e-4, beta 0.75, bias 1)
and what `graphopt.optimize` makes of it run interleaved in onnxruntime's CPU provider at 1
thread and ORT_DISABLE_ALL (so neither is rewritten), medians of the per-call wall time, with
their outputs compared. The default shapes are where the onnx wheel's light CNNs apply LRN.

    python bench/lrn.py
    python bench/lrn.py --shapes 1x64x56x56 --runs 200
"""

from __future__ import annotations

import os
import sys

import numpy as np
from onnx import TensorProto, helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _fused_kernel import compare, table_main  # noqa: E402

import graphopt  # noqa: E402

SHAPES = ((1, 64, 56, 56), (1, 192, 56, 56), (1, 96, 54, 54), (1, 256, 26, 26))


def _model(shape: tuple[int, ...]):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    node = helper.make_node("LRN", ["x"], ["y"], size=5, alpha=1e-4, beta=0.75, bias=1.0)
    graph = helper.make_graph([node], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def rows(shape: tuple[int, ...], runs: int) -> list[list[str]]:
    feeds = {"x": (np.random.default_rng(0).standard_normal(shape) * 30).astype(np.float32)}
    model = _model(shape)
    lowered = graphopt.optimize(model).to_onnx()
    return [compare(shape, {"LRN": model.SerializeToString(),
                            "lowered": lowered.SerializeToString()}, feeds, runs)]


COLUMNS = ["shape", "LRN µs", "lowered µs", "×", "max abs Δ"]

if __name__ == "__main__":
    sys.exit(table_main(__doc__, COLUMNS, SHAPES, "NxCxHxW", "1x64x56x56", rows, runs=100))
