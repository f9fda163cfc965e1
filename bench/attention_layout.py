"""A model with attention, compiled with and without FuseAttention, against the original.

Per model: the original at ORT_ENABLE_ALL, graphopt -O2 with FuseAttention switched off, and
graphopt -O2, each run at ORT_ENABLE_ALL in onnxruntime's CPU provider at 1 thread, the calls
interleaved, medians of the per-call wall time, node counts beside them, outputs compared with
the original at ORT_DISABLE_ALL. Without --dims the inputs are MODEL.inputs.npz or
MODEL.npz beside the model (as exported), if there is one; otherwise graphopt's seeded random
feeds, each symbolic dim the size --dims gives it (else 1), with a bool input (a key padding
mask) False and an input named like a mask 1, but for the last quarter of the last row. The
`inputs` column says which, with the shapes run. --extra adds already compiled files (another
graphopt's output, say) to the same runs.

    python bench/attention_layout.py tenc_sf.dyn18.onnx --dims seq=128,batch=4
    python bench/attention_layout.py a.onnx b.onnx --dims seq=64,batch=2 --extra before=a.old.onnx
    python bench/attention_layout.py ../shared/models/dev_bert.ts.onnx --json out/attention.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import graphopt  # noqa: E402
from graphopt import numerics  # noqa: E402
from _common import (Stats, compare_outputs, json_path, markdown_table, positive_int,  # noqa: E402
                     run_model, session_options, write_json)


def _feeds(path: str, dims: dict[str, int]) -> tuple[dict[str, np.ndarray], str]:
    """The feeds, and where they came from with the shapes they have (a static model ignores
    --dims, which the shapes then show)."""
    stem = os.path.splitext(path)[0]
    for saved in (stem + ".inputs.npz", stem + ".npz"):
        if not dims and os.path.exists(saved):  # the inputs it was exported with
            with np.load(saved) as data:
                feeds = {name: data[name] for name in data.files}
            return feeds, f"{os.path.basename(saved)} {_shapes(feeds)}"
    model = onnx.load(path, load_external_data=False)
    feeds = numerics.random_feeds(model, seed=0, dims=dims)
    for name, value in feeds.items():
        if value.dtype == bool:  # a key padding mask (True: padding)
            value[...] = False
            if value.ndim == 2:
                value[-1, value.shape[1] - value.shape[1] // 4:] = True
        elif "mask" in name:  # an attention mask (1: attend)
            value[...] = 1
            if value.ndim == 2:
                value[-1, value.shape[1] - value.shape[1] // 4:] = 0
    return feeds, f"seeded random {_shapes(feeds)}"


def _shapes(feeds: dict[str, np.ndarray]) -> str:
    return " ".join(f"{name}[{','.join(map(str, value.shape))}]" for name, value in feeds.items())


def bench(path: str, dims: dict[str, int], extra: dict[str, str], runs: int,
          folder: str) -> list[dict]:
    files = {"original": path}
    for name, disabled in (("-O2 without FuseAttention", {"FuseAttention"}), ("-O2", set())):
        out = os.path.join(folder, f"{len(files)}.onnx")
        graphopt.save(graphopt.optimize(path, level=2, disable_passes=disabled), out)
        files[name] = out
    files.update(extra)
    feeds, inputs = _feeds(path, dims)
    want = run_model(path, feeds)
    sessions = {name: ort.InferenceSession(file, session_options("all"),
                                           providers=["CPUExecutionProvider"])
                for name, file in files.items()}
    times: dict[str, list[float]] = {name: [] for name in files}
    order = list(sessions)
    for i in range(runs + 10):
        # Each round starts one variant later: none always runs on the caches the same
        # other one left.
        for name in order[i % len(order):] + order[:i % len(order)]:
            start = time.perf_counter()
            sessions[name].run(None, feeds)
            if i >= 10:
                times[name].append(time.perf_counter() - start)
    base = float(np.median(times["original"]))
    rows = []
    for name, file in files.items():
        check = compare_outputs(want, run_model(file, feeds))
        rows.append({"model": os.path.basename(path), "variant": name, "inputs": inputs,
                     "nodes": len(onnx.load(file, load_external_data=False).graph.node),
                     "stats": Stats.of([t * 1e3 for t in times[name]]),
                     "ratio": float(np.median(times[name])) / base,
                     "check": check})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", help="ONNX models")
    parser.add_argument("--dims", default="", help="sizes of symbolic dims: seq=128,batch=4 "
                        "(default: the inputs in MODEL.npz, else 1)")
    parser.add_argument("--extra", action="append", default=[], metavar="NAME=FILE",
                        help="a compiled file to run beside the others (one model only)")
    parser.add_argument("--runs", type=positive_int, default=200,
                        help="timed calls per variant (200)")
    parser.add_argument("--json", metavar="FILE", type=json_path,
                        help="also write the rows as JSON")
    args = parser.parse_args(argv)
    try:
        dims = {k: int(v) for k, v in (p.split("=") for p in args.dims.split(",") if p)}
    except ValueError:  # no "=", two of them, or a size that is no integer
        parser.error(f"--dims {args.dims}: expected NAME=N pairs separated by commas")
    if any(n < 1 for n in dims.values()):
        parser.error(f"--dims {args.dims}: sizes must be at least 1")
    if any("=" not in p for p in args.extra):
        parser.error("--extra takes NAME=FILE")
    extra = dict(p.split("=", 1) for p in args.extra)
    if extra and len(args.models) > 1:
        parser.error("--extra goes with one model")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for path in args.models:
            rows += bench(path, dims, extra, args.runs, folder)
    print(f"median (min–max) ms per call of {args.runs} interleaved calls, 1 thread, "
          f"ORT_ENABLE_ALL, onnxruntime {ort.__version__}; max abs Δ against the original at "
          "ORT_DISABLE_ALL\n")
    print(markdown_table(
        ["model", "inputs", "variant", "nodes", "ms", "× original", "max abs Δ"],
        [[r["model"], r["inputs"], r["variant"], str(r["nodes"]), r["stats"].cell(),
          f"{r['ratio']:.2f}", r["check"].cell()] for r in rows]))
    if args.json:
        write_json(args.json, [{"model": r["model"], "inputs": r["inputs"],
                                "variant": r["variant"], "nodes": r["nodes"],
                                "median_ms": r["stats"].median, "min_ms": r["stats"].low,
                                "max_ms": r["stats"].high, "ratio": r["ratio"],
                                "max_abs_diff": r["check"].worst, "ok": r["check"].ok}
                               for r in rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
