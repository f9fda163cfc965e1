"""onnxruntime's CPU PRelu against the ops graphopt's LowerPRelu puts in its place.

Per shape and kind of slope (one value; per-channel in [0, 1]; per-channel on both sides of
[0, 1]), a one-PRelu model and what `graphopt.optimize` makes of it run interleaved in
onnxruntime's CPU provider at 1 thread and ORT_DISABLE_ALL (so neither is rewritten), medians
of the per-call wall time, with their outputs compared.

    python bench/prelu.py
    python bench/prelu.py --shapes 1x48x64x64,1x128x16x16 --runs 500
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import markdown_table, shape_list, write_json  # noqa: E402
from _fused_kernel import compare  # noqa: E402

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    default = ",".join("x".join(map(str, shape)) for shape in SHAPES)
    parser.add_argument("--shapes", type=shape_list("NxCxHxW", "1x48x64x64"),
                        default=list(SHAPES), help=f"NxCxHxW shapes (default {default})")
    parser.add_argument("--runs", type=int, default=300, help="timed calls per variant (300)")
    parser.add_argument("--json", metavar="FILE", help="also write the table as JSON to FILE")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be ≥ 1")
    table = [r for shape in args.shapes for r in rows(shape, args.runs)]
    print(f"median µs per call of {args.runs} interleaved calls, 1 thread, ORT_DISABLE_ALL, "
          f"onnxruntime {ort.__version__}\n")
    columns = ["shape", "slope", "graphopt's form", "PRelu µs", "form µs", "×", "max abs Δ"]
    print(markdown_table(columns, table))
    if args.json:
        write_json(args.json, {"runs": args.runs, "onnxruntime": ort.__version__,
                               "columns": columns, "rows": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
