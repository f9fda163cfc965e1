"""The precision and quantization flags of the commands that compile (optimize, tune, bisect,
diff --pass), and the compile options they set."""

from __future__ import annotations

import os

from graphopt.cli_types import path_text
from graphopt.errors import OptionError, UsageError
from graphopt.option_names import spelled
from graphopt.precision_modes import OP_TYPE_ENTRY


def _comma_list(values, flag: str = "") -> set[str]:
    """The names of a repeatable comma-list flag; an empty one (`--keep-dtype ""`, an unset
    shell variable, a stray comma alone) is refused rather than read as none."""
    names = {item.strip() for value in values or () for item in value.split(",") if item.strip()}
    if values and not names:
        raise OptionError(f"{flag}: no name given")
    return names


# Endings of ATC's --keep_dtype list files, which no node name has.
LIST_SUFFIXES = (".cfg", ".txt", ".lst", ".list")


def keep_dtype_files(values) -> list[str]:
    """The --keep-dtype entries that name list files (read, so not to be overwritten)."""
    return sorted(name for name in _comma_list(values, spelled("--keep-dtype"))
                  if os.path.isfile(name))


def check_keep_dtype(values) -> None:
    """Read --keep-dtype's entries as a compile would, for their errors alone (a missing list
    file): graphopt atc drops the flag where ATC's must_keep_origin_dtype makes it redundant."""
    _keep_dtype(set(_comma_list(values, spelled("--keep-dtype"))))


def _keep_dtype(names: set[str]) -> tuple[set[str], set[str]]:
    """--keep-dtype's node names, and op types: an entry that names a file is read as ATC's
    --keep_dtype list (a node name, or `OpType::Type` for an op type, per line; `#` comments);
    any other entry is such a line itself, unless it can only be a path (_check_not_a_path)."""
    nodes, types = set(), set()
    for name in names:
        if not os.path.isfile(name):
            _check_not_a_path(name)
            _keep_entry(name, spelled('--keep-dtype'), nodes, types)
            continue
        try:
            with open(name, encoding="utf-8-sig") as f:
                lines = [line.split("#", 1)[0].strip() for line in f]
        except (OSError, UnicodeDecodeError) as exc:
            raise OptionError(f"{spelled('--keep-dtype')} {name}: cannot read it "
                              f"({getattr(exc, 'strerror', None) or exc})") from None
        entries = [line for line in lines if line]
        if not entries:
            raise OptionError(f"{spelled('--keep-dtype')} {name}: the file names no node or "
                              "op type")
        for entry in entries:
            _keep_entry(entry, f"{spelled('--keep-dtype')} {name}", nodes, types)
    return nodes, types


def _check_not_a_path(entry: str) -> None:
    """OptionError for an entry that is not a file but can only mean one: a directory, a list
    file's ending, or a file with an extension in a folder that exists. A mistyped or missing
    list would otherwise be a node name that matches nothing, which only a note says. Exporters
    name nodes with slashes (`/backbone/conv1/Conv`, `/Relu`) but no extension after the last
    one, so those stay node names."""
    if os.path.isdir(entry):
        raise OptionError(f"{spelled('--keep-dtype')} {entry}: is a directory, expected node names or ATC's "
                          "--keep_dtype list file")
    folder, base = os.path.split(entry)
    extension = os.path.splitext(base)[1]
    # A letter after the dot: `Conv.0` (paddle2onnx's names) is no file name.
    if extension.lower() in LIST_SUFFIXES or \
            (folder and extension[1:2].isalpha() and os.path.isdir(folder)):
        raise OptionError(f"{spelled('--keep-dtype')} {entry}: no such file (a node name spelled like a "
                          "path goes in a list file, one name per line)")


def _keep_entry(entry: str, where: str, nodes: set[str], types: set[str]) -> None:
    """One --keep-dtype entry into `nodes`, or, as `OpType::Type`, into `types`."""
    kind, separator, op_type = entry.partition(OP_TYPE_ENTRY)
    if separator and not kind:
        if not op_type.strip():
            raise OptionError(f"{where}: {entry!r} names no op type")
        types.add(op_type.strip())
    else:
        nodes.add(entry)


