"""Cost model accuracy: the calibrated CPU cost model's per-node predictions against onnxruntime's
profiled kernel times, ranked (Spearman), and whole-model predicted vs measured latency."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict

import numpy as np
import onnx
import onnxruntime as ort
from _common import (
    THREADS,
    geomean,
    json_path,
    markdown_table,
    positive_int,
    session_options,
    write_json,
)
from _models import matching, sized_zoo_models, unmatched

import graphopt
from graphopt.cli_paths import check_output_path
from graphopt.errors import GraphoptError
from graphopt.ir import load_onnx
from graphopt.tuner.calibrate import default_path, load_or_calibrate
from graphopt.tuner.cpu_model import CpuCostModel, op_class, spearman

# The zoo's architectures at sizes that profile in seconds on a 2-core machine.
SIZES: dict[str, tuple[dict, str]] = {
    "tiny": ({}, ""),
    "resnet50": ({"width": 0.25}, "width 0.25"),
    "resnet50@int8": ({"width": 0.25}, "width 0.25, INT8"),
    "mobilenetv2": ({}, ""),
    "bert_base": ({"layers": 2, "hidden": 128, "heads": 2, "intermediate": 512, "vocab": 1000},
                  "2 layers, hidden 128"),
    "gpt2_small": ({}, ""),
}

DESCRIPTION = __doc__
EPILOG = ("example:\n  .venv/bin/python bench/cost_model.py --json out/bench/cost_model.json\n")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="cost_model.py", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=positive_int, default=20, metavar="N",
                   help="profiled and timed runs per model (default 20, after 3 warm-ups)")
    p.add_argument("--calibration", metavar="FILE",
                   help=f"calibration JSON (default {default_path()}); if absent, measured "
                        "--quick and saved there first")
    p.add_argument("--level", default="all", choices=("disable", "basic", "extended", "all"),
                   help="onnxruntime optimization level of the profiled session (default all)")
    p.add_argument("--only", action="append", default=[], metavar="TEXT",
                   help="only models whose row name contains TEXT; repeatable")
    p.add_argument("--json", metavar="FILE", type=json_path,
                   help="also write the results as JSON to FILE")
    args = p.parse_args(argv)
    if args.calibration and not os.path.exists(args.calibration):
        try:  # it will be written after the measuring: its folder must take a file now
            check_output_path("--calibration", args.calibration)
        except GraphoptError as e:
            p.error(str(e))
    return args


def optimized(path: str, feeds, out_path: str, int8: bool) -> onnx.ModelProto:
    """graphopt -O2 for the cpu target with the inputs' shapes pinned (the cost model needs
    static shapes), every node named so the profile can be matched; `int8` quantizes it,
    calibrated on the feeds with noise added (the ranges only need to be plausible here)."""
    shapes = {name: list(array.shape) for name, array in feeds.items()}
    options = {}
    if int8:
        rng = np.random.default_rng(1)
        calibration = out_path + ".calib.npz"
        np.savez(calibration, **{name: np.stack([a + rng.normal(0, 0.1, a.shape).astype(a.dtype)
                                                 for _ in range(4)])
                                 for name, a in feeds.items()})
        options = {"quantize": "int8", "calibration": calibration}
    proto = graphopt.optimize(path, level=2, target="cpu", input_shapes=shapes,
                              pass_options=options).to_onnx()
    seen: set[str] = set()
    for i, node in enumerate(proto.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}"
        seen.add(node.name)
    onnx.save(proto, out_path)
    return proto


def profile(path: str, feeds, runs: int, level: str, workdir: str) -> dict[str, float]:
    """Median kernel seconds per node name over `runs` profiled runs (warm-ups dropped)."""
    options = session_options(level, threads=THREADS)
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(workdir, "profile")
    sess = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    warmup = 3
    for _ in range(warmup + runs):
        sess.run(None, feeds)
    trace = sess.end_profiling()
    with open(trace, encoding="utf-8") as f:
        events = json.load(f)
    os.remove(trace)
    per_node: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            per_node[e["name"][: -len("_kernel_time")]].append(e["dur"] * 1e-6)
    # Each node appears once per run; the first `warmup` are the warm-ups.
    return {name: statistics.median(d[warmup:] or d) for name, d in per_node.items()}


def wall(path: str, feeds, runs: int, level: str) -> float:
    sess = ort.InferenceSession(path, session_options(level, threads=THREADS),
                                providers=["CPUExecutionProvider"])
    for _ in range(3):
        sess.run(None, feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def match(profiled: str, nodes) -> str | None:
    """The graphopt node a profiled kernel comes from: the same name, or, for a node that
    onnxruntime rewrote further (MatMul + Add → "<MatMul's name>/MatMulAddFusion"), the longest
    node name that prefixes it at a "/". A QDQ Conv's QLinearConv is "<Conv's name>_token_N"."""
    name = re.sub(r"_token_\d+$", "", profiled)
    while name:
        if name in nodes:
            return name
        name = name.rpartition("/")[0]
    return None


