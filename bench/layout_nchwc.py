"""NCHWc ahead of time: graphopt's -O2 output plus LayoutNchwc at lower onnxruntime levels beside
the -O2 output at ORT_ENABLE_ALL, which builds the same layout itself at every session start."""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field

import onnx
import onnxruntime as ort

import graphopt
from graphopt.passes import Options, PassContext, PassManager, Pipeline
from graphopt.passes.layout_nchwc import NCHWC
from graphopt.nchwc_block import detect_block_size

from _common import (compare_outputs, json_path, markdown_table, positive_int, run_model,
                     short_reason, write_json)
from _latency_variants import SESSION_CONFIG, Runner, Variant, open_runner
from _models import ZOO_QUICK, BenchModel, matching, sized_zoo_models, unmatched
from latency import ATOL, MIN_RUNS, RTOL, Timing, timed_rounds

DESCRIPTION = """\
Time graphopt's -O2 output with LayoutNchwc applied (onnxruntime's blocked NCHWc ops, written
ahead of time) at ORT_ENABLE_BASIC, ORT_ENABLE_EXTENDED and ORT_ENABLE_ALL beside the -O2 output
at ORT_ENABLE_ALL (whose session start runs onnxruntime's own NchwcTransformer) and at
ORT_ENABLE_EXTENDED (no NCHWc at all), on the zoo's resnet50, mobilenetv2, blazepalm, lcnetv3
and unet.

Inference: every variant gets its own session (intra_op T, inter_op 1, spinning stopped after each
run), warm-up rounds, then timed rounds interleaved (A B C ... A B C ...); median (min-max) ms and
the ratio to the baseline (-O2 at ORT_ENABLE_ALL). Start-up: InferenceSession creation plus the
first inference, the variants interleaved again, median of --startup-runs. Every variant's outputs
are checked against the original model at ORT_DISABLE_ALL on seed-0 inputs."""

EPILOG = """\
examples:
  python bench/layout_nchwc.py
  python bench/layout_nchwc.py --threads 1 --runs 5 --startup-runs 3 --quick
  python bench/layout_nchwc.py --json out/layout_nchwc.json
"""

BASELINE = "o2_all"
VARIANTS = [
    Variant("o2_all", "-O2 @ALL", "graphopt -O2 at ORT_ENABLE_ALL (ORT blocks it at session start)",
            "o2", "all"),
    Variant("o2_extended", "-O2 @EXTENDED", "graphopt -O2 at ORT_ENABLE_EXTENDED (stays NCHW)",
            "o2", "extended"),
    Variant("nchwc_basic", "+NCHWc @BASIC", "graphopt -O2 + LayoutNchwc at ORT_ENABLE_BASIC",
            "nchwc", "basic"),
    Variant("nchwc_extended", "+NCHWc @EXTENDED",
            "graphopt -O2 + LayoutNchwc at ORT_ENABLE_EXTENDED", "nchwc", "extended"),
    Variant("nchwc_all", "+NCHWc @ALL", "graphopt -O2 + LayoutNchwc at ORT_ENABLE_ALL",
            "nchwc", "all"),
]
# The full-size architectures by default; --quick shrinks resnet50 as latency.py's --quick does.
SIZES = {"resnet50": ({}, ""), "mobilenetv2": ({}, ""), "blazepalm": ({}, ""),
         # squeeze-and-excitation gates; ConvTranspose up-sampling into skip Concats (at the
         # size latency.py runs it: 128x128, 16 base channels)
         "lcnetv3": ({}, ""),
         "unet": ({"base_channels": 16, "image_size": 128}, "base 16, 128x128")}
QUICK_SIZES = {name: ZOO_QUICK[name] for name in SIZES}


@dataclass
class Built:
    paths: dict[str, str]
    seconds: dict[str, float]      # -O2 compile, LayoutNchwc alone
    nchwc_ops: dict[str, int]      # com.microsoft.nchwc ops in the LayoutNchwc output
    stats: dict[str, int]


