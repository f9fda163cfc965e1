"""The `graphopt` command: thin argument parsing over the library."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import threading

from graphopt import __version__
from graphopt.cli_atc import add_atc_parser
from graphopt.cli_bisect import add_bisect_parser
from graphopt.cli_calibrate import add_calibrate_parser
from graphopt.cli_compare import add_compare_parser
from graphopt.cli_diff import add_diff_parser
from graphopt.cli_partition import add_partition_parser
from graphopt.cli_paths import check_output_path
from graphopt.output_kind import check_file_name, writes_om, writes_onnx
from graphopt.cli_precision import add_precision_args, precision_options
from graphopt.cli_profile import add_profile_parser
from graphopt.cli_report import add_report_parser
from graphopt.cli_run import add_inspect_parser, add_run_parser
from graphopt.cli_streams import streams_as_files
from graphopt.cli_targets import add_targets_parser
from graphopt.cli_tune import add_kb_parser, add_tune_parser
from graphopt.atc_flags import ATC_ONLY, JSON_FILE, atc_hints
from graphopt.cli_types import (dynamic_dims, input_shapes, name_text, path_text, target_name,
                                tolerance)
from graphopt.errors import GraphoptError, OptionError, UsageError, interrupt_behind
from graphopt.help_format import CommandsHelpFormatter, HelpFormatter
from graphopt.option_names import command_line
from graphopt.terminal_text import (ClosedStreamError, OutputFailed, ReaderGone, escaped_output,
                                    paths_shown_as, silence_stdout)

EXAMPLES = """examples:
  graphopt optimize model.onnx -o model.om
  graphopt optimize model.onnx -o model.opt.onnx -O3 --verify
  graphopt optimize bert.onnx -o bert.om --input-shape "input_ids:1,128;attention_mask:1,128"
  graphopt optimize model.onnx -o model.om --target ascend310 --input-shape "x:1,3,224,224"
  graphopt optimize bert.onnx -o bert.om --dynamic-dims "batch_size:1,8;sequence_length:128,512"
  graphopt partition model.onnx --target ascend310
  graphopt targets ascend910b
  graphopt tune model.onnx --target ascend310 --tuning-db tuning.db --trials 50
  graphopt inspect model.om
  graphopt run model.om --inputs x.npz --repeat 100
  graphopt passes
  graphopt zoo build resnet50 -o resnet50.onnx
