"""`graphopt atc`: an atc command line as it is (`--model=x.onnx --framework=5 --output=x
--soc_version=Ascend310 …`), translated flag by flag into `graphopt optimize`'s and run, the
translation printed so that a script can move to graphopt's own spelling."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from collections.abc import Mapping

from graphopt.errors import OptionError, UsageError
from graphopt.help_format import HelpFormatter
from graphopt.option_names import flags_spelled

# ATC's --soc_version -> graphopt's target: the chips graphopt has a profile for.
SOC_TARGETS = (("ascend310b", "ascend310b"), ("ascend910b", "ascend910b"),
               ("ascend310", "ascend310"))
# What may follow each family in a --soc_version, lowercased.
_SOC_MODELS = {"ascend310b": r"\d*", "ascend910b": r"\d*(c|-\d+)?", "ascend310": ""}
# ATC's --mode values that show a model rather than compile one, with what each shows.
SHOWING_MODES = {"1": "the --om model, node by node, as JSON into --json",
                 "6": "the --om artifact's summary"}
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
# What ATC's --input_format takes for an ONNX model, and where each keeps height and width.
INPUT_FORMATS = {"NCHW": (2, 3), "NCDHW": (3, 4), "ND": None}
LOG_LEVELS = ("debug", "info", "warning", "error", "null")
# The ATC flags that name inputs or outputs: a trailing ';' (which ATC takes) names nothing.
NAME_LISTS = ("--out_nodes", "--input_fp16_nodes", "--output_type")


class _Once(argparse.Action):
    """Store a flag's value, refusing a second one: an atc line that names a flag twice (a
    script's default and its override) would otherwise compile with the last, unsaid."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, "_atc_given", set())
        if self.dest in given:
            parser.error(f"{option_string} is given twice ({getattr(namespace, self.dest)!r} "
                         f"and {values!r}): give it once")
        namespace._atc_given = given | {self.dest}
        setattr(namespace, self.dest, values)


def add_atc_parser(sub) -> None:
    p = sub.add_parser(
        "atc", help="run an atc command line as graphopt optimize (ONNX models)",
        description="Take ATC's flags as an atc command line writes them, translate each into "
                    "graphopt optimize's, print the translation, and run it. Only ONNX models "
                    "(--framework=5); flags with no graphopt counterpart are refused by name.",
        epilog='examples:\n  graphopt atc --model=resnet50.onnx --framework=5 --output=resnet50 \\\n'
               '      --soc_version=Ascend310 --input_shape="input:1,3,224,224"',
        formatter_class=HelpFormatter)
    p.register("action", None, _Once)  # each flag below, given twice, is refused
    # Required as ATC requires them, checked by translate: ATC's --mode=1 needs none of them.
    p.add_argument("--model", metavar="FILE.onnx", help="the ONNX model (required)")
    p.add_argument("--framework", metavar="5", help="5: ONNX, the only one (required)")
    p.add_argument("--output", metavar="PATH",
                   help="the artifact, without its .om (as atc writes it; required)")
    p.add_argument("--soc_version", metavar="CHIP",
                   help="Ascend310, Ascend310B*, Ascend910B*: graphopt's --target (required)")
    p.add_argument("--input_shape", metavar="SHAPES",
                   help='"x:1,3,224,224;y:…" (-1: dynamic); for an input --insert_op_conf '
                        "preprocesses, the model's input: checked, and its batch pins the fed "
                        "image")
    p.add_argument("--input_format", metavar="NCHW|NCDHW|ND",
                   help="NCHW (ATC's default for ONNX), NCDHW or ND: where "
                        "--dynamic_image_size finds height and width")
    p.add_argument("--precision_mode", metavar="MODE",
                   help=", ".join(PRECISION_MODES) + " (default force_fp16, as ATC's)")
    p.add_argument("--precision_mode_v2", metavar="MODE", help=", ".join(PRECISION_MODES_V2))
    for flag, ours in SAME_VALUE.items():
        p.add_argument(flag, metavar="VALUE", help=f"graphopt's {ours}")
    p.add_argument("--dynamic_batch_size", metavar="B1,B2,…",
                   help="profiles over the inputs' -1 batch dims (--dynamic-dims)")
    p.add_argument("--dynamic_image_size", metavar="H,W;H,W",
                   help="profiles over the inputs' -1 height and width dims, one H,W each")
    p.add_argument("--dynamic_dims", metavar="D,D;D,D",
                   help="profiles over every -1 dim of --input_shape, in order")
    p.add_argument("--log", metavar="LEVEL",
                   help=f"{', '.join(LOG_LEVELS)}; error and null print errors only (-q)")
    p.add_argument("--mode", default="0", metavar="0|1|6",
                   help="0: compile (default); 1: the --om model, node by node, as JSON into "
                        "--json; 6: the --om artifact's summary (both graphopt inspect)")
    p.add_argument("--om", metavar="FILE",
                   help="--mode=1 and 6: the .om to show (or, with --mode=1, an .onnx model)")
    p.add_argument("--json", metavar="FILE", help="--mode=1: the JSON file to write")
    p.set_defaults(func=_cmd_atc)


