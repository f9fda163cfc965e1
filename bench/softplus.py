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

import argparse
import os
import sys

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import markdown_table, shape_list, write_json  # noqa: E402
from _fused_kernel import compare  # noqa: E402

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    default = ",".join("x".join(map(str, shape)) for shape in SHAPES)
    parser.add_argument("--shapes", type=shape_list("NxCxHxW", "1x64x56x56"),
                        default=list(SHAPES), help=f"NxCxHxW shapes (default {default})")
    parser.add_argument("--runs", type=int, default=100, help="timed calls per variant (100)")
    parser.add_argument("--json", metavar="FILE", help="also write the table as JSON to FILE")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be ≥ 1")
    table = [r for shape in args.shapes for r in rows(shape, args.runs)]
    print(f"median µs per call of {args.runs} interleaved calls, 1 thread, ORT_DISABLE_ALL, "
          f"onnxruntime {ort.__version__}\n")
    columns = ["shape", "op", "op µs", "lowered µs", "×", "max abs Δ"]
    print(markdown_table(columns, table))
    if args.json:
        write_json(args.json, {"runs": args.runs, "onnxruntime": ort.__version__,
                               "columns": columns, "rows": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