def measure(model, cost: CpuCostModel, run_overhead_s: float, runs: int, level: str,
            workdir: str) -> dict:
    opt_path = os.path.join(workdir, "optimized.onnx")
    proto = optimized(model.path, model.feeds, opt_path, int8="INT8" in model.name)
    ir = load_onnx(proto)
    nodes = {n.name: n for n in ir.graph}
    measured = profile(opt_path, model.feeds, runs, level, workdir)
    measured_wall = wall(opt_path, model.feeds, runs, level)
    per_node: dict[str, float] = defaultdict(float)
    for name, seconds in measured.items():
        node = match(name, nodes)
        if node is not None:
            per_node[node] += seconds
    pairs = [(name, cost.node_seconds(nodes[name]), seconds, op_class(nodes[name]),
              nodes[name].op_type) for name, seconds in per_node.items()]
    total_kernel = sum(measured.values())
    matched_kernel = sum(p[2] for p in pairs)
    predicted = [p[1] for p in pairs]
    actual = [p[2] for p in pairs]
    log_err = [abs(math.log2(p / a)) for p, a in zip(predicted, actual) if p > 0 and a > 0]
    os.remove(opt_path)
    return {
        "name": model.name, "nodes": len(nodes), "profiled": len(measured),
        "matched": sum(match(n, nodes) is not None for n in measured),
        "coverage": matched_kernel / total_kernel if total_kernel else 0.0,
        "spearman": spearman(predicted, actual),
        "median_abs_log2_error": statistics.median(log_err) if log_err else None,
        "predicted_s": cost.model_seconds(ir) + run_overhead_s,
        "measured_s": measured_wall,
        "nodes_detail": [{"node": n, "op": op, "class": c, "predicted_s": p, "measured_s": m}
                         for n, p, m, c, op in pairs],
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    problem = unmatched(args.only, lambda wanted: sized_zoo_models("", SIZES, wanted))
    if problem:  # before the calibration, which can take minutes
        print(problem, file=sys.stderr)
        return 1
    ort.set_default_logger_severity(3)
    calibration = load_or_calibrate(args.calibration, quick=True, threads=THREADS,
                                    progress=lambda key, m: print(
                                        f"calibrating: {key} {m.seconds * 1e6:.1f} µs",
                                        file=sys.stderr, flush=True))
    cost = calibration.cost_model()
    wanted = matching(args.only)
    rows = []
    with tempfile.TemporaryDirectory(prefix="graphopt-cost-") as workdir:
        for model in sized_zoo_models(workdir, SIZES, wanted):
            began = time.perf_counter()
            rows.append(measure(model, cost, calibration.run_overhead_us * 1e-6, args.runs,
                                args.level, workdir))
            print(f"{model.name}: {time.perf_counter() - began:.1f} s", file=sys.stderr, flush=True)
    every = [d for r in rows for d in r["nodes_detail"]]
    overall = spearman([d["predicted_s"] for d in every], [d["measured_s"] for d in every])
    by_class: dict[str, list] = defaultdict(list)
    for d in every:
        by_class[d["class"]].append(d)
    ratios = [r["predicted_s"] / r["measured_s"] for r in rows if r["measured_s"]]

    print(f"CPU cost model vs onnxruntime {ort.__version__} ({args.level} optimizations, "
          f"{THREADS} thread): graphopt -O2 --target cpu output; per-node kernel times from "
          f"onnxruntime profiling (median of {args.runs} runs), matched to predictions by node "
          f"name (a kernel onnxruntime fused further counts for the graphopt node whose name "
          f"prefixes its own); coverage = matched share of profiled kernel time; model ms = median wall time "
          f"of {args.runs} runs vs the predicted sum plus the calibrated run overhead.\n"
          f"calibration: {calibration.cpu_model}, onnxruntime {calibration.onnxruntime_version}"
          f"{' (quick)' if calibration.quick else ''}; graphopt {graphopt.__version__}; "
          f"python {platform.python_version()}; {os.cpu_count()} CPUs.\n")
    table = [[r["name"], f"{r['matched']}/{r['profiled']}", f"{r['coverage']:.0%}",
              _num(r["spearman"], ".3f"), _num(r["median_abs_log2_error"], ".2f"),
              f"{r['predicted_s'] * 1e3:.2f}", f"{r['measured_s'] * 1e3:.2f}",
              f"{r['predicted_s'] / r['measured_s']:.2f}"] for r in rows]
    table.append(["all nodes", f"{len(every)}", "", _num(overall, ".3f"), "", "", "",
                  _num(geomean(ratios), ".2f") + " (geomean)"])
    print(markdown_table(["model", "nodes matched", "coverage", "Spearman ρ",
                          "median abs log2(pred/meas)", "predicted ms", "measured ms",
                          "pred/meas"], table))
    print()
    class_rows = [[cls, str(len(ds)),
                   _num(spearman([d["predicted_s"] for d in ds], [d["measured_s"] for d in ds]),
                        ".3f"),
                   f"{sum(d['predicted_s'] for d in ds) * 1e3:.2f}",
                   f"{sum(d['measured_s'] for d in ds) * 1e3:.2f}"]
                  for cls, ds in sorted(by_class.items())]
    print(markdown_table(["op class", "nodes", "Spearman ρ", "predicted ms (sum)",
                          "measured ms (sum)"], class_rows))
    if args.json:
        write_json(args.json, {"calibration": calibration.to_json(), "level": args.level,
                               "runs": args.runs, "spearman_all_nodes": overall,
                               "models": rows})
    return 0


def _num(value, spec: str) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else format(value, spec)


if __name__ == "__main__":
    sys.exit(main())
