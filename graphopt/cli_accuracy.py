"""After a lossy compile: the accuracy report against the input model, and the speed check."""

from __future__ import annotations

import os
import sys

def print_accuracy(args, source=None, changed=("QuantizeInt8", "QuantizeInt4Weights"),
                    fitted_ranges: bool = True, warnings_only: bool = False) -> None:
    """The accuracy report of the written model against the input (`source`, its proto as read
    before the output overwrote it, when it did), on --verify's inputs, the first calibration
    samples or seeded random data; a failure to run it is a warning, the model is written.
    `changed`: the lossy passes that changed the model (a note says what was fitted to the
    calibration data only when something was). `warnings_only` (-q): its warnings alone, on
    standard error, and no speed check."""
    from graphopt.errors import GraphoptError
    from graphopt.tools.accuracy import SeededInputsRefused, accuracy_report

    # What --verify ran on (inputs the user chose, which a quantization may not have seen),
    # else the first calibration samples, else random data.
    calibration = None if args.inputs else args.calibration
    reference = args.model if source is None else source
    try:
        if _edited(args):  # what the written model is compared with
            from graphopt.source_edits import edited_source, given_edits

            reference = edited_source(reference, label=args.model,
                                      input_shapes=args.input_shape, **given_edits(args))
        report = accuracy_report(reference, args.output,
                                 args.inputs, calibration=calibration,
                                 reference_label=_edited_label(args),
                                 input_shapes=None if calibration or args.inputs
                                 else args.input_shape)
    except GraphoptError as e:
        hint = ("; --calibration FILE.npz or --verify --inputs FILE.npz give it inputs the model "
                "runs on" if isinstance(e, SeededInputsRefused) else "")
        # Name the data it ran on: an id out of range there reads as the model's fault.
        data = (f"on --inputs {args.inputs}: " if args.inputs else
                f"on --calibration {calibration}: " if calibration else "")
        print(f"graphopt: warning: no accuracy report: {data}{e}{hint}", file=sys.stderr)
        return
    if warnings_only:
        below_the_rule(args, report)
        return
    print()
    print(report.format())
    if not below_the_rule(args, report) and str(report.inputs).startswith("seeded random"):
        # Nothing to warn of, but the figures are still the seeded data's: a Llama's int4 read
        # 0.992 on one token of id 0 or 1 and 0.986 on 32 tokens spread over its vocabulary.
        print(f"note: {seeded_note(args)}")
    pass_name = "QuantizeInt8" if args.quantize == "int8" else "QuantizeInt4Weights"
    if calibration and (args.quantize == "int8" or args.int4_method == "gptq") \
            and pass_name in changed and (fitted_ranges or args.quantize != "int8"):
        fitted = "its int8 ranges were" if args.quantize == "int8" else "GPTQ's rounding was"
        print(f"note: measured on the calibration data, which {fitted} fitted to; inputs "
              "it did not see may agree less (graphopt compare MODEL OUTPUT --samples "
              "HELD_OUT.npz reports on those)")
    if _runs_on_this_cpu(args):
        print_speed(args, reference, report.feeds, changed)


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


def print_speed(args, source, feeds, changed=("QuantizeInt8", "QuantizeInt4Weights",
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
    print(f"graphopt: warning: {args.output} runs slower than {args.model} on this machine: "
          f"{why}", file=sys.stderr)


def seeded_note(args) -> str:
    """What the seeded inputs were: the images --insert-op-conf made the model take get every
    pixel value (codegen.feeds.random_feeds), not the floats the other inputs get."""
    images = (", pixels 0-255 in --insert-op-conf's images"
              if getattr(args, "insert_op_conf", None) else "")
    return (f"measured on seeded random inputs (standard normal floats, integers 0 and 1"
            f"{images}), unlike a deployment's: --verify --inputs FILE.npz measures on real ones")


def below_the_rule(args, report) -> bool:
    """Warn of an output whose cosine is below the rule compare and --verify judge this lossy
    compile by (0.999, 0.98 after int4): the table shows the figure, but an exit 0 read as
    fine (entropy ranges took a random-weight MobileNetV2 to 0.96). Whether it warned so."""
    from graphopt.tools.accuracy_rule import LOSSY_PASSES
    from graphopt.tools.rule_text import cosine_text, exact

    threshold = LOSSY_PASSES["QuantizeInt4Weights" if args.quantize == "int4" else
                             "QuantizeInt8"]
    changed = [o for o in report.outputs if o.differ]
    if changed:  # compare and --verify require these equal: a class id that flipped fails
        shown = ", ".join(f"'{o.name}' {o.note}" for o in changed[:5])
        print(f"graphopt: warning: output(s) of integers, bools or strings changed, which "
              f"`graphopt compare` and --verify require equal: {shown}", file=sys.stderr)
    low = [o for o in report.outputs if o.cosine is not None and o.cosine < threshold]
    if not low:
        return False
    hint = ("; another --calibration-method may keep more (minmax is the default)"
            if args.quantize == "int8" and args.calibration_method not in (None, "minmax")
            else "")
    if str(report.inputs).startswith("seeded random"):
        # Integer inputs drawn as 0 and 1 are no model's bytes or ids: magika's int4 compile
        # read 0.973 on them and 0.999998 on real bytes.
        hint += f"; {seeded_note(args)}"
    shown = ", ".join(f"'{o.name}' {cosine_text(o.cosine, threshold)}" for o in low[:5])
    more = f", and {len(low) - 5} more (in the table)" if len(low) > 5 else ""
    print(f"graphopt: warning: cosine below {exact(threshold)}, the rule `graphopt compare` "
          f"and --verify judge this compile by: {shown}{more}{hint}", file=sys.stderr)
    return True