"""


def parse_size(text: str) -> int:
    """Bytes with an optional K/M/G suffix (powers of 1024)."""
    from graphopt.api_args import parse_size as parse

    try:
        return parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_optimize(sub) -> None:
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
                   help="optimization level 0-3 (default 2; 3 may change results in the last "
                        "bits; `graphopt passes` lists the passes of each level)")
    p.add_argument("--disable-pass", action="append", default=[], type=name_text,
                   metavar="NAME",
                   help="skip a pass by name; repeatable")
    switches = p.add_mutually_exclusive_group()  # both given, one would be dropped
    switches.add_argument("--switch-file", type=path_text, metavar="FILE",
                          help="file of `PassName: on|off` lines (or JSON) switching passes off")
    p.add_argument("--input-shape", type=input_shapes, metavar="SHAPES",
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
    p.add_argument("--fold-size-limit", type=parse_size, metavar="BYTES",
                   help="largest tensor constant folding may create (default 1M; suffix K/M/G)")
    p.add_argument("--verify", action="store_true",
                   help="run original and optimized with onnxruntime (no ORT optimizations) on "
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
    switches.add_argument("--fusion-switch-file", type=path_text, metavar="FILE",
                          help="same as --switch-file (ATC's spelling)")
    p.add_argument("--target", type=target_name, metavar="NAME|FILE",
                   help="compile for a target (`graphopt targets` lists them): nodes are placed on "
                        "its devices and an .om holds one model per device partition")
    p.add_argument("--tuning-db", type=path_text, metavar="FILE.db|URL",
                   help="apply what `graphopt tune` stored in this knowledge base: the subgraph "
                        "decisions tuned for this model, and tuned tilings in an NPU .om's "
                        "kernel configs")
    p.add_argument("--memory-reorder", action="store_true",
                   help="reorder each partition's nodes to lower its peak work memory")
    p.add_argument("--memory-plot", type=path_text, metavar="FILE",
                   help="draw each partition's memory plan, tensors over time × address "
                        "(.png or .svg; one file per partition when there are several)")
    p.add_argument("--allow-custom-ops", action="store_true",
                   help="keep ops of unknown custom domains instead of refusing the model")
    add_precision_args(p)
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    p.set_defaults(func=_cmd_optimize)


def _cmd_optimize(args) -> int:
    from graphopt.compile_memory import memory_plots
    from graphopt.compile_save import save
    from graphopt.compiler import optimize
    from graphopt.ir.collector import collect_dropped
    from graphopt.passes.memory import draw_plan
    from graphopt.summary import format_summary

    # -o may replace the model itself (written atomically, read before); not its inputs.
    check_output_path("-o", args.output, _files_read(args))
    if args.memory_plot:
        check_output_path("--memory-plot", args.memory_plot, {"the model": args.model,
                                                              "-o": args.output})
    if not (writes_onnx(args.output) or writes_om(args.output)):
        raise OptionError(f"-o {args.output}: the output must end in .onnx or .om")
    check_file_name("-o", args.output)
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
        raise OptionError(f"--memory-plot {args.memory_plot}: the picture must end in .png or .svg")
    if (args.memory_plot or args.memory_reorder) and not (args.target or writes_om(args.output)):
        raise OptionError("--memory-plot/--memory-reorder plan an artifact's memory: "
                          "write an .om or give --target")
    if args.tuning_db and not (args.target or writes_om(args.output)):
        raise OptionError("--tuning-db applies what `graphopt tune` found for a target: give "
                          "--target or -o FILE.om")
    if args.dynamic_dims and not writes_om(args.output):
        raise OptionError(f"--dynamic-dims: -o {args.output}: the shape profiles are kept "
                          "together in an .om; ONNX holds one shape per model")
    target = args.target or ("cpu" if writes_om(args.output) else None)
    pass_options = precision_options(args) or None
    if args.no_accuracy_report and not pass_options:  # it would change nothing
        raise OptionError("--no-accuracy-report applies to a --precision or --quantize compile "
                          "(a float32 compile prints no accuracy report)")
    result = optimize(args.model, level=args.level, disable_passes=args.disable_pass,
                      switch_file=_switch_file(args), input_shapes=args.input_shape,
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
    if args.tuning_db and result.tuned_study is None and not args.quiet and \
            not writes_om(args.output) and \
            not any(note.startswith("--tuning-db holds") for note in result.notes):
        result.notes.append(f"--tuning-db: nothing in it applies to {args.output}: no subgraph "
                            f"decisions for this model on {target} at -O{args.level} (`graphopt "
                            "tune --job subgraph` makes them), and kernel tilings go into an .om "
                            "only")
    report = bool(pass_options) and not args.no_accuracy_report and not args.quiet
    source = _overwritten_source(args) if report else None
    # Checked before the model is written: a compile that fails writes nothing.
    plots = memory_plots(result, args.memory_plot) if args.memory_plot else []
    if args.verify and writes_om(args.output):  # the artifact itself is run before it lands
        from graphopt.atomic import checked_before_replace
        from graphopt.cli_verify_om import artifact_check

        with checked_before_replace(artifact_check(args)):
            save(result, args.output)
    else:
        save(result, args.output)  # with the tilings of the --tuning-db optimize read
    for path, title, plan in plots:
        draw_plan(plan, path, title=title)
        if not args.quiet:
            print(f"wrote {path}")
    if not args.quiet:
        print(format_summary(result, args.output))
        if report:
            # The model is written: its IR's memory goes to the report's onnxruntime sessions
            # (0.6 GB less at the peak on a BERT-base --precision fp16 compile).
            from graphopt.tools.accuracy_rule import lossy_passes

            changed = lossy_passes(result.log.to_json()["passes"])
            fitted = _fitted_ranges(result)
            del result, plots
            collect_dropped()
            _print_accuracy(args, source, changed, fitted)
            return 0
    else:  # "print nothing on success": an output that will not load is not quite that
        from graphopt.compile_checks import UNLOADABLE_NOTE

        for note in result.notes:
            if note.startswith(UNLOADABLE_NOTE):
                print(f"graphopt: warning: {note}", file=sys.stderr)
    return 0


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
            "--keep-dtype": keep_dtype_files(args.keep_dtype), "--tuning-db": tuning_db}


def _switch_file(args) -> str | None:
    """--switch-file, or --fusion-switch-file read first so that its errors name that flag."""
    if args.fusion_switch_file:
        from graphopt.switches import read_switch_file

        read_switch_file(args.fusion_switch_file, "--fusion-switch-file")
    return args.switch_file or args.fusion_switch_file


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


def _print_accuracy(args, source=None, changed=("QuantizeInt8", "QuantizeInt4Weights"),
                    fitted_ranges: bool = True) -> None:
    """The accuracy report of the written model against the input (`source`, its proto as read
    before the output overwrote it, when it did), on --verify's inputs, the first calibration
    samples or seeded random data; a failure to run it is a warning, the model is written.
    `changed`: the lossy passes that changed the model (a note says what was fitted to the
    calibration data only when something was)."""
    from graphopt.errors import GraphoptError
    from graphopt.tools.accuracy import SeededInputsRefused, accuracy_report

    # What --verify ran on (inputs the user chose, which a quantization may not have seen),
    # else the first calibration samples, else random data.
    calibration = None if args.inputs else args.calibration
    reference = args.model if source is None else source
    try:
        if _edited(args):  # what the written model is compared with
            from graphopt.source_edits import edited_source, given_edits

            reference = edited_source(reference, label=args.model, **given_edits(args))
        report = accuracy_report(reference, args.output,
                                 args.inputs, calibration=calibration,
                                 reference_label=_edited_label(args),
                                 input_shapes=None if calibration or args.inputs
                                 else args.input_shape)
    except GraphoptError as e:
        hint = ("; --calibration FILE.npz or --verify --inputs FILE.npz give it inputs the model "
                "runs on" if isinstance(e, SeededInputsRefused) else "")
        print(f"graphopt: warning: no accuracy report: {e}{hint}", file=sys.stderr)
        return
    print()
    print(report.format())
    _below_the_rule(args, report)
    pass_name = "QuantizeInt8" if args.quantize == "int8" else "QuantizeInt4Weights"
    if calibration and (args.quantize == "int8" or args.int4_method == "gptq") \
            and pass_name in changed and (fitted_ranges or args.quantize != "int8"):
        fitted = "its int8 ranges were" if args.quantize == "int8" else "GPTQ's rounding was"
        print(f"note: measured on the calibration data, which {fitted} fitted to; inputs "
              "it did not see may agree less (--verify --inputs FILE.npz reports on those)")
    if _runs_on_this_cpu(args):
        _print_speed(args, reference, report.feeds, changed)


def _edited(args) -> bool:
    """Whether the compile edits its source before any pass (what it is compared with)."""
    from graphopt.source_edits import given_edits

    return bool(given_edits(args))


def _edited_label(args) -> str:
    """The input model's name in the accuracy report, saying how the compile edited it."""
    edits = [edit for edit, given in (("ended at --out-nodes", args.out_nodes),
                                      ("with --insert-op-conf's preprocessing",
                                       args.insert_op_conf),
                                      ("with the dtypes of --input-fp16-nodes/--output-type",
                                       args.input_fp16_nodes or args.output_type)) if given]
    return " ".join([args.model, *edits])