@dataclass
class Row:
    model: BenchModel
    built: Built | None = None
    error: str | None = None
    runs: dict[int, int] = field(default_factory=dict)
    timings: dict[int, dict[str, Timing]] = field(default_factory=dict)
    startup: dict[int, dict[str, Timing]] = field(default_factory=dict)

    def ratio(self, table: dict[int, dict[str, Timing]], threads: int, key: str) -> float | None:
        base, other = table[threads][BASELINE].stats, table[threads][key].stats
        return other.median / base.median if base and other else None


def build(model: BenchModel, workdir: str) -> Built:
    """The -O2 output, then LayoutNchwc through the pass manager on the same IR."""
    start = time.perf_counter()
    result = graphopt.optimize(model.path)
    o2_seconds = time.perf_counter() - start
    o2 = os.path.join(workdir, "o2.onnx")
    graphopt.save(result, o2)
    ctx = PassContext(Options())
    start = time.perf_counter()
    log = PassManager(Pipeline("nchwc", "LayoutNchwc", ("LayoutNchwc",)), ctx).run(result.model)
    layout_seconds = time.perf_counter() - start
    nchwc = os.path.join(workdir, "nchwc.onnx")
    graphopt.save(result, nchwc)
    ops = Counter(n.op_type for n in onnx.load(nchwc, load_external_data=False).graph.node
                  if n.domain == NCHWC)
    return Built({"o2": o2, "nchwc": nchwc}, {"o2": o2_seconds, "layout": layout_seconds},
                 dict(ops), dict(log.records[0].stats))


def measure(row: Row, expected: dict | None, threads: int, args) -> None:
    timings = {v.key: Timing() for v in VARIANTS}
    runners: dict[str, Runner] = {}
    for variant in VARIANTS:
        try:
            runners[variant.key] = open_runner(variant, row.built.paths[variant.file], threads,
                                               row.model.feeds)
        except Exception as e:  # noqa: BLE001 - the reason is the table cell
            timings[variant.key].error = short_reason(e)

    def round_(timed: bool, check: bool = False) -> float:
        total = 0.0
        for key in list(runners):
            start = time.perf_counter()
            raw = runners[key].call()
            seconds = time.perf_counter() - start
            if check and expected is not None:
                timings[key].check = compare_outputs(expected, runners[key].outputs(raw),
                                                     RTOL, ATOL)
            total += seconds
            if timed:
                timings[key].times.append(seconds * 1e3)
        return total

    n = timed_rounds(round_, args.warmup, args.runs, args.budget)
    runners.clear()
    row.runs[threads], row.timings[threads] = n, timings
    row.startup[threads] = measure_startup(row, threads, args.startup_runs)


def measure_startup(row: Row, threads: int, runs: int) -> dict[str, Timing]:
    """InferenceSession creation + first inference per variant, variants interleaved."""
    startup = {v.key: Timing() for v in VARIANTS}
    for _ in range(runs):
        for variant in VARIANTS:
            timing = startup[variant.key]
            if timing.error:
                continue
            gc.collect()
            runner = None
            try:
                start = time.perf_counter()
                runner = open_runner(variant, row.built.paths[variant.file], threads,
                                     row.model.feeds)
                runner.call()
                timing.times.append((time.perf_counter() - start) * 1e3)
            except Exception as e:  # noqa: BLE001
                timing.error, timing.times = short_reason(e), []
            del runner
    return startup


def bench_model(model: BenchModel, threads: list[int], args, workdir: str) -> Row:
    row = Row(model)
    try:
        row.built = build(model, workdir)
    except Exception as e:  # noqa: BLE001
        row.error = short_reason(e)
        return row
    try:
        expected = run_model(model.path, model.feeds)  # the original at ORT_DISABLE_ALL
    except Exception as e:  # noqa: BLE001
        expected, row.error = None, f"original fails at ORT_DISABLE_ALL: {short_reason(e)}"
    for t in threads:
        measure(row, expected, t, args)
    return row


# ---------------------------------------------------------------------------------------------
# output


