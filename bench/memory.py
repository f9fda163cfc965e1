"""Activation memory bench: graphopt's static memory plan beside the planners runtimes use."""

from __future__ import annotations

import argparse
import glob
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort

import graphopt
from graphopt.ir import DType, Graph, Model, Value
from graphopt.passes.memory import (MemoryPlanError, check_plan, plan_memory, schedule_for_memory,
                                    verify_plan)

from _common import (geomean, json_path, markdown_table, positive_int, positive_ints, short_reason,
                     write_json)
from _models import (BenchModel, check_folder, folder_models, light_models, matching, unmatched,
                     zoo_models)

DESCRIPTION = """\
Plan the work buffer (CANN's work memory: the arena holding every intermediate tensor) of each
model after graphopt's -O2, with every strategy on the same schedule and the same buffers (views
share storage, elementwise ops write in place of inputs that die there, 64-byte alignment):
naive (no reuse), same-size (onnxruntime's planner), greedy by size (TFLite), graphopt (the best
of its strategies), beside the lower bound (max over the schedule of live bytes), then the lower
bound and graphopt's plan on graphopt's memory-aware order. Models: the graphopt zoo, the onnx
wheel's light corpus and its pytorch-converted models, plus --shared DIR. Each plan is verified
statically and run in the arena executor (every intermediate in its planned slot), its outputs
compared with onnxruntime's whole-model run at ORT_DISABLE_ALL on seed-0 inputs (max Δ).
Planning time is the median of --runs plans. Last, planning time of synthetic random DAGs."""

EPILOG = """\
examples:
  python bench/memory.py --quick
  python bench/memory.py --json out/memory.json
  python bench/memory.py --only light --no-check
"""

PYTORCH_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data",
                           "pytorch-converted")


@dataclass
class Row:
    name: str
    nodes: int = 0
    sizes: dict[str, int] = field(default_factory=dict)  # strategy -> arena bytes
    strategy: str = ""
    bound: int = 0
    reordered_bound: int = 0
    reordered_arena: int = 0
    reordered_method: str = ""
    optimal_order: bool = False
    plan_seconds: float = 0.0
    schedule_seconds: float = 0.0
    max_abs: float | None = None
    check_ok: bool | None = None
    error: str | None = None

    @property
    def arena(self) -> int:
        return self.sizes.get("graphopt", 0)


def pytorch_models(wanted) -> list[BenchModel]:
    models = []
    for folder in sorted(glob.glob(os.path.join(PYTORCH_DIR, "*"))):
        path = os.path.join(folder, "model.onnx")
        name = f"pytorch-converted/{os.path.basename(folder).removeprefix('test_')}"
        if os.path.exists(path) and wanted(name):
            models.append(BenchModel(name, path, {}))
    return models


def compiled(model: BenchModel) -> Model:
    """The model after -O2 with its dynamic input dims pinned to the feed's shapes."""
    pins = {name: list(np.shape(feed)) for name, feed in model.feeds.items()}
    return graphopt.optimize(model.path, level=2, input_shapes=pins or None).model


def _median_seconds(fn, runs: int) -> tuple[float, object]:
    result, times = None, []
    for _ in range(runs):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def measure(bench_model: BenchModel, runs: int, check: bool) -> Row:
    row = Row(bench_model.name)
    try:
        model = compiled(bench_model)
        row.nodes = len(model.graph)
        row.plan_seconds, plan = _median_seconds(lambda: plan_memory(model), runs)
    except (MemoryPlanError, graphopt.errors.GraphoptError) as e:
        row.error = short_reason(e)
        return row
    verify_plan(plan, model)
    row.sizes = {"naive": plan.candidates["naive"], "same_size": plan.candidates["same_size"],
                 "greedy_by_size": plan.candidates["greedy_by_size"], "graphopt": plan.arena_bytes}
    row.strategy, row.bound = plan.strategy, plan.lower_bound
    row.schedule_seconds, schedule = _median_seconds(lambda: schedule_for_memory(model), runs)
    reordered = plan_memory(model, schedule.order)
    verify_plan(reordered, model)
    row.reordered_bound, row.reordered_arena = reordered.lower_bound, reordered.arena_bytes
    row.reordered_method, row.optimal_order = schedule.method, schedule.optimal
    if check and row.arena:
        feeds = bench_model.feeds or None
        try:
            result = check_plan(model, reordered, feeds)
            row.max_abs = max(result.max_abs.values(), default=0.0)
            row.check_ok = result.ok
        except Exception as e:  # noqa: BLE001 - the model may not run in onnxruntime at all
            row.error = f"n/a: {short_reason(e, 48)}"
    return row