def _cmd_atc(args) -> int:
    from graphopt.cli import run_argv
    from graphopt.cli_precision import check_keep_dtype

    argv = translate(args)
    line = "graphopt " + shlex.join(argv)
    quiet = "-q" in argv or (args.log is not None and args.log.lower() in ("error", "null"))
    # Messages name the flags as the atc line wrote them, where graphopt's spelling differs.
    spellings = _atc_spellings(args)
    dropped = args.keep_dtype is not None and "--keep-dtype" not in argv
    if dropped:  # not passed on, but a missing list file is named
        with flags_spelled(spellings):
            check_keep_dtype([args.keep_dtype])
    if not quiet:
        if dropped:
            given = ("--precision_mode_v2=origin" if args.precision_mode_v2 else
                     "--precision_mode=must_keep_origin_dtype")
            print("graphopt atc: --keep_dtype lists nodes to keep in their dtype, which "
                  f"--precision keep ({given}) keeps every node in: not passed on")
        # --mode=6 prints the summary on stdout, which a script may read: the line goes aside
        shows = args.mode.strip() == "6"
        print(f"graphopt atc: running {line}", flush=True, file=sys.stderr if shows else sys.stdout)
    with flags_spelled(spellings):
        status = run_argv(argv)
    if status and quiet:  # the graphopt flags a message may name: what they came from
        print(f"graphopt atc: ran {line}", file=sys.stderr)
    return status


def _atc_spellings(args) -> dict[str, str]:
    """graphopt's flag -> the atc line's, for the flags it gave with the same meaning."""
    spelled = {ours: flag for flag, ours in SAME_VALUE.items()}
    # Not --target: its values are graphopt's target names, not ATC's chips.
    spelled["--input-shape"] = "--input_shape"
    for flag in ("--dynamic_batch_size", "--dynamic_image_size", "--dynamic_dims"):
        if getattr(args, flag[2:]):
            spelled["--dynamic-dims"] = flag
    return spelled


