"""`graphopt atc`: an atc command line as it is (`--model=x.onnx --framework=5 --output=x
--soc_version=Ascend310 …`), translated flag by flag into `graphopt optimize`'s and run, the
translation printed so that a script can move to graphopt's own spelling."""

from __future__ import annotations

import shlex

from graphopt.errors import OptionError
from graphopt.help_format import HelpFormatter

# ATC's --soc_version -> graphopt's target: the chips graphopt has a profile for.
SOC_TARGETS = (("ascend310b", "ascend310b"), ("ascend910b", "ascend910b"),
               ("ascend310", "ascend310"))
# ATC's --precision_mode and --precision_mode_v2 -> graphopt's --precision.
PRECISION_MODES = {
    "force_fp16": "fp16", "allow_mix_precision": "mixed-fp16",
    "allow_mix_precision_fp16": "mixed-fp16", "allow_mix_precision_bf16": "mixed-bf16",
    "must_keep_origin_dtype": "keep",
}
PRECISION_MODES_V2 = {"fp16": "fp16", "origin": "keep", "mixed_float16": "mixed-fp16",
                      "mixed_bfloat16": "mixed-bf16"}
# ATC flags that become graphopt's of the same meaning, value unchanged.
SAME_VALUE = {"--out_nodes": "--out-nodes", "--insert_op_conf": "--insert-op-conf",
              "--keep_dtype": "--keep-dtype", "--input_fp16_nodes": "--input-fp16-nodes",
              "--output_type": "--output-type", "--fusion_switch_file": "--fusion-switch-file"}
ONNX_FRAMEWORK = "5"


def add_atc_parser(sub) -> None:
    p = sub.add_parser(
        "atc", help="run an atc command line as graphopt optimize (ONNX models)",
        description="Take ATC's flags as an atc command line writes them, translate each into "
                    "graphopt optimize's, print the translation, and run it. Only ONNX models "
                    "(--framework=5); flags with no graphopt counterpart are refused by name.",
        epilog='examples:\n  graphopt atc --model=resnet50.onnx --framework=5 --output=resnet50 \\\n'
               '      --soc_version=Ascend310 --input_shape="input:1,3,224,224"',
        formatter_class=HelpFormatter)
    p.add_argument("--model", required=True, metavar="FILE.onnx", help="the ONNX model")
    p.add_argument("--framework", required=True, metavar="5", help="5: ONNX, the only one")
    p.add_argument("--output", required=True, metavar="PATH",
                   help="the artifact, without its .om (as atc writes it)")
    p.add_argument("--soc_version", metavar="CHIP",
                   help="Ascend310, Ascend310B*, Ascend910B*: graphopt's --target")
    p.add_argument("--input_shape", metavar="SHAPES", help='"x:1,3,224,224;y:…" (-1: dynamic)')
    p.add_argument("--input_format", metavar="NCHW|ND",
                   help="accepted: ONNX inputs are as the model declares them")
    p.add_argument("--precision_mode", metavar="MODE",
                   help=", ".join(PRECISION_MODES))
    p.add_argument("--precision_mode_v2", metavar="MODE", help=", ".join(PRECISION_MODES_V2))
    for flag, ours in SAME_VALUE.items():
        p.add_argument(flag, metavar="VALUE", help=f"graphopt's {ours}")
    p.add_argument("--dynamic_batch_size", metavar="B1,B2,…",
                   help="profiles over the inputs' -1 batch dims (--dynamic-dims)")
    p.add_argument("--dynamic_image_size", metavar="H,W;H,W",
                   help="profiles over the inputs' -1 height and width dims")
    p.add_argument("--dynamic_dims", metavar="D,D;D,D",
                   help="profiles over every -1 dim of --input_shape, in order")
    p.add_argument("--log", metavar="LEVEL", help="error or null: print errors only (-q)")
    p.add_argument("--mode", default="0", metavar="0",
                   help="0 (compile) only; 1 and 6 are graphopt inspect")
    p.set_defaults(func=_cmd_atc)


def _cmd_atc(args) -> int:
    from graphopt.cli import run_argv

    argv = translate(args)
    if args.log not in ("error", "null"):
        print("graphopt atc: running graphopt " + shlex.join(argv), flush=True)
    return run_argv(argv)


