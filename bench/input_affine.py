"""FoldInputAffine on conv nets that scale and shift an activation before the next conv.

For one model (the zoo's lcnetv3 by default, or the ONNX file given with --model and its
inputs with --inputs), graphopt's .om for the cpu target compiled with FoldInputAffine switched off
and on, run through graphopt's runtime at 1 thread, interleaved (off, on, off, on, ...),
medians of the per-call wall time, their ratio, the ops each leaves, and the largest
difference of the two .om's outputs from the original's at ORT_DISABLE_ALL.

    python bench/input_affine.py
    python bench/input_affine.py --runs 200 --image-size 640
    python bench/input_affine.py --model det.onnx --inputs det_inputs.npz
    python bench/input_affine.py --json out/input_affine.json
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
import warnings

import numpy as np
import onnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (Stats, json_path, markdown_table, positive_int, run_model,  # noqa: E402
                     write_json)

import graphopt  # noqa: E402
from graphopt import zoo  # noqa: E402

VARIANTS = {"off": ["FoldInputAffine"], "on": []}


def _ops(result) -> int:
    return sum(1 for node in result.model.graph if node.op_type in ("Mul", "Add", "Div"))


def row(label: str, path: str, feeds: dict[str, np.ndarray], runs: int, folder: str) -> dict:
    expected = run_model(path, feeds)
    sessions, counts, errors = {}, {}, {}
    for key, disabled in VARIANTS.items():
        result = graphopt.optimize(path, target="cpu", disable_passes=disabled)
        counts[key] = _ops(result)
        om = os.path.join(folder, f"{key}.om")
        graphopt.save(result, om)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sessions[key] = graphopt.load(om, intra_op_num_threads=1)
        actual = sessions[key].run(feeds)
        errors[key] = max(float(np.max(np.abs(actual[name] - value)))
                          for name, value in expected.items())
    times = {key: [] for key in sessions}
    for _ in range(5):  # warm-up
        for session in sessions.values():
            session.run(feeds)
    gc.collect()
    gc.disable()
    try:
        for _ in range(runs):
            for key, session in sessions.items():
                start = time.perf_counter()
                session.run(feeds)
                times[key].append(time.perf_counter() - start)
    finally:
        gc.enable()
    stats = {key: Stats.of([t * 1e3 for t in times[key]]) for key in times}
    return {"model": label, "runs": runs, "ops": counts, "max_abs_error": errors,
            "ms": {key: {"median": s.median, "min": s.low, "max": s.high}
                   for key, s in stats.items()},
            "ratio": stats["on"].median / stats["off"].median}


def cells(result: dict) -> list[str]:
    ops, err = result["ops"], result["max_abs_error"]
    return [result["model"], f"{ops['off']} → {ops['on']}",
            *(Stats(t["median"], t["min"], t["max"]).cell() for t in result["ms"].values()),
            f"{result['ratio']:.2f}", f"{err['off']:.1e} / {err['on']:.1e}"]


def _image_size(text: str) -> int:
    """--image-size: lcnetv3 downsamples by 32, so a positive multiple of 32."""
    size = positive_int(text)
    if size % 32:
        raise argparse.ArgumentTypeError(f"must be a multiple of 32, not {size}")
    return size


COLUMNS = ["model", "Mul/Add/Div ops", "off ms (min–max)", "on ms (min–max)", "on / off",
           "max abs Δ vs original (off / on)"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=positive_int, default=100,
                        help="timed calls of each (default 100)")
    parser.add_argument("--image-size", type=_image_size, default=320,
                        help="lcnetv3's input size, a multiple of 32 (default 320)")
    parser.add_argument("--model", help="an ONNX file instead of the zoo's lcnetv3")
    parser.add_argument("--inputs", help="the .npz of --model's inputs (default: seed-0 inputs)")
    parser.add_argument("--json", type=json_path,
                        help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        if args.model:
            path, label = args.model, os.path.basename(args.model)
        else:
            path, label = os.path.join(folder, "lcnetv3.onnx"), f"zoo/lcnetv3 {args.image_size}"
            onnx.save(zoo.build("lcnetv3", image_size=args.image_size), path)
        if args.inputs:
            feeds = dict(np.load(args.inputs))
        else:
            feeds = zoo.sample_inputs(onnx.load(path, load_external_data=False))
        result = row(label, path, feeds, args.runs, folder)
    print(markdown_table(COLUMNS, [cells(result)]))
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