def _runs_on_this_cpu(args) -> bool:
    """Whether the written model runs on this machine's CPU as it would deployed: compiled for
    a CPU target or for none (an NPU target's form runs on a stand-in here)."""
    if not args.target:
        return True
    from graphopt.partition.target import load_target

    target = load_target(args.target)
    return target.device(target.primary).kind == "cpu"


def _print_speed(args, source, feeds, changed=("QuantizeInt8", "QuantizeInt4Weights",
                                               "ConvertPrecision")) -> None:
    """The written model's run time against the source's, and a warning when it is slower: a
    quantization that runs slower than float (onnxruntime's int8 depthwise convolutions, a
    float first layer between int8 ones) said nothing of it. The reason given is the precision
    pass's only where it changed the model (`changed`, the lossy passes that did)."""
    from graphopt.tools.speed_check import speed_check

    try:
        check = speed_check(source, args.output, feeds)
    except Exception as e:  # noqa: BLE001 -- a check after the model is written warns only
        print(f"graphopt: warning: no speed check: {type(e).__name__}: {e}", file=sys.stderr)
        return
    source_label = (args.model if isinstance(source, (str, os.PathLike))
                    else _edited_label(args) if _edited(args)
                    else f"{args.model} as it was before -o replaced it")
    print(check.format(source_label, args.output))
    if not check.slower:
        return
    if not changed:  # 4-bit unpacking blamed on a model with no 4-bit weight
        why = ("no precision pass changed the model, so the precision mode is not why (small "
               "models' times vary from run to run)")
    elif "QuantizeInt8" in changed:
        ends = "" if getattr(args, "quantize_ends", False) else \
            ", --quantize-ends quantizes the first and last"  # not advice already taken
        why = ("onnxruntime's int8 kernels gain on large convolutions and GEMMs, less on "
               "depthwise convolutions and small layers, and a layer left float next to int8 "
               f"ones adds conversions (--quant-skip keeps more layers float{ends})")
    elif "QuantizeInt4Weights" in changed:
        why = "4-bit weights save memory; their unpacking can cost time on small layers"
    else:
        why = ("onnxruntime's CPU provider computes many half-precision ops through casts to "
               "float32; the mode pays off on hardware with half-precision kernels")
    print(f"warning: {args.output} runs slower than {args.model} on this machine: {why}")