def _cell(row: Row, table, threads: int, key: str, absolute: bool = False) -> str:
    timing = table[threads][key]
    if timing.error:
        return f"error: {timing.error}"
    if absolute or key == BASELINE:
        return f"{timing.stats.median:.3g}" + (" ✗" if timing.wrong else "")
    r = row.ratio(table, threads, key)
    return "" if r is None else f"{r:.2f}" + (" ✗" if timing.wrong else "")


def tables(rows: list[Row], threads: int, args) -> str:
    others = [v for v in VARIANTS if v.key != BASELINE]
    latency = [["model", f"{VARIANTS[0].name} ms"] + [f"{v.name} ×" for v in others]
               + ["max Δ (all variants)"]]
    startup = [["model", f"{VARIANTS[0].name} ms"] + [f"{v.name} ×" for v in others]]
    for row in rows:
        label = row.model.name + (f" ({row.runs[threads]} runs)"
                                  if row.runs.get(threads, args.runs) < args.runs else "")
        if row.error and not row.timings:
            latency.append([label, f"error: {row.error}"] + [""] * len(others) + [""])
            continue
        checks = [t.check for t in row.timings[threads].values() if t.check is not None]
        worst = max((c.worst for c in checks if c.worst is not None), default=None)
        latency.append([label] + [_cell(row, row.timings, threads, v.key) for v in VARIANTS]
                       + ["" if worst is None else f"{worst:.1e}"
                          + ("" if all(c.ok for c in checks) else " ✗")])
        startup.append([row.model.name] + [_cell(row, row.startup, threads, v.key)
                                           for v in VARIANTS])
    return (f"Inference, {threads} thread{'s' if threads > 1 else ''} (× = median / "
            f"{VARIANTS[0].name} median):\n\n" + markdown_table(latency[0], latency[1:])
            + f"\n\nSession creation + first inference, {threads} "
            f"thread{'s' if threads > 1 else ''} (median of {args.startup_runs}):\n\n"
            + markdown_table(startup[0], startup[1:]))


def header(args, threads: list[int], block: int, load: float | None) -> str:
    legend = "; ".join(f"{v.name} = {v.what}" for v in VARIANTS)
    return (f"LayoutNchwc bench: {args.runs} timed runs per variant after {args.warmup} warm-up "
            f"runs, interleaved, medians; start-up over {args.startup_runs} interleaved "
            f"rounds. NCHWc block size {block} (MLAS: 8 with AVX2, 16 with AVX-512F).\n"
            f"{legend}.\nmax Δ = max absolute difference over every output and variant against "
            f"the original at ORT_DISABLE_ALL on seed-0 inputs; ✗ = beyond rtol {RTOL:g} / "
            f"atol {ATOL:g}.\nSessions: intra_op {'/'.join(map(str, threads))}, inter_op 1, "
            f"{', '.join(f'{k}={v}' for k, v in SESSION_CONFIG.items())}. onnxruntime "
            f"{ort.__version__}; onnx {onnx.__version__}; graphopt {graphopt.__version__}; "
            f"python {platform.python_version()}; {os.cpu_count()} CPUs"
            + (f"; load average {load:.2f} at start." if load is not None else "."))


def build_lines(rows: list[Row]) -> list[str]:
    lines = []
    for row in rows:
        if row.built is None:
            continue
        b = row.built
        lines.append(f"{row.model.name}: -O2 {b.seconds['o2']:.2f} s, LayoutNchwc "
                     f"{b.seconds['layout'] * 1e3:.0f} ms; nchwc ops "
                     + ", ".join(f"{k}={v}" for k, v in sorted(b.nchwc_ops.items())))
    return lines


