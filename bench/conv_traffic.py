"""What a conv's input bands save over its im2col matrix in the NPU cost model: every distinct
conv kernel of the zoo's ResNet-50 (1×3×224×224), under the default tiling, priced as the cost
model prices it (GM→L1 moves the input band a tile's output pixels read) and as it priced the
same GEMM before 2026-12-07 (GM→L1 moved the im2col matrix, the feature map kh·kw times over).

All figures are the cost model's estimates, so one run suffices (no timing noise).

    .venv/bin/python bench/conv_traffic.py [--target ascend310] [--json out/conv_traffic.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _common import json_path, markdown_table, summary, write_json

from graphopt import optimize, zoo
from graphopt.tuner import estimate
from graphopt.tuner.signature import model_kernels

TARGETS = ("ascend310", "ascend910b")
SHAPES = "input:1,3,224,224"


def _conv_rows(target: str) -> list[dict]:
    result = optimize(zoo.build("resnet50"), target=target, input_shapes=SHAPES)
    rows = []
    for group in model_kernels(result.model, result.partitioning):
        shape = group.shape
        if shape.conv is None:
            continue  # the classifier's GEMM: priced as before
        device = result.partitioning.target.device(group.device)
        band = estimate(shape, None, device)
        im2col = estimate(dataclasses.replace(shape, conv=None), None, device)
        geometry = shape.conv
        rows.append({
            "signature": group.signature, "nodes": len(group.nodes),
            "conv": f"{'x'.join(map(str, geometry.kernel))} s{geometry.strides[0]} "
                    f"{shape.k // geometry.taps}→{shape.n} @{'x'.join(map(str, geometry.inputs))}",
            "im2col_us": im2col.seconds * 1e6, "band_us": band.seconds * 1e6,
            "im2col_gm_cycles": im2col.breakdown["gm_to_l1_cycles"],
            "band_gm_cycles": band.breakdown["gm_to_l1_cycles"],
            "bound": f"{im2col.bound} → {band.bound}"})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--target", action="append", choices=TARGETS,
                        help="this target only (repeatable; default both)")
    parser.add_argument("--json", metavar="FILE", type=json_path,
                        help="also write the rows as JSON to FILE")
    args = parser.parse_args()
    results = {}
    for target in args.target or TARGETS:
        rows = results[target] = _conv_rows(target)
        table = [[r["conv"], str(r["nodes"]), f"{r['im2col_us']:.2f}", f"{r['band_us']:.2f}",
                  f"{r['im2col_us'] / r['band_us']:.2f}",
                  f"{r['band_gm_cycles'] / r['im2col_gm_cycles']:.2f}", r["bound"]]
                 for r in rows]
        print(f"{target}: ResNet-50's conv kernels under the default tiling (µs per node)")
        print(markdown_table(["conv (kernel stride Cin→Cout @input)", "nodes", "im2col µs",
                              "band µs", "×", "GM→L1 band / im2col", "bound"], table))
        total = [sum(r["nodes"] * r[key] for r in rows) for key in ("im2col_us", "band_us")]
        print(f"all {sum(r['nodes'] for r in rows)} conv nodes: {total[0] / 1e3:.3f} ms with "
              f"im2col traffic, {total[1] / 1e3:.3f} ms with input bands "
              f"({total[0] / total[1]:.2f}x)\n")
    if args.json:
        write_json(args.json, {"model": "resnet50", "input_shapes": SHAPES, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
