"""onnxruntime's CPU SkipLayerNormalization against the Add + LayerNormalization it replaces.

Why graphopt leaves the residual Add and LayerNormalization apart on the CPU: per shape, two
one-op-deep models (com.microsoft::SkipLayerNormalization; Add then LayerNormalization) run
interleaved in onnxruntime's CPU provider at 1 thread and ORT_DISABLE_ALL (so neither is
rewritten), medians of the per-call wall time, with their outputs compared.

    python bench/skip_layernorm.py
    python bench/skip_layernorm.py --shapes 1x128x768,8x128x768 --runs 500
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


def bench(shape: tuple[int, ...], runs: int, warmup: int = 20) -> list:
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in "xs"}
    sessions = {name: ort.InferenceSession(_model(fused, shape), session_options("disable"),
                                           providers=["CPUExecutionProvider"])
                for name, fused in (("SkipLayerNormalization", True),
                                    ("Add + LayerNormalization", False))}
    times: dict[str, list[float]] = {name: [] for name in sessions}
    outputs = {}
    for i in range(warmup + runs):
        for name, session in sessions.items():
            start = time.perf_counter()
            outputs[name] = session.run(None, feeds)[0]
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    fused, unfused = (float(np.median(t)) * 1e6 for t in times.values())
    diff = float(np.max(np.abs(outputs["SkipLayerNormalization"]
                                - outputs["Add + LayerNormalization"])))
    return ["x".join(map(str, shape)), f"{fused:.1f}", f"{unfused:.1f}",
            f"{fused / unfused:.2f}", f"{diff:.1e}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", type=shape_list("BxSxC", "1x128x768,1x64x768"),
                        default=list(SHAPES),
                        help="BxSxC shapes, comma-separated (default 1x128x768,1x64x768,1x128x256)")
    parser.add_argument("--runs", type=int, default=300, help="timed calls per variant (300)")
    parser.add_argument("--json", metavar="FILE", help="also write the table as JSON to FILE")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be ≥ 1")
    rows = [bench(shape, args.runs) for shape in args.shapes]
    print(f"median µs per call of {args.runs} interleaved calls, 1 thread, ORT_DISABLE_ALL, "
          f"onnxruntime {ort.__version__}\n")
    columns = ["shape", "SkipLayerNormalization µs", "Add + LayerNormalization µs", "×",
               "max abs Δ"]
    print(markdown_table(columns, rows))
    if args.json:
        write_json(args.json, {"runs": args.runs, "onnxruntime": ort.__version__,
                               "columns": columns, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