def to_json(rows: list[Row], threads: list[int], args, block: int, seconds: float,
            load: float | None) -> dict:
    def timing_json(t: Timing) -> dict:
        s = t.stats
        return {"times_ms": t.times, "median_ms": s.median if s else None,
                "min_ms": s.low if s else None, "max_ms": s.high if s else None,
                "error": t.error,
                "max_abs_diff": t.check.max_abs if t.check else None,
                "within_tolerance": t.check.ok if t.check else None}

    models = []
    for row in rows:
        entry = {"model": row.model.name, "error": row.error,
                 "build": None if row.built is None else {
                     "seconds": row.built.seconds, "nchwc_ops": row.built.nchwc_ops,
                     "layout_stats": row.built.stats},
                 "threads": {}}
        for t in threads if row.timings else ():
            entry["threads"][str(t)] = {
                "runs": row.runs[t],
                "inference": {v.key: timing_json(row.timings[t][v.key])
                              | {"ratio": row.ratio(row.timings, t, v.key)} for v in VARIANTS},
                "startup": {v.key: timing_json(row.startup[t][v.key])
                            | {"ratio": row.ratio(row.startup, t, v.key)} for v in VARIANTS}}
        models.append(entry)
    return {"bench": "layout_nchwc",
            "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
            "runs": args.runs, "warmup_runs": args.warmup, "startup_runs": args.startup_runs,
            "threads": threads, "inter_op_threads": 1, "block_size": block, "rtol": RTOL,
            "atol": ATOL, "baseline": BASELINE,
            "variants": {v.key: {"name": v.name, "what": v.what} for v in VARIANTS},
            "versions": {"onnxruntime": ort.__version__, "onnx": onnx.__version__,
                         "graphopt": graphopt.__version__},
            "cpus": os.cpu_count(), "load_average_start": load, "wall_seconds": seconds,
            "models": models}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="layout_nchwc.py", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="resnet50 at width 0.25 (latency.py's --quick size)")
    p.add_argument("--runs", type=positive_int, default=20, metavar="N",
                   help="timed inference runs per variant (default 20)")
    p.add_argument("--warmup", type=positive_int, default=3, metavar="N",
                   help="warm-up runs per variant (default 3; the first checks the outputs)")
    p.add_argument("--startup-runs", type=positive_int, default=10, metavar="N",
                   help="session creation + first inference rounds (default 10)")
    p.add_argument("--budget", type=float, default=30.0, metavar="SECONDS",
                   help=f"timed seconds per model and thread count; fewer runs (never under "
                        f"{MIN_RUNS}) when a round takes longer than SECONDS/N (0: always N)")
    p.add_argument("--threads", default="1,2", metavar="T[,T...]",
                   help="intra-op thread counts, one table each (default 1,2)")
    p.add_argument("--only", action="append", default=[], metavar="TEXT",
                   help="bench only models whose name contains TEXT; repeatable")
    p.add_argument("--json", metavar="FILE", type=json_path,
                   help="also write the results as JSON to FILE")
    args = p.parse_args(argv)
    try:
        args.thread_counts = sorted({int(t) for t in args.threads.split(",") if t.strip()})
    except ValueError:
        p.error(f"--threads {args.threads}: expected comma-separated integers")
    if not args.thread_counts or min(args.thread_counts) < 1:
        p.error(f"--threads {args.threads}: thread counts must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK_SIZES if args.quick else SIZES
    problem = unmatched(args.only, lambda wanted: sized_zoo_models("", sizes, wanted))
    if problem:
        print(problem, file=sys.stderr)
        return 1
    block = detect_block_size()
    if not block:
        print("neither AVX2 nor AVX-512F in /proc/cpuinfo: onnxruntime has no NCHWc kernels "
              "here, nothing to bench", file=sys.stderr)
        return 1
    ort.set_default_logger_severity(3)
    threads = args.thread_counts
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    start = time.perf_counter()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="graphopt-nchwc-") as workdir:
        for model in sized_zoo_models(workdir, sizes, matching(args.only)):
            began = time.perf_counter()
            files = tempfile.mkdtemp(dir=workdir)
            rows.append(bench_model(model, threads, args, files))
            print(f"{model.name}: {time.perf_counter() - began:.0f} s", file=sys.stderr,
                  flush=True)
    seconds = time.perf_counter() - start
    print(header(args, threads, block, load))
    print()
    print("\n".join(build_lines(rows)))
    for t in threads:
        print()
        print(tables(rows, t, args))
    print(f"\n{len(rows)} models in {seconds:.0f} s")
    if args.json:
        write_json(args.json, to_json(rows, threads, args, block, seconds, load))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
