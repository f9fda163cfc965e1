"""`graphopt optimize`: compile an ONNX model into optimized ONNX or an .om artifact."""

from __future__ import annotations

import os
import shlex
import sys

from graphopt.cli_accuracy import print_accuracy
from graphopt.cli_paths import check_output_path
from graphopt.cli_precision import add_precision_args, precision_options
from graphopt.cli_types import (JoinedShapes, dynamic_dims, input_shapes, name_text, parse_size,
                                path_text, target_name, tolerance)
from graphopt.errors import OptionError, UsageError
from graphopt.help_format import HelpFormatter
from graphopt.option_names import flags_spelled, spelled
from graphopt.output_kind import check_file_name, writes_om, writes_onnx
from graphopt.progress import compile_progress

# The first also head the top-level --help's examples.
COMMON_EXAMPLES = """  graphopt optimize model.onnx -o model.om
  graphopt optimize model.onnx -o model.opt.onnx -O3 --verify
  graphopt optimize bert.onnx -o bert.om --input-shape "input_ids:1,128;attention_mask:1,128"
  graphopt optimize model.onnx -o model.om --target ascend310 --input-shape "x:1,3,224,224"
  graphopt optimize bert.onnx -o bert.om --dynamic-dims "batch_size:1,8;sequence_length:128,512"
"""
EXAMPLES = ("examples:\n" + COMMON_EXAMPLES
            + "  graphopt optimize resnet.onnx -o resnet.om --quantize int8 --calibration c.npz\n"
            + '  graphopt optimize yolo.onnx -o yolo.om --out-nodes "boxes;scores"\n')


