"""Inference latency: graphopt's compiled model beside what a user would otherwise run."""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from itertools import chain

import onnx
import onnxruntime as ort

from graphopt import zoo

from _common import (
    Check,
    Stats,
    compare_outputs,
    geomean,
    json_path,
    markdown_table,
    positive_int,
    run_model,
    short_reason,
    write_json,
)
from _latency_variants import (
    BASELINE,
    VARIANTS,
    BuiltFile,
    Runner,
    build_files,
    open_runner,
    versions,
)
from _models import (ZOO_QUICK, BenchModel, check_folder, folder_models, light_models,
                     matching, sized_zoo_models, unmatched)

DESCRIPTION = """\
Time inference of graphopt's compiled model (its optimized .onnx at ORT_ENABLE_ALL and its .om
run by graphopt's OmSession) beside the original at ORT_DISABLE_ALL and ORT_ENABLE_ALL, onnxsim's
and onnxslim's outputs at ORT_ENABLE_ALL and onnxruntime's own offline-optimized model, on the same
model, inputs and thread count: the graphopt zoo and the onnx wheel's light corpus (9 CNNs), plus
--shared DIR if given.

Per model and thread count, every variant gets its own session (intra_op T, inter_op 1 thread);
then warm-up rounds and timed rounds, variants interleaved (A B C ... A B C ...). Each figure is
the median (min-max) in ms, its ratio to the original at ORT_ENABLE_ALL, and the max absolute
difference of every output against the original at ORT_DISABLE_ALL on seed-0 inputs.
A variant that fails (a tool error, a model that cannot load or run) gets "error: <reason>" and
the bench goes on."""

EPILOG = """\
examples:
  python bench/latency.py --quick
  python bench/latency.py --compact --json out/latency.json
  python bench/latency.py --shared ../shared/models --only dev_bert --threads 1
  python bench/latency.py --only bert --only gpt2 --threads 1 --dims sequence_length=128
"""

# The check beside every latency figure: looser than graphopt's --verify atol (1e-5) because
# ORT_ENABLE_ALL's own fusions (Gelu, LayerNorm, Gemm) move float32 results by ~1e-5.
RTOL, ATOL = 1e-4, 1e-4
# A slow model's runs never drop below this, budget or not.
MIN_RUNS = 5
# "slower than the original at ENABLE_ALL" in the notes: beyond this ratio of medians.
SLOWER = 1.05

# Default zoo sizes: the real architectures, bert_base at a size whose 1-thread run stays in
# milliseconds (--full builds the 12-layer, hidden-768 one).
ZOO_DEFAULT: dict[str, tuple[dict, str]] = {
    "tiny": ({}, ""), "matmul256": ({}, ""), "resnet50": ({}, ""),
    # zero conv biases computed at run time, BatchNorm unfused: what onnxruntime cannot fold
    "resnet50@raw": ({"raw_dynamo": True}, "raw dynamo export"),
    # NHWC between Transpose pairs around every conv, BatchNorm as Sub/Mul/Add: tf2onnx's form
    "resnet50@nhwc": ({"nhwc": True}, "NHWC, as tf2onnx exports"),
    "mobilenetv2": ({}, ""),
    "blazepalm": ({}, ""),
    "lcnetv3": ({}, ""),
    "bert_base": ({"layers": 4, "hidden": 256, "heads": 4, "intermediate": 1024},
                  "4 layers, hidden 256"),
    "gpt2_small": ({}, ""),
    # at 128x128 with 16 base channels a run takes ~0.1 s instead of ~1.2 s at its default
    "unet": ({"base_channels": 16, "image_size": 128}, "base 16, 128x128"),
}
# --full: bert_base and unet at their default (real) sizes, and gpt2_small at GPT-2 small's,
# whose LM head transposes the tied 154 MB token embedding on every run unless a compiler
# folds it.
ZOO_FULL_SIZE: dict[str, tuple[dict, str]] = {
    **ZOO_DEFAULT, "bert_base": ({}, ""), "unet": ({}, ""),
    "gpt2_small": ({"layers": 12, "hidden": 768, "heads": 12, "vocab": 50257, "positions": 1024},
                   "GPT-2 small size"),
}


@dataclass
class Timing:
    """One variant at one thread count: times in ms, or why there are none."""

    times: list[float] = field(default_factory=list)
    error: str | None = None
    check: Check | None = None

    @property
    def stats(self) -> Stats | None:
        return Stats.of(self.times) if self.times and not self.error else None

    @property
    def wrong(self) -> bool:
        return self.check is not None and not self.check.ok