def translate(args) -> list[str]:
    """The `graphopt optimize` argv an atc command line's flags (parsed) ask for."""
    if args.mode.strip() in SHOWING_MODES:
        return _inspect_argv(args)
    if args.mode.strip() != "0":
        precheck = ("; its --mode=3 (a pre-check of the model's ops) is graphopt partition "
                    "MODEL --target NAME, which shows where each op runs and why"
                    if args.mode.strip() == "3" else "")
        raise OptionError(f"--mode={args.mode}: graphopt atc takes --mode=0 (compile), 1 (a "
                          "model as JSON) and 6 (an .om's summary)" + precheck)
    shown = [flag for flag in ("--om", "--json") if getattr(args, flag[2:]) is not None]
    if shown:
        raise OptionError(f"{' and '.join(shown)}: for --mode=1 and 6, which show a model; "
                          "--mode=0 compiles --model into --output")
    missing = [flag for flag in ("--model", "--framework", "--output", "--soc_version")
               if not getattr(args, flag[2:])]
    if missing:
        chips = (" (Ascend310, Ascend310B*, Ascend910B*; for the CPU: graphopt optimize "
                 "model.onnx -o model.om)" if "--soc_version" in missing else "")
        raise UsageError(f"atc: the following arguments are required: {', '.join(missing)}"
                         f"{chips} (see graphopt atc --help)")
    if args.framework != ONNX_FRAMEWORK:
        if args.framework.strip().lower() == "onnx":
            raise OptionError(f"--framework={args.framework}: ATC names the framework by "
                              f"number; ONNX is --framework={ONNX_FRAMEWORK}")
        raise OptionError(f"--framework={args.framework}: graphopt reads ONNX models "
                          f"(--framework={ONNX_FRAMEWORK}); convert the model to ONNX first")
    if args.log is not None and args.log.lower() not in LOG_LEVELS:
        raise OptionError(f"--log={args.log}: ATC's levels are {', '.join(LOG_LEVELS)}")
    for flag in ("--input_shape", "--input_format", "--dynamic_batch_size",
                 "--dynamic_image_size", "--dynamic_dims", *SAME_VALUE):
        value = getattr(args, flag[2:])
        if value is not None and not value.strip(" ,;"):  # an unset variable in a script
            raise OptionError(f"{flag}={value}: an empty value (leave the flag out for "
                              "ATC's default)")
    if args.output.endswith(("/", os.sep)):  # out/ would write out/.om, a hidden file
        raise OptionError(f"--output={args.output}: names a directory; ATC's --output is the "
                          "artifact's path, .om added where it lacks it (--output=out/resnet50)")
    output = args.output if args.output.lower().endswith(".om") else args.output + ".om"
    argv = ["optimize", args.model, "-o", output, "--target", _target(args.soc_version)]
    layout = (args.input_format or "NCHW").upper()
    if layout not in INPUT_FORMATS:
        raise OptionError(f"--input_format={args.input_format}: ATC takes NCHW (its default), "
                          "NCDHW or ND for an ONNX model")
    shapes = _input_shapes(args.input_shape) if args.input_shape else {}
    images = _aipp_inputs(args) if shapes and args.insert_op_conf else {}
    if shapes:
        argv += ["--input-shape", _fed_shapes(args.input_shape, args.insert_op_conf, shapes, images,
                                              INPUT_FORMATS.get(layout))]
    precision = _precision(args)
    argv += ["--precision", precision]
    for flag, ours in SAME_VALUE.items():
        value = getattr(args, flag[2:])
        if flag == "--keep_dtype" and precision == "keep":
            continue  # every node keeps its dtype: ATC takes the list, graphopt refuses it
        if value is not None:
            argv += [ours, value.strip().rstrip(";") if flag in NAME_LISTS else value]
    dynamic = _dynamic_dims(args, shapes, INPUT_FORMATS[layout], images)
    if dynamic:
        argv += ["--dynamic-dims", dynamic]
    if args.log is not None and args.log.lower() in ("error", "null"):
        argv.append("-q")
    return argv


def _inspect_argv(args) -> list[str]:
    """`graphopt inspect`'s argv for ATC's --mode=1 (the --om model's nodes as JSON, written to
    --json) and --mode=6 (the artifact's summary)."""
    mode = args.mode.strip()
    needed = ("--om", "--json") if mode == "1" else ("--om",)
    missing = [flag for flag in needed if not getattr(args, flag[2:])]
    if missing:
        raise UsageError(f"atc: --mode={mode} needs {' and '.join(missing)} "
                         f"({SHOWING_MODES[mode]}; see graphopt atc --help)")
    compiling = [flag for flag in ("--model", "--output", "--input_shape", "--input_format",
                                   "--precision_mode", "--precision_mode_v2",
                                   "--dynamic_batch_size", "--dynamic_image_size",
                                   "--dynamic_dims", *SAME_VALUE)
                 if getattr(args, flag[2:]) is not None]
    if compiling:  # ATC would show --om as it is: compile flags do nothing there
        kind = "a compile flag" if len(compiling) == 1 else "compile flags"
        raise OptionError(f"{', '.join(compiling)}: {kind}; --mode={mode} shows --om as it is "
                          "(leave them out, or compile with --mode=0)")
    if mode == "6" and args.json is not None:
        raise OptionError("--json: --mode=6 prints the summary; --mode=1 writes the JSON")
    if args.framework is not None and args.framework != ONNX_FRAMEWORK:
        raise OptionError(f"--framework={args.framework}: graphopt reads ONNX models and .om "
                          f"artifacts (--framework={ONNX_FRAMEWORK})")
    argv = ["inspect", args.om] + (["--json", "--nodes", "-o", args.json] if mode == "1" else [])
    if args.log is not None and args.log.lower() not in LOG_LEVELS:
        raise OptionError(f"--log={args.log}: ATC's levels are {', '.join(LOG_LEVELS)}")
    return argv