def add_optimize_parser(sub) -> None:
    p = sub.add_parser(
        "optimize", help="optimize an ONNX model and write ONNX or an .om artifact",
        description="Import an ONNX model, run an optimization pipeline and write the result: "
                    "optimized ONNX for `-o x.onnx`, graphopt's artifact for `-o x.om`. "
                    "Ends with a summary of passes and op-type changes.",
        formatter_class=HelpFormatter, epilog=EXAMPLES)
    p.add_argument("model", type=path_text,
                   help="input .onnx file (external data next to it is loaded)")
    p.add_argument("-o", "--output", required=True, type=path_text, metavar="FILE",
                   help="output path: .onnx for ONNX, .om for the graphopt artifact")
    p.add_argument("-O", dest="level", type=int, default=2, choices=range(4), metavar="LEVEL",
                   help="optimization level 0-3 (default 2; 3 may change results by up to about "
                        "2e-5 of a layer's largest output: Winograd convs, Softplus, Mish; "
                        "`graphopt passes` lists the passes of each level)")
    add_pass_switches(p)
    p.add_argument("--input-shape", type=input_shapes, action=JoinedShapes, metavar="SHAPES",
                   help='pin input dims, ATC style: "x:1,3,224,224;mask:1,128" (-1 keeps a dim dynamic)')
    p.add_argument("--out-nodes", metavar="NAMES",
                   help='end the model at these tensors, ATC style: "boxes;Conv_12:0" (a '
                        'tensor name or node:index each); they become its outputs and what '
                        'only the others needed goes')
    p.add_argument("--insert-op-conf", type=path_text, metavar="FILE",
                   help="ATC's AIPP configuration: the inputs it names take uint8 frames "
                        "(RGB, XRGB, grey, or YUV420SP such as a decoder's NV12), cropped, "
                        "colour-converted and normalized in the model")
    p.add_argument("--input-fp16-nodes", metavar="NAMES",
                   help='ATC\'s --input_fp16_nodes: these float32 inputs take float16 ("x;y")')
    p.add_argument("--output-type", metavar="TYPE",
                   help="ATC's --output_type: FP16 or FP32 for every float output, or per "
                        'output ("logits:FP16;node:1:FP32")')
    p.add_argument("--dynamic-dims", type=dynamic_dims, metavar="DIMS",
                   help='compile one plan per shape profile into the .om, ATC style: '
                        '"batch:1,4,8;seq:128,512" (every combination) or '
                        '"batch=1,seq=512;batch=8,seq=128" (listed); a dim is a symbolic input '
                        'dim or INPUT[AXIS]. The runtime takes the profile the inputs match')
    add_fold_size_limit(p)
    p.add_argument("--verify", action="store_true",
                   help="run original and optimized with onnxruntime (no ORT optimizations; "
                        "after a lossy precision pass at ORT_ENABLE_ALL, judged by cosine) on "
                        "seeded inputs; fail and write nothing if outputs differ, or if the "
                        "optimized model does not load at ORT_ENABLE_ALL")
    p.add_argument("--inputs", type=path_text, metavar="NPZ",
                   help="with --verify: its inputs instead of random data, and the accuracy "
                        "report's (instead of the calibration samples)")
    p.add_argument("--rtol", type=tolerance, metavar="R",
                   help="relative tolerance for --verify (1e-4; after a lossy precision pass "
                        "--verify judges by cosine unless --rtol/--atol is given)")
    p.add_argument("--atol", type=tolerance, metavar="A",
                   help="absolute tolerance for --verify (1e-5)")
    p.add_argument("--dump-dir", type=path_text, metavar="DIR",
                   help="write the IR after import and after each pass, plus passes.json")
    p.add_argument("--dump-format", metavar="text|onnx|both",
                   help="--dump-dir files: printed IR (text, the default), ONNX that Netron "
                        "and `graphopt diff` read, weights shared in one weights.bin (onnx), "
                        "or both")
    p.add_argument("--verify-each", action="store_true",
                   help="verify the graph's structure after every pass")
    p.add_argument("--trace-rule", action="append", default=[], metavar="RULE",
                   help="report why RULE did not fire at its closest near-misses; repeatable")
    p.add_argument("--target", type=target_name, metavar="NAME|FILE",
                   help="compile for a target (`graphopt targets` lists them): nodes are placed on "
                        "its devices and an .om holds one model per device partition "
                        "(default: cpu for an .om, none for an .onnx)")
    # --storage as tune, kb and report spell a storage URL: it was an unrecognized argument.
    # One or the other, as there: given both, the last had won unsaid.
    storage = p.add_mutually_exclusive_group()
    storage.add_argument("--tuning-db", dest="tuning_db", type=path_text, metavar="FILE.db|URL",
                         help="apply what `graphopt tune` stored in this knowledge base: the "
                              "subgraph decisions tuned for this model, and tuned tilings in an "
                              "NPU .om's kernel configs")
    storage.add_argument("--storage", dest="storage_url", type=path_text, metavar="URL",
                         help="the same, as tune, kb and report spell a storage URL")
    p.add_argument("--memory-reorder", action="store_true",
                   help="reorder each partition's nodes to lower its peak work memory")
    p.add_argument("--memory-plot", type=path_text, metavar="FILE",
                   help="draw each partition's memory plan, tensors over time × address "
                        "(.png or .svg; with several plans, partitions or shape profiles, one "
                        "FILE-stem.<profile>.<partition>.ext each)")
    p.add_argument("--allow-custom-ops", action="store_true",
                   help="keep ops of unknown custom domains instead of refusing the model")
    add_precision_args(p)
    p.add_argument("-q", "--quiet", action="store_true",
                   help="print nothing but errors and warnings")
    p.set_defaults(func=_cmd_optimize)


def _cmd_optimize(args) -> int:
    # --storage is --tuning-db as tune, kb and report spell it: one keyword behind both, and
    # the messages name the flag given.
    given = "--storage" if args.storage_url else "--tuning-db"
    args.tuning_db = args.tuning_db or args.storage_url
    with flags_spelled({"--tuning-db": given}):
        return _optimize(args)


