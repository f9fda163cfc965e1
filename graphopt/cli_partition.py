"""`graphopt partition`: where each node of a model would run on a target, and why not elsewhere."""

from __future__ import annotations

import json

from graphopt.cli_optimize import add_fold_size_limit, add_pass_switches, switch_file_of
from graphopt.cli_precision import add_precision_args, precision_options
from graphopt.cli_types import JoinedShapes, input_shapes, path_text, target_name
from graphopt.help_format import HelpFormatter
from graphopt.table import wrap_to_terminal


def add_partition_parser(sub) -> None:
    p = sub.add_parser(
        "partition", help="show the device partitions of a model on a target",
        description="Optimize a model (as `graphopt optimize` would), place every node on a device "
                    "of the target and print the partition table and, for every node left on the "
                    "host CPU, the reason (unsupported op, dtype, rank, attribute, dynamic shape, "
                    "or an NPU island whose transfers cost more than it saves).",
        formatter_class=HelpFormatter,
        epilog="examples:\n"
               "  graphopt partition yolo.onnx --target ascend310\n"
               '  graphopt partition bert.onnx --target ascend910b --input-shape "input_ids:1,128"\n')
    p.add_argument("model", type=path_text, help="input .onnx file")
    p.add_argument("--target", type=target_name, required=True, metavar="NAME|FILE",
                   help="a built-in target (`graphopt targets`) or a profile .json")
    p.add_argument("-O", dest="level", type=int, default=2, choices=range(4), metavar="LEVEL",
                   help="optimization level before partitioning (default 2)")
    p.add_argument("--input-shape", type=input_shapes, action=JoinedShapes, metavar="SHAPES",
                   help='pin input dims, ATC style: "x:1,3,224,224"; NPUs need static shapes')
    add_pass_switches(p)
    add_fold_size_limit(p)
    p.add_argument("--all-fallbacks", action="store_true",
                   help="list every fallback reason, not the first 20")
    p.add_argument("--json", action="store_true", help="print the partitioning as JSON")
    p.add_argument("--allow-custom-ops", action="store_true",
                   help="keep ops of unknown custom domains (they stay on the host CPU)")
    # A float16 compile places by its float16 ops: a profile whose Conv takes float16 only
    # runs it on the NPU, where the float32 model's table sent it to the host.
    add_precision_args(p, report=False)
    p.set_defaults(func=_cmd_partition)


def _cmd_partition(args) -> int:
    from graphopt.compiler import optimize
    from graphopt.partition.report import dynamic_hint, format_partitioning, partitioning_json

    result = optimize(args.model, level=args.level, disable_passes=args.disable_pass,
                      switch_file=switch_file_of(args), fold_size_limit=args.fold_size_limit,
                      input_shapes=args.input_shape, allow_custom_ops=args.allow_custom_ops,
                      target=args.target, pass_options=precision_options(args) or None)
    if args.json:
        print(json.dumps(partitioning_json(result.partitioning), indent=2))
    else:
        print(format_partitioning(result.partitioning, all_fallbacks=args.all_fallbacks))
        hint = dynamic_hint(result.model, result.partitioning, result.log)
        if hint:
            print(wrap_to_terminal(f"hint: {hint}"))
    return 0