def _below_the_rule(args, report) -> None:
    """Warn of an output whose cosine is below the rule compare and --verify judge this lossy
    compile by (0.999, 0.98 after int4): the table shows the figure, but an exit 0 read as
    fine (entropy ranges took a random-weight MobileNetV2 to 0.96)."""
    from graphopt.tools.accuracy_rule import LOSSY_PASSES
    from graphopt.tools.rule_text import cosine_text, exact

    threshold = LOSSY_PASSES["QuantizeInt4Weights" if args.quantize == "int4" else
                             "QuantizeInt8"]
    changed = [o for o in report.outputs if o.differ]
    if changed:  # compare and --verify require these equal: a class id that flipped fails
        shown = ", ".join(f"'{o.name}' {o.note}" for o in changed[:5])
        print(f"warning: output(s) of integers, bools or strings changed, which `graphopt "
              f"compare` and --verify require equal: {shown}")
    low = [o for o in report.outputs if o.cosine is not None and o.cosine < threshold]
    if not low:
        return
    hint = ("; another --calibration-method may keep more (minmax is the default)"
            if args.quantize == "int8" and args.calibration_method not in (None, "minmax")
            else "")
    shown = ", ".join(f"'{o.name}' {cosine_text(o.cosine, threshold)}" for o in low[:5])
    more = f", and {len(low) - 5} more (in the table)" if len(low) > 5 else ""
    print(f"warning: cosine below {exact(threshold)}, the rule `graphopt compare` and --verify "
          f"judge this compile by: {shown}{more}{hint}")