def add_precision_args(p, report: bool = True, scope: str = "") -> None:
    """The precision flags; `report`: with --no-accuracy-report (commands that compile and
    write a model print the report); `scope` heads the group's description (diff's
    "with --pass: ")."""
    from graphopt.precision_modes import CALIBRATION_METHODS, INT4_METHODS, MODES, QUANTIZE

    g = p.add_argument_group("precision and quantization",
                             f"{scope}compile as `graphopt optimize` does with these flags"
                             if scope else None)
    # In any case, as --output-type takes FP16: ATC's users write the dtype upper-case.
    g.add_argument("--precision", type=str.lower, choices=MODES, default="keep",
                   help="fp16/bf16: every float32 op the target runs in half; mixed-fp16/"
                        "mixed-bf16: matrix work in half, sensitive ops (softmax, reductions, "
                        "normalizations, exp/log/pow/sqrt/div) float32 (default keep)")
    g.add_argument("--precision-allow", action="append", metavar="OPS",
                   help="op types converted under a mixed mode (and under fp16/bf16 where no "
                        "matrix work is near); comma list, repeatable")
    g.add_argument("--precision-deny", action="append", metavar="OPS",
                   help="op types kept in their dtype; comma list, repeatable")
    g.add_argument("--keep-dtype", action="append", metavar="NODES|FILE",
                   help="node names (or OpType::Type for op types) kept in their dtype; "
                        "comma list, repeatable; a file is read as ATC's --keep_dtype list "
                        "(one per line)")
    g.add_argument("--quantize", type=str.lower, choices=QUANTIZE, default="none",
                   help="int8: static INT8 with calibration; int4: weight-only block-wise INT4 "
                        "of MatMul/Gemm weights (com.microsoft::MatMulNBits)")
    g.add_argument("--calibration", type=path_text, metavar="FILE.npz|DIR",
                   help="representative inputs (int8 ranges, --int4-method gptq's rounding; "
                        "the accuracy report's first 8 samples)")
    g.add_argument("--calibration-method", choices=CALIBRATION_METHODS,
                   help="int8 activation range method (default minmax)")
    g.add_argument("--calibration-percentile", type=float, metavar="P",
                   help="int8 percentile method: the clipping percentile (default 99.999)")
    scales = g.add_mutually_exclusive_group()
    scales.add_argument("--per-channel", dest="per_channel", action="store_true", default=None,
                        help="int8: one weight scale per output channel (the default)")
    scales.add_argument("--per-tensor", dest="per_channel", action="store_false",
                        help="int8: one weight scale per tensor")
    g.add_argument("--activation-symmetric", action="store_true",
                   help="int8: symmetric activation ranges instead of asymmetric ones "
                        "(written as uint8 around 128 on the CPU, int8 for an NPU)")
    g.add_argument("--quant-skip", action="append", metavar="NAMES_OR_OPS",
                   help="node names or op types left float; comma list, repeatable")
    g.add_argument("--quantize-ends", action="store_true",
                   help="int8: quantize the end layers too (kept float by default: those that read "
                        "a graph input or write a graph output, e.g. a classifier's stem and "
                        "head, a language model's vocabulary head)")
    g.add_argument("--quantize-sensitive", action="store_true",
                   help="int8: quantize the layers whose outputs their int8 inputs and weights "
                        "would drown in rounding error too (kept float by default, found by "
                        "simulating the quantization on the calibration data)")
    g.add_argument("--no-equalize-channels", action="store_true",
                   help="int8: leave the channel ranges as they are (by default, where Conv "
                        "and Gemm layers write and read activations only through Relu, pooling "
                        "and Add, each channel's scale moves into their weights so that its "
                        "activations use the int8 range more evenly; the float outputs stay "
                        "the same)")
    g.add_argument("--int4-group-size", type=int, metavar="N",
                   help="int4: weights per scale along K, a power of 2 ≥ 16 (default 32)")
    g.add_argument("--int4-embeddings", action="store_true",
                   help="int4: quantize embedding tables too (com.microsoft::"
                        "GatherBlockQuantized); a tied output head shares its table's bytes")
    g.add_argument("--int4-method", choices=INT4_METHODS,
                   help="int4: rtn rounds each block to its fitted range (default); gptq also "
                        "moves each weight's rounding error onto the weights not yet rounded, "
                        "to keep the layer's outputs on the --calibration inputs (slower)")
    g.add_argument("--int4-accuracy-level", type=int, metavar="L",
                   help="int4: what MatMulNBits computes in: 0 float activations (default), "
                        "1 fp32, 2 fp16, 3 bf16, 4 activations quantized to int8 on the fly "
                        "(faster token-by-token decoding on the CPU, slightly less accurate)")
    if report:
        g.add_argument("--no-accuracy-report", action="store_true",
                       help="skip the accuracy report printed after a converted or quantized "
                            "compile, and its speed line")


