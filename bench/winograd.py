"""3×3 convolutions direct against their Winograd F(4×4, 3×3) form, per layer shape.

Where WinogradConv's rule (graphopt/passes/winograd.py: pays_off) comes from: per shape, a
Conv(3×3, pad 1) + Relu model and the same model with the conv rewritten by WinogradConv
(forced, whatever the rule says) run interleaved in onnxruntime's CPU provider at 1 thread and
ORT_ENABLE_ALL, as an .om's sessions would (the direct conv blocked into NCHWc by onnxruntime),
medians of the per-call wall time. `rule` is what the pass decides for that shape; `error` is
the largest difference over the largest direct output.

    python bench/winograd.py
    python bench/winograd.py --shapes 256x56x56,512x28x28 --runs 30
    python bench/winograd.py --batch 8 --shapes 64x56x56,128x28x28,256x14x14,512x7x7
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (json_path, markdown_table, positive_int, session_options,  # noqa: E402
                     shape_list, write_json)

import graphopt  # noqa: E402
from graphopt.ir import onnx_export  # noqa: E402
from graphopt.passes import winograd  # noqa: E402

# channels x height x width (filters = channels): UNet's and VGG's layers, then ResNet's and
# Inception's, where the rewrite loses.
SHAPES = ((128, 128, 128), (256, 64, 64), (512, 32, 32), (1024, 16, 16), (128, 56, 56),
          (256, 56, 56), (256, 28, 28), (512, 28, 28), (512, 14, 14), (192, 35, 35),
          (64, 256, 256), (64, 56, 56), (128, 28, 28), (256, 14, 14), (512, 7, 7), (384, 17, 17))


def direct_model(channels: int, height: int, width: int, batch: int = 1) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((channels, channels, 3, 3))
              / np.sqrt(9 * channels)).astype(np.float32)
    bias = rng.standard_normal(channels).astype(np.float32)
    shape = [batch, channels, height, width]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"])], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def winograd_model(direct: onnx.ModelProto) -> onnx.ModelProto:
    """`direct` with its conv rewritten, shapes inferred by an -O1 compile first."""
    model = graphopt.optimize(direct, level=1).model
    (conv,) = [node for node in model.graph if node.op_type == "Conv"]
    winograd.rewrite(conv)
    model.graph.remove_initializer(model.graph.initializers["w"])
    return onnx_export.to_onnx(model)


def bench(shape: tuple[int, int, int], runs: int, batch: int = 1, warmup: int = 2) -> list[str]:
    channels, height, width = shape
    direct = direct_model(*shape, batch=batch)
    models = {"direct": direct, "winograd": winograd_model(direct)}
    sessions = {name: ort.InferenceSession(proto.SerializeToString(), session_options("all"),
                                           providers=["CPUExecutionProvider"])
                for name, proto in models.items()}
    x = np.random.default_rng(1).standard_normal((batch, *shape)).astype(np.float32)
    times: dict[str, list[float]] = {name: [] for name in sessions}
    outputs = {}
    for i in range(warmup + runs):
        for name, session in sessions.items():
            start = time.perf_counter()
            outputs[name] = session.run(None, {"x": x})[0]
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    direct_ms, winograd_ms = (float(np.median(t)) * 1e3 for t in times.values())
    error = float(np.abs(outputs["winograd"] - outputs["direct"]).max()
                  / np.abs(outputs["direct"]).max())
    th, tw = winograd.tiles(height, width)
    rule = "winograd" if winograd.pays_off(channels, channels, height, width, batch) \
        else "direct"
    return [f"{channels}×{height}×{width}", str(batch * th * tw), rule, f"{direct_ms:.3g}",
            f"{winograd_ms:.3g}", f"{direct_ms / winograd_ms:.2f}", f"{error:.1e}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", type=shape_list("CxHxW", "256x56x56,512x28x28"),
                        default=list(SHAPES),
                        help="CxHxW layer shapes (as many filters as channels), comma-separated")
    parser.add_argument("--runs", type=positive_int, default=15,
                        help="timed calls per variant (15)")
    parser.add_argument("--batch", type=positive_int, default=1, help="images per call (1)")
    parser.add_argument("--json", metavar="FILE", type=json_path,
                        help="also write the table as JSON to FILE")
    args = parser.parse_args(argv)
    ort.set_default_logger_severity(3)
    print(f"median ms per call of {args.runs} interleaved calls, batch {args.batch}, 1 thread, "
          f"ORT_ENABLE_ALL, "
          f"onnxruntime {ort.__version__}; × = direct / winograd (above 1: Winograd faster)\n")
    rows = []
    for shape in args.shapes:
        rows.append(bench(shape, args.runs, args.batch))
        print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    columns = ["C×H×W", "tiles", "rule", "direct ms", "winograd ms", "×", "error"]
    print(markdown_table(columns, rows))
    if args.json:
        write_json(args.json, {"runs": args.runs, "batch": args.batch,
                               "onnxruntime": ort.__version__, "columns": columns, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
