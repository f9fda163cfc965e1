"""onnxruntime's CPU PRelu against the ops graphopt's LowerPRelu puts in its place.

Per shape and kind of slope (one value; per-channel in [0, 1]; per-channel on both sides of
[0, 1]), a one-PRelu model and what `graphopt.optimize` makes of it run interleaved in
onnxruntime's CPU provider at 1 thread and ORT_DISABLE_ALL (so neither is rewritten), medians
of the per-call wall time, with their outputs compared.

    python bench/prelu.py
    python bench/prelu.py --shapes 1x48x64x64,1x128x16x16 --runs 500
"""

from __future__ import annotations

import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _fused_kernel import compare, table_main  # noqa: E402

import graphopt  # noqa: E402

SHAPES = ((1, 48, 64, 64), (1, 128, 16, 16), (1, 24, 128, 128))
SLOPES = {  # kind → slope of C channels (a trained PReLU's range, MediaPipe's models' too)
    "one": lambda c, rng: np.array([0.25], np.float32),
    "in (0, 1]": lambda c, rng: rng.uniform(0.01, 1.0, (c, 1, 1)).astype(np.float32),
    "mixed": lambda c, rng: rng.uniform(-1.0, 3.5, (c, 1, 1)).astype(np.float32),
}


def _prelu(shape: tuple[int, ...], slope: np.ndarray):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    graph = helper.make_graph([helper.make_node("PRelu", ["x", "slope"], ["y"])], "g", [x], [y],
                              [numpy_helper.from_array(slope, "slope")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def rows(shape: tuple[int, ...], runs: int) -> list[list[str]]:
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    out = []
    for kind, make in SLOPES.items():
        model = _prelu(shape, make(shape[1], rng))
        lowered = graphopt.optimize(model).to_onnx()
        form = " + ".join(sorted({n.op_type for n in lowered.graph.node}))
        row = compare(shape, {"PRelu": model.SerializeToString(),
                              form: lowered.SerializeToString()}, feeds, runs)
        out.append([row[0], kind, form, *row[1:]])
    return out


COLUMNS = ["shape", "slope", "graphopt's form", "PRelu µs", "form µs", "×", "max abs Δ"]

if __name__ == "__main__":
    sys.exit(table_main(__doc__, COLUMNS, SHAPES, "NxCxHxW", "1x48x64x64", rows, runs=300))