def human(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"


def _ratio(value: int, bound: int) -> str:
    return f"{value / bound:.3f}" if bound else ""


def format_table(rows: list[Row], check: bool) -> str:
    headers = ["model", "nodes", "lower bound", "naive ×", "same-size ×", "greedy-by-size ×",
               "graphopt ×", "graphopt arena (strategy)", "reordered LB", "reordered ×", "order",
               "plan ms"] + (["arena max Δ"] if check else [])
    body = []
    for row in rows:
        if row.error and not row.sizes:
            body.append([row.name, str(row.nodes), f"error: {row.error}"]
                        + [""] * (len(headers) - 3))
            continue
        b = row.bound
        order = row.reordered_method + (" (optimal)" if row.optimal_order else "")
        lowered = "" if row.reordered_bound >= b else f" ({row.reordered_bound / b - 1:+.1%})"
        cells = [row.name, str(row.nodes), human(b), _ratio(row.sizes["naive"], b),
                 _ratio(row.sizes["same_size"], b), _ratio(row.sizes["greedy_by_size"], b),
                 _ratio(row.arena, b), f"{human(row.arena)} ({row.strategy})",
                 human(row.reordered_bound) + lowered,
                 _ratio(row.reordered_arena, row.reordered_bound), order,
                 f"{row.plan_seconds * 1e3:.3g}"]
        if check:
            cells.append(row.error or ("" if row.max_abs is None else
                                       f"{row.max_abs:.1e}" + ("" if row.check_ok else " ✗")))
        body.append(cells)
    planned = [r for r in rows if r.sizes and r.bound]
    for label, subset in _groups(planned):
        means = [geomean([r.sizes[k] / r.bound for r in subset])
                 for k in ("naive", "same_size", "greedy_by_size", "graphopt")]
        body.append([f"geomean × {label} (n={len(subset)})", "", "",
                     *[f"{m:.3f}" for m in means], "",
                     f"{geomean([r.reordered_bound / r.bound for r in subset]):.3f} of LB",
                     f"{geomean([r.reordered_arena / r.reordered_bound for r in subset]):.3f}",
                     "", ""] + ([""] if check else []))
    return markdown_table(headers, body)


def _groups(rows: list[Row]) -> list[tuple[str, list[Row]]]:
    sets: dict[str, list[Row]] = {}
    for row in rows:
        sets.setdefault(row.name.split("/")[0], []).append(row)
    return [*sets.items(), ("all", rows)] if len(sets) > 1 else list(sets.items())


def goals(rows: list[Row], empty: list[str], unplanned: list[str]) -> str:
    """The goals' verdicts, and the models left out of the table (empty arena, or a
    pytorch-converted model graphopt could not plan: that corpus holds many it cannot run)."""
    planned = [r for r in rows if r.sizes and r.bound]

    def ratio(r: Row) -> float:
        return max(r.arena / r.bound, r.reordered_arena / r.reordered_bound)

    lines = _left_out(empty, unplanned)
    if not planned:  # every model chosen plans to an empty arena, or failed
        return "\n".join(["no model with work memory to plan: no goal to judge", *lines])
    worst = max(planned, key=ratio)
    above_greedy = [r.name for r in planned if r.arena > r.sizes["greedy_by_size"]]
    lowered = [f"{r.name} ({r.reordered_bound / r.bound - 1:+.1%}, {r.reordered_method})"
               for r in planned if r.reordered_bound < r.bound]
    proven = [r.name for r in planned if r.reordered_bound == r.bound and r.optimal_order]
    lines = [
        f"graphopt ≤ 1.03 × the lower bound of its own schedule on every model (original and "
        f"reordered): {'yes' if ratio(worst) <= 1.03 else 'NO'} "
        f"(worst {ratio(worst):.3f}, {worst.name})",
        "graphopt never above greedy by size: "
        + ("yes" if not above_greedy else "NO: " + ", ".join(above_greedy)),
        f"reordering lowered the peak on {len(lowered)} of {len(planned)} models: "
        + (", ".join(lowered) or "none"),
        f"original order already optimal (proven: the exact search finished, or the peak meets "
        f"the bytes that must be live around some node in any order) on {len(proven)} more: "
        + (", ".join(proven) or "none"),
    ] + lines
    return "\n".join(lines)


def _left_out(empty: list[str], unplanned: list[str]) -> list[str]:
    lines = []
    for names, what in ((empty, "plan to an empty arena (a single node, or no intermediate "
                                "tensor)"),
                        (unplanned, "of pytorch-converted were not planned (they do not "
                                    "import or compile)")):
        if names:
            short = [n.split("/")[-1] for n in names]
            more = ", …" if len(short) > 8 else ""
            lines.append(f"{len(names)} more models {what}: {', '.join(short[:8])}{more}")
    return lines


# -- synthetic scale ---------------------------------------------------------------------------
def synthetic(nodes: int, seed: int = 0) -> Model:
    """A random DAG shaped like a CNN's: elementwise chains, residual adds, concats, reshapes
    (views) and MatMuls against shared weights, on [1, c, 8, 8] tensors, skips up to 16 back."""
    rng = random.Random(seed)
    graph = Graph("synthetic")
    values = [graph.add_input(Value("x", DType.FLOAT, (1, 32, 8, 8)))]
    consts: dict[tuple, Value] = {}

    def const(key: tuple, make) -> Value:
        if key not in consts:
            consts[key] = graph.make_initializer(key[0], make())
        return consts[key]

    while len(graph) < nodes:
        a = values[-1] if rng.random() < 0.7 else rng.choice(values[-16:])
        c = a.shape[1]
        r = rng.random()
        if r < 0.35:
            node = graph.make_node(rng.choice(["Relu", "Sigmoid", "Tanh"]), [a],
                                   dtype=DType.FLOAT, shape=a.shape)
        elif r < 0.55:
            same = [v for v in values[-16:] if v.shape == a.shape and v is not a]
            op, inputs = ("Add", [a, rng.choice(same)]) if same else ("Neg", [a])
            node = graph.make_node(op, inputs, dtype=DType.FLOAT, shape=a.shape)
        elif r < 0.7 and c <= 256:
            b = rng.choice(values[-8:])
            node = graph.make_node("Concat", [a, b], {"axis": 1}, dtype=DType.FLOAT,
                                   shape=(1, c + b.shape[1], 8, 8))
        elif r < 0.8:
            flat = const(("flat", c), lambda: np.array([1, c, 64], np.int64))
            view = graph.make_node("Reshape", [a, flat], dtype=DType.FLOAT, shape=(1, c, 64))
            back = const(("unflat", c), lambda: np.array([1, c, 8, 8], np.int64))
            node = graph.make_node("Reshape", [view.output, back], dtype=DType.FLOAT, shape=a.shape)
        else:
            co = rng.choice([16, 32, 64, 128])
            w = const(("w", c, co), lambda: np.zeros((co, c, 1, 1), np.float32))
            node = graph.make_node("Conv", [a, w], dtype=DType.FLOAT, shape=(1, co, 8, 8))
        values.append(node.output)
    graph.outputs.append(values[-1])
    return Model(graph)


def scale_rows(sizes: list[int], runs: int) -> list[list[str]]:
    rows = []
    for n in sizes:
        model = synthetic(n)
        plan_s, plan = _median_seconds(lambda: plan_memory(model), runs)
        sched_s, schedule = _median_seconds(lambda: schedule_for_memory(model), max(1, runs // 2))
        verify_s, _ = _median_seconds(lambda: verify_plan(plan), 1)
        rows.append([f"synthetic {n:,}", str(len(model.graph)), str(len(plan.buffers)),
                     f"{plan_s:.3f}", f"{sched_s:.3f}", f"{verify_s:.3f}",
                     f"{human(plan.arena_bytes)} ({plan.strategy})",
                     _ratio(plan.arena_bytes, plan.lower_bound),
                     f"{human(schedule.original_peak)} → {human(schedule.peak)} "
                     f"({schedule.method})"])
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="memory.py", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="small zoo sizes, 3 light CNNs, 1 planning run, synthetic 1k and 10k only")
    p.add_argument("--runs", type=positive_int, default=5, metavar="N",
                   help="timed plans per model (default 5)")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="skip the arena executor (static verification still runs)")
    p.add_argument("--scale", type=lambda text: positive_ints(text) if text.strip() else [],
                   default=[1000, 10000], metavar="N,N",
                   help="synthetic DAG sizes whose planning is timed (default 1000,10000; '' none)")
    p.add_argument("--shared", metavar="DIR", help="also plan every DIR/*.onnx")
    p.add_argument("--only", action="append", default=[], metavar="TEXT",
                   help="only models whose row name contains TEXT; repeatable")
    p.add_argument("--json", metavar="FILE", type=json_path,
                   help="also write the results as JSON to FILE")
    args = p.parse_args(argv)
    check_folder(p, args.shared)
    if args.quick:
        args.runs = 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def sources(workdir: str, wanted):
        yield from zoo_models(workdir, args.quick, wanted)
        yield from light_models(args.quick, wanted)
        yield from pytorch_models(wanted)  # a list: built here, so names come in row order
        if args.shared:
            yield from folder_models(args.shared, wanted)

    problem = unmatched(args.only, lambda wanted: sources("", wanted))
    if problem:
        print(problem, file=sys.stderr)
        return 1
    ort.set_default_logger_severity(3)
    start = time.perf_counter()
    rows: list[Row] = []
    empty: list[str] = []
    unplanned: list[str] = []
    with tempfile.TemporaryDirectory(prefix="graphopt-memory-") as workdir:
        for model in sources(workdir, matching(args.only)):
            began = time.perf_counter()
            row = measure(model, args.runs, args.check)
            if row.sizes and not row.bound:
                empty.append(row.name)
            elif not row.name.startswith("pytorch-converted/") or row.sizes:
                rows.append(row)
            else:
                unplanned.append(row.name)
            print(f"{model.name}: {time.perf_counter() - began:.1f} s", file=sys.stderr, flush=True)
    scale = scale_rows(args.scale, 1 if args.quick else 3) if args.scale else []
    print(f"Work memory (arena) per model after graphopt -O2, 64-byte alignment; × = arena / the "
          f"lower bound of the same schedule (1.000 is optimal for that order). graphopt = the "
          f"smallest of same-size, greedy-by-size, greedy-by-breadth, best-fit (XLA heap "
          f"simulator) and graphopt's greedy search, its strategy in parentheses. reordered LB = "
          f"the lower bound on graphopt's memory-aware order (change vs the original order), "
          f"graphopt reordered × = its plan on that order / that bound. order = the ordering "
          f"that won. plan ms = median of {args.runs} plan_memory runs. arena max Δ = max "
          f"absolute difference of every output of the arena executor (reordered plan) against "
          f"onnxruntime's whole-model run at ORT_DISABLE_ALL, seed-0 inputs.\n"
          f"graphopt {graphopt.__version__}; onnxruntime {ort.__version__}; "
          f"onnx {onnx.__version__}; python {platform.python_version()}; {os.cpu_count()} CPUs.")
    print()
    print(format_table(rows, args.check))
    print()
    print(goals(rows, empty, unplanned))
    if scale:
        print()
        print(markdown_table(["graph", "nodes", "buffers", "plan_memory s",
                              "schedule_for_memory s", "verify_plan s", "arena", "×",
                              "peak: original → reordered"], scale))
    if args.json:
        write_json(args.json, {
            "bench": "memory", "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
            "alignment": 64, "runs": args.runs, "wall_seconds": time.perf_counter() - start,
            "models": [row.__dict__ | {"arena": row.arena} for row in rows],
            "empty_arena": empty, "unplanned": unplanned, "scale": scale})
    return 0


if __name__ == "__main__":
    sys.exit(main())
