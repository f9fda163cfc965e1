"""Compile-time bench: graphopt optimize beside onnxsim, onnxslim and ORT's offline optimizer."""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import math
import os
import platform
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from itertools import chain

import onnx
import onnxruntime as ort

from _common import (ATOL, RTOL, THREADS, Check, Stats, check_outputs, geomean, json_path,
                     markdown_table, megabytes, node_count, positive_int, run_model, short_reason,
                     write_json)
from _compilers import Compiler, compilers
from _models import (BenchModel, check_folder, folder_models, light_models, matching, unmatched,
                     zoo_models)

DESCRIPTION = """\
Time graphopt's optimize (default -O2, no tuning; optimize + save to .onnx) beside onnxsim
(simplify + onnx.save), onnxslim (slim + onnx.save) and onnxruntime's offline optimization
(InferenceSession creation at ORT_ENABLE_BASIC with optimized_model_filepath) on the same files:
the graphopt zoo and the onnx wheel's light corpus (9 CNNs), plus --shared DIR if given.

Tools run in this process, interleaved (graphopt, onnxsim, onnxslim, ORT, graphopt, ...): one
warm-up round, then the timed rounds. Each cell has the median with min-max, the ratio of the
tool's median to graphopt's, the node count and size of what the tool wrote, and the max absolute
difference of every output against the original at ORT_DISABLE_ALL on seed-0 inputs.
A tool that fails on a model gets "error: <reason>" in its cell and the bench goes on."""

EPILOG = """\
examples:
  python bench/compile_time.py --quick
  python bench/compile_time.py --json out/compile_time.json
  python bench/compile_time.py --shared ../shared/models --only dev_bert
"""


@dataclass
class ToolResult:
    times: list[float] = field(default_factory=list)
    error: str | None = None
    nodes: int | None = None
    megabytes: float | None = None
    check: Check | None = None

    @property
    def stats(self) -> Stats | None:
        return Stats.of(self.times) if self.times and not self.error else None


@dataclass
class Row:
    model: BenchModel
    nodes: int
    megabytes: float
    runs: int
    tools: dict[str, ToolResult]
    reference_error: str | None = None


def planned_runs(runs: int, budget: float, warmup_seconds: float) -> int:
    """`runs`, or fewer (never under 3) when one round of all tools takes over budget/runs."""
    if budget <= 0 or warmup_seconds <= 0:
        return runs
    return min(runs, max(3, math.floor(budget / warmup_seconds)))


def _compile_once(tool: Compiler, src: str, dst: str) -> float:
    # Collect the previous tool's garbage now, outside the timer, not inside the next tool's run.
    gc.collect()
    sink = io.StringIO()  # onnxsim/onnxslim may print; that output is not the table
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), \
            contextlib.redirect_stderr(sink):
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        tool.compile(src, dst)
        return time.perf_counter() - start


def measure(model: BenchModel, tools: list[Compiler], runs: int, budget: float,
            workdir: str) -> Row:
    outputs = {t.name: os.path.join(workdir, f"out{i}.onnx") for i, t in enumerate(tools)}
    results = {t.name: ToolResult(error=t.missing) for t in tools}
    active = [t for t in tools if t.compile is not None]

    def round_(timed: bool) -> float:
        total = 0.0
        for tool in active:
            result = results[tool.name]
            if result.error:
                continue  # a tool that failed once on this model fails again; skip its time
            try:
                seconds = _compile_once(tool, model.path, outputs[tool.name])
            except Exception as e:  # noqa: BLE001 - any failure is a table cell, not a crash
                result.error = short_reason(e)
                continue
            total += seconds
            if timed:
                result.times.append(seconds)
        return total

    n = planned_runs(runs, budget, round_(timed=False))
    for _ in range(n):
        round_(timed=True)

    row = Row(model, node_count(model.path), megabytes(model.path), n, results)
    try:
        expected = run_model(model.path, model.feeds)
    except Exception as e:  # noqa: BLE001
        expected, row.reference_error = None, short_reason(e)
    for tool in active:
        result, out = results[tool.name], outputs[tool.name]
        if result.error or not os.path.exists(out):
            continue
        result.nodes, result.megabytes = node_count(out), megabytes(out)
        if expected is not None:
            result.check = check_outputs(out, model.feeds, expected)
        os.remove(out)  # VGG-19 folded is 550 MB per tool; keep the temp dir small
    return row


def _time_cells(result: ToolResult, base: Stats | None, with_ratio: bool) -> list[str]:
    stats = result.stats
    if stats is None:
        cell = result.error if result.error and result.error.startswith("n/a") else \
            f"error: {result.error}"
        return [cell] + [""] * (3 if with_ratio else 2)
    cells = [stats.cell()]
    if with_ratio:
        cells.append(f"{stats.median / base.median:.2f}" if base else "")
    cells.append(f"{result.nodes} / {result.megabytes:.3g} MB")
    cells.append(result.check.cell() if result.check else "")
    return cells


