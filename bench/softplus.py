"""onnxruntime's CPU Softplus and Mish against the ops graphopt's LowerSoftplus (-O3) puts in
their place.

Per shape and op, a one-op model and what `graphopt.optimize(level=3)` makes of it run
interleaved in onnxruntime's CPU provider at 1 thread and ORT_DISABLE_ALL (so neither is
rewritten; the local function -O3 packs the ops into is inlined at load), medians of the
per-call wall time, with their outputs compared.

    python bench/softplus.py
    python bench/softplus.py --shapes 1x64x56x56,1x32x208x208 --runs 100
"""

from __future__ import annotations

import os
import sys

import numpy as np
from onnx import TensorProto, helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _fused_kernel import compare, table_main  # noqa: E402

import graphopt  # noqa: E402

SHAPES = ((1, 64, 56, 56), (1, 128, 28, 28), (1, 32, 104, 104))
OPS = {"Softplus": 17, "Mish": 18}  # op → the opset that has it


def _model(op: str, shape: tuple[int, ...]):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPS[op])])


def rows(shape: tuple[int, ...], runs: int) -> list[list[str]]:
    # Activations as a conv leaves them, with tails: most within a few units of 0.
    rng = np.random.default_rng(0)
    feeds = {"x": (rng.standard_normal(shape) * 3).astype(np.float32)}
    out = []
    for op in OPS:
        model = _model(op, shape)
        lowered = graphopt.optimize(model, level=3).to_onnx()
        row = compare(shape, {op: model.SerializeToString(),
                              "lowered": lowered.SerializeToString()}, feeds, runs)
        out.append([row[0], op, *row[1:]])
    return out


COLUMNS = ["shape", "op", "op µs", "lowered µs", "×", "max abs Δ"]

if __name__ == "__main__":
    sys.exit(table_main(__doc__, COLUMNS, SHAPES, "NxCxHxW", "1x64x56x56", rows, runs=100))