def _add_passes(sub) -> None:
    p = sub.add_parser("passes", help="list passes and optimization levels",
                       description="List every pass with its description and the pipelines "
                                   "that the -O levels run.")
    p.set_defaults(func=_cmd_passes)


def _cmd_passes(args) -> int:
    from graphopt.help_format import first_sentence
    from graphopt.passes import PASSES, PIPELINES, FixedPoint
    from graphopt.table import format_table

    rows = [[name, cls.description] for name, cls in sorted(PASSES.items())]
    print(format_table(["pass", "what it does"], rows))
    print()
    rule_rows = []
    for name, cls in sorted(PASSES.items()):
        for rule in getattr(cls, "rules", ()):
            rule_rows.append([rule.name, name, first_sentence(rule.__doc__ or "", 160)])
    if rule_rows:
        print(format_table(["rule", "pass", "matches"], rule_rows))
    print()
    for level, pipeline in PIPELINES.items():
        print(f"-O{level}  {pipeline.description}")
        for step in pipeline.steps:
            if isinstance(step, FixedPoint):
                print(f"       repeat until no change: {', '.join(step.passes)}")
            else:
                print(f"       {step}")
    print("\nWith --target cpu (the default for an .om), -O3 runs WinogradConv before the final "
          "cleanup: wide\n3×3 convs as Winograd GEMMs (results within ~2e-5 of each layer's "
          "outputs). On a CPU with\nAVX2 or AVX-512F, -O2 and -O3 then run LayoutNchwc: conv nets "
          "blocked into onnxruntime's\nNCHWc ops offline.")
    return 0


def _add_zoo(sub) -> None:
    p = sub.add_parser("zoo", help="list or build the bundled benchmark models",
                       description="Deterministic model builders (no downloads) that look like "
                                   "PyTorch exports.")
    zoo_sub = p.add_subparsers(dest="zoo_command", required=True, metavar="{list,build}")
    p.commands = zoo_sub.choices  # for errors: `zoo build`'s usage, not zoo's
    zoo_sub.add_parser("list", help="list the models").set_defaults(func=_cmd_zoo_list)
    build = zoo_sub.add_parser("build", help="build one model into an .onnx file",
                               description="Build a zoo model (seeded weights, no download) "
                                           "and write it as ONNX.")
    build.add_argument("name", help="model name from `graphopt zoo list`")
    build.add_argument("-o", "--output", required=True, type=path_text, metavar="FILE",
                       help="output .onnx path")
    build.set_defaults(func=_cmd_zoo_build)


def _cmd_zoo_list(args) -> int:
    from graphopt import zoo
    from graphopt.table import format_table

    print(format_table(["model", "description"], [list(row) for row in zoo.list_models()]))
    return 0


def _cmd_zoo_build(args) -> int:
    from graphopt import zoo
    from graphopt.atomic import atomic_write_bytes

    if os.path.isdir(args.output):
        raise OptionError(f"-o {args.output}: is a directory, expected a file path")
    if not writes_onnx(args.output):
        raise OptionError(f"-o {args.output}: zoo build writes ONNX (name it .onnx); compile it "
                          "to an .om with graphopt optimize")
    try:
        proto = zoo.build(args.name)
    except KeyError:
        names = ", ".join(name for name, _ in zoo.list_models())
        raise OptionError(f"zoo: unknown model '{args.name}' (known: {names})") from None
    try:
        atomic_write_bytes(args.output, proto.SerializeToString())
    except OSError as e:
        raise OptionError(f"-o {args.output}: cannot write it ({e.strerror or e})") from None
    print(f"wrote {args.output}: {len(proto.graph.node)} nodes")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with graphopt's one-line error format (exit status 2 for usage errors), and
    without abbreviated options: `run --output y.npz` quietly meant `--outputs`, and a later
    option sharing a prefix would change what a script's abbreviation means."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.given: list[str] = []

    def parse_known_args(self, args=None, namespace=None):
        self.given = list(sys.argv[1:] if args is None else args)  # for error()'s hints
        return super().parse_known_args(args, namespace)

    def error(self, message: str):  # type: ignore[override]
        if self.prog == "graphopt":  # no or unknown command: the usage line is the best help
            self.print_usage(sys.stderr)
            self.exit(2, f"graphopt: error: {_command_hint(message, self.given)}\n")
        command = self.prog.removeprefix("graphopt ")
        if command == "inspect" and message.startswith("argument --json: ignored explicit"):
            message += f" (--json=FILE is {JSON_FILE})"  # atc --mode=1 --json=x.json pasted
        if message.startswith("the following arguments are required"):
            # A pasted atc command line names its model with --model=: argparse stops at the
            # missing positional, before the unrecognized flags _parse would give hints for.
            hints = atc_hints(self, self.given)
            message += f" ({'; '.join(hints)})" if hints else ""
        message += _precision_hint(message)
        self.exit(2, f"graphopt: error: {command}: {message} (see {self.prog} --help)\n")