def ratios(rows: list[Row], tool: str) -> list[float]:
    """The tool's time over graphopt's, per row where both wrote a model that runs and matches
    the original: as latency.py's geomeans, a compile whose output is wrong or unrunnable
    (marked ✗ or "output unrunnable" in its row) is no figure to average."""
    out = []
    for row in rows:
        base, other = row.tools["graphopt"], row.tools[tool]
        if base.stats and other.stats and _sound(base) and _sound(other):
            out.append(other.stats.median / base.stats.median)
    return out


def _sound(result: ToolResult) -> bool:
    return result.check is None or (result.check.error is None and result.check.ok)


def geomean_groups(rows: list[Row]) -> list[tuple[str, list[Row]]]:
    """One geomean per model set (zoo, light, ...) and one over all: the sets do different work
    (the other tools materialize the light CNNs' generated weights, hundreds of MB, which
    graphopt's fold size cap refuses), so one number alone would hide which set drives it."""
    sets: dict[str, list[Row]] = {}
    for row in rows:
        sets.setdefault(row.model.name.split("/")[0], []).append(row)
    groups = [(f"geomean × {name}", subset) for name, subset in sets.items()]
    return groups + [("geomean × all", rows)] if len(groups) > 1 else [("geomean ×", rows)]


def format_table(rows: list[Row], tools: list[Compiler]) -> str:
    headers = ["model", "nodes / MB in", "runs"]
    for i, tool in enumerate(tools):
        headers += [f"{tool.name} s"] + (["×"] if i else []) + ["nodes / MB out", "max Δ"]
    body = []
    for row in rows:
        base = row.tools["graphopt"].stats
        cells = [row.model.name, f"{row.nodes} / {row.megabytes:.3g} MB", str(row.runs)]
        for i, tool in enumerate(tools):
            cells += _time_cells(row.tools[tool.name], base, with_ratio=i > 0)
        if row.reference_error:
            cells[0] += f" (original fails at ORT_DISABLE_ALL: {row.reference_error})"
        body.append(cells)
    for label, subset in geomean_groups(rows):
        mean = [label, "", ""]
        for i, tool in enumerate(tools):
            if i == 0:
                mean += ["", "", ""]
                continue
            found = ratios(subset, tool.name)
            g = geomean(found)
            mean += ["", f"{g:.2f} (n={len(found)})" if g else "", "", ""]
        body.append(mean)
    return markdown_table(headers, body)


def format_compact(rows: list[Row], tools: list[Compiler]) -> str:
    """One column per tool: graphopt's median seconds and node count, the others' time ratios;
    ✗ marks outputs beyond tolerance, "error" a tool that failed or wrote an unrunnable model."""
    headers = ["model", "nodes", "graphopt s", "nodes after"] + [f"{t.name} ×" for t in tools[1:]]
    body = []
    for row in rows:
        base = row.tools["graphopt"]
        cells = [row.model.name, str(row.nodes),
                 f"{base.stats.median:.3g}{_mark(base)}" if base.stats else "error",
                 str(base.nodes) if base.stats else ""]
        for tool in tools[1:]:
            result = row.tools[tool.name]
            if result.stats is None or base.stats is None:
                cells.append("n/a" if (result.error or "").startswith("n/a") else "error")
            else:
                cells.append(f"{result.stats.median / base.stats.median:.2f}{_mark(result)}")
        body.append(cells)
    for label, subset in geomean_groups(rows):
        mean = [label, "", "", ""]
        for tool in tools[1:]:
            g = geomean(ratios(subset, tool.name))
            mean.append(f"{g:.2f}" if g else "")
        body.append(mean)
    return markdown_table(headers, body)


def _mark(result: ToolResult) -> str:
    if result.check is None:
        return ""
    if result.check.error:
        return " (output unrunnable)"
    return "" if result.check.ok else " ✗"


def header(tools: list[Compiler], runs: int, budget: float) -> str:
    versions = ", ".join(f"{t.name} {t.version}" if t.compile else f"{t.name} not installed"
                         for t in tools)
    return (
        f"Compile time in seconds: median (min–max) of up to {runs} timed runs after 1 warm-up "
        f"run, tools interleaved per round. Compile benchmarks use fewer runs than latency "
        f"benchmarks (20) because each run takes seconds; a model whose warm-up round of all "
        f"tools exceeds {budget:g}/{runs} s gets fewer (never under 3): see `runs`.\n"
        f"× = tool median / graphopt median (above 1: slower than graphopt); the geomeans "
        f"leave out rows where either output is beyond tolerance or does not run. "
        f"graphopt = optimize (-O2, no tuning) + save; onnxsim = load + simplify + save; "
        f"onnxslim = slim + save; ORT basic = InferenceSession creation at ORT_ENABLE_BASIC "
        f"writing optimized_model_filepath, ORT's offline optimization at the level it "
        f"recommends for portable output (EXTENDED and ALL may write EP-specific fused ops).\n"
        f"max Δ = max absolute difference over every output against the original model at "
        f"ORT_DISABLE_ALL on seed-0 inputs; ✗ = beyond rtol {RTOL:g} / atol {ATOL:g}. "
        f"ORT sessions: intra_op {THREADS}, inter_op 1 thread.\n"
        f"{versions}; onnx {onnx.__version__}; python {platform.python_version()}; "
        f"{os.cpu_count()} CPUs.")


