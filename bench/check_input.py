"""The input check's type inference: one whole-model run against inference by kind of node.

`graphopt.compile_checks.check_input` (schema checks, then strict ONNX shape inference) on each
model, three ways, interleaved, medians of --runs (each on a fresh import, which is not timed):

* whole: one `onnx.shape_inference.infer_shapes` over the exported model;
* by kind: `graphopt.kind_inference`, every node walked, ONNX asked once per kind of node;
* default: what a compile does (by kind from `opcheck.BY_KIND_NODES` nodes, with its fallback).

    python bench/check_input.py
    python bench/check_input.py --runs 20 --only scale
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import onnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import graphopt.kind_inference as kind_inference  # noqa: E402
from graphopt import opcheck  # noqa: E402
from graphopt.compile_checks import check_input  # noqa: E402
from graphopt.ir import load_onnx  # noqa: E402
from _common import json_path, markdown_table, positive_int, summary, write_json  # noqa: E402
from _models import LIGHT_DIR, ZOO_QUICK, matching, sized_zoo_models, unmatched  # noqa: E402
from scale import NODES_PER_LAYER, transformer_model  # noqa: E402

LIGHT = ("densenet121", "inception_v2", "shufflenet", "resnet50")
SCALE_NODES = (1000, 10000)
WAYS = {  # way -> (BY_KIND_NODES, the walk's first give-up checkpoint)
    "whole": (sys.maxsize, kind_inference._FIRST_CHECKPOINT),
    "by kind": (0, sys.maxsize),
    "default": (opcheck.BY_KIND_NODES, kind_inference._FIRST_CHECKPOINT),
}


def timed_check(path: str, way: str) -> float:
    opcheck.BY_KIND_NODES, kind_inference._FIRST_CHECKPOINT = WAYS[way]
    model = load_onnx(path)
    start = time.perf_counter()
    check_input(model, path)
    return time.perf_counter() - start


def models(workdir: str, wanted) -> list[tuple[str, str]]:
    rows = []
    for bench_model in sized_zoo_models(workdir, ZOO_QUICK, wanted):
        path = os.path.join(workdir, "kept_" + os.path.basename(bench_model.path))
        shutil.copyfile(bench_model.path, path)  # sized_zoo_models deletes its own file
        rows.append((bench_model.name, path))
    for name in LIGHT:
        if wanted(f"light/{name}"):
            rows.append((f"light/{name}", os.path.join(LIGHT_DIR, f"light_{name}.onnx")))
    for nodes in SCALE_NODES:
        label = f"scale/{nodes}"
        if wanted(label):
            path = os.path.join(workdir, f"scale_{nodes}.onnx")
            onnx.save(transformer_model(max(1, round(nodes / NODES_PER_LAYER))), path)
            rows.append((label, path))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=summary(__doc__))
    p.add_argument("--runs", type=positive_int, default=11,
                   help="timed checks per model and way (default 11)")
    p.add_argument("--only", action="append", default=[],
                   help="rows whose name contains this text (again for more)")
    p.add_argument("--json", metavar="FILE", type=json_path,
                   help="also write the results as JSON to FILE")
    args = p.parse_args(argv)
    only = args.only
    problem = unmatched(only, lambda wanted: models("", wanted))
    if problem:
        print(problem, file=sys.stderr)
        return 1
    saved = opcheck.BY_KIND_NODES, kind_inference._FIRST_CHECKPOINT
    results = []
    with tempfile.TemporaryDirectory() as workdir:
        for name, path in models(workdir, matching(only)):
            times = {way: [] for way in WAYS}
            for way in WAYS:
                timed_check(path, way)  # warm-up
            for _ in range(args.runs):
                for way in WAYS:  # interleaved: a slow spell lands on every way
                    times[way].append(timed_check(path, way))
            medians = {way: statistics.median(t) for way, t in times.items()}
            results.append({"model": name, "nodes": len(load_onnx(path).graph),
                            "ms": {w: m * 1e3 for w, m in medians.items()}})
            print(f"{name}: {', '.join(f'{w} {m * 1e3:.1f} ms' for w, m in medians.items())}",
                  file=sys.stderr)
    opcheck.BY_KIND_NODES, kind_inference._FIRST_CHECKPOINT = saved
    rows = [[r["model"], str(r["nodes"]), f"{r['ms']['whole']:.1f}", f"{r['ms']['by kind']:.1f}",
             f"{r['ms']['by kind'] / r['ms']['whole']:.2f}", f"{r['ms']['default']:.1f}"]
            for r in results]
    print(f"check_input ms, median of {args.runs} interleaved runs; by kind × = by kind / whole "
          "(below 1: faster)\n")
    print(markdown_table(["model", "nodes", "whole ms", "by kind ms", "by kind ×", "default ms"],
                         rows))
    if args.json:
        write_json(args.json, {"bench": "check_input", "runs": args.runs, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