def _command_hint(message: str, given: list[str]) -> str:
    """argparse's error about graphopt's command, with what was meant: the command a typo is
    closest to, or, for options given before any command, that the command comes first."""
    import difflib
    import shlex

    found = re.match(r"argument COMMAND: invalid choice: '([^']*)' \(choose from (.*)\)$",
                     message)
    if found:
        close = difflib.get_close_matches(found.group(1), re.findall(r"'([^']+)'",
                                                                     found.group(2)), n=1)
        return message + (f"; did you mean {close[0]}?" if close else "")
    options = [arg for arg in given if arg.startswith("-")]
    if message.startswith("the following arguments are required") and options:
        flag = options[0].split("=", 1)[0]
        if flag == "--model" or flag in ATC_ONLY:  # a whole atc command line, pasted
            return (f"{flag} is ATC's: graphopt atc takes an atc command line as it is "
                    f"(graphopt atc {shlex.join(given)})")
        return (f"{options[0]} is not an option of graphopt itself: the command comes first "
                f"(graphopt COMMAND {options[0]} …; graphopt --help lists the commands)")
    return message


def _precision_hint(message: str) -> str:
    """What a --precision choice that is not one means in graphopt's flags: quantization is
    --quantize, and mixed precision names its half type."""
    found = re.match(r"argument --precision: invalid choice: '([^']*)'", message)
    if not found:
        return ""
    wanted = found.group(1).lower()
    if wanted in ("int8", "int4"):
        return (f" ({wanted} is quantization: --quantize {wanted}"
                + (" --calibration DATA" if wanted == "int8" else "") + ")")
    if wanted in ("mixed", "mix"):
        return " (mixed precision names its half type: mixed-fp16 or mixed-bf16)"
    return ""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="graphopt",
        description="graphopt: an ahead-of-time graph compiler for ONNX models.",
        formatter_class=CommandsHelpFormatter, epilog=EXAMPLES)
    parser.add_argument("--version", action="version", version=f"graphopt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=_Parser)
    _add_optimize(sub)
    add_partition_parser(sub)
    add_targets_parser(sub)
    add_calibrate_parser(sub)
    add_tune_parser(sub)
    add_kb_parser(sub)
    add_run_parser(sub)
    add_profile_parser(sub)
    add_inspect_parser(sub)
    add_compare_parser(sub)
    add_diff_parser(sub)
    add_bisect_parser(sub)
    add_report_parser(sub)
    add_atc_parser(sub)
    _add_passes(sub)
    _add_zoo(sub)
    parser.commands = sub.choices  # name -> the command's parser
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM (kill, docker stop, Kubernetes), SIGHUP (a closed terminal, a dropped SSH
    session) or SIGQUIT, raised where the command is, as Ctrl-C's KeyboardInterrupt is: atomic
    writes then remove their temporary files, and tuning stops its workers."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def message(self) -> str:
        named = "" if self.signum == signal.SIGTERM else f" ({signal.Signals(self.signum).name})"
        return f"graphopt: terminated{named}"


_TERMINATING = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@contextlib.contextmanager
def _terminate_as_interrupt():
    def terminate(signum, frame):
        raise Terminated(signum)

    replaced = {}
    try:
        for signum in _TERMINATING:
            # An ignored signal stays ignored: `nohup graphopt tune …` must outlive its terminal.
            if signal.getsignal(signum) is not signal.SIG_IGN:
                replaced[signum] = signal.signal(signum, terminate)
    except ValueError:  # not the main thread: leave signals to the embedding program
        yield
        return
    try:
        yield
    finally:  # None: a handler set outside Python, which cannot be put back
        for signum, previous in replaced.items():
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)