def _optimize(args) -> int:
    from graphopt.compile_memory import memory_plots
    from graphopt.compile_save import save
    from graphopt.ir.collector import collect_dropped
    from graphopt.ir.data_files import data_files
    from graphopt.passes.memory import draw_plan
    from graphopt.summary import format_summary

    # -o may replace the model itself (written atomically, read before); not its inputs.
    check_output_path("-o", args.output, _files_read(args))
    if args.memory_plot:
        check_output_path("--memory-plot", args.memory_plot, {"the model": args.model,
                                                              "-o": args.output})
    if not (writes_onnx(args.output) or writes_om(args.output)):
        raise UsageError(f"-o {args.output}: the output must end in .onnx or .om")
    check_file_name("-o", args.output)
    if args.memory_plot:
        check_file_name("--memory-plot", args.memory_plot)
    if args.dump_format and not args.dump_dir:
        raise OptionError(f"--dump-format {args.dump_format} needs --dump-dir, the directory to "
                          "dump into")
    for flag, path in (("-o", args.output), ("--memory-plot", args.memory_plot)):
        if args.dump_dir and path and os.path.realpath(path) == os.path.realpath(args.dump_dir):
            raise OptionError(f"--dump-dir {args.dump_dir}: the same path as {flag}; the dump "
                              "is a folder of files, the output one file")
    if args.inputs and not args.verify:
        raise OptionError("--inputs is only used with --verify")
    if args.trace_rule and args.quiet:  # the report would be computed and thrown away
        raise OptionError("--trace-rule prints a report, which -q (print nothing but errors) "
                          "would drop: give one or the other")
    for flag, value in (("--rtol", args.rtol), ("--atol", args.atol)):
        if value is not None and not args.verify:  # it would judge nothing, silently
            raise OptionError(f"{flag} is only used with --verify")
    if args.memory_plot and not args.memory_plot.lower().endswith((".png", ".svg")):
        raise UsageError(f"--memory-plot {args.memory_plot}: the picture must end in .png or .svg")
    if (args.memory_plot or args.memory_reorder) and not (args.target or writes_om(args.output)):
        raise OptionError("--memory-plot/--memory-reorder plan an artifact's memory: "
                          "write an .om or give --target")
    if args.tuning_db and not (args.target or writes_om(args.output)):
        raise OptionError(f"{spelled('--tuning-db')} applies what `graphopt tune` found for "
                          "a target: give --target or -o FILE.om")
    if args.dynamic_dims and not writes_om(args.output):
        raise OptionError(f"--dynamic-dims: -o {args.output}: the shape profiles are kept "
                          "together in an .om; ONNX holds one shape per model")
    target = args.target or ("cpu" if writes_om(args.output) else None)
    pass_options = precision_options(args) or None
    if args.no_accuracy_report and not pass_options:  # it would change nothing
        raise OptionError("--no-accuracy-report applies to a --precision or --quantize compile "
                          "(a compile that keeps the model's dtypes prints no accuracy report)")
    with compile_progress(not args.quiet):  # a line on a terminal for long steps
        result = _compiled(args, target, pass_options)
    # An NPU .om's compile says what it applied of the tilings; a CPU .om has none to apply.
    npu = result.partitioning is not None and any(
        device.kind == "npu" for device in result.partitioning.target.devices)
    if args.tuning_db and result.tuned_study is None and not args.quiet and \
            (not writes_om(args.output) or not npu) and \
            not any(note.startswith(f"{spelled('--tuning-db')} holds")
                    for note in result.notes):
        tilings = ("kernel tilings go into an .om only" if not writes_om(args.output) else
                   f"the {target} target has no NPU kernels to take tilings")
        result.notes.append(f"{spelled('--tuning-db')}: nothing in it applies to "
                            f"{args.output}: no subgraph decisions for this model on {target} "
                            f"at -O{args.level} (`graphopt tune --job subgraph` makes them), "
                            f"and {tilings}")
    # Under -q too: its table is left out, not its warning of a cosine below the rule.
    report = bool(pass_options) and not args.no_accuracy_report
    source = _overwritten_source(args) if report else None
    in_place = os.path.exists(args.output) and os.path.samefile(args.model, args.output)
    weights_files = data_files(args.model) if in_place else set()
    # Checked before the model is written: a compile that fails writes nothing. A picture per
    # partition takes a name made from FILE's (p.p0_npu.svg), checked as FILE was: one had
    # replaced the input model of that name, or failed as a directory after the .om was written.
    plots = memory_plots(result, args.memory_plot) if args.memory_plot else []
    for path, _, _ in plots:
        if path != args.memory_plot:
            check_output_path("--memory-plot", path, {"the model": args.model,
                                                      "-o": args.output, **_files_read(args)})
    written_check = None
    if args.verify and writes_om(args.output):  # the artifact itself is run before it lands
        from graphopt.atomic import checked_before_replace
        from graphopt.cli_verify_om import artifact_check

        written_check = artifact_check(args)
        with checked_before_replace(written_check):
            save(result, args.output)
    else:
        save(result, args.output)  # with the tilings of the --tuning-db optimize read
    for path, title, plan in plots:
        draw_plan(plan, path, title=title)
    # Only a compile over its own input can leave a weights file unread; reading the output
    # back otherwise cost its size in memory (a 2.6 GiB model's .om: 3.3 GB peak, not 1.2).
    unread = sorted(_shown_path(path) for path in weights_files - data_files(args.output)) \
        if weights_files else []
    if unread:  # not deleted: another model may read them too
        result.notes.append(f"{', '.join(unread)}: the weights file of the model -o replaced, "
                            f"which {args.output} no longer reads: delete it if no other model "
                            "does")
    idle = _idle_device(result, compile_flags(args))
    if idle:  # on stderr, and under -q too: the flag asked for a device the artifact never uses
        print(f"graphopt: warning: {idle}", file=sys.stderr)
    if not args.quiet:
        print(format_summary(result, args.output, compile_flags(args)))
        if written_check is not None and written_check.measured:
            # The summary's error is the compiled model's on one thread: the file's may differ
            # in its last bits (0 against 0.0028 on YOLO's 900-pixel boxes).
            where = ("the same inputs, and seeded ones at each shape profile's shapes"
                     if len(result.profiles) > 1 else "the same inputs")
            print(f"{args.output} as written: max abs error "
                  f"{max(written_check.measured.values()):.3g} on {where}, run by "
                  "graphopt's runtime")
            for note in written_check.notes:  # why an error past rtol/atol was accepted
                print(f"verify ({args.output} as written): {note}")
        for path, _, _ in plots:  # after the summary, whose memory lines they draw
            print(f"wrote {path}")
    else:  # "print nothing on success": an output that will not load is not quite that
        from graphopt.compile_checks import UNLOADABLE_NOTE

        for note in result.notes:
            if note.startswith(UNLOADABLE_NOTE):
                print(f"graphopt: warning: {note}", file=sys.stderr)
    if report:  # under -q, its warning alone: an output below the rule is not "success" either
        # The model is written: its IR's memory goes to the report's onnxruntime sessions
        # (0.6 GB less at the peak on a BERT-base --precision fp16 compile).
        from graphopt.tools.accuracy_rule import lossy_passes

        changed = lossy_passes(result.log.to_json()["passes"])
        fitted = _fitted_ranges(result)
        del result, plots
        collect_dropped()
        print_accuracy(args, source, changed, fitted, warnings_only=args.quiet)
    return 0


