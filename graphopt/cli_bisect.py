"""`graphopt bisect`: name the pass run and the single rewrite that broke a model's accuracy."""

from __future__ import annotations

import json
import math
import sys

from graphopt.cli_compare import add_rule_options, check_rule_options
from graphopt.cli_optimize import add_fold_size_limit, add_pass_switches, switch_file_of
from graphopt.cli_precision import add_precision_args, precision_options
from graphopt.cli_types import JoinedShapes, input_shapes, path_text, target_name
from graphopt.errors import one_line
from graphopt.help_format import HelpFormatter

EXAMPLES = """examples:
  graphopt bisect model.onnx                        # -O2, seeded random inputs
  graphopt bisect model.onnx -O3 --inputs x.npz --rtol 1e-3 --atol 1e-4
  graphopt bisect model.onnx --target cpu --input-shape "x:1,3,224,224" --json
  graphopt bisect model.onnx --quantize int8 --calibration calib.npz --min-cosine 0.9999
  graphopt bisect model.onnx --disable-pass FuseAttention --switch-file switches.cfg

Give it the options of the compile that broke: the passes switched off there are off in
every compile bisect makes.

The exit status is 0 when the full compile is within tolerance (nothing to find) and 1 when
a culprit is found, so a CI step fails exactly when the compile breaks accuracy. Errors exit
2, as cmp's and diff's do, after a `graphopt: error: ...` line on stderr; the report goes to
stdout only when the search ran. Progress, one line per evaluated model, goes to stderr.
"""

MAX_LINES = 40  # per side in the text report; --json carries every line


