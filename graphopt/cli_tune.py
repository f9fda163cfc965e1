"""`graphopt tune` (operator tuning of a model's NPU cube kernels) and `graphopt kb` (the
tuning knowledge base: list, export, import)."""

from __future__ import annotations

import argparse
import sys

from graphopt.errors import OptionError
from graphopt.table import format_table

TUNE_EXAMPLES = """examples:
  graphopt tune model.onnx --target ascend310 --input-shape "x:1,3,224,224"
  graphopt tune model.onnx --target ascend310 --trials 100 --tuning-db tuning.db --workers 2
  graphopt tune model.onnx --target ascend310 --storage postgresql://user@host/db --workers 8
  graphopt tune bert.onnx --target ascend310 --job subgraph -O3 --trials 40
  graphopt tune resnet50.onnx --target cpu --job subgraph --objective measured --trials 30
  graphopt optimize model.onnx -o model.om --target ascend310 --tuning-db tuning.db

--job op ranks tilings with the analytical NPU cost model, never a device. --job subgraph turns
groups of alike fusions and layout changes on or off and scores each compile with the cost
models (the whole partitioned model, tuned tilings included) or, on a CPU target with
--objective measured, by timing it with onnxruntime. A rerun on the same database resumes the
study; --trials counts the new trials of this run. `optimize --tuning-db` applies both.
"""


def _storage_args(p, *, db_only: bool = False) -> None:
    if db_only:
        p.add_argument("--tuning-db", metavar="FILE.db",
                       help="the knowledge base (default: ~/.cache/graphopt/tuning.db)")
        p.add_argument("--storage", metavar="URL", help="an Optuna storage URL instead")
        return
    group = p.add_mutually_exclusive_group()
    group.add_argument("--tuning-db", metavar="FILE.db",
                       help="SQLite knowledge base (default: ~/.cache/graphopt/tuning.db)")
    group.add_argument("--storage", metavar="URL",
                       help="any Optuna storage URL (sqlite:///x.db, postgresql://…); use a "
                            "server for more than a few --workers")