@dataclass
class Row:
    model: BenchModel
    files: dict[str, BuiltFile]
    reference_error: str | None = None
    runs: dict[int, int] = field(default_factory=dict)             # threads -> timed runs
    timings: dict[int, dict[str, Timing]] = field(default_factory=dict)

    def ratio(self, threads: int, key: str) -> float | None:
        base, other = self.timings[threads][BASELINE].stats, self.timings[threads][key].stats
        return other.median / base.median if base and other else None

    def label(self, runs: int, threads: int) -> str:
        """The model's name, with its run count at `threads` when the budget cut it."""
        n = self.runs[threads]
        return self.model.name + (f" ({n} runs)" if n < runs else "")


def planned_runs(runs: int, budget: float, round_seconds: float) -> int:
    """`runs`, or fewer (never under MIN_RUNS) when one round of all variants takes over
    budget/runs."""
    if budget <= 0 or round_seconds <= 0:
        return runs
    return min(runs, max(MIN_RUNS, math.floor(budget / round_seconds)))


def timed_rounds(round_, warmup: int, runs: int, budget: float) -> int:
    """Drive `round_(timed=…, check=…)`, one interleaved pass over the variants that returns
    its seconds: a first round whose outputs are the correctness check, `warmup - 1` more
    untimed ones (the last plans the run count), then the timed rounds with the cyclic
    collector off, since a collection inside one variant's run would be charged to it.
    Returns how many timed rounds ran."""
    seconds = round_(timed=False, check=True)
    for _ in range(warmup - 1):
        seconds = round_(timed=False)
    n = planned_runs(runs, budget, seconds)
    gc.collect()
    gc.disable()
    try:
        for _ in range(n):
            round_(timed=True)
    finally:
        gc.enable()
    return n


def measure(model: BenchModel, files: dict[str, BuiltFile], expected: dict | None,
            threads: int, args) -> tuple[int, dict[str, Timing]]:
    timings = {v.key: Timing() for v in VARIANTS}
    runners: dict[str, Runner] = {}
    for variant in VARIANTS:
        built = files[variant.file]
        if built.error:
            timings[variant.key].error = built.error
            continue
        try:
            runners[variant.key] = open_runner(variant, built.path, threads, model.feeds)
        except Exception as e:  # noqa: BLE001 - the reason is the table cell
            timings[variant.key].error = short_reason(e)

    def round_(timed: bool, check: bool = False) -> float:
        total = 0.0
        for key in list(runners):
            timing = timings[key]
            try:
                start = time.perf_counter()
                raw = runners[key].call()
                seconds = time.perf_counter() - start
                if check and expected is not None:
                    timing.check = compare_outputs(expected, runners[key].outputs(raw), RTOL, ATOL)
                del raw
            except Exception as e:  # noqa: BLE001
                timing.error, timing.times = short_reason(e), []
                del runners[key]
                continue
            total += seconds
            if timed:
                timing.times.append(seconds * 1e3)
        return total

    n = timed_rounds(round_, args.warmup, args.runs, args.budget)
    runners.clear()
    gc.collect()
    return n, timings


def bench_model(model: BenchModel, threads: list[int], args, workdir: str) -> Row:
    files = build_files(model.path, workdir, args.level)
    row = Row(model, files)
    try:
        expected = run_model(model.path, model.feeds)  # ORT_DISABLE_ALL, 1 thread
    except Exception as e:  # noqa: BLE001
        expected, row.reference_error = None, short_reason(e)
    for t in threads:
        row.runs[t], row.timings[t] = measure(model, files, expected, t, args)
    return row


# ---------------------------------------------------------------------------------------------
# output


def _threads_name(t: int) -> str:
    return f"{t} thread" + ("s" if t > 1 else "")


def geomean_groups(rows: list[Row]) -> list[tuple[str, list[Row]]]:
    """One geomean per model set (zoo, light, ...) and one over all."""
    sets: dict[str, list[Row]] = {}
    for row in rows:
        sets.setdefault(row.model.name.split("/")[0], []).append(row)
    groups = [(f"geomean × {name}", subset) for name, subset in sets.items()]
    return groups + [("geomean × all", rows)] if len(groups) > 1 else [("geomean ×", rows)]


def ratios(rows: list[Row], threads: int, key: str) -> list[float]:
    """The variant's ratios where both it and the baseline ran with outputs within tolerance:
    a fast wrong answer is no speed-up."""
    out = []
    for row in rows:
        timing, base = row.timings[threads][key], row.timings[threads][BASELINE]
        r = row.ratio(threads, key)
        if r is not None and not timing.wrong and not base.wrong:
            out.append(r)
    return out


