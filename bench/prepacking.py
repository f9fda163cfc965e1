"""onnxruntime's weight pre-packing on and off: its cost at session creation, its gain per run.

Why graphopt's CPU partitions skip pre-packing where every GEMM has one row
(graphopt/codegen/prepacking.py): per case, a one-op model (a MatMul of [rows, K] by a constant
[K, N], or an fp32 convolution) gets two sessions at ORT_DISABLE_ALL, one with
session.disable_prepacking. Session creation is timed over interleaved rounds, then the runs,
interleaved too; medians, ratios unpacked / packed, and the largest output difference.

    python bench/prepacking.py
    python bench/prepacking.py --threads 2 --rows 1,2,8 --runs 100
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (json_path, markdown_table, positive_int, positive_ints,  # noqa: E402
                     session_options, write_json)

GEMMS = ((4096, 4096), (768, 3072), (2048, 1000), (256, 256))  # K, N
ROWS = (1, 2, 8, 128)
# (name, op, weight shape, input shape, attributes): 3×3 and 1×1 convs, a depthwise conv, and a
# transposed conv, the kinds the rule treats as neutral.
CONVS = (("conv 3x3, 512 ch, 14x14", "Conv", (512, 512, 3, 3), (1, 512, 14, 14),
          {"pads": [1, 1, 1, 1]}),
         ("conv 1x1, 1024 ch, 14x14", "Conv", (1024, 1024, 1, 1), (1, 1024, 14, 14), {}),
         ("depthwise 3x3, 512 ch, 28x28", "Conv", (512, 1, 3, 3), (1, 512, 28, 28),
          {"pads": [1, 1, 1, 1], "group": 512}),
         ("conv transpose 4x4/2, 256 ch", "ConvTranspose", (256, 256, 4, 4), (1, 256, 14, 14),
          {"strides": [2, 2]}))


def _model(op: str, weight: np.ndarray, x_shape: tuple, attrs: dict) -> bytes:
    node = helper.make_node(op, ["x", "w"], ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8).SerializeToString()


def _options(packed: bool, threads: int) -> ort.SessionOptions:
    options = session_options("disable", threads=threads)
    if not packed:
        options.add_session_config_entry("session.disable_prepacking", "1")
    return options


def bench(name: str, data: bytes, x: np.ndarray, threads: int, runs: int,
          sessions: int) -> dict:
    """Creation and run times of `data` with and without pre-packing, interleaved."""
    created: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(sessions):
        for packed in (True, False):
            start = time.perf_counter()
            ort.InferenceSession(data, _options(packed, threads),
                                 providers=["CPUExecutionProvider"])
            created[packed].append(time.perf_counter() - start)
    live = {packed: ort.InferenceSession(data, _options(packed, threads),
                                         providers=["CPUExecutionProvider"])
            for packed in (True, False)}
    ran: dict[bool, list[float]] = {True: [], False: []}
    outputs = {}
    for i in range(runs + 3):  # 3 warm-up rounds
        for packed, session in live.items():
            start = time.perf_counter()
            outputs[packed] = session.run(None, {"x": x})[0]
            if i >= 3:
                ran[packed].append(time.perf_counter() - start)
    med = {key: {packed: float(np.median(values[packed])) * 1e3 for packed in (True, False)}
           for key, values in (("create", created), ("run", ran))}
    return {"case": name, "create_packed_ms": med["create"][True],
            "create_unpacked_ms": med["create"][False], "run_packed_ms": med["run"][True],
            "run_unpacked_ms": med["run"][False],
            "run_ratio": med["run"][False] / med["run"][True],
            "max_diff": float(np.max(np.abs(outputs[True] - outputs[False])))}


def cases(rows: list[int]):
    rng = np.random.default_rng(0)
    for k, n in GEMMS:
        weight = (rng.standard_normal((k, n)) * 0.02).astype(np.float32)
        for m in rows:
            x = rng.standard_normal((m, k)).astype(np.float32)
            yield f"MatMul [{m}, {k}] x [{k}, {n}]", _model("MatMul", weight, x.shape, {}), x
    for name, op, w_shape, x_shape, attrs in CONVS:
        weight = (rng.standard_normal(w_shape) * 0.02).astype(np.float32)
        yield name, _model(op, weight, x_shape, attrs), rng.standard_normal(x_shape).astype(
            np.float32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=positive_ints, default=list(ROWS),
                        help="GEMM rows to try, comma-separated (default 1,2,8,128)")
    parser.add_argument("--threads", type=positive_int, default=1, help="intra-op threads (1)")
    parser.add_argument("--runs", type=positive_int, default=40, help="timed runs per variant (40)")
    parser.add_argument("--sessions", type=positive_int, default=5,
                        help="sessions created per variant (5)")
    parser.add_argument("--json", metavar="FILE", type=json_path,
                        help="also write the rows as JSON")
    args = parser.parse_args(argv)

    results = []
    for name, data, x in cases(args.rows):
        results.append(bench(name, data, x, args.threads, args.runs, args.sessions))
        print(f"{name}: done", file=sys.stderr, flush=True)
    table = [[r["case"], f"{r['create_packed_ms']:.1f}", f"{r['create_unpacked_ms']:.1f}",
              f"{r['run_packed_ms']:.3f}", f"{r['run_unpacked_ms']:.3f}", f"{r['run_ratio']:.2f}",
              f"{r['max_diff']:.1e}"] for r in results]
    print(f"onnxruntime {ort.__version__}, {args.threads} thread(s), ORT_DISABLE_ALL; medians of "
          f"{args.sessions} session creations and {args.runs} runs per variant, interleaved; "
          "run × = unpacked / packed\n")
    print(markdown_table(["case", "create packed ms", "create unpacked ms", "run packed ms",
                          "run unpacked ms", "run ×", "max abs Δ"], table))
    if args.json:
        write_json(args.json, {"onnxruntime": ort.__version__, "threads": args.threads,
                               "rows": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