def to_json(rows: list[Row], tools: list[Compiler], args, seconds: float) -> dict:
    models = []
    for row in rows:
        base = row.tools["graphopt"].stats
        entry = {"model": row.model.name, "path": row.model.path, "nodes": row.nodes,
                 "megabytes": row.megabytes, "runs": row.runs,
                 "reference_error": row.reference_error, "tools": {}}
        for name, r in row.tools.items():
            s = r.stats
            entry["tools"][name] = {
                "seconds": r.times, "median": s.median if s else None,
                "min": s.low if s else None, "max": s.high if s else None,
                "ratio_to_graphopt": s.median / base.median if s and base else None,
                "error": r.error, "nodes": r.nodes, "megabytes": r.megabytes,
                "max_abs_diff": r.check.max_abs if r.check else None,
                "within_tolerance": r.check.ok if r.check else None,
                "check_error": r.check.error if r.check else None}
        models.append(entry)
    return {"bench": "compile_time", "command": " ".join([os.path.basename(sys.argv[0])] +
                                                           sys.argv[1:]),
            "runs": args.runs, "budget_seconds": args.budget, "warmup_runs": 1,
            "quick": args.quick, "ort_threads": {"intra_op": THREADS, "inter_op": 1},
            "ort_offline_level": "ORT_ENABLE_BASIC", "rtol": RTOL, "atol": ATOL,
            "versions": {t.name: t.version or None for t in tools} | {"onnx": onnx.__version__},
            "cpus": os.cpu_count(), "wall_seconds": seconds, "models": models,
            "geomean_ratio_to_graphopt": {
                label: {t.name: {"ratio": geomean(ratios(subset, t.name)),
                                 "n": len(ratios(subset, t.name))} for t in tools[1:]}
                for label, subset in geomean_groups(rows)}}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="compile_time.py", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="about a minute: small zoo sizes (resnet50 width 0.25, a 2-layer "
                        "hidden-128 bert_base), 3 light CNNs, 3 runs")
    p.add_argument("--runs", type=positive_int, metavar="N",
                   help="timed runs per model after the warm-up (default 5, 3 with --quick)")
    p.add_argument("--budget", type=float, default=40.0, metavar="SECONDS",
                   help="timed seconds per model the run count aims at: a model whose warm-up "
                        "round takes longer than SECONDS/N gets fewer runs, never under 3 "
                        "(default 40; 0 always runs N)")
    p.add_argument("--shared", metavar="DIR",
                   help="also bench every DIR/*.onnx (DIR/NAME.inputs.npz is its feed if present)")
    p.add_argument("--only", action="append", default=[], metavar="TEXT",
                   help="bench only models whose row name contains TEXT; repeatable")
    p.add_argument("--compact", action="store_true",
                   help="a narrow table: graphopt's seconds and nodes, the others' time ratios")
    p.add_argument("--json", metavar="FILE", type=json_path,
                   help="also write the results as JSON to FILE")
    args = p.parse_args(argv)
    if args.runs is None:
        args.runs = 3 if args.quick else 5
    check_folder(p, args.shared)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def sources(workdir: str, wanted):
        return chain(zoo_models(workdir, args.quick, wanted), light_models(args.quick, wanted),
                     folder_models(args.shared, wanted) if args.shared else ())

    problem = unmatched(args.only, lambda wanted: sources("", wanted))
    if problem:
        print(problem, file=sys.stderr)
        return 1
    ort.set_default_logger_severity(3)  # the tools' own ORT sessions warn about every model
    tools = compilers()
    start = time.perf_counter()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="graphopt-compile-time-") as workdir:
        for model in sources(workdir, matching(args.only)):
            began = time.perf_counter()
            rows.append(measure(model, tools, args.runs, args.budget, workdir))
            print(f"{model.name}: {rows[-1].runs} runs, {time.perf_counter() - began:.0f} s",
                  file=sys.stderr, flush=True)
    seconds = time.perf_counter() - start
    print(header(tools, args.runs, args.budget))
    print()
    print(format_compact(rows, tools) if args.compact else format_table(rows, tools))
    if any(row.model.name.startswith("light/") for row in rows):
        print("\nlight/*: the weights are built at run time by ConstantOfShape; graphopt folds "
              "those up to --fold-size-limit (1 MiB) and keeps larger ones as nodes, the other "
              "tools write every weight into the file (hundreds of MB for vgg19 and alexnet).")
    print(f"\n{len(rows)} models in {seconds:.0f} s")
    if args.json:
        write_json(args.json, to_json(rows, tools, args, seconds))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