def add_pass_switches(p, scope: str = "") -> None:
    """--disable-pass and the switch files, which optimize, bisect and diff --pass take alike;
    `scope` starts each help text (diff's "with --pass: ")."""
    p.add_argument("--disable-pass", action="append", default=[], type=name_text,
                   metavar="NAME",
                   help=f"{scope}skip a pass (or one rule of a pass) by name; repeatable")
    switches = p.add_mutually_exclusive_group()  # both given, one would be dropped
    switches.add_argument("--switch-file", type=path_text, metavar="FILE",
                          help=f"{scope}file of `PassName: on|off` lines (or JSON) switching "
                               "passes off")
    switches.add_argument("--fusion-switch-file", type=path_text, metavar="FILE",
                          help=f"{scope}same as --switch-file (ATC's spelling)")


def add_fold_size_limit(p, scope: str = "") -> None:
    p.add_argument("--fold-size-limit", type=parse_size, metavar="BYTES",
                   help=f"{scope}largest tensor constant folding may create that is larger "
                        "than what it folds away (default 1M; suffix K/M/G)")


def _compiled(args, target, pass_options):
    """The compile the command line asks for."""
    from graphopt.compiler import optimize

    return optimize(args.model, level=args.level, disable_passes=args.disable_pass,
                    switch_file=switch_file_of(args), input_shapes=args.input_shape,
                    fold_size_limit=args.fold_size_limit, verify=args.verify,
                    inputs=args.inputs, rtol=args.rtol, atol=args.atol,
                    dump_dir=args.dump_dir, dump_format=args.dump_format or "text",
                    verify_structure=args.verify_each,
                    allow_custom_ops=args.allow_custom_ops, trace_rules=args.trace_rule,
                    target=target, memory_reorder=args.memory_reorder,
                    pass_options=pass_options, dynamic_dims=args.dynamic_dims,
                    tuning_db=args.tuning_db, out_nodes=args.out_nodes,
                    insert_op_conf=args.insert_op_conf,
                    input_fp16_nodes=args.input_fp16_nodes, output_type=args.output_type)