def main(argv: list[str] | None = None) -> int:
    # Names from the models reach the messages: none acts on a terminal, and no character an
    # encoding lacks (nor a closed stdout) fails a command; --help included. Messages name the
    # flags (--input-shape), where the library's name its keyword arguments (input_shapes).
    with escaped_output(), command_line():
        try:
            try:
                args = _parse(argv)
            finally:  # --help's text: a reader gone is found here, not at the interpreter's exit
                sys.stdout.flush()
        except KeyboardInterrupt:
            print("graphopt: interrupted", file=sys.stderr)
            return 130
        except (ClosedStreamError, OutputFailed) as e:  # --help into a closed stdout
            print(f"graphopt: error: {e}", file=sys.stderr)
            return 1
        except ReaderGone:
            return _reader_gone()
        return _run_command(args)


# The exit statuses of an interrupted command: Ctrl-C, and Terminated's signals.
_INTERRUPTED = frozenset({130, *(128 + signum for signum in (signal.SIGTERM, signal.SIGHUP,
                                                              signal.SIGQUIT))})


def entry() -> None:
    """The `graphopt` console script: main(), then exit. An interrupted command whose
    libraries left a thread running exits at once rather than wait for it at the interpreter's
    shutdown: a Ctrl-C that lands as Optuna starts a trial's heartbeat thread orphans it, and
    the process hung after "graphopt: interrupted" until a second Ctrl-C."""
    status = main()
    if status in _INTERRUPTED and any(thread.is_alive() and not thread.daemon
                                      for thread in threading.enumerate()
                                      if thread is not threading.main_thread()):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status)
    raise SystemExit(status)


def _reader_gone() -> int:
    """The exit status of a command whose output's reader went away (`| head -1`): as a
    program killed by SIGPIPE, which is what a shell's pipeline status (and `set -o
    pipefail`) expect; what is still buffered goes nowhere."""
    silence_stdout()
    return 128 + signal.SIGPIPE


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse ends a nargs="+" positional at the first option: `diff A --json B` leaves B
    # over. A command that takes more positionals after options names them (diff's models).
    more = getattr(args, "positionals_after_options", None)
    if extra and more:
        getattr(args, more).extend(text for text in extra if not text.startswith("-"))
        extra = [text for text in extra if text.startswith("-")]
    if extra:  # reported by the command's parser: its usage, not graphopt's, is the help
        command = parser.commands.get(getattr(args, "command", None), parser)
        nested = getattr(command, "commands", {})  # kb export, zoo build: theirs
        command = nested.get(getattr(args, f"{args.command}_command", None), command)
        hints = atc_hints(command, extra)  # `--input_shape=…` pasted from an atc command
        command.error(f"unrecognized arguments: {' '.join(extra)}"
                      + (f" ({'; '.join(hints)})" if hints else ""))
    return args


def run_argv(argv: list[str]) -> int:
    """Run a command line from inside a command (graphopt atc's translation of its flags)."""
    return _run_command(_parse(argv))


