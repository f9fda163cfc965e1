"""`graphopt tune` (operator tuning of a model's NPU cube kernels) and `graphopt kb` (the
tuning knowledge base: list, export, import)."""

from __future__ import annotations

import json
import logging
import os
import sys

from graphopt.cli_optimize import (add_fold_size_limit, add_pass_switches, compile_flags,
                                   switch_file_of)
from graphopt.cli_paths import check_output_path
from graphopt.cli_types import (JoinedShapes, input_shapes, name_text, path_text, positive_int,
                                positive_seconds, positive_thread_count, run_count, seed,
                                target_name, thread_count)
from graphopt.errors import OptionError, interrupt_behind
from graphopt.help_format import HelpFormatter
from graphopt.progress import ProgressLine
from graphopt.table import format_table

TUNE_EXAMPLES = """examples:
  graphopt tune model.onnx --target ascend310 --input-shape "x:1,3,224,224"
  graphopt tune model.onnx --target ascend310 --trials 100 --tuning-db tuning.db --workers 2
  graphopt tune model.onnx --target ascend310 --storage postgresql://user@host/db --workers 8
  graphopt tune model.onnx --target ascend310 --quantize int8 --calibration calib.npz
  graphopt tune bert.onnx --target ascend310 --job subgraph -O3 --trials 40
  graphopt tune resnet50.onnx --target cpu --job subgraph --objective measured --trials 30
  graphopt optimize model.onnx -o model.om --target ascend310 --tuning-db tuning.db

--job op ranks tilings with the analytical NPU cost model, never a device. --job subgraph turns
groups of alike fusions and layout changes on or off and scores each compile with the cost
models (the whole partitioned model, tuned tilings included) or, on a CPU target with
--objective measured, by timing it with onnxruntime. A rerun on the same database resumes the
study; --trials counts the new trials of this run. `optimize --tuning-db` applies both.
With --precision or --quantize, op tuning tunes the kernels of the converted model (int8
signatures for --quantize int8 on an NPU), which `optimize` with the same flags then finds.
"""