def _geomean_cell(rows: list[Row], threads: int, key: str) -> str:
    found = ratios(rows, threads, key)
    g = geomean(found)
    return f"{g:.2f} (n={len(found)})" if g else ""


def _error_cell(timing: Timing) -> str:
    return timing.error if timing.error.startswith("n/a") else f"error: {timing.error}"


def _mark(timing: Timing) -> str:
    return " ✗" if timing.wrong else ""


def format_table(rows: list[Row], threads: list[int]) -> str:
    """One row per model and variant; per thread count the median (min–max), × and max Δ."""
    headers = ["model", "variant", "runs"]
    for t in threads:
        headers += [f"{_threads_name(t)}: ms", "×", "max Δ"]
    body = []
    for row in rows:
        for i, variant in enumerate(VARIANTS):
            name = ""
            if i == 0:
                name = row.model.name
                if row.reference_error:
                    name += f" (original fails at ORT_DISABLE_ALL: {row.reference_error})"
            cells = [name, variant.name,
                     " / ".join(str(row.runs[t]) for t in threads) if i == 0 else ""]
            for t in threads:
                timing = row.timings[t][variant.key]
                if timing.stats is None:
                    cells += [_error_cell(timing), "", ""]
                    continue
                r = row.ratio(t, variant.key)
                cells += [timing.stats.cell(), f"{r:.2f}" if r is not None else "",
                          timing.check.cell() if timing.check else ""]
            body.append(cells)
    for label, subset in geomean_groups(rows):
        for i, variant in enumerate(VARIANTS):
            cells = [label if i == 0 else "", variant.name, ""]
            for t in threads:
                cells += ["", _geomean_cell(subset, t, variant.key), ""]
            body.append(cells)
    return markdown_table(headers, body)


def format_compact(rows: list[Row], threads: int, runs: int) -> str:
    """model, the original's ENABLE_ALL median ms, then each variant's ratio to it."""
    others = [v for v in VARIANTS if v.key != BASELINE]
    headers = ["model", "orig ENABLE_ALL ms"] + [f"{v.name} ×" for v in others]
    body = []
    for row in rows:
        base = row.timings[threads][BASELINE]
        cells = [row.label(runs, threads),
                 f"{base.stats.median:.3g}{_mark(base)}" if base.stats else "error"]
        for variant in others:
            timing = row.timings[threads][variant.key]
            r = row.ratio(threads, variant.key)
            if r is None:
                cells.append("n/a" if (timing.error or "").startswith("n/a") else "error")
            else:
                cells.append(f"{r:.2f}{_mark(timing)}")
        body.append(cells)
    for label, subset in geomean_groups(rows):
        body.append([label, ""] + [_geomean_cell(subset, threads, v.key) for v in others])
    return markdown_table(headers, body)


def notes(rows: list[Row], threads: list[int], compact: bool) -> list[str]:
    """What a reader should not miss: failures, outputs beyond tolerance, and variants slower
    than the original at ORT_ENABLE_ALL."""
    errors: dict[tuple[str, str], dict[str, list[int]]] = {}  # (variant, reason) -> model -> T
    wrong, slower = [], []
    for row in rows:
        for variant in VARIANTS:
            for t in threads:
                timing = row.timings[t][variant.key]
                if timing.error and not timing.error.startswith("n/a"):
                    errors.setdefault((variant.name, timing.error), {}) \
                        .setdefault(row.model.name, []).append(t)
                if timing.wrong:
                    wrong.append(f"{row.model.name} {variant.name} {t}T: {timing.check.cell()}")
                r = row.ratio(t, variant.key)
                if r is not None and r > SLOWER and variant.level != "disable":
                    slower.append(f"{row.model.name} {variant.name} {t}T ×{r:.2f}")
    lines = []
    if errors and compact:
        lines.append("errors:")
        for (name, reason), where in errors.items():
            # The same failure at every thread count is one failure; name the counts otherwise.
            models = [m if len(ts) == len(threads) else f"{m} ({'/'.join(map(str, ts))}T)"
                      for m, ts in where.items()]
            lines.append(f"- {name}: {reason} — {', '.join(models)}")
    lines.append("outputs beyond tolerance: " + ("; ".join(wrong) if wrong else "none"))
    lines.append(f"slower than the original at ORT_ENABLE_ALL (× > {SLOWER:g}, "
                 f"orig DISABLE_ALL aside): " + ("; ".join(slower) if slower else "none"))
    return lines


