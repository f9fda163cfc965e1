"""Dev check: every model in ../shared/models keeps its reference outputs through import→export,
through the default pipeline, and through the `.om` it compiles to (written, loaded and run by
graphopt's runtime); not part of `make test`, the folder is not in the repo."""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import time
from collections import Counter

import numpy as np
import onnx

import graphopt
from graphopt import numerics
from graphopt.ir import load_onnx, to_onnx
from graphopt.table import format_table

LAYERNORMS = ("LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
              "RMSNormalization")
GELUS = ("Gelu", "FastGelu", "BiasGelu", "QuickGelu")
ATTENTIONS = ("MultiHeadAttention", "Attention")


def _feeding(model, op_type: str, consumer: str) -> int:
    """How many `op_type` nodes feed a `consumer` node."""
    return sum(1 for n in model.graph.all_nodes() if n.op_type == op_type
               and any(c.op_type == consumer for c in n.output.consumers()))


# ../shared/models beside the repository, wherever the check is run from.
DEFAULT_FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared",
                              "models")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folder", nargs="?", default=os.path.normpath(DEFAULT_FOLDER),
                        help="models, each with NAME.inputs.npz and NAME.ref.npz beside it "
                             "(default: %(default)s)")
    parser.add_argument("-O", dest="level", type=int, default=2, choices=range(4),
                        metavar="LEVEL", help="optimization level 0 to 3 (default 2)")
    parser.add_argument("--rtol", type=float, default=1e-4, help="default 1e-4")
    parser.add_argument("--atol", type=float, default=1e-5, help="default 1e-5")
    parser.add_argument("--strict", action="store_true",
                        help="also fail when a decomposed LayerNorm, GELU or attention block "
                             "(a Softmax) is left unfused")
    args = parser.parse_args()
    paths = sorted(glob.glob(os.path.join(args.folder, "*.onnx")))
    if not paths:  # a check of nothing must not pass
        parser.error(f"{args.folder}: no .onnx models there")
    rows, failures = [], 0
    for path in paths:
        stem = path[: -len(".onnx")]
        missing = [f for f in (stem + ".inputs.npz", stem + ".ref.npz") if not os.path.exists(f)]
        if missing:
            print(f"{os.path.basename(path)}: no {', '.join(map(os.path.basename, missing))} "
                  "beside it: not checked", file=sys.stderr)
            failures += 1
            continue
        with np.load(stem + ".inputs.npz") as f:
            feeds = {k: f[k] for k in f.files}
        with np.load(stem + ".ref.npz") as f:
            reference = {k: f[k] for k in f.files}
        start = time.perf_counter()
        result = graphopt.optimize(path, level=args.level, verify_structure=True)
        seconds = time.perf_counter() - start
        status = []
        for label, proto in (("round-trip", to_onnx(load_onnx(path))), ("optimized", result.to_onnx())):
            onnx.checker.check_model(proto)
            problems = numerics.compare(reference, numerics.run(proto, feeds), args.rtol, args.atol)
            status.append("ok" if not problems else f"{label}: {problems[0]}")
            failures += bool(problems)
        with tempfile.TemporaryDirectory() as folder:
            artifact = os.path.join(folder, "model.om")
            graphopt.save(result, artifact)
            outputs = graphopt.load(artifact).run(feeds)
        problems = numerics.compare(reference, outputs, args.rtol, args.atol)
        status.append("ok" if not problems else f".om: {problems[0]}")
        failures += bool(problems)
        ops = Counter(n.op_type for n in result.model.graph.all_nodes())
        layernorms = sum(ops[o] for o in LAYERNORMS)
        gelus = sum(ops[o] for o in GELUS)
        # Decomposed leftovers: a LayerNorm centres x with Sub(x, ReduceMean(x)) (a lone
        # ReduceMean is global pooling); a GELU keeps an Erf, or a Tanh feeding Add(·, 1) (a
        # pooler's Tanh is an activation); attention's Softmax feeds the MatMul with V (YOLO's
        # DFL head has a Softmax of its own).
        centred = _feeding(result.model, "ReduceMean", "Sub")
        tanh_gelu = _feeding(result.model, "Tanh", "Add")
        softmax_attention = _feeding(result.model, "Softmax", "MatMul")
        rows.append([os.path.basename(path), result.nodes_before, result.model.graph.count_nodes(),
                     f"{seconds:.2f}", *status, f"{layernorms} / {centred}",
                     f"{gelus} / {ops['Erf'] + tanh_gelu}",
                     f"{sum(ops[o] for o in ATTENTIONS)} / {softmax_attention}"])
        failures += bool(args.strict and (centred or ops["Erf"] or tanh_gelu or softmax_attention))
    print(format_table(["model", "nodes", "after", "s", "round-trip", "optimized", ".om",
                        "LayerNorm fused / left", "GELU fused / left",
                        "attention fused / left"], rows))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