def precision_argv(args) -> list[str]:
    """The precision and quantization flags of a parsed command line, as `graphopt optimize`
    takes them: for a command that prints the optimize line that goes with its work."""
    argv: list[str] = []
    for flag in ("--precision", "--quantize"):
        value = getattr(args, flag[2:])
        if value not in ("keep", "none"):
            argv += [flag, value]
    for flag in ("--precision-allow", "--precision-deny", "--keep-dtype", "--quant-skip"):
        for value in getattr(args, flag[2:].replace("-", "_")) or ():
            argv += [flag, value]
    for flag in ("--calibration", "--calibration-method", "--calibration-percentile",
                 "--int4-group-size", "--int4-method", "--int4-accuracy-level"):
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            argv += [flag, str(value)]
    if args.per_channel is not None:
        argv.append("--per-channel" if args.per_channel else "--per-tensor")
    for flag in ("--activation-symmetric", "--quantize-ends", "--quantize-sensitive",
                 "--no-equalize-channels", "--int4-embeddings"):
        if getattr(args, flag[2:].replace("-", "_")):
            argv.append(flag)
    return argv


def precision_options(args) -> dict:
    """The Options fields the precision flags set ({} when none is used); flags that only one
    scheme reads are refused with the others."""
    int8_only = {"--calibration-method": args.calibration_method,
                 "--calibration-percentile": args.calibration_percentile,
                 "--per-channel/--per-tensor": args.per_channel,
                 "--activation-symmetric": args.activation_symmetric or None,
                 "--quantize-ends": args.quantize_ends or None,
                 "--quantize-sensitive": args.quantize_sensitive or None,
                 "--no-equalize-channels": args.no_equalize_channels or None}
    for flag, value in int8_only.items():
        if value is not None and args.quantize != "int8":
            raise OptionError(f"{flag} applies to --quantize int8")
    for flag, value in {"--int4-group-size": args.int4_group_size,
                        "--int4-embeddings": args.int4_embeddings or None,
                        "--int4-accuracy-level": args.int4_accuracy_level,
                        "--int4-method": args.int4_method}.items():
        if value is not None and args.quantize != "int4":
            raise OptionError(f"{flag} applies to --quantize int4")
    if args.quant_skip and args.quantize == "none":
        raise OptionError("--quant-skip applies to --quantize int8|int4")
    if args.calibration and not os.path.exists(args.calibration):
        raise OptionError(f"--calibration {args.calibration}: no such file or directory")
    if args.calibration and not (os.path.isdir(args.calibration)
                                 or (os.path.isfile(args.calibration)
                                     and args.calibration.endswith(".npz"))):
        raise OptionError(f"--calibration {args.calibration}: not an .npz file or a directory")
    if args.calibration_percentile is not None and args.calibration_method != "percentile":
        raise OptionError("--calibration-percentile applies to --calibration-method percentile "
                          f"(the ranges here come from {args.calibration_method or 'minmax'})")
    if args.calibration_percentile is not None and not 50 < args.calibration_percentile <= 100:
        raise UsageError(f"--calibration-percentile {args.calibration_percentile}: must be in "
                          "(50, 100] (99.999 clips the top 0.001% of each tensor)")
    keep_nodes, keep_types = _keep_dtype(_comma_list(args.keep_dtype, "--keep-dtype"))
    options = {"precision": args.precision, "quantize": args.quantize,
               "precision_allow": _comma_list(args.precision_allow, "--precision-allow"),
               "precision_deny": _comma_list(args.precision_deny, "--precision-deny"),
               # op types as the pass takes them, so that its notes name --keep-dtype
               "keep_dtype": keep_nodes | {OP_TYPE_ENTRY + op for op in keep_types},
               "quant_skip": _comma_list(args.quant_skip, "--quant-skip"),
               "calibration": args.calibration,
               "calibration_method": args.calibration_method,
               "calibration_percentile": args.calibration_percentile,
               "per_channel": args.per_channel,
               "activation_symmetric": args.activation_symmetric or None,
               "quant_keep_ends": False if args.quantize_ends else None,
               "quant_keep_sensitive": False if args.quantize_sensitive else None,
               "quant_equalize": False if args.no_equalize_channels else None,
               "int4_group_size": args.int4_group_size,
               "int4_embeddings": args.int4_embeddings or None,
               "int4_accuracy_level": args.int4_accuracy_level,
               "int4_method": args.int4_method}
    options = {k: v for k, v in options.items() if v not in (None, set())}
    if options == {"precision": "keep", "quantize": "none"} and not args.calibration:
        return {}
    return options
