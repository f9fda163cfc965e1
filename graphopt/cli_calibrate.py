"""`graphopt calibrate`: measure this CPU's cost-model constants with onnxruntime, write them."""

from __future__ import annotations

import os
import sys

from graphopt.cli_paths import check_output_path
from graphopt.cli_types import path_text, positive_thread_count, target_name
from graphopt.errors import OptionError, UsageError
from graphopt.help_format import HelpFormatter
from graphopt.table import format_table


def add_calibrate_parser(sub) -> None:
    p = sub.add_parser(
        "calibrate", help="measure the CPU cost model's constants on this machine",
        description="Runs onnxruntime micro-benchmarks (MatMul, Conv, both again as int8 QDQ, "
                    "Add, Softmax, LayerNormalization, Transpose, a chain of tiny Relus) at "
                    "ORT_ENABLE_ALL, "
                    "fits peak GFLOP/s, bandwidth and per-node overhead per op class, prints "
                    "them and writes them as JSON, which the CPU cost model then reads.",
        formatter_class=HelpFormatter,
        epilog="examples:\n"
               "  graphopt calibrate --target cpu\n"
               "  graphopt calibrate --target cpu --quick -o calib.json --threads 2\n")
    p.add_argument("--target", type=target_name, default="cpu", metavar="NAME",
                   help="the target to calibrate; only 'cpu' (the machine this runs on)")
    # path_text: an empty -o (an unset shell variable) read as no -o, and the calibration
    # went over the default file every estimate reads.
    p.add_argument("-o", "--output", type=path_text, metavar="FILE.json",
                   help="where to write the JSON (default: $XDG_CACHE_HOME/graphopt/"
                        "calibration-cpu.json, ~/.cache when unset)")
    p.add_argument("--threads", type=positive_thread_count, default=1, metavar="N",
                   help="onnxruntime intra-op threads (default 1, as the benches report)")
    p.add_argument("--quick", action="store_true",
                   help="smaller kernels and a ~3 s budget instead of ~12 s")
    p.set_defaults(func=_cmd_calibrate)


def _cmd_calibrate(args) -> int:
    from graphopt.tuner.calibrate import calibrate, default_path

    if args.target != "cpu":
        from graphopt.partition import load_target

        load_target(args.target)  # an unknown name is named as such first
        raise OptionError(
            f"--target {args.target}: only the cpu target can be calibrated: the micro-benchmarks "
            "run on the machine graphopt runs on, and no NPU device is attached here; an NPU "
            "target's figures come from its profile (`graphopt targets "
            f"{args.target}`)")
    if args.output:  # checked before the benchmarks, which take seconds
        check_output_path("-o", args.output)
        if not args.output.lower().endswith(".json"):  # a model given by mistake stays whole
            raise UsageError(f"-o {args.output}: calibrate writes JSON (name it .json)")
    else:  # the default file's folder, created now (HOME may be unset, a file, read-only)
        try:
            os.makedirs(os.path.dirname(default_path()), exist_ok=True)
        except OSError as exc:
            raise OptionError(f"the default calibration file {default_path()}: cannot create "
                              f"its folder ({exc.strerror or exc}); give -o FILE") from None
        check_output_path("the default calibration file", default_path())

    def progress(key: str, m) -> None:
        print(f"  {key:<12} {m.name:<28} {m.seconds * 1e6:10.1f} µs  ({m.runs} runs)",
              file=sys.stderr, flush=True)

    print(f"calibrating cpu on {args.threads} thread(s)"
          f"{' (quick)' if args.quick else ''}…", file=sys.stderr, flush=True)
    result = calibrate(threads=args.threads, seconds_budget=3.0 if args.quick else 12.0,
                       quick=args.quick, progress=progress)
    path = result.save(args.output or default_path())  # before the table: `| head` stops there
    rows = [[cls, f"{c.peak_gflops:.1f}", f"{c.bandwidth_gbs:.1f}", f"{c.overhead_us:.2f}"]
            for cls, c in result.constants.items()]
    print(format_table(["op class", "peak GFLOP/s", "bandwidth GB/s", "overhead µs"], rows,
                       title=f"cpu: {result.cpu_model}, onnxruntime {result.onnxruntime_version}, "
                             f"{result.threads} thread(s)"))
    print(f"fixed cost per session run: {result.run_overhead_us:.1f} µs")
    print(f"wrote {path}")
    return 0