def _target(soc: str) -> str:
    chip = soc.strip().lower()
    for prefix, target in SOC_TARGETS:
        # A model number after the family (and the 910B's variants, Ascend910B2C and
        # Ascend910B4-1), nothing else: a typo such as Ascend310B1x names no chip.
        rest = chip[len(prefix):]
        if chip.startswith(prefix) and re.fullmatch(_SOC_MODELS[prefix], rest):
            return target
    raise OptionError(f"--soc_version={soc}: graphopt has target profiles for Ascend310, "
                      "Ascend310B* and Ascend910B* (graphopt targets lists them; a profile file "
                      "describes another chip: graphopt optimize --target my_chip.json)")


def _precision(args) -> str:
    """graphopt's --precision for ATC's --precision_mode(_v2); force_fp16 (fp16) when neither
    is given, ATC's default for both."""
    if args.precision_mode and args.precision_mode_v2:
        raise OptionError("--precision_mode and --precision_mode_v2: give one")
    for flag, value, table in (("--precision_mode", args.precision_mode, PRECISION_MODES),
                               ("--precision_mode_v2", args.precision_mode_v2,
                                PRECISION_MODES_V2)):
        if value is None:
            continue
        if value in ("force_fp32", "cube_fp16in_fp32out"):
            keep = "must_keep_origin_dtype" if table is PRECISION_MODES else "origin"
            raise OptionError(f"{flag}={value}: ATC computes cube ops from float16 inputs into "
                              f"float32 there, which graphopt has no mode for: {keep} keeps "
                              "float32 throughout (as precise or more)")
        if value in ("allow_fp32_to_fp16", "allow_fp32_to_bf16"):
            half = value[-4:]
            nearest = "allow_mix_precision" if half == "fp16" else "allow_mix_precision_bf16"
            raise OptionError(f"{flag}={value}: ATC runs cube ops in {half} there and keeps "
                              "every other op in float32 where its kernel takes it, which "
                              f"graphopt has no mode for: {nearest} is nearest (cube ops in "
                              f"{half}, numerically sensitive ops in float32, the rest following "
                              "their inputs), must_keep_origin_dtype keeps float32 throughout")
        if value not in table:
            raise OptionError(f"{flag}={value}: graphopt atc takes {', '.join(table)} "
                              "(graphopt's --precision: keep, fp16, bf16, mixed-fp16, "
                              "mixed-bf16)")
        return table[value]
    return "fp16"


def _input_shapes(text: str) -> dict[str, list[str]]:
    """ATC's --input_shape as {input: [dim text, …]} (names may hold ':', dims follow the last)."""
    shapes = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, colon, dims = part.rpartition(":")
        if not colon or not name:
            raise OptionError(f"--input_shape={text}: {part!r} is not name:d0,d1,…")
        if name in shapes:
            raise OptionError(f"--input_shape={text}: input '{name}' is given twice")
        shapes[name] = [d.strip() for d in dims.split(",")] if dims.strip() else []
        if any("~" in d for d in shapes[name]):
            raise OptionError(f"--input_shape={text}: {part!r}: shape ranges (1~10) are not "
                              "taken: -1 with --dynamic_dims lists the sizes to compile")
        if any(d.lstrip("+-").isdecimal() and int(d) == 0 for d in shapes[name]):
            raise OptionError(f"--input_shape={text}: {part!r}: ATC takes no dim of 0")
        if any(d.lstrip("+-").isdecimal() and int(d) < -1 for d in shapes[name]):
            raise OptionError(f"--input_shape={text}: {part!r}: -2 is ATC's unknown rank, "
                              "which graphopt does not take: give each dim, -1 for a dynamic "
                              "one")
    return shapes


def _aipp_inputs(args) -> dict[str, tuple[list | None, tuple[int, int] | None, object]]:
    """The inputs --insert_op_conf gives preprocessing (the model's feedable inputs its
    related_input_rank counts), with their dims in the model (a number, or None where open),
    the (h, w) its images come out at (the crop's size, else the source size; None where
    the file leaves it to the model) and the aipp_op; empty when the file or the model cannot
    be read, which the compile then reports."""
    from graphopt.aipp_config import read_aipp_config
    from graphopt.errors import GraphoptError
    from graphopt.ir.onnx_io import read_model_proto

    try:
        ops = read_aipp_config(args.insert_op_conf)
        graph = read_model_proto(args.model, load_external=False).graph
    except GraphoptError:
        return {}
    weights = {tensor.name for tensor in graph.initializer}
    feedable = [value for value in graph.input if value.name not in weights]
    return {feedable[op.input_rank].name: (_dims(feedable[op.input_rank]), _made_size(op), op)
            for op in ops if op.input_rank < len(feedable)}


