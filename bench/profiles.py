"""Shape profiles: what one `.om` holding a plan per profile (`--dynamic-dims`) costs and gains.

For each model with dynamic batch and sequence dims, and each profile of a batch × sequence grid:
  - steady-state latency, interleaved: onnxruntime at ORT_ENABLE_ALL on the dynamic original (what
    a user runs without graphopt), the profiled `.om` (the runtime picks the profile by shape), and
    an `.om` compiled for that shape alone (`--input-shape`), which the profiled one should match;
  - each output's max |Δ| against the original at ORT_DISABLE_ALL, of the profiled `.om` (the
    single-shape one is checked too, and named in that cell when it is off);
and once per model: compile time, file size, and load + first inference of the profiled `.om`
against the single-shape one and against onnxruntime's session creation + first run.

    python bench/profiles.py                      # zoo bert_base (4 layers) and gpt2_small
    python bench/profiles.py --runs 30 --batch 1,8 --seq 128,256 --json out/profiles.json
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
import warnings

import onnx
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import graphopt  # noqa: E402
import models as zoo  # noqa: E402
from _common import (Stats, compare_outputs, json_path, markdown_table,  # noqa: E402
                     positive_int, run_model, session_options, write_json)
from _models import matching, unmatched  # noqa: E402

CPU = ["CPUExecutionProvider"]
MODELS = {
    "bert_base (4 layers)": ("bert_base", {"layers": 4}),
    "gpt2_small": ("gpt2_small", {}),
}


def load_om(path: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return graphopt.load(path, intra_op_num_threads=1, inter_op_num_threads=1)


def timed(make) -> tuple[float, object]:
    start = time.perf_counter()
    value = make()
    return time.perf_counter() - start, value


def start_up(path: str, feeds: dict, runs: int) -> dict[str, Stats]:
    """Load + first run, interleaved cold starts (files in the page cache after round 0)."""
    def ort_start():
        session = ort.InferenceSession(path["onnx"], session_options("all"), providers=CPU)
        return session.run(None, feeds)

    variants = {"onnxruntime": ort_start,
                "profiled .om": lambda: load_om(path["profiled"]).run(feeds),
                "single-shape .om": lambda: load_om(path["single"]).run(feeds)}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(runs + 1):
        for name, start in variants.items():
            seconds, _ = timed(start)
            if round_:
                times[name].append(seconds)
    return {name: Stats.of(values) for name, values in times.items()}


def steady(sessions: dict, feeds: dict, runs: int, warmup: int = 3) -> dict[str, Stats]:
    """Per-run latency of each session on `feeds`, interleaved."""
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for round_ in range(warmup + runs):
        for name, run in sessions.items():
            seconds, _ = timed(lambda: run(feeds))
            if round_ >= warmup:
                times[name].append(seconds)
    return {name: Stats.of(values) for name, values in times.items()}


def bench_model(label: str, name: str, options: dict, batches, seqs, runs: int,
                workdir: str) -> dict:
    proto = zoo.build(name, **options)
    path = {"onnx": os.path.join(workdir, f"{name}.onnx"),
            "profiled": os.path.join(workdir, f"{name}.profiles.om")}
    onnx.save(proto, path["onnx"])
    grid = f"batch_size:{','.join(map(str, batches))};sequence_length:{','.join(map(str, seqs))}"
    # An untimed compile first: the first one in a process pays one-time costs (imports,
    # caches) that the single-shape compiles after it would not, ~0.45 s on gpt2_small.
    graphopt.optimize(path["onnx"], target="cpu", dynamic_dims=grid)
    compile_s, result = timed(lambda: graphopt.optimize(path["onnx"], target="cpu",
                                                        dynamic_dims=grid))
    graphopt.save(result, path["profiled"])
    profiled = load_om(path["profiled"])
    original = ort.InferenceSession(path["onnx"], session_options("all"), providers=CPU)
    rows, single_compile, single_paths = [], [], {}
    for batch, seq in itertools.product(batches, seqs):
        feeds = zoo.sample_inputs(proto, seed=batch * 1000 + seq,
                                  dims={"batch_size": batch, "sequence_length": seq})
        single = os.path.join(workdir, f"{name}.{batch}x{seq}.om")
        shapes = ";".join(f"{k}:{','.join(map(str, v.shape))}" for k, v in feeds.items())
        seconds, compiled = timed(lambda: graphopt.optimize(path["onnx"], target="cpu",
                                                            input_shapes=shapes))
        single_compile.append(seconds)
        graphopt.save(compiled, single)
        single_paths[(batch, seq)] = single
        alone = load_om(single)
        expected = run_model(path["onnx"], feeds)
        check = compare_outputs(expected, profiled.run(feeds))
        single_check = compare_outputs(expected, alone.run(feeds))
        stats = steady({"onnxruntime": lambda f: original.run(None, f),
                        "profiled .om": profiled.run, "single-shape .om": alone.run},
                       feeds, runs)
        # The column is the profiled .om's; the single-shape one it is timed against is
        # flagged there when it is off too.
        cell = check.cell() + ("" if single_check.ok else f" (single-shape: {single_check.cell()})")
        rows.append({"batch": batch, "seq": seq, "profile": profiled.profile_for(feeds),
                     "check": cell, "ok": check.ok and single_check.ok,
                     "single_check": single_check.cell(),
                     **{k: vars(v) for k, v in stats.items()}})
        print(f"{label} {batch}×{seq}: ORT {stats['onnxruntime'].median * 1e3:.2f} ms, profiled "
              f"{stats['profiled .om'].median * 1e3:.2f} ms, single "
              f"{stats['single-shape .om'].median * 1e3:.2f} ms, {cell}", flush=True,
              file=sys.stderr)  # progress: stdout carries the tables alone
        del alone
    first = (batches[0], seqs[0])
    feeds = zoo.sample_inputs(proto, seed=0, dims={"batch_size": first[0],
                                                   "sequence_length": first[1]})
    starts = start_up({**path, "single": single_paths[first]}, feeds, max(5, runs // 2))
    return {"model": label, "profiles": len(rows), "compile_s": compile_s,
            "single_compile_s": sum(single_compile) / len(single_compile),
            "om_mb": os.path.getsize(path["profiled"]) / 1e6,
            "single_om_mb": os.path.getsize(single_paths[first]) / 1e6,
            "start_up": {k: vars(v) for k, v in starts.items()}, "rows": rows}


def format_model(result: dict, runs: int) -> str:
    table = []
    for row in result["rows"]:
        ort_ms = row["onnxruntime"]["median"] * 1e3
        prof_ms = row["profiled .om"]["median"] * 1e3
        single_ms = row["single-shape .om"]["median"] * 1e3
        table.append([f"{row['batch']}×{row['seq']}", row["profile"], f"{ort_ms:.2f}",
                      f"{prof_ms:.2f}", f"{single_ms:.2f}", f"{ort_ms / prof_ms:.2f}",
                      f"{prof_ms / single_ms:.2f}", row["check"]])
    s = result["start_up"]
    lines = [
        f"### {result['model']}: {result['profiles']} profiles",
        "",
        f"compile {result['compile_s']:.2f} s for all profiles ({result['single_compile_s']:.2f} s "
        f"per single-shape compile); .om {result['om_mb']:.1f} MB (single shape "
        f"{result['single_om_mb']:.1f} MB)",
        f"load + first run (median of {max(5, runs // 2)} interleaved cold starts): onnxruntime "
        f"{s['onnxruntime']['median'] * 1e3:.1f} ms, profiled .om "
        f"{s['profiled .om']['median'] * 1e3:.1f} ms, single-shape .om "
        f"{s['single-shape .om']['median'] * 1e3:.1f} ms",
        "",
        markdown_table(["batch×seq", "profile", "ORT ENABLE_ALL ms", "profiled .om ms",
                        "single-shape .om ms", "ORT / profiled", "profiled / single",
                        "max abs Δ vs original"], table),
    ]
    return "\n".join(lines)


def _sizes(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma list of sizes") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"'{text}': sizes must be ≥ 1")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=positive_int, default=20, help="timed runs per variant (20)")
    parser.add_argument("--batch", type=_sizes, default=[1, 4], help="batch sizes (1,4)")
    parser.add_argument("--seq", type=_sizes, default=[64, 128], help="sequence lengths (64,128)")
    parser.add_argument("--only", action="append", default=[],
                        help="models whose name contains this; repeatable")
    parser.add_argument("--json", metavar="FILE", type=json_path,
                        help="also write the results as JSON")
    args = parser.parse_args(argv)
    problem = unmatched(args.only, lambda wanted: filter(wanted, MODELS))
    if problem:
        print(problem, file=sys.stderr)
        return 1
    wanted = matching(args.only)
    results = []
    with tempfile.TemporaryDirectory(prefix="graphopt-profiles-") as workdir:
        for label, (name, options) in MODELS.items():
            if not wanted(label):
                continue
            results.append(bench_model(label, name, options, args.batch, args.seq, args.runs,
                                       workdir))
    print(f"\nsteady state: median of {args.runs} interleaved runs after 3 warmup, 1 thread "
          f"(intra and inter op); onnxruntime {ort.__version__}\n")
    print("\n\n".join(format_model(r, args.runs) for r in results))
    if args.json:
        write_json(args.json, {"runs": args.runs, "onnxruntime": ort.__version__,
                               "models": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