def add_tune_parser(sub) -> None:
    p = sub.add_parser(
        "tune", help="tune kernel tilings (--job op) or fusion decisions (--job subgraph), "
                     "AOE style",
        description="Op tuning (default): compile the model for an NPU target, find its "
                    "distinct cube-kernel signatures (MatMul/Gemm/Conv as GEMMs) and run one "
                    "Optuna study per signature over its tiling space, ranking tilings by the "
                    "NPU cost model. Subgraph tuning: one study over the compile's fusion and "
                    "layout decisions. Results go to the knowledge base that `graphopt "
                    "optimize --tuning-db` reads.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=TUNE_EXAMPLES)
    p.add_argument("model", help="input .onnx file")
    p.add_argument("--target", required=True, metavar="NAME|FILE",
                   help="the target (`graphopt targets` lists them); op tuning needs an NPU")
    p.add_argument("--input-shape", metavar="SHAPES",
                   help='pin input dims, ATC style: "x:1,3,224,224;mask:1,128"')
    p.add_argument("--job", default="op", choices=("op", "subgraph"),
                   help="op: tune each cube kernel's tiling (default); subgraph: tune which "
                        "fusions and layout changes the compile makes")
    p.add_argument("-O", dest="level", type=int, default=2, choices=range(4), metavar="LEVEL",
                   help="optimization level of the compile being tuned (default 2)")
    p.add_argument("--objective", default="estimate", choices=("estimate", "measured"),
                   help="subgraph: score compiles by the cost models (default) or by timing "
                        "them with onnxruntime (CPU targets)")
    p.add_argument("--granularity", default="rule", choices=("rule", "shape"),
                   help="subgraph: switch alike rewrites together per rule and op (default) "
                        "or also per output shape (a finer, bigger space)")
    p.add_argument("--repeat", type=int, default=20, metavar="N",
                   help="--objective measured: timed runs per candidate (default 20)")
    p.add_argument("--threads", type=int, metavar="N",
                   help="--objective measured: onnxruntime intra-op threads (default: its own)")
    p.add_argument("--trials", type=int, default=50, metavar="N",
                   help="new trials per kernel signature, or of the subgraph study (default 50)")
    p.add_argument("--timeout", type=float, metavar="S", help="stop each kernel after S seconds")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    p.add_argument("--sampler", default="tpe", choices=("tpe", "random"),
                   help="Optuna sampler (default tpe)")
    _storage_args(p)
    p.add_argument("--study", metavar="NAME",
                   help="study name (only with one kernel signature; default: the signature)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="local worker processes sharing the storage (default 1)")
    p.add_argument("--plot", metavar="FILE",
                   help="best-so-far cost vs trial per kernel (.png or .svg)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=_cmd_tune)


def _storage(args):
    return args.storage or args.tuning_db  # None: the default file (search.default_db_path)


def _cmd_tune(args) -> int:
    from graphopt.compiler import optimize
    from graphopt.tuner.model import model_estimate
    from graphopt.tuner.search import storage_url, tune_kernel
    from graphopt.tuner.signature import model_kernels

    if args.trials < 1:
        raise OptionError(f"--trials must be ≥ 1, got {args.trials}")
    if args.workers < 1:
        raise OptionError(f"--workers must be ≥ 1, got {args.workers}")
    if args.timeout is not None and args.timeout <= 0:
        raise OptionError(f"--timeout must be > 0, got {args.timeout}")
    if args.plot and not args.plot.endswith((".png", ".svg")):
        raise OptionError(f"--plot {args.plot}: the picture must end in .png or .svg")
    if args.job == "subgraph":
        from graphopt.cli_tune_subgraph import cmd_tune_subgraph
        return cmd_tune_subgraph(args, _storage(args))
    if args.objective != "estimate":
        raise OptionError("--objective measured is for --job subgraph; op tuning ranks "
                          "tilings of NPU kernels, which this machine cannot time")
    result = optimize(args.model, level=args.level, input_shapes=args.input_shape,
                      target=args.target)
    partitioning = result.partitioning
    if not any(partitioning.target.device(p.device).kind == "npu"
               for p in partitioning.partitions):
        raise OptionError(f"--target {args.target}: no node of {args.model} runs on an NPU "
                          "device, so there is nothing to tune")
    kernels = model_kernels(result.model, partitioning)
    if not kernels:
        raise OptionError(f"{args.model}: no NPU cube kernel (MatMul/Gemm/Conv with static "
                          "shapes) to tune; pin dynamic dims with --input-shape")
    if args.study and len(kernels) > 1:
        raise OptionError(f"--study {args.study}: the model has {len(kernels)} kernel "
                          "signatures, each needs its own study; drop --study")
    url = storage_url(_storage(args))
    show = not args.quiet and sys.stderr
    results = []
    for i, group in enumerate(kernels, 1):
        def progress(done: int, total: int, best: float, i=i) -> None:
            if show:
                print(f"\rkernel {i}/{len(kernels)}  trial {done}/{total}  "
                      f"best {best * 1e6:.2f} µs ", end="", file=sys.stderr, flush=True)

        results.append(tune_kernel(
            group.shape, partitioning.target.device(group.device), trials=args.trials,
            timeout=args.timeout, seed=args.seed, storage=url, study_name=args.study,
            sampler=args.sampler, progress=progress, target=args.target,
            op_class=group.signature.split("/")[1], workers=args.workers))
    if show:
        print(file=sys.stderr)
    rows = [[g.signature, len(g.nodes), f"{r.default[1] * 1e6:.2f}", f"{r.best[1] * 1e6:.2f}",
             f"{r.speedup:.3f}", r.trials, str(r.best[0])] for g, r in zip(kernels, results)]
    print(format_table(["kernel signature", "nodes", "default µs", "tuned µs", "speedup",
                        "trials", "tuned tiling"], rows,
                       title=f"op tuning on {partitioning.target.name} (estimates; {url})"))
    tuned = {node: r.best[0] for g, r in zip(kernels, results) for node in g.nodes}
    before = model_estimate(result.model, partitioning).seconds
    after = model_estimate(result.model, partitioning, tuned).seconds
    print(f"whole model (estimate): default {before * 1e6:.2f} µs, tuned {after * 1e6:.2f} µs, "
          f"{before / after:.3f}x")
    if args.plot:
        draw_histories([(g.signature, r.history, r.default[1]) for g, r in zip(kernels, results)],
                       args.plot)
        print(f"wrote {args.plot}")
    return 0


def add_kb_parser(sub) -> None:
    p = sub.add_parser("kb", help="list, export or import the tuning knowledge base",
                       description="The knowledge base is the tuning storage: one study per "
                                   "kernel signature. Export writes each signature's best "
                                   "tiling as JSON; import adds them as completed trials.")
    kb_sub = p.add_subparsers(dest="kb_command", required=True, metavar="{list,export,import}")
    ls = kb_sub.add_parser("list", help="one row per kernel signature")
    _storage_args(ls, db_only=True)
    ls.set_defaults(func=_cmd_kb_list)
    ex = kb_sub.add_parser("export", help="write the best tilings as JSON")
    ex.add_argument("json", metavar="FILE.json")
    _storage_args(ex, db_only=True)
    ex.set_defaults(func=_cmd_kb_export)
    im = kb_sub.add_parser("import", help="add a JSON export's tilings to the knowledge base")
    im.add_argument("json", metavar="FILE.json")
    _storage_args(im, db_only=True)
    im.set_defaults(func=_cmd_kb_import)


def _cmd_kb_list(args) -> int:
    from graphopt.tuner.kb import list_kb

    def us(seconds):
        return "" if seconds is None else f"{seconds * 1e6:.2f}"

    rows = [[r["signature"], r["trials"], us(r["default_seconds"]), us(r["best_seconds"]),
             "" if r["speedup"] is None else f"{r['speedup']:.3f}", r["tiling"] or ""]
            for r in list_kb(_storage(args))]
    print(format_table(["kernel signature", "trials", "default µs", "best µs", "speedup",
                        "best tiling"], rows))
    return 0


def _cmd_kb_export(args) -> int:
    from graphopt.tuner.kb import export_kb

    print(f"wrote {args.json}: {export_kb(_storage(args), args.json)} kernel(s)")
    return 0


def _cmd_kb_import(args) -> int:
    from graphopt.tuner.kb import import_kb

    print(f"imported {import_kb(args.json, _storage(args))} kernel tiling(s) from {args.json}")
    return 0


def _history_curves(series: list[tuple[str, list[float], float]]):
    """Each history as best-so-far / default (capped at 1.0), and the y value at the bottom."""
    curves = [[min(v / default, 1.0) for v in hist if v != float("inf")]
              for _, hist, default in series]
    low = min((min(c) for c in curves if c), default=0.5)
    return curves, min(low, 0.95) - 0.02


def _history_xy(n: int, low: float, width: int, height: int, margin: int):
    def xy(i: int, v: float) -> tuple[int, int]:
        x = margin + i * (width - 2 * margin) // max(n - 1, 1)
        y = margin + int((1.0 - v) / (1.0 - low) * (height - 2 * margin))
        return x, y
    return xy


def histories_svg(series: list[tuple[str, list[float], float]], *, width: int = 720,
                  height: int = 360) -> str:
    """Best-so-far cost / default cost vs trial as SVG text, one line per (name, history,
    default seconds), with a legend."""
    from html import escape

    from graphopt.passes.memory.plot import _colour

    margin = 32
    curves, low = _history_curves(series)
    n = max((len(c) for c in curves), default=1)
    xy = _history_xy(n, low, width, height, margin)
    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
              'font-family="sans-serif" font-size="10">'),
             f'<rect width="{width}" height="{height}" fill="white"/>',
             (f'<polyline points="{margin},{margin} {margin},{height - margin} '
              f'{width - margin},{height - margin}" fill="none" stroke="black"/>'),
             (f'<text x="{margin}" y="{height - 8}">trial → ({n})   y: best cost / default '
              f'(1.0 at top, {low:.2f} at bottom)</text>')]
    for k, ((name, _, _), curve) in enumerate(zip(series, curves)):
        points = " ".join(f"{x},{y}" for x, y in (xy(i, v) for i, v in enumerate(curve)))
        parts.append(f'<polyline points="{points}" fill="none" stroke="rgb{_colour(k)}" '
                     f'stroke-width="2"><title>{escape(name)}</title></polyline>')
        parts.append(f'<text x="{width - margin - 300}" y="{margin + 12 * k}" '
                     f'fill="rgb{_colour(k)}">{escape(name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def draw_histories(series: list[tuple[str, list[float], float]], path: str, *,
                   width: int = 720, height: int = 360) -> None:
    """Best-so-far cost / default cost vs trial, one line per (name, history, default seconds):
    SVG (with a legend) when `path` ends in .svg, else PNG (passes.memory.plot's writer)."""
    from graphopt.passes.memory.plot import _Canvas, _colour

    if path.lower().endswith(".svg"):
        data = histories_svg(series, width=width, height=height).encode()
    else:
        margin = 32
        curves, low = _history_curves(series)
        xy = _history_xy(max((len(c) for c in curves), default=1), low, width, height, margin)
        canvas = _Canvas(width, height)
        canvas.fill(margin - 1, margin, margin, height - margin + 1, (0, 0, 0))
        canvas.fill(margin - 1, height - margin, width - margin, height - margin + 1, (0, 0, 0))
        for k, curve in enumerate(curves):
            rgb = tuple(c * 3 // 4 for c in _colour(k))
            for i in range(1, len(curve)):
                (x0, y0), (x1, y1) = xy(i - 1, curve[i - 1]), xy(i, curve[i])
                canvas.fill(x0, y0 - 1, x1 + 1, y0 + 1, rgb)              # the step's flat run
                canvas.fill(x1 - 1, min(y0, y1), x1 + 1, max(y0, y1) + 1, rgb)  # and its drop
        data = canvas.png()
    with open(path, "wb") as f:
        f.write(data)