def _made_size(op) -> tuple[int, int] | None:
    """The (h, w) an AIPP block's images come out at, where the file sets it."""
    size = op.crop_size if op.crop else op.src_size
    return tuple(size) if all(size) else None


def _dims(value) -> list | None:
    """A graph input's dims (a number, or None where open), or None when it has no shape."""
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]


def _fed_shapes(text: str, conf: str | None, shapes: dict[str, list[str]], images: dict[str, tuple],
                height_width: tuple[int, int] | None) -> str:
    """--input-shape's text. ATC's shape of an input AIPP preprocesses is the model's input
    (NCHW float), checked against it and against the size the AIPP file makes its images;
    graphopt's pin is of what is fed, the uint8 image, whose size the AIPP file sets: its
    batch alone carries over."""
    from graphopt.aipp_graph import image_shape

    fed = {}
    for name, dims in shapes.items():
        if name not in images or not dims:
            fed[name] = dims
            continue
        model, made, op = images[name]
        axes = _image_axes(dims, model, op, height_width)
        given = tuple(dims[axis] for axis in axes) \
            if axes is not None and len(dims) > max(axes) else ()
        if made is not None and given:
            if all(d.isdecimal() for d in given) and tuple(map(int, given)) != made:
                # ATC refuses it too; graphopt kept the batch alone and compiled at the file's
                # size, the height and width the line gave dropped without a word.
                raise OptionError(f"--input_shape={text}: input '{name}' is {given[0]}×"
                                  f"{given[1]} there, but --insert_op_conf's preprocessing "
                                  f"makes {made[0]}×{made[1]} images (its crop_size, else "
                                  "src_image_size)")
        if model is not None and not _fits(dims, model):
            shown = ",".join("?" if size is None else str(size) for size in model)
            raise OptionError(f"--input_shape={text}: input '{name}' is [{shown}] in the model, "
                              f"the input --insert_op_conf's preprocessing feeds, not "
                              f"{','.join(dims)}")
        fed[name] = [dims[0], "-1", "-1", "-1"]
        if made is None and given and all(d.isdecimal() for d in given) and \
                model is not None and any(model[axis] is None for axis in axes):
            # The file leaves the image's size to the model, whose size is open: ATC takes
            # the size the line gives, which graphopt's pin of the image carries. A crop's
            # size is behind the preprocessing, where no pin of the fed image reaches.
            if op.crop:
                raise OptionError(f"--insert_op_conf={conf}: input '{name}' is "
                                  "cropped to the model's size, which the model leaves open; "
                                  f"ATC takes {given[0]}×{given[1]} from --input_shape, graphopt "
                                  f"from the file: add crop_size_h: {given[0]} and crop_size_w: "
                                  f"{given[1]} to its aipp_op block")
            fed[name][1:] = [str(size) for size in image_shape(op, 0, *map(int, given))[1:]]
    return ";".join(f"{name}:{','.join(dims)}" for name, dims in fed.items())


def _image_axes(dims: list[str], model: list | None, op,
                height_width: tuple[int, int] | None) -> tuple[int, int] | None:
    """Where an input AIPP feeds keeps its height and width: after the channels, which the
    model's dims (else the line's) place at 1 (NCHW) or at 3 (NHWC, as tf2onnx exports), as
    the compile finds them; else where --input_format says."""
    channels = op.channels
    for known in (model, [int(d) if d.isdecimal() else None for d in dims]):
        if known is not None and len(known) == 4:
            if known[1] == channels:
                return (2, 3)
            if known[3] == channels:
                return (1, 2)
    return height_width


def _fits(dims: list[str], model: list) -> bool:
    """Whether ATC's dims (text) describe an input of the model's dims (None where open)."""
    return len(dims) == len(model) and all(
        size is None or dim == "-1" or not dim.isdecimal() or int(dim) == size
        for dim, size in zip(dims, model))


