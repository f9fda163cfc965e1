"""INT4 weight-only: gpt2_small compiled at -O2 as float32, float16 and int4 (MatMulNBits; with
--int4-embeddings the embedding tables too, the tied head sharing its table; "acc4" computes with
int8 activations, --int4-accuracy-level 4; "gptq" rounds with --int4-method gptq), side by side:
weight bytes, logits cosine to the original, latency at ORT_ENABLE_ALL.

Weight bytes are printed twice: those of the MatMul weights alone (their scales and zero points
included), and those of every initializer of the model, against the float16 model's.

Variants run interleaved (A B C A B C …) after warm-up; medians (min-max) in ms and the ratio
fp32 / variant (above 1: faster). The correctness columns are the logits cosine against the
original at ORT_DISABLE_ALL, median (min) over --seeds seeded token-id sets, and the largest
absolute difference.

    .venv/bin/python bench/precision_int4.py [--runs 30] [--threads 1,2] [--group-size 32] [--seeds 8]
                                             [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort
from _common import (json_path, markdown_table, positive_int, positive_ints, session_options,
                     summary, write_json)
from onnx import numpy_helper

import graphopt
from graphopt import numerics, zoo
from graphopt.tools.metrics import cosine_similarity

VARIANTS = {
    "fp32": {},
    "fp16": {"precision": "fp16"},
    "int4": {"quantize": "int4"},
    "int4 acc4": {"quantize": "int4", "int4_accuracy_level": 4},
    "int4 gptq": {"quantize": "int4", "int4_method": "gptq"},
    "int4+emb": {"quantize": "int4", "int4_embeddings": True},
    "fp16 int4+emb": {"precision": "fp16", "quantize": "int4", "int4_embeddings": True},
    "fp16 int4+emb gptq": {"precision": "fp16", "quantize": "int4", "int4_embeddings": True,
                           "int4_method": "gptq"},
}
# GPTQ's calibration, seeded apart from the evaluated ids: 32 rows of 64 token ids (more rows
# than any layer has input features) and 512 single ids, none of them an evaluated single
# token: the two lengths the bench evaluates. With the 64-token rows alone, the single-token
# sets' worst cosine at blocks of 64 with float16 scales was 0.976: the lone-token rows'
# statistics (position 0, attention to itself only) were a small share of XᵀX.
CALIBRATION_SEED = 1234
CALIBRATION_ROWS = {"prompts": (32, 64), "tokens": (512, 1)}


def evaluated_ids(seed: int, seq: int) -> np.ndarray:
    """The token ids the cosine is measured on: one row of `seq`, seeded."""
    return np.random.default_rng(seed).integers(0, 1000, (1, seq))


def matmul_weight_bytes(proto) -> int:
    """Bytes of the initializers MatMul/MatMulNBits read as B, scales and zero points."""
    inits = {t.name: t for t in proto.graph.initializer}
    names = {i for n in proto.graph.node if n.op_type in ("MatMul", "MatMulNBits")
             for i in n.input[1:4]}
    return sum(numpy_helper.to_array(inits[n]).nbytes for n in names if n in inits)


def weight_bytes(proto) -> int:
    """Bytes of every initializer: what the model stores."""
    return sum(numpy_helper.to_array(t).nbytes for t in proto.graph.initializer)


def time_interleaved(sessions: dict, feeds: dict, runs: int, warmup: int = 3) -> dict:
    times = {name: [] for name in sessions}
    for _ in range(warmup):
        for session in sessions.values():
            session.run(None, feeds)
    for _ in range(runs):
        for name, session in sessions.items():
            start = time.perf_counter()
            session.run(None, feeds)
            times[name].append((time.perf_counter() - start) * 1000)
    return times


def _group_size(text: str) -> int:
    """--group-size: graphopt's int4_group_size, a power of 2 ≥ 16, checked before gpt2_small is
    built and compiled rather than by the first int4 compile."""
    size = positive_int(text)
    if size < 16 or size & (size - 1):
        raise argparse.ArgumentTypeError(f"must be a power of 2 ≥ 16 (16, 32, …), not {size}")
    return size


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--runs", type=positive_int, default=30,
                        help="interleaved rounds (default 30)")
    # Comma-separated as the other benches take lists (1,2), or spaced (1 2)
    parser.add_argument("--threads", type=positive_ints, nargs="+", default=[[1, 2]],
                        help="intra-op thread counts to time (default 1,2)")
    parser.add_argument("--seq", type=positive_ints, nargs="+", default=[[1, 64]],
                        help="sequence lengths to time (default 1,64)")
    parser.add_argument("--group-size", type=_group_size, default=32, metavar="N",
                        help="weights per scale (--int4-group-size) of the int4 variants")
    parser.add_argument("--seeds", type=positive_int, default=8,
                        help="seeded token-id sets the cosine is taken over (default 8)")
    parser.add_argument("--json", metavar="FILE", type=json_path,
                        help="also write the results as JSON to FILE")
    args = parser.parse_args(argv)
    args.threads = [n for group in args.threads for n in group]
    args.seq = [n for group in args.seq for n in group]

    original = zoo.build("gpt2_small")
    with tempfile.TemporaryDirectory() as folder:
        calibration = os.path.join(folder, "calibration")
        os.mkdir(calibration)
        rng = np.random.default_rng(CALIBRATION_SEED)
        evaluated = {int(evaluated_ids(seed, 1)[0, 0]) for seed in range(args.seeds)}
        unseen = np.array([token for token in range(1000) if token not in evaluated])
        for name, shape in CALIBRATION_ROWS.items():  # one file per length, batch-sized
            ids = rng.choice(unseen, shape) if shape[1] == 1 else rng.integers(0, 1000, shape)
            np.savez(os.path.join(calibration, f"{name}.npz"), input_ids=ids)
        extra = {"int4_group_size": args.group_size, "calibration": calibration}
        compiled = {name: graphopt.optimize(original, level=2, pass_options={
                        **opts, **(extra if "quantize" in opts else {})}).to_onnx()
                    for name, opts in VARIANTS.items()}
    sizes = {name: matmul_weight_bytes(p) for name, p in compiled.items()}
    totals = {name: weight_bytes(p) for name, p in compiled.items()}
    print(markdown_table(["variant", "MatMul weights MiB", "all weights MiB", "below fp16"], [
        [name, f"{sizes[name] / 2**20:.2f}", f"{totals[name] / 2**20:.2f}",
         f"{100 * (1 - totals[name] / totals['fp16']):.1f}%"] for name in compiled]))
    print()
    rows, data = [], {"model": "gpt2_small", "onnxruntime": ort.__version__, "runs": args.runs,
                      "matmul_weight_bytes": sizes, "weight_bytes": totals, "results": []}
    for seq in args.seq:
        # The cosine of a random-weight model's logits varies with the tokens: several seeded
        # id sets, the first of which is also the timed one.
        id_sets = [{"input_ids": evaluated_ids(seed, seq)} for seed in range(args.seeds)]
        feeds = id_sets[0]
        references = [numerics.run(original, ids)["logits"] for ids in id_sets]
        checks = {}
        for name, proto in compiled.items():
            cosines, worst = [], 0.0
            for ids, expected in zip(id_sets, references):
                got = numerics.run(proto, ids, level="all")["logits"]
                cosines.append(cosine_similarity(expected, got))
                worst = max(worst, float(np.abs(got.astype(np.float64) - expected).max()))
            checks[name] = (statistics.median(cosines), min(cosines), worst)
        for threads in args.threads:
            sessions = {name: ort.InferenceSession(p.SerializeToString(),
                                                   session_options("all", threads=threads),
                                                   providers=["CPUExecutionProvider"])
                        for name, p in compiled.items()}
            times = time_interleaved(sessions, feeds, args.runs)
            base = statistics.median(times["fp32"])
            for name, ms in times.items():
                med = statistics.median(ms)
                cosine, least, worst = checks[name]
                rows.append([f"{seq}", f"{threads}", name, f"{cosine:.4f} ({least:.4f})",
                             f"{worst:.3g}", f"{med:.3f} ({min(ms):.3f}-{max(ms):.3f})",
                             f"{base / med:.2f}x"])
                data["results"].append({"seq": seq, "threads": threads, "variant": name,
                                        "median_ms": med, "min_ms": min(ms), "max_ms": max(ms),
                                        "speedup_vs_fp32": base / med,
                                        "logits_cosine_median": checks[name][0],
                                        "logits_cosine_min": checks[name][1],
                                        "logits_max_abs": checks[name][2]})
    print(markdown_table(["seq", "threads", "variant", "logits cosine median (min)",
                          "max abs diff", "median ms (min-max)", "fp32 / variant"], rows))
    if args.json:
        write_json(args.json, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
