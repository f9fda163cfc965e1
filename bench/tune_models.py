"""Whole-model op tuning on the NPU targets: the zoo's ResNet-50 (1×3×224×224) and BERT-base
(1×128), FP16 and INT8, default against tuned tilings under the cost model.

Each row is `graphopt tune` as a user runs it (30 trials per kernel signature, seed 0, a fresh
knowledge base), read from its table and its whole-model line; INT8 calibrates on 8 seeded
random samples (BERT: random token ids). All figures are the cost model's estimates, so one
run suffices (no timing noise).

    .venv/bin/python bench/tune_models.py [--trials 30] [--only resnet50] [--json out/tune_models.json]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _common import json_path, markdown_table, positive_int, summary, write_json

import onnx

from graphopt import zoo

MODELS = {"resnet50": "input:1,3,224,224", "bert_base": "input_ids:1,128;attention_mask:1,128"}
TARGETS = ("ascend310", "ascend910b")
SAMPLES = 8


def _calibration(model: str, path: str) -> None:
    rng = np.random.default_rng(0)
    if model == "resnet50":
        np.savez(path, input=rng.standard_normal((SAMPLES, 3, 224, 224)).astype(np.float32))
    else:
        np.savez(path, input_ids=rng.integers(0, 30522, (SAMPLES, 128)).astype(np.int64),
                 attention_mask=np.ones((SAMPLES, 128), np.int64))


def _tune(path: str, target: str, shapes: str, trials: int, db: str, extra: list[str]) -> dict:
    """`graphopt tune`'s table rows and whole-model figures, as it prints them."""
    argv = [sys.executable, "-m", "graphopt", "tune", path, "--target", target,
            "--input-shape", shapes, "--trials", str(trials), "--seed", "0",
            "--tuning-db", db, "-q", *extra]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    whole = re.search(r"whole model \(estimate\): default ([\d.]+) µs, tuned ([\d.]+) µs", out)
    rows = [line.split() for line in out.splitlines()
            if line.startswith(f"{target}/")]
    return {"default_us": float(whole[1]), "tuned_us": float(whole[2]),
            "signatures": len(rows), "int8_signatures": sum(r[0].endswith("/int8") for r in rows),
            "kernels": [{"signature": r[0], "nodes": int(r[1]), "default_us": float(r[2]),
                         "tuned_us": float(r[3]), "tiling": " ".join(r[6:])} for r in rows]}


def _ms(us: float) -> str:
    return f"{us / 1e3:.2f}" if us >= 2e3 else f"{us / 1e3:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--trials", type=positive_int, default=30,
                        help="trials per kernel signature (default 30)")
    parser.add_argument("--only", action="append", choices=sorted(MODELS),
                        help="this model only (repeatable)")
    parser.add_argument("--json", metavar="FILE", type=json_path,
                        help="also write the results, per kernel, as JSON to FILE")
    args = parser.parse_args()
    results, table = [], []
    with tempfile.TemporaryDirectory(prefix="graphopt-bench-tune-") as tmp:
        for name in args.only or MODELS:
            path = os.path.join(tmp, f"{name}.onnx")
            onnx.save(zoo.build(name), path)
            calib = os.path.join(tmp, f"{name}.calib.npz")
            _calibration(name, calib)
            for target in TARGETS:
                fp16 = _tune(path, target, MODELS[name], args.trials,
                             os.path.join(tmp, f"{name}.{target}.fp16.db"), [])
                int8 = _tune(path, target, MODELS[name], args.trials,
                             os.path.join(tmp, f"{name}.{target}.int8.db"),
                             ["--quantize", "int8", "--calibration", calib])
                results.append({"model": name, "target": target, "fp16": fp16, "int8": int8})
                table.append([
                    name, target, str(fp16["signatures"]),
                    f"{_ms(fp16['default_us'])} / {_ms(fp16['tuned_us'])} ms",
                    f"{fp16['default_us'] / fp16['tuned_us']:.2f}",
                    f"{_ms(int8['default_us'])} / {_ms(int8['tuned_us'])} ms",
                    f"{fp16['tuned_us'] / int8['tuned_us']:.2f}",
                    f"{int8['int8_signatures']} of {int8['signatures']}"])
                print(f"{name} {target} done", file=sys.stderr, flush=True)
    print(markdown_table(["model", "target", "signatures", "FP16 default / tuned", "FP16 ×",
                          "INT8 default / tuned", "INT8 × FP16, tuned", "INT8 signatures"],
                         table))
    print(f"\n{args.trials} trials per kernel signature, seed 0; estimates of the cost model")
    for entry in results:  # what the cube kernels add up to, every node of each signature
        sums = {kind: [sum(k["nodes"] * k[f"{when}_us"] for k in entry[kind]["kernels"])
                       for when in ("default", "tuned")] for kind in ("fp16", "int8")}
        print(f"{entry['model']} {entry['target']}: cube kernels FP16 "
              f"{_ms(sums['fp16'][0])} / {_ms(sums['fp16'][1])} ms, INT8 "
              f"{_ms(sums['int8'][0])} / {_ms(sums['int8'][1])} ms (default / tuned)")
    if args.json:
        write_json(args.json, {"trials": args.trials, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