def header(args, threads: list[int], load: float | None) -> str:
    v = versions()
    tools = ", ".join(f"{name} {ver}" if ver else f"{name} not installed"
                      for name, ver in v.items())
    legend = "; ".join(f"{x.name} = {x.what}" for x in VARIANTS)
    return (
        f"Inference latency in ms: median (min–max) of {args.runs} timed runs per variant after "
        f"{args.warmup} warm-up runs, variants interleaved per round (A B C … A B C …) in one "
        f"process; a model whose warm-up round of all variants takes over {args.budget:g}/"
        f"{args.runs} s gets fewer runs (never under {MIN_RUNS}), noted after its name.\n"
        f"× = variant median / median of the original at ORT_ENABLE_ALL, same model, inputs and "
        f"thread count (below 1: faster). max Δ = max absolute difference over every output "
        f"against the original at ORT_DISABLE_ALL (1 thread) on seed-0 inputs; ✗ = beyond rtol "
        f"{RTOL:g} / atol {ATOL:g} (a ✗ figure stays out of the geomean, n = models counted).\n"
        f"{legend}.\n"
        + (f"graphopt's .onnx and .om compiled at -O{args.level}, not -O2.\n"
           if args.level != 2 else "") +
        f"Every timed session: intra_op {'/'.join(map(str, threads))}, inter_op 1 thread, "
        f"session.force_spinning_stop=1 (idle workers of one session would otherwise spin on "
        f"the cores the next variant runs on); the .om runtime's sessions get the same.\n"
        f"{tools}; onnx {onnx.__version__}; python {platform.python_version()}; "
        f"{os.cpu_count()} CPUs"
        + (f"; load average {load:.2f} at start." if load is not None else "."))


def to_json(rows: list[Row], threads: list[int], args, seconds: float,
            load: float | None, workdir: str) -> dict:
    models = []
    for row in rows:
        entry = {"model": row.model.name,
                 "path": None if row.model.path.startswith(workdir) else row.model.path,
                 "inputs": {k: [str(a.dtype), list(a.shape)] for k, a in row.model.feeds.items()},
                 "reference_error": row.reference_error,
                 "build": {k: {"seconds": f.seconds, "error": f.error}
                           for k, f in row.files.items() if k != "original"},
                 "threads": {}}
        for t in threads:
            variants = {}
            for variant in VARIANTS:
                timing = row.timings[t][variant.key]
                s = timing.stats
                check = timing.check
                variants[variant.key] = {
                    "name": variant.name, "times_ms": timing.times,
                    "median_ms": s.median if s else None, "min_ms": s.low if s else None,
                    "max_ms": s.high if s else None,
                    "ratio_to_original_enable_all": row.ratio(t, variant.key),
                    "error": timing.error,
                    "max_abs_diff": check.max_abs if check else None,
                    "within_tolerance": check.ok if check else None,
                    "check_error": check.error if check else None}
            entry["threads"][str(t)] = {"runs": row.runs[t], "variants": variants}
        models.append(entry)
    return {
        "bench": "latency",
        "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
        "runs": args.runs, "warmup_runs": args.warmup, "budget_seconds": args.budget,
        "min_runs": MIN_RUNS, "quick": args.quick, "full": args.full, "level": args.level,
        "threads": threads,
        "inter_op_threads": 1, "rtol": RTOL, "atol": ATOL, "baseline": BASELINE,
        "variants": {v.key: {"name": v.name, "what": v.what} for v in VARIANTS},
        "versions": versions() | {"onnx": onnx.__version__},
        "cpus": os.cpu_count(), "load_average_start": load, "wall_seconds": seconds,
        "models": models,
        "geomean_ratio_to_original_enable_all": {
            label: {str(t): {v.key: {"ratio": geomean(ratios(subset, t, v.key)),
                                     "n": len(ratios(subset, t, v.key))} for v in VARIANTS}
                    for t in threads}
            for label, subset in geomean_groups(rows)}}


# ---------------------------------------------------------------------------------------------