def add_bisect_parser(sub) -> None:
    p = sub.add_parser(
        "bisect", help="find the pass and the single rewrite that broke a model's outputs",
        description="Compile the model, run it and the original with onnxruntime (optimizations\n"
                    "disabled) on the same inputs, and if the outputs differ beyond tolerance,\n"
                    "binary-search the rewrites the passes made, in order: compiles allowing\n"
                    "only the first k rewrites locate the first one after which the outputs\n"
                    "break. Prints that rewrite's pass run, rule and anchor node, and the printed\n"
                    "IR around it before and after. A pass that breaks outputs without asking\n"
                    "the rewrite gate is reported at pass granularity.",
        formatter_class=HelpFormatter, epilog=EXAMPLES)
    p.add_argument("model", type=path_text,
                   help="the .onnx model whose optimized outputs are wrong")
    p.add_argument("-O", dest="level", type=int, default=2, choices=range(4), metavar="LEVEL",
                   help="optimization level 0-3 (default 2)")
    p.add_argument("--target", type=target_name, metavar="NAME|FILE",
                   help="compile for a target (a built-in name or a profile .json), as "
                        "`graphopt optimize --target` does; without it, for none, as "
                        "`optimize -o x.onnx` (an .om compiled without --target used cpu: "
                        "give --target cpu to bisect that compile)")
    p.add_argument("--input-shape", type=input_shapes, action=JoinedShapes, metavar="SHAPES",
                   help='pin input dims, ATC style: "x:1,3,224,224;mask:1,128"')
    p.add_argument("--inputs", type=path_text, metavar="NPZ",
                   help="an .npz with one array per input, named like the input "
                        "(default: seeded random data)")
    add_pass_switches(p)
    add_fold_size_limit(p)
    add_rule_options(p, lossy="a compile whose passes include")
    p.add_argument("--allow-custom-ops", action="store_true",
                   help="keep ops of unknown custom domains in the compiles (onnxruntime must "
                        "still run them, with their library registered)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_precision_args(p, report=False)
    p.set_defaults(func=_cmd_bisect, error_status=2)


def _cmd_bisect(args) -> int:
    from graphopt.tools.bisect import bisect

    check_rule_options(args)
    result = bisect(args.model, level=args.level, target=args.target, feeds=args.inputs,
                    rtol=args.rtol, atol=args.atol, min_cosine=args.min_cosine,
                    input_shapes=args.input_shape, allow_custom_ops=args.allow_custom_ops,
                    pass_options=precision_options(args), disable_passes=args.disable_pass,
                    switch_file=switch_file_of(args), fold_size_limit=args.fold_size_limit,
                    progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps(result.to_json(), indent=1) if args.json else format_result(result))
    return 1 if result.found else 0


def _block(title: str, lines: list[str]) -> list[str]:
    shown = [f"    {line}" for line in lines[:MAX_LINES]]
    if len(lines) > MAX_LINES:
        shown.append(f"    … {len(lines) - MAX_LINES} more line(s) (--json has them all)")
    return [title] + (shown or ["    (nothing)"])


def format_result(result) -> str:
    n = result.total_rewrites
    head = f"{result.model} at {result.pipeline}" + (
        f" with {', '.join(result.switched_off)} off" if result.switched_off else "") + (
        f" for target {result.target}" if result.target else "") + (
        f", on {result.inputs}" if result.inputs else "")
    if not result.found:
        return "\n".join(
            [f"{head}: the full compile is within {result.judged_by}"
             + (" but for rounding (see note)" if result.rounding_note else "")
             + ", nothing to bisect",
             f"1 evaluation: the full compile ({n} rewrite(s) in {result.pass_runs} pass runs)"]
            + ([f"note: {result.rule_note}"] if result.rule_note else [])
            + ([f"note: {result.rounding_note}"] if result.rounding_note else [])
            + ([f"note: output(s) {', '.join(result.empty_outputs)} hold no element at these "
                "input shapes: nothing of them was compared"] if result.empty_outputs else [])
            # compare of the .om can still fail where this passes: YOLO by 0.0027 at atol 0.
            + ["note: bisect runs the compiled graph at ORT_DISABLE_ALL; an .om's sessions "
               "also run onnxruntime's own optimizer at the level each partition records "
               "(graphopt inspect shows it), whose rounding `graphopt compare` of the .om "
               "measures"])
    # The search tells n + 1 answers apart: the import itself, or one of the n rewrites.
    bound = math.ceil(math.log2(n + 1))
    # The bound is the search's own: the full compile before it, and a search over the pass
    # runs after it (a pass that asks no rewrite gate), are evaluations too.
    counts = (f"{result.evaluations} evaluations: the full compile, then a binary search over "
              f"{n} rewrite(s) in {result.pass_runs} pass runs (at most ceil(log2 {n + 1}) = "
              f"{bound} steps)" + (", then one over the pass runs"
                                   if result.granularity == "pass" else ""))
    lines = [f"{head}: outputs break {result.judged_by}", counts, ""]
    if result.granularity == "import":
        lines.append("culprit: the import itself (the model breaks before any pass runs)")
    else:
        if result.granularity == "rewrite" or result.allowed == result.total_rewrites:
            where = f"pass run {result.pass_run} of {result.pass_runs}"
        else:  # the log of a compile with fewer rewrites, which may sweep fixed points less
            where = f"pass run {result.pass_run} when only the first {result.allowed} " \
                    f"rewrite(s) are allowed"
        if result.iteration:
            where += f", fixed-point iteration {result.iteration}"
        lines.append(f"culprit pass:    {result.pass_name} ({where})")
        if result.granularity == "rewrite":
            lines.append(one_line(f"culprit rewrite: {result.rule} at {result.anchor} (rewrite "
                                  f"{result.rewrite_in_run} of {result.rewrites_in_run} in that "
                                  f"run, {result.rewrite} of {result.total_rewrites} overall)"))
        else:
            lines.append("culprit rewrite: none to name: the pass asks no rewrite gate, so it "
                         "has no finer granularity than the pass run")
        if result.enabled_by:
            lines.append(f"it breaks outputs only after {result.enabled_by}")
    lines.append(one_line(f"outputs then:    {result.problem}"))
    if result.rule_note:
        lines.append(f"note: {result.rule_note}")
    if result.rounding_note:  # an evaluation on the way passed as "ok (rounding alone)"
        lines.append(f"note: an evaluation passed by rounding alone: {result.rounding_note}")
    if result.granularity != "import":
        lines += [""] + _block("before (- removed, context unmarked):", result.before_lines)
        lines += _block("after (+ created):", result.after_lines)
    return "\n".join(lines)