def _dynamic_dims(args, shapes: dict[str, list[str]], height_width: tuple[int, int] | None,
                  images: Mapping[str, object]) -> str | None:
    """--dynamic-dims' listed profiles for ATC's --dynamic_batch_size (a batch size each, for
    every -1 dim, which must be a first dim), --dynamic_image_size (an H,W pair each, for every
    input's -1 height and width) or --dynamic_dims (a value for each -1 dim, in order)."""
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
    awkward = [n for n, _ in dynamic if set(n) & set("=,;[]")]
    if awkward:  # name[axis]=value is how --dynamic-dims names them
        raise OptionError(f"{flag}: input '{awkward[0]}' has a -1 dim, and graphopt's "
                          "--dynamic-dims cannot name an input whose name holds '=', ',', ';', "
                          "'[' or ']': graphopt optimize --dynamic-dims \"DIM:V1,V2\" sets the "
                          "model's symbolic dim by its own name")
    where = ", ".join(f"{n}[{a}]" for n, a in dynamic)
    if flag == "--dynamic_batch_size":  # "1,2,4": a batch size each, for every -1 dim
        off = [f"{n}[{a}]" for n, a in dynamic if a != 0]
        if off:
            raise OptionError(f"{flag}: --input_shape gives -1 at {', '.join(off)}, not a "
                              "first dim: ATC's --dynamic_batch_size takes -1 as the batch "
                              "(first) dim only; --dynamic_dims sets others")
        profiles = [[b.strip()] * len(dynamic) for b in value.split(",")]
        shown = "a batch size"
    elif flag == "--dynamic_image_size":  # "224,224;448,448": one H,W for every input
        profiles = _image_profiles(value, dynamic, shapes, height_width, images)
        shown = "a height and a width (H,W)"
    else:  # "16,16;64,64": a value for each -1 dim, profile by profile
        profiles = [[v.strip() for v in part.split(",")]
                    for part in filter(None, (p.strip() for p in value.split(";")))]
        shown = f"{len(dynamic)} whole number(s), one per -1 dim of --input_shape ({where})"
    listed = []
    for values in profiles:
        if len(values) != len(dynamic) or not all(v.isdecimal() and int(v) for v in values):
            raise OptionError(f"{flag}={value}: each profile gives {shown}, sizes of 1 or more")
        listed.append(",".join(f"{name}[{axis}]={v}" for (name, axis), v in zip(dynamic, values)))
    return ";".join(listed)


def _image_profiles(value: str, dynamic: list[tuple[str, int]], shapes: dict[str, list[str]],
                    height_width: tuple[int, int] | None,
                    images: Mapping[str, object]) -> list[list[str]]:
    """ATC's --dynamic_image_size profiles as a value per -1 dim: each "H,W" goes to every
    input's height and width, which --input_format places, and which must be its -1 dims."""
    flag = "--dynamic_image_size"
    if height_width is None:
        raise OptionError(f"{flag}: --input_format=ND has no height or width (ATC takes NCHW "
                          "or NCDHW here); --dynamic_dims sets the -1 dims one by one")
    if set(images) & {name for name, _ in dynamic}:
        raise OptionError(f"{flag}: {', '.join(sorted(images))}: --insert_op_conf's "
                          "src_image_size sets the size of the image it preprocesses")
    h_axis, w_axis = height_width
    for name in dict.fromkeys(name for name, _ in dynamic):
        axes = {axis for n, axis in dynamic if n == name}
        if axes != {h_axis, w_axis} or len(shapes[name]) != w_axis + 1:
            raise OptionError(f"{flag}: --input_shape gives {name} "
                              f"{','.join(shapes[name])}: ATC's --dynamic_image_size takes -1 "
                              f"as an input's height and width, dims {h_axis} and {w_axis} of "
                              "its --input_format, and nowhere else; --dynamic_dims sets other "
                              "dims")
    pairs = [[v.strip() for v in part.split(",")]
             for part in filter(None, (p.strip() for p in value.split(";")))]
    if not pairs or any(len(pair) != 2 for pair in pairs):
        raise OptionError(f"{flag}={value}: each profile gives a height and a width (H,W), "
                          f"for every input's -1 height and width "
                          f"({', '.join(f'{n}[{a}]' for n, a in dynamic)})")
    return [[pair[0] if axis == h_axis else pair[1] for _, axis in dynamic] for pair in pairs]