def with_dims(model: BenchModel, dims: dict[str, int]) -> BenchModel:
    """A zoo model fed at `dims` (its symbolic dims by name) instead of the defaults."""
    proto = onnx.load(model.path)
    feeds = zoo.sample_inputs(proto, seed=0, dims=dims)
    named = ", ".join(f"{k}={v}" for k, v in dims.items())
    return BenchModel(f"{model.name} @ {named}", model.path, feeds)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="latency.py", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="about a minute: small zoo sizes (resnet50 width 0.25, a 2-layer "
                        "hidden-128 bert_base), 3 light CNNs, 10 runs")
    p.add_argument("--full", action="store_true",
                   help="bert_base at its real size (12 layers, hidden 768) instead of "
                        "4 layers, hidden 256, gpt2_small at GPT-2 small's (12 layers, "
                        "hidden 768, vocab 50257), and unet at 64 base channels and 256x256")
    p.add_argument("--runs", type=positive_int, metavar="N",
                   help="timed runs per variant (default 20, 10 with --quick)")
    # At least 1: the first warm-up run's outputs are the correctness check.
    p.add_argument("--warmup", type=positive_int, default=3, metavar="N",
                   help="warm-up runs per variant before timing (default 3)")
    p.add_argument("--budget", type=float, default=20.0, metavar="SECONDS",
                   help="timed seconds per model and thread count the run count aims at: a model "
                        "whose round of all variants takes longer than SECONDS/N gets fewer "
                        f"runs, never under {MIN_RUNS} (default 20; 0 always runs N)")
    p.add_argument("--threads", default="1,2", metavar="T[,T...]",
                   help="intra-op thread counts, one table each (default 1,2)")
    p.add_argument("--shared", metavar="DIR",
                   help="also bench every DIR/*.onnx (DIR/NAME.inputs.npz is its feed if present)")
    p.add_argument("--only", action="append", default=[], metavar="TEXT",
                   help="bench only models whose row name contains TEXT; repeatable")
    p.add_argument("--dims", default="", metavar="NAME=N[,NAME=N...]",
                   help="the zoo models' symbolic input dims for their feeds (default "
                        "batch_size=1, sequence_length=16), e.g. sequence_length=128; the row "
                        "names them")
    p.add_argument("--compact", action="store_true",
                   help="narrow tables: the original's ENABLE_ALL ms, then one ratio per variant")
    p.add_argument("--level", type=int, choices=(2, 3), default=2,
                   help="graphopt's -O level for its .onnx and .om (default 2; -O3 adds, on the "
                        ".om's cpu target, Winograd convs)")
    p.add_argument("--json", metavar="FILE", type=json_path,
                   help="also write the results as JSON to FILE")
    args = p.parse_args(argv)
    if args.quick and args.full:
        p.error("--quick and --full contradict each other")
    if args.runs is None:
        args.runs = 10 if args.quick else 20
    try:
        args.thread_counts = sorted({int(t) for t in args.threads.split(",") if t.strip()})
    except ValueError:
        p.error(f"--threads {args.threads}: expected comma-separated integers")
    if not args.thread_counts or min(args.thread_counts) < 1:
        p.error(f"--threads {args.threads}: thread counts must be at least 1")
    try:
        args.dim_values = {name.strip(): int(n) for name, _, n in
                           (d.partition("=") for d in args.dims.split(",") if d.strip())}
    except ValueError:
        p.error(f"--dims {args.dims}: expected NAME=N pairs separated by commas")
    if any(n < 1 for n in args.dim_values.values()):
        p.error(f"--dims {args.dims}: dims must be at least 1")
    check_folder(p, args.shared)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ort.set_default_logger_severity(3)
    threads = args.thread_counts
    sizes = ZOO_QUICK if args.quick else ZOO_FULL_SIZE if args.full else ZOO_DEFAULT

    def sources(workdir: str, wanted):
        return chain(sized_zoo_models(workdir, sizes, wanted), light_models(args.quick, wanted),
                     folder_models(args.shared, wanted) if args.shared else ())

    problem = unmatched(args.only, lambda wanted: sources("", wanted))
    if problem:
        print(problem, file=sys.stderr)
        return 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    start = time.perf_counter()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="graphopt-latency-") as workdir:
        for model in sources(workdir, matching(args.only)):
            if args.dim_values and model.name.startswith("zoo/"):
                model = with_dims(model, args.dim_values)
            began = time.perf_counter()
            files_dir = tempfile.mkdtemp(dir=workdir)
            try:
                rows.append(bench_model(model, threads, args, files_dir))
            finally:
                shutil.rmtree(files_dir, ignore_errors=True)  # vgg19 folded is 550 MB per tool
            runs = ", ".join(f"{rows[-1].runs[t]} runs at {t}T" for t in threads)
            print(f"{model.name}: {runs}, {time.perf_counter() - began:.0f} s",
                  file=sys.stderr, flush=True)
    seconds = time.perf_counter() - start
    print(header(args, threads, load))
    print()
    if args.compact:
        for t in threads:
            print(f"{_threads_name(t)} (intra_op {t}, inter_op 1):\n")
            print(format_compact(rows, t, args.runs))
            print()
    else:
        print(format_table(rows, threads))
        print()
    print("\n".join(notes(rows, threads, args.compact)))
    print(f"\n{len(rows)} models in {seconds:.0f} s")
    if args.json:
        write_json(args.json, to_json(rows, threads, args, seconds, load, workdir))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