def _storage_args(p, *, db_only: bool = False) -> None:
    group = p.add_mutually_exclusive_group()  # both given, one would be silently ignored
    group.add_argument("--tuning-db", metavar="FILE.db",
                       help=("the knowledge base" if db_only else "SQLite knowledge base")
                       + " (default: $XDG_CACHE_HOME/graphopt/tuning.db, ~/.cache when unset)")
    group.add_argument("--storage", metavar="URL",
                       help="an Optuna storage URL instead" if db_only else
                       "any Optuna storage URL (sqlite:///x.db, postgresql://…); use a server "
                       "for more than a few --workers")


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
        formatter_class=HelpFormatter, epilog=TUNE_EXAMPLES)
    p.add_argument("model", type=path_text, help="input .onnx file")
    p.add_argument("--target", type=target_name, required=True, metavar="NAME|FILE",
                   help="the target (`graphopt targets` lists them); op tuning needs an NPU")
    p.add_argument("--input-shape", type=input_shapes, action=JoinedShapes, metavar="SHAPES",
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
    p.add_argument("--repeat", type=run_count, default=20, metavar="N",
                   help="--objective measured: timed runs per candidate (default 20)")
    p.add_argument("--threads", type=thread_count, metavar="N",
                   help="--objective measured: onnxruntime intra-op threads (default: its own)")
    p.add_argument("--trials", type=positive_int, default=50, metavar="N",
                   help="new trials per kernel signature, or of the subgraph study (default 50)")
    p.add_argument("--timeout", type=positive_seconds, metavar="S",
                   help="stop each kernel after S seconds")
    p.add_argument("--seed", type=seed, default=0, help="sampler seed, 0 to 2**32 - 1 "
                   "(default 0)")
    p.add_argument("--sampler", default="tpe", choices=("tpe", "random"),
                   help="Optuna sampler (default tpe)")
    _storage_args(p)
    p.add_argument("--study", type=name_text, metavar="NAME",
                   help="study name (only with one kernel signature; default: the signature)")
    p.add_argument("--workers", type=positive_thread_count, default=1, metavar="N",
                   help="local worker processes sharing the storage (default 1)")
    p.add_argument("--plot", type=path_text, metavar="FILE",
                   help="best-so-far cost vs trial per kernel (.png or .svg)")
    p.add_argument("--allow-custom-ops", action="store_true",
                   help="keep ops of unknown custom domains instead of refusing the model "
                        "(they stay on the host CPU)")
    add_pass_switches(p, scope="op: ")
    add_fold_size_limit(p, scope="op: ")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    from graphopt.cli_precision import add_precision_args

    add_precision_args(p, report=False)
    p.set_defaults(func=_cmd_tune)


def named_storage(args):
    """The storage the user named, None for the default file (storage.default_db_path)."""
    if args.storage is not None and "://" not in args.storage:
        from graphopt.tuner.storage import STORAGE_URLS

        raise OptionError(f"--storage {args.storage}: not a storage URL (use {STORAGE_URLS}); "
                          "a knowledge-base file is --tuning-db FILE.db")
    return args.storage or args.tuning_db


def _storage_option(args) -> str:
    """The flag that named the storage, for errors."""
    return "--storage" if args.storage else "--tuning-db"


def _check_plot(path: str, args) -> None:
    from graphopt.tuner.storage import sqlite_path

    # Checked up front: the picture is drawn after the tuning, which can take hours.
    if not path.lower().endswith((".png", ".svg")):
        raise OptionError(f"--plot {path}: the picture must end in .png or .svg")
    check_output_path("--plot", path, {"the model": args.model,
                                       "the knowledge base": sqlite_path(named_storage(args))})


def _cmd_tune(args) -> int:
    try:
        return _tune(args)
    except BaseException as exc:
        # Ctrl-C or a termination signal (cli.Terminated), also where a library's cleanup
        # raised another error while it unwound (inside a trial's objective, Optuna's).
        url = getattr(args, "resolved_storage", None)
        if url and interrupt_behind(exc) is not None:  # said before the command's last line
            print(f"note: {_kept(args, url)}", file=sys.stderr)
        raise


def _kept(args, url: str) -> str:
    """What a stopped tune left behind: a knowledge base file not yet made holds nothing (the
    stop came before the first trial), which the note had called kept trials."""
    from graphopt.tuner.storage import sqlite_path

    given = named_storage(args)
    path = sqlite_path(given)
    if path is not None and not os.path.exists(path):
        return f"the stop came before any trial was stored: {path} was not made"
    shown = path if path is not None and given is not None and "://" not in str(given) \
        else url
    return (f"the trials completed before the stop are kept in {shown}; the same command "
            "resumes the job")


def _tune(args) -> int:
    from graphopt.compiler import optimize
    from graphopt.tuner.model import model_estimate
    from graphopt.tuner.npu_model import estimate
    from graphopt.tuner.search import tune_kernel
    from graphopt.tuner.signature import idle_kernels, model_kernels
    from graphopt.tuner.storage import check_writable, opened, storage_url

    if args.plot:
        _check_plot(args.plot, args)
    # A Ctrl-C that lands while SQLAlchemy closes a connection made its pool log the
    # interrupt with a traceback before graphopt's one line: cleanup noise, never a result.
    logging.getLogger("sqlalchemy.pool").setLevel(logging.CRITICAL)
    # Checked before the compile, which can take minutes, and without creating anything.
    url = storage_url(named_storage(args), option=_storage_option(args))
    check_writable(named_storage(args), _storage_option(args))
    args.resolved_storage = url
    from graphopt.cli_precision import precision_options

    precision = precision_options(args)
    if precision and args.job == "subgraph":
        raise OptionError("--precision/--quantize apply to --job op; for subgraph tuning, "
                          "write the converted model first (graphopt optimize … -o "
                          "model.int8.onnx --target …) and tune that")
    switched = [flag for flag, given in (("--disable-pass", args.disable_pass),
                                         ("--switch-file", args.switch_file),
                                         ("--fusion-switch-file", args.fusion_switch_file),
                                         ("--fold-size-limit", args.fold_size_limit is not None))
                if given]
    if switched and args.job == "subgraph":
        raise OptionError(f"{', '.join(switched)}: for --job op; subgraph tuning searches which "
                          "rewrites the compile makes, and `graphopt optimize --tuning-db` "
                          "applies what it found")
    if args.job == "subgraph":
        from graphopt.cli_tune_subgraph import cmd_tune_subgraph
        return cmd_tune_subgraph(args, url)
    if args.objective != "estimate":
        raise OptionError("--objective measured is for --job subgraph; op tuning ranks "
                          "tilings of NPU kernels, which this machine cannot time")
    if args.granularity != "rule":
        raise OptionError("--granularity is for --job subgraph; op tuning has a study per "
                          "kernel signature")
    given = [flag for flag, value, default in (("--repeat", args.repeat, 20),
                                               ("--threads", args.threads, None))
             if value != default]
    if given:
        raise OptionError(f"{' and '.join(given)} time candidates of --job subgraph "
                          "--objective measured; op tuning ranks tilings by the cost model")
    # The compile whose kernels are tuned: the one `optimize` makes with the same options.
    result = optimize(args.model, level=args.level, input_shapes=args.input_shape,
                      target=args.target, pass_options=precision or None,
                      allow_custom_ops=args.allow_custom_ops, disable_passes=args.disable_pass,
                      switch_file=switch_file_of(args), fold_size_limit=args.fold_size_limit)
    partitioning = result.partitioning
    if not any(device.kind == "npu" for device in partitioning.target.devices):
        raise OptionError(f"--target {args.target} has no NPU: op tuning picks the tilings of "
                          "NPU cube kernels; on the CPU, --job subgraph tunes fusion and layout "
                          "decisions (--objective measured times them on this machine)")
    if not any(partitioning.target.device(p.device).kind == "npu"
               for p in partitioning.partitions):
        raise OptionError(f"--target {args.target}: no node of {args.model} runs on an NPU "
                          "device, so there is nothing to tune" + _hint(result))
    kernels = model_kernels(result.model, partitioning)
    idle = idle_kernels(result.model, partitioning)
    if idle:
        print(_idle_note(idle) + ("" if kernels else "; nothing to tune"
                                  + (f", so no --plot {args.plot}" if args.plot else "")))
        if not kernels:  # a model that compiles fine, whose cube kernels have no work
            return 0
    if not kernels:
        dynamic = any(v.static_shape is None for v in result.model.graph.inputs)
        raise OptionError(f"{args.model}: no NPU cube kernel (MatMul/Gemm/Conv with static "
                          "shapes) to tune" + (_hint(result) or (
                              "; pin dynamic dims with --input-shape" if dynamic else
                              "; its NPU ops run on the vector units, whose kernels have no "
                              "tiling to tune (--job subgraph tunes fusion decisions)")))
    if args.study and len(kernels) > 1:
        raise OptionError(f"--study {args.study}: the model has {len(kernels)} kernel "
                          "signatures, each needs its own study; drop --study")
    line = ProgressLine(not args.quiet)
    results = []
    # Opened here, so that a server that refuses the connection is named by the flag given;
    # closed after, leaving an SQLite file at rest. The line ends on Ctrl-C too: "graphopt:
    # interrupted" gets a line of its own.
    with opened(url, option=_storage_option(args)) as store, line:
        pooled = args.workers > 1 and len(kernels) > 1
        if pooled:  # each worker tunes its share of the kernels; their results are read below
            from graphopt.tuner.kernel_workers import tune_in_workers

            # Each worker tunes its kernels one after another, each up to --timeout.
            rounds = -(-len(kernels) // args.workers)
            line.begin(1, None if args.timeout is None else args.timeout * rounds)
            tune_in_workers(kernels, args.target, url, trials=args.trials, timeout=args.timeout,
                            seed=args.seed, sampler=args.sampler, workers=args.workers,
                            progress=lambda done, total: line.update(
                                f"{len(kernels)} kernels on {args.workers} workers  "
                                f"trial {done}/{total}", done, total))
        for i, group in enumerate(kernels, 1):
            def progress(done: int, total: int, best: float, i=i) -> None:
                line.update(f"kernel {i}/{len(kernels)}  trial {done}/{total}  "
                            f"best {best * 1e6:.2f} µs", done, total)

            if not pooled:
                line.begin(len(kernels), args.timeout)
            results.append(tune_kernel(
                group.shape, partitioning.target.device(group.device),
                trials=0 if pooled else args.trials, timeout=args.timeout, seed=args.seed,
                storage=store, study_name=args.study, sampler=args.sampler,
                progress=None if pooled else progress, target=args.target,
                op_class=group.signature.split("/")[1], workers=1 if pooled else args.workers))
        # What a compile with this knowledge base applies: the best stored tiling of each
        # kernel, which another study of the same kernel (--study NAME, an import) may hold.
        from graphopt.tuner.kb import tuned_tilings

        applied = tuned_tilings(url, result.model, partitioning, skipped=[])
        # The rows read again after that: another run on the same studies may have added
        # better trials meanwhile, and rows read as each kernel finished disagreed with the
        # whole-model line. Read after `applied`, a row can only be as fast or faster, so a
        # faster applied tiling is another study's.
        results = [tune_kernel(group.shape, partitioning.target.device(group.device),
                               trials=0, storage=store, study_name=args.study,
                               target=args.target, op_class=group.signature.split("/")[1])
                   for group in kernels]
    rows = [[g.signature, len(g.nodes), f"{r.default[1] * 1e6:.2f}", f"{r.best[1] * 1e6:.2f}",
             f"{r.speedup:.3f}", r.trials, str(r.best[0])] for g, r in zip(kernels, results)]
    print(format_table(["kernel signature", "nodes", "default µs", "tuned µs", "speedup",
                        "trials", "tuned tiling"], rows,
                       title=f"op tuning on {partitioning.target.shown} (estimates; {url})"))
    counted, elsewhere = {}, []  # the tiling a compile applies to each node, and where
    for group, found in zip(kernels, results):
        device = partitioning.target.device(group.device)
        for node in group.nodes:
            other = applied.get(node)
            if other is not None and other != found.best[0] and \
                    estimate(group.shape, other, device).seconds < found.best[1]:
                counted[node] = other
                elsewhere += [group.signature] if group.signature not in elsewhere else []
            else:
                counted[node] = found.best[0]
    before = model_estimate(result.model, partitioning).seconds
    after = model_estimate(result.model, partitioning, counted).seconds
    print(f"whole model (estimate): default {before * 1e6:.2f} µs, tuned {after * 1e6:.2f} µs, "
          f"{before / after:.3f}x")
    # A compile applies the tilings only when told where they are (AOE's bank is read by ATC
    # itself): the next step, spelled out.
    print(f"apply them: {_apply_line(args)}")
    if elsewhere:
        print(f"note: {len(elsewhere)} kernel(s) have a faster tiling in another study of "
              f"{url} (--study NAME, kb import), which a compile applies and the whole-model "
              f"figure counts: {', '.join(elsewhere[:3])}{', …' if len(elsewhere) > 3 else ''} "
              "(kb list shows it)")
    foreign = [name for r in results for name in r.foreign]
    if foreign:  # another Optuna client's or an edited trial: counted, never the best
        print(_left_out_note(foreign))
    if args.plot:
        from graphopt.tuner.history_plot import draw_histories

        draw_histories([(g.signature, r.history, r.default[1]) for g, r in zip(kernels, results)],
                       args.plot, kind="estimated")
        print(f"wrote {args.plot}")
    return 0


def _left_out_note(foreign: list[str]) -> str:
    """The note naming trials that record no tiling graphopt wrote ("study #number")."""
    return (f"note: left out {len(foreign)} trial(s) that record no tiling graphopt wrote "
            f"({', '.join(foreign[:3])}{', …' if len(foreign) > 3 else ''})")


def _apply_line(args) -> str:
    """The optimize command line that compiles the model with the tilings just stored."""
    import shlex

    from graphopt.tuner.storage import default_db_path

    stem = os.path.splitext(os.path.basename(args.model))[0]
    line = ["graphopt", "optimize", args.model, "-o", f"{stem}.om", "--target", args.target]
    # The kernels tuned are those of this compile (the int8 kernels of the int8 compile): the
    # same level, shapes, switches and precision make the same kernels.
    line += compile_flags(args)
    line += ["--tuning-db", named_storage(args) or default_db_path()]
    return shlex.join(line)


def _idle_note(nodes: list[str]) -> str:
    shown = ", ".join(nodes[:4]) + (f", +{len(nodes) - 4}" if len(nodes) > 4 else "")
    return (f"skipped {len(nodes)} NPU cube kernel(s) with a zero-size dim (no work, so no "
            f"tiling to tune): {shown}")


def _hint(result) -> str:
    from graphopt.partition.report import dynamic_hint

    hint = dynamic_hint(result.model, result.partitioning, result.log)
    return f": {hint}" if hint else ""


def add_kb_parser(sub) -> None:
    p = sub.add_parser("kb", help="list, export or import the tuning knowledge base",
                       description="The knowledge base is the tuning storage: one study per "
                                   "kernel signature (op tuning) and per model, target and "
                                   "level (subgraph tuning). Export writes each signature's "
                                   "best tiling as JSON; import adds them as completed trials.")
    kb_sub = p.add_subparsers(dest="kb_command", required=True, metavar="{list,export,import}")
    p.commands = kb_sub.choices  # for errors: `kb export`'s usage, not kb's
    ls = kb_sub.add_parser("list", help="one row per kernel signature, then the subgraph studies")
    ls.add_argument("--json", action="store_true",
                    help="print {\"kernels\": [...], \"subgraph_studies\": [...]} as JSON "
                         "(times in seconds) instead of the tables")
    _storage_args(ls, db_only=True)
    ls.set_defaults(func=_cmd_kb_list)
    ex = kb_sub.add_parser("export", help="write the best tilings as JSON")
    ex.add_argument("json", metavar="FILE.json", help="where to write it (- for standard "
                    "output)")
    _storage_args(ex, db_only=True)
    ex.set_defaults(func=_cmd_kb_export)
    im = kb_sub.add_parser("import", help="add a JSON export's tilings to the knowledge base")
    im.add_argument("json", type=path_text, metavar="FILE.json",  # '' said ": no such file"
                    help="the export to read (- for standard input, as from kb export -)")
    im.add_argument("--target", type=target_name, action="append", default=[],
                    metavar="PROFILE.json",
                    help="the profile of a custom target whose kernels the export holds "
                         "(repeat for several; built-in targets need none)")
    _storage_args(im, db_only=True)
    im.set_defaults(func=_cmd_kb_import)


def _cmd_kb_list(args) -> int:
    from graphopt.tuner.kb import list_kb, list_subgraph_studies
    from graphopt.tuner.storage import opened

    def us(seconds):
        return "" if seconds is None else f"{seconds * 1e6:.2f}"

    # A mistyped --tuning-db would otherwise become a new, empty database and an empty table.
    foreign: list[str] = []  # listed without them, as a compile leaves them out
    with opened(named_storage(args), option=_storage_option(args), read_only=True) as store:
        kernels, studies = list_kb(store, skipped=foreign), list_subgraph_studies(store)
    if args.json:
        print(json.dumps({"kernels": kernels, "subgraph_studies": studies,
                          "left_out_trials": foreign}, indent=2))
        return 0
    if not kernels and not studies:  # a table of headers alone reads as a failure
        print("no tuning results in it yet (`graphopt tune MODEL --target NAME "
              f"{_storage_option(args)} …` adds them)")
        return 0
    # A study `tune --study NAME` named shows that name beside its kernel's signature.
    rows = [[r["signature"] if r["study"] == r["signature"]
             else f"{r['signature']} (study {r['study']})", r["trials"],
             us(r["default_seconds"]), us(r["best_seconds"]),
             "" if r["speedup"] is None else f"{r['speedup']:.3f}", r["tiling"] or ""]
            for r in kernels]
    if rows:  # subgraph studies alone: no headers-only kernel table above theirs
        print(format_table(["kernel signature", "trials", "default µs", "best µs", "speedup",
                            "best tiling"], rows))
    if foreign:
        print(_left_out_note(foreign))
    stale = sum(bool(r.get("stale")) for r in kernels)
    if stale:
        print(f"note: {stale} kernel(s) hold figures another cost model priced (a knowledge "
              "base another graphopt version filled, or one tuned on an edited profile of "
              "the same name); the table shows this graphopt's prices of the default and of "
              "the stored tiling a compile applies (--json has the stored figures too)")
    if studies:  # the fusion decisions `tune --job subgraph` chose, one study per model
        if rows:
            print()
        print(format_table(["subgraph study", "trials", "default µs", "best µs"],
                           [[r["study"], r["trials"], us(r["default_seconds"]),
                             us(r["best_seconds"]) + ("" if r["confirmed"] else " (unconfirmed)")]
                            for r in studies]))
        if not all(r["confirmed"] for r in studies):
            print("note: an unconfirmed best is a measured run's that stopped before its "
                  "side-by-side re-timing; a compile does not apply it (tune again to confirm)")
    return 0


def _cmd_kb_export(args) -> int:
    from graphopt.tuner.kb import (export_kb, export_text, list_subgraph_studies,
                                   replacement_refusal)
    from graphopt.tuner.storage import opened, sqlite_path

    if args.json != "-":
        check_output_path("kb export", args.json,
                          {"the knowledge base": sqlite_path(named_storage(args))})
        refusal = replacement_refusal(args.json)
        if refusal:  # before the knowledge base is opened
            raise OptionError(f"kb export {args.json}: {refusal}")
    with opened(named_storage(args), option=_storage_option(args), read_only=True) as store:
        subgraph = len(list_subgraph_studies(store))
        # Said, not left to be found: moving a knowledge base by export and import keeps the
        # tilings only.
        left = (f" (not its {subgraph} subgraph study(ies): their decisions are keyed by the "
                "model file and tuned again with it)" if subgraph else "")
        foreign: list[str] = []  # exported without them, as a compile leaves them out
        if args.json == "-":  # to standard output, for a pipe; the count goes to stderr
            text, count = export_text(store, skipped=foreign)
            sys.stdout.write(text)
            print(f"exported {count} kernel(s){left}", file=sys.stderr)
        else:
            print(f"wrote {args.json}: {export_kb(store, args.json, skipped=foreign)} "
                  f"kernel(s){left}")
    if foreign:  # beside the count: standard output holds the export itself with `-`
        print(_left_out_note(foreign), file=sys.stderr if args.json == "-" else sys.stdout)
    return 0


def _cmd_kb_import(args) -> int:
    from graphopt.tuner.kb import ImportInterrupted, import_kb
    from graphopt.tuner.storage import check_writable, sqlite_path, storage_url

    # Checked, not opened: a JSON file import_kb refuses must not leave a new database behind.
    url = storage_url(named_storage(args), option=_storage_option(args))
    check_writable(named_storage(args), _storage_option(args))
    source = "standard input" if args.json == "-" else args.json
    from graphopt.partition import builtin_targets

    built_in = [name for name in args.target if name in builtin_targets()]
    if built_in:  # it would change nothing: a built-in target's kernels need no profile
        raise OptionError(f"--target {built_in[0]}: kb import takes the profile files of "
                          "custom targets the export names; built-in targets need none")
    counts: dict = {}
    try:
        added = import_kb(args.json, url, targets=args.target, counts=counts,
                          option=_storage_option(args))
    except ImportInterrupted as stopped:
        print(f"graphopt: interrupted after importing {stopped.added} of {stopped.total} "
              f"kernel(s) from {source}; run the import again to add the rest (kernels the "
              "knowledge base holds already are skipped)", file=sys.stderr)
        return 130
    if added or not counts.get("kernels"):
        why = "" if added or os.path.exists(sqlite_path(url) or "") else \
            " (it holds none: no knowledge base was created)"
    else:
        why = f" (the knowledge base holds the tilings of all {counts['kernels']} already)"
    print(f"imported {added} kernel tiling(s) from {source}{why}")
    legacy = counts.get("legacy") or []
    if legacy:  # an export of before 2026-12-07
        print(f"left out {len(legacy)} conv kernel(s) keyed without the conv's geometry "
              f"({legacy[0]}{', …' if len(legacy) > 1 else ''}), as graphopt wrote them before "
              "2026-12-07, tuned when a conv was priced as reading its im2col matrix from GM: "
              "no compile looks them up; `graphopt tune` the model again for them")
    return 0
