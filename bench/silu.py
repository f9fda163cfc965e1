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

import argparse
import os
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import markdown_table, session_options, shape_list, write_json  # noqa: E402

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


def bench(shape: tuple[int, ...], runs: int, warmup: int = 20) -> list:
    feeds = {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
    sessions = {name: ort.InferenceSession(_model(fused, shape), session_options("disable"),
                                           providers=["CPUExecutionProvider"])
                for name, fused in (("QuickGelu", True), ("Sigmoid + Mul", False))}
    times: dict[str, list[float]] = {name: [] for name in sessions}
    outputs = {}
    for i in range(warmup + runs):
        for name, session in sessions.items():
            start = time.perf_counter()
            outputs[name] = session.run(None, feeds)[0]
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    fused, unfused = (float(np.median(t)) * 1e6 for t in times.values())
    diff = float(np.max(np.abs(outputs["QuickGelu"] - outputs["Sigmoid + Mul"])))
    return ["x".join(map(str, shape)), f"{fused:.1f}", f"{unfused:.1f}",
            f"{fused / unfused:.2f}", f"{diff:.1e}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", type=shape_list("BxSxC", "1x128x11008,1x1x11008"),
                        default=list(SHAPES),
                        help="BxSxC shapes, comma-separated (default 1x1x11008,1x16x11008,"
                             "1x128x11008,1x64x14336,2x16x172)")
    parser.add_argument("--runs", type=int, default=300, help="timed calls per variant (300)")
    parser.add_argument("--json", metavar="FILE", help="also write the table as JSON to FILE")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be ≥ 1")
    rows = [bench(shape, args.runs) for shape in args.shapes]
    print(f"median µs per call of {args.runs} interleaved calls, 1 thread, ORT_DISABLE_ALL, "
          f"onnxruntime {ort.__version__}\n")
    columns = ["shape", "QuickGelu(alpha=1) µs", "Sigmoid + Mul µs", "×", "max abs Δ"]
    print(markdown_table(columns, rows))
    if args.json:
        write_json(args.json, {"runs": args.runs, "onnxruntime": ort.__version__,
                               "columns": columns, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