def translate(args) -> list[str]:
    """The `graphopt optimize` argv an atc command line's flags (parsed) ask for."""
    if args.mode != "0":
        raise OptionError(f"--mode={args.mode}: graphopt atc compiles (mode 0); ATC's --mode=1 "
                          "is graphopt inspect x.om --json, its --mode=6 graphopt inspect x.om")
    if args.framework != ONNX_FRAMEWORK:
        raise OptionError(f"--framework={args.framework}: graphopt reads ONNX models "
                          f"(--framework={ONNX_FRAMEWORK}); convert the model to ONNX first")
    output = args.output if args.output.lower().endswith(".om") else args.output + ".om"
    argv = ["optimize", args.model, "-o", output]
    if args.soc_version:
        argv += ["--target", _target(args.soc_version)]
    if args.input_format and args.input_format.upper() not in ("NCHW", "ND", "NHWC"):
        raise OptionError(f"--input_format={args.input_format}: ATC takes NCHW or ND for an "
                          "ONNX model")
    shapes = _input_shapes(args.input_shape) if args.input_shape else {}
    if args.input_shape:
        argv += ["--input-shape", args.input_shape]
    precision = _precision(args)
    if precision:
        argv += ["--precision", precision]
    for flag, ours in SAME_VALUE.items():
        value = getattr(args, flag[2:])
        if value is not None:
            argv += [ours, value]
    dynamic = _dynamic_dims(args, shapes)
    if dynamic:
        argv += ["--dynamic-dims", dynamic]
    if args.log in ("error", "null"):
        argv.append("-q")
    return argv


def _target(soc: str) -> str:
    chip = soc.strip().lower()
    for prefix, target in SOC_TARGETS:
        if chip.startswith(prefix) and (prefix != "ascend310" or chip == "ascend310"):
            return target
    raise OptionError(f"--soc_version={soc}: graphopt has target profiles for Ascend310, "
                      "Ascend310B* and Ascend910B* (graphopt targets lists them; a profile file "
                      "describes another chip: graphopt optimize --target my_chip.json)")


def _precision(args) -> str | None:
    if args.precision_mode and args.precision_mode_v2:
        raise OptionError("--precision_mode and --precision_mode_v2: give one")
    for flag, value, table in (("--precision_mode", args.precision_mode, PRECISION_MODES),
                               ("--precision_mode_v2", args.precision_mode_v2,
                                PRECISION_MODES_V2)):
        if value is None:
            continue
        if value not in table:
            raise OptionError(f"{flag}={value}: graphopt atc takes {', '.join(table)} "
                              "(graphopt's --precision: keep, fp16, bf16, mixed-fp16, "
                              "mixed-bf16)")
        return table[value]
    return None


def _input_shapes(text: str) -> dict[str, list[str]]:
    """ATC's --input_shape as {input: [dim text, …]} (names may hold ':', dims follow the last)."""
    shapes = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, colon, dims = part.rpartition(":")
        if not colon or not name:
            raise OptionError(f"--input_shape={text}: {part!r} is not name:d0,d1,…")
        shapes[name] = [d.strip() for d in dims.split(",")]
    return shapes


def _dynamic_dims(args, shapes: dict[str, list[str]]) -> str | None:
    """--dynamic-dims' listed profiles for ATC's --dynamic_batch_size, --dynamic_image_size or
    --dynamic_dims: each profile a value for every -1 dim of --input_shape."""
    given = [(flag, value) for flag, value in (
        ("--dynamic_batch_size", args.dynamic_batch_size),
        ("--dynamic_image_size", args.dynamic_image_size),
        ("--dynamic_dims", args.dynamic_dims)) if value]
    if not given:
        return None
    if len(given) > 1:
        raise OptionError(f"{given[0][0]} and {given[1][0]}: ATC takes one of them")
    flag, value = given[0]
    dynamic = [(name, axis) for name, dims in shapes.items()
               for axis, dim in enumerate(dims) if dim == "-1"]
    if not dynamic:
        raise OptionError(f"{flag}: --input_shape gives no -1 dim for it to set (ATC's "
                          "--input_shape=\"x:-1,3,224,224\" marks them)")
    if flag == "--dynamic_batch_size":  # "1,2,4": a batch size each, for every -1 dim
        profiles = [[b.strip()] * len(dynamic) for b in value.split(",")]
    else:  # "224,224;448,448": a value for each -1 dim, profile by profile
        profiles = [[v.strip() for v in part.split(",")]
                    for part in filter(None, (p.strip() for p in value.split(";")))]
    listed = []
    for values in profiles:
        if len(values) != len(dynamic) or not all(v.isdecimal() for v in values):
            raise OptionError(f"{flag}={value}: each profile gives {len(dynamic)} whole "
                              f"number(s), one per -1 dim of --input_shape "
                              f"({', '.join(f'{n}[{a}]' for n, a in dynamic)})")
        listed.append(",".join(f"{name}[{axis}]={v}" for (name, axis), v in zip(dynamic, values)))
    return ";".join(listed)
