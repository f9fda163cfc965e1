"""`graphopt diff`: compare two models or ONNX dumps, or show what one pass did to a model."""

from __future__ import annotations

import json

from graphopt.cli_optimize import add_fold_size_limit, add_pass_switches, switch_file_of
from graphopt.cli_precision import add_precision_args, precision_options
from graphopt.cli_types import JoinedShapes, input_shapes, non_negative_int, target_name
from graphopt.errors import OptionError, UsageError
from graphopt.help_format import HelpFormatter
from graphopt.option_names import FLAGS

EXAMPLES = """examples:
  graphopt diff model.onnx model.opt.onnx
  graphopt optimize model.onnx -o out.onnx --dump-dir dump --dump-format onnx
  ls dump                           # one file per pass run, numbered in order
  graphopt diff dump/019_SimplifySlicing.onnx dump/020_FuseConvBatchNorm.onnx  # two from ls
  graphopt diff model.onnx --pass FuseConvBatchNorm
  graphopt diff model.onnx --pass FoldConstants --all-runs -O3 --json
  graphopt diff model.onnx --pass QuantizeInt8 --quantize int8 --calibration calib.npz
  graphopt diff golden.onnx model.opt.onnx --exit-code   # in CI: fail when they differ

The exit status is 0 (with --exit-code: 0 when the models are the same, 1 when they differ)
and 2 on an error, as diff's.
"""


def add_diff_parser(sub) -> None:
    p = sub.add_parser(
        "diff", help="compare two models or dumps, or show what one pass did",
        description="Compare two ONNX models (or `--dump-format onnx` dumps): nodes removed, "
                    "added and changed (matched by name, then by op, inputs and outputs), "
                    "initializers, graph inputs and outputs, opset imports, model-local "
                    "functions, and op-type counts. With --pass, compile one model and "
                    "compare its graph right before and right after the first run of that "
                    "pass that changed it.",
        formatter_class=HelpFormatter, epilog=EXAMPLES)
    p.add_argument("models", nargs="+", metavar="MODEL",
                   help="two .onnx files (A, then B), or one with --pass")
    p.add_argument("--pass", dest="pass_name", metavar="NAME",
                   help="compile MODEL and diff the graph before/after this pass "
                        "(`graphopt passes` lists them)")
    p.add_argument("--all-runs", action="store_true",
                   help="with --pass: diff before its first run against after its last run")
    p.add_argument("-O", dest="level", type=int, choices=range(4), metavar="LEVEL",
                   help="with --pass: optimization level 0-3 (default 2)")
    p.add_argument("--target", type=target_name, metavar="NAME|FILE",
                   help="with --pass: compile for this target (`graphopt targets`); "
                        "without it, for none (an .om compiled without --target used cpu)")
    p.add_argument("--input-shape", type=input_shapes, action=JoinedShapes, metavar="SHAPES",
                   help='with --pass: pin input dims, ATC style: "x:1,3,224,224;mask:1,128"')
    p.add_argument("--allow-custom-ops", action="store_true",
                   help="with --pass: keep ops of unknown custom domains instead of refusing "
                        "the model")
    p.add_argument("--json", action="store_true", help="print the diff as JSON")
    p.add_argument("--exit-code", action="store_true",
                   help="exit 1 when the models differ, as git diff --exit-code does")
    p.add_argument("--limit", type=non_negative_int, default=40, metavar="N",
                   help="show at most N entries per list in the text form (0: all; default 40)")
    add_pass_switches(p, scope="with --pass: ")
    add_fold_size_limit(p, scope="with --pass: ")
    add_precision_args(p, report=False, scope="with --pass: ")
    p.set_defaults(func=_cmd_diff, positionals_after_options="models", error_status=2)


def _cmd_diff(args) -> int:
    from graphopt.tools.diff import diff_models, load_for_diff
    from graphopt.tools.diff_format import format_diff

    precision = precision_options(args)
    if args.pass_name is None:
        used = [flag for flag, on in (("--all-runs", args.all_runs),
                                      ("-O", args.level is not None),
                                      ("--target", args.target),
                                      ("--input-shape", args.input_shape),
                                      ("--allow-custom-ops", args.allow_custom_ops),
                                      ("--disable-pass", args.disable_pass),
                                      ("--switch-file", args.switch_file),
                                      ("--fusion-switch-file", args.fusion_switch_file),
                                      ("--fold-size-limit", args.fold_size_limit is not None),
                                      *((FLAGS.get(key, key), True)
                                        for key, value in precision.items()
                                        if value not in ("keep", "none"))) if on]
        if used:
            raise OptionError(f"{', '.join(used)} {'apply' if len(used) > 1 else 'applies'} "
                              "only with --pass NAME")
        if len(args.models) != 2:
            raise UsageError(f"diff takes two models A and B, got {len(args.models)} "
                              "(or one model with --pass NAME)")
        a, b = args.models
        diff = diff_models(load_for_diff(a), load_for_diff(b), label_a=a, label_b=b)
        print(json.dumps(diff.to_json(), indent=1) if args.json
              else format_diff(diff, args.limit))
        return int(args.exit_code and not diff.empty)

    from graphopt.tools.diff_pass import diff_pass

    if len(args.models) != 1:
        raise UsageError(f"--pass {args.pass_name} takes one model, got {len(args.models)}")
    result = diff_pass(args.models[0], args.pass_name,
                       level=2 if args.level is None else args.level,
                       target=args.target, all_runs=args.all_runs,
                       allow_custom_ops=args.allow_custom_ops, input_shapes=args.input_shape,
                       pass_options=precision or None, disable_passes=args.disable_pass,
                       switch_file=switch_file_of(args), fold_size_limit=args.fold_size_limit)
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
    else:
        print(result.note)
        print(format_diff(result.diff, args.limit))
    return int(args.exit_code and not result.diff.empty)
