"""`graphopt profile`: per-kernel time of an .onnx or .om from onnxruntime's profiler, with advice."""

from __future__ import annotations

import json

from graphopt.cli_paths import check_output_path, refuse_model_name
from graphopt.cli_types import (JoinedShapes, input_shapes, non_negative_int, path_text,
                                positive_int, run_count, thread_count, warmup_count)
from graphopt.errors import OptionError
from graphopt.help_format import HelpFormatter

EXAMPLES = """examples:
  graphopt profile model.om                         # the levels and partitions `graphopt run` uses
  graphopt profile model.onnx --input-shape "input_ids:1,128" --repeat 50 --top 20
  graphopt profile model.om --inputs x.npz --threads 1 --trace trace.json   # for chrome://tracing
  graphopt profile model.om --json > profile.json

Times come from onnxruntime's own profiler (SessionOptions.enable_profiling): one event per
kernel per run, its duration in µs. Kernels are matched to graph nodes by name; kernels that
onnxruntime created itself (its NCHWc reorders, say) are counted and reported as unmatched.
"""


# The CLI's own defaults, kept here so that building the parser imports no onnxruntime.
DEFAULT_REPEAT = 10
DEFAULT_WARMUP = 3
LEVELS = ("disable", "basic", "extended", "all")


def add_profile_parser(sub) -> None:
    p = sub.add_parser(
        "profile", help="time every kernel of a model and suggest what to optimize",
        description="Run an .onnx model or a compiled .om with onnxruntime's profiler on and\n"
                    "report where the time goes: per op type, the top kernels, and for an .om\n"
                    "per partition; the CPU cost model's prediction beside each measurement\n"
                    "(Spearman rank correlation over kernels); then advice: bottleneck op types\n"
                    "(memory-, compute- or overhead-bound by the roofline), fusable patterns left\n"
                    "unfused, nodes that fell back to the CPU and layout conversions.",
        formatter_class=HelpFormatter, epilog=EXAMPLES)
    p.add_argument("model", type=path_text, help="an .onnx model or a compiled .om artifact")
    p.add_argument("--inputs", type=path_text, metavar="NPZ",
                   help="an .npz with one array per input (default: seeded random data)")
    p.add_argument("--input-shape", type=input_shapes, action=JoinedShapes, metavar="SHAPES",
                   help='pin dynamic input dims for the random inputs: "x:1,3,224,224;mask:1,128" '
                        "(an .om with shape profiles: by default the first profile's dims, as "
                        "`graphopt run` takes them)")
    p.add_argument("--repeat", type=run_count, default=DEFAULT_REPEAT, metavar="N",
                   help=f"profiled runs (default {DEFAULT_REPEAT})")
    p.add_argument("--warmup", type=warmup_count, default=DEFAULT_WARMUP, metavar="N",
                   help=f"untimed runs first, left out of the profile (default {DEFAULT_WARMUP}; "
                        "the first run checks the outputs and is left out even at 0)")
    p.add_argument("--threads", type=thread_count, metavar="N",
                   help="onnxruntime intra-op threads (default, or 0: onnxruntime chooses, as "
                        "`graphopt run` does)")
    p.add_argument("--level", metavar="LEVEL", choices=LEVELS,
                   help=f"onnxruntime optimization level: {', '.join(LEVELS)} (default: for an "
                        ".om each partition's recorded level, as `graphopt run` uses; all for "
                        "an .onnx)")
    p.add_argument("--top", type=positive_int, default=10, metavar="K",
                   help="kernels listed in the top table (default 10)")
    p.add_argument("--calibration", type=path_text, metavar="FILE",
                   help="cost-model constants from `graphopt calibrate` (default: its default "
                        "file when present, else the cpu target profile's figures)")
    p.add_argument("--seed", type=non_negative_int, metavar="N",
                   help="seed of the random inputs used without --inputs (default 0)")
    p.add_argument("--json", action="store_true", help="print the profile and hints as JSON")
    p.add_argument("--trace", type=path_text, metavar="FILE",
                   help="keep onnxruntime's chrome trace (all partitions) as FILE, for "
                        "chrome://tracing or ui.perfetto.dev")
    p.set_defaults(func=_cmd_profile)


def _cmd_profile(args) -> int:
    from graphopt.atomic import atomic_write_bytes
    from graphopt.input_shapes import parse_input_shapes
    from graphopt.tools.advisor import advise
    from graphopt.tools.profile import profile_model
    from graphopt.tools.profile_report import format_profile

    if args.seed is not None and args.inputs:  # as run and compare: it would seed nothing
        raise OptionError("--seed only applies to random inputs; drop it or --inputs")
    if args.trace:
        check_output_path("--trace", args.trace, {"the model": args.model,
                                                  "--inputs": args.inputs,
                                                  "--calibration": args.calibration})
        refuse_model_name("--trace", args.trace, "profile writes a JSON trace")
    shapes = parse_input_shapes(args.input_shape) if args.input_shape else None
    feeds = args.inputs  # profile_model reads it, and names it when it does not fit
    profile = profile_model(args.model, feeds, repeat=args.repeat, warmup=args.warmup,
                            threads=args.threads, level=args.level, input_shapes=shapes,
                            calibration=args.calibration,
                            seed=0 if args.seed is None else args.seed)
    hints = advise(profile)
    if args.trace:
        atomic_write_bytes(args.trace, json.dumps(profile.trace).encode("utf-8"))
    if args.json:
        print(json.dumps({**profile.to_json(), "hints": [h.to_json() for h in hints],
                          "trace": args.trace}, indent=2))
    else:
        print(format_profile(profile, hints, args.top))
        if args.trace:
            print(f"\nwrote {args.trace}: {len(profile.trace)} trace event(s)")
    return 0