def _idle_device(result, flags: list[str]) -> str | None:
    """Why the artifact of a compile for an NPU target runs nothing on its NPU, or None: a
    note among many said it (122 nodes of a ResNet with an open batch), and exit 0 read as
    a device compile. The reasons are counted in the line itself: the notes name some of
    them only (an LSTM without a kernel, none). `flags`: compile_flags, which the partition
    command it suggests takes."""
    from graphopt.partition.report import reason_counts
    from graphopt.partition.target import as_given

    partitioning = result.partitioning
    # A graph of no node (or Constants alone) has no work that could have run on the NPU.
    if partitioning is None or not partitioning.fallbacks():
        return None
    target = partitioning.target
    primary = target.device(target.primary)
    if primary.kind != "npu" or any(target.device(p.device).kind == "npu"
                                    for p in partitioning.partitions):
        return None
    nodes = sum(p.node_count() for p in partitioning.partitions)
    source = shlex.quote(result.source_label) if result.source_label != "<model>" else "MODEL"
    if result.profiles:  # the partitioning shown is the first profile's: pin its shapes
        from graphopt.input_shapes import format_input_shapes

        pinned = format_input_shapes(result.profiles[0].profile.input_shapes)
        kept = [f for f, before in zip(flags, [None, *flags]) if "--input-shape" not in (f, before)]
        flags = [*kept, "--input-shape", pinned]
    again = shlex.join(["--target", as_given(target), *flags])
    return (f"--target {as_given(target)}: all {nodes} node(s) run on the host "
            f"{target.host}, none on the {primary.name} ({reason_counts(partitioning)}; "
            f"`graphopt partition {source} {again}` lists each one)")


def _files_read(args) -> dict[str, str | list[str] | None]:
    """The files optimize reads besides the model, by the option that names them."""
    from graphopt.cli_precision import keep_dtype_files
    from graphopt.partition import builtin_targets

    tuning_db = None
    if args.tuning_db:  # sqlite:///kb.db names a file too; a server's URL none
        from graphopt.tuner.storage import sqlite_path

        tuning_db = sqlite_path(args.tuning_db)
    return {"--inputs": args.inputs, "--calibration": args.calibration,
            "--switch-file": args.switch_file, "--fusion-switch-file": args.fusion_switch_file,
            "--insert-op-conf": args.insert_op_conf,
            "--target": None if args.target in (None, *builtin_targets()) else args.target,
            "--keep-dtype": keep_dtype_files(args.keep_dtype), spelled("--tuning-db"): tuning_db}


def compile_flags(args) -> list[str]:
    """The flags of a parsed command line that decide what its compile makes (level, pinned
    shapes, pass switches, precision), for a command that prints another command of the same
    compile: tune's `apply them:` line, optimize's `graphopt partition …` hint."""
    from graphopt.cli_precision import precision_argv

    flags = [f"-O{args.level}"] if args.level != 2 else []
    if args.input_shape:
        flags += ["--input-shape", args.input_shape]
    for name in args.disable_pass:
        flags += ["--disable-pass", name]
    if args.switch_file or args.fusion_switch_file:
        flags += ["--switch-file", args.switch_file or args.fusion_switch_file]
    if args.fold_size_limit is not None:
        flags += ["--fold-size-limit", str(args.fold_size_limit)]
    if args.allow_custom_ops:
        flags.append("--allow-custom-ops")
    return flags + precision_argv(args)


def switch_file_of(args) -> str | None:
    """--switch-file, or --fusion-switch-file read first so that its errors name that flag."""
    if args.fusion_switch_file:
        from graphopt.switches import read_switch_file

        read_switch_file(args.fusion_switch_file, spelled("--fusion-switch-file"))
    return args.switch_file or args.fusion_switch_file


def _shown_path(path: str) -> str:
    """`path` relative to the working folder where it lies below it."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _overwritten_source(args):
    """The input model, read before -o overwrites it (None when -o is another file): the
    accuracy report must compare the output with the model as it was, not with itself."""
    from graphopt.tools.compare_run import load_reference

    if not (os.path.exists(args.output) and os.path.samefile(args.model, args.output)):
        return None
    return load_reference(args.model).proto


def _fitted_ranges(result) -> bool:
    """Whether int8 fitted activation ranges to the calibration data: a static layer's
    QuantizeLinear holds one, where a dynamic MatMul measures its input on every run."""
    return any(record.name == "QuantizeInt8" and record.stats.get("QuantizeLinear")
               for record in result.log.records)