def _run_command(args) -> int:
    """The command's exit status; errors are reported in one line, tracebacks only on request."""
    copies: dict[str, str] = {}  # inputs read from pipes: their files, as the user named them
    with paths_shown_as(copies):
        return _run_guarded(args, copies)


def _storage_error_behind(error: BaseException) -> BaseException | None:
    """The Optuna or SQLAlchemy error `error` is or was raised while handling: Optuna's trial
    loop, cleaning up after a database that went away, raises an UnboundLocalError or an
    AssertionError of its own on top of the storage's error."""
    seen, hops = error, 0
    while seen is not None and hops < 20:
        if type(seen).__module__.startswith(("optuna", "sqlalchemy")):
            return seen
        seen, hops = seen.__cause__ or seen.__context__, hops + 1
    return None


@contextlib.contextmanager
def _thread_storage_errors_in_one_line():
    """A storage error in one of Optuna's threads (the heartbeat of a running trial, when the
    database is locked or gone) is one line on standard error, not a page of traceback; the
    trial loop then fails with the same error, which the command reports."""
    default = threading.excepthook

    def hook(info) -> None:
        storage_error = _storage_error_behind(info.exc_value) if info.exc_value else None
        if storage_error is None or os.environ.get("GRAPHOPT_DEBUG"):
            default(info)
            return
        from graphopt.tuner.storage import failure_reason

        reason = failure_reason(storage_error) or type(storage_error).__name__
        print(f"graphopt: warning: the tuning storage failed in a background thread: {reason}",
              file=sys.stderr)

    threading.excepthook = hook
    try:
        yield
    finally:
        threading.excepthook = default


def _run_guarded(args, copies: dict[str, str]) -> int:
    # compare, bisect and diff exit 1 when the check fails (diff --exit-code: the models
    # differ), so their errors exit 2, as cmp's and diff's do: a CI step can tell a broken
    # model from a missing file.
    error_status = getattr(args, "error_status", 1)
    try:
        with _terminate_as_interrupt(), streams_as_files(args, copies), \
                _thread_storage_errors_in_one_line():
            # A command that will print its report finds a closed standard output first, not
            # after its work: a compile would write its file, then fail (`>&-`, as cat does).
            if getattr(sys.stdout, "closed_stream", False) and not getattr(args, "quiet", False):
                raise ClosedStreamError("standard output is closed")
            status = args.func(args)
            sys.stdout.flush()  # a reader gone, a full disk: reported here, not at exit
            return status
    except UsageError as e:
        print(f"graphopt: error: {e}", file=sys.stderr)
        return 2
    except GraphoptError as e:
        print(f"graphopt: error: {e}", file=sys.stderr)
        return error_status
    except Terminated as e:
        print(e.message, file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        print("graphopt: interrupted", file=sys.stderr)
        return 130
    except ReaderGone:  # output piped into `head` and the like: stop quietly
        return _reader_gone()
    except (ClosedStreamError, OutputFailed) as e:  # started with `>&-`, or a full disk
        print(f"graphopt: error: {e}", file=sys.stderr)
        return error_status
    except Exception as e:  # noqa: BLE001 - a one-line report; GRAPHOPT_DEBUG=1 shows the traceback
        if os.environ.get("GRAPHOPT_DEBUG"):
            raise
        interrupt = interrupt_behind(e)
        if isinstance(interrupt, Terminated):
            print(interrupt.message, file=sys.stderr)
            return 128 + interrupt.signum
        if interrupt is not None:
            print("graphopt: interrupted", file=sys.stderr)
            return 130
        storage_error = _storage_error_behind(e)
        if storage_error is not None:
            from graphopt.tuner.storage import failure_reason

            reason = failure_reason(storage_error)
            if reason:  # the database failed under a storage that had opened
                print(f"graphopt: error: the tuning storage failed: {reason}", file=sys.stderr)
                return 1
        print(f"graphopt: internal error: {type(e).__name__}: {e} "
              "(set GRAPHOPT_DEBUG=1 for a traceback)", file=sys.stderr)
        return 3
