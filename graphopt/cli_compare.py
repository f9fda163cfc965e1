"""`graphopt compare`: a reference .onnx against a candidate .onnx or .om, tensor by tensor."""

from __future__ import annotations


from graphopt.cli_paths import check_output_path, refuse_model_name
from graphopt.cli_types import (JoinedShapes, cosine, input_shapes, non_negative_int, path_text,
                                tolerance)
from graphopt.errors import OptionError
from graphopt.help_format import HelpFormatter

EXAMPLES = """examples:
  graphopt compare model.onnx model.om                       # outputs on seeded random inputs
  graphopt compare model.onnx model.opt.onnx --per-tensor    # and every shared intermediate
  graphopt compare model.onnx model.om --inputs x.npz --csv report.csv
  graphopt compare model.onnx model_fp16.onnx --min-cosine 0.999 --json
  graphopt compare model.onnx model_int8.om --samples held_out/   # accuracy over many samples

The exit status is 0 when every output passes, 1 when any fails and 2 on an error (an
unreadable model, bad --inputs), as cmp's and diff's are. Intermediates are informative:
their failures are listed, and the first one in graph order is named (that is where the
accuracy broke), but they never change the exit status.
"""


def add_compare_parser(sub) -> None:
    p = sub.add_parser(
        "compare", help="compare a model's outputs (and intermediates) with a reference",
        description="Run a reference .onnx (onnxruntime, optimizations disabled) and a candidate\n"
                    "(.onnx run the same way, or an .om run by graphopt's runtime) on the same\n"
                    "inputs and report, per output, cosine similarity, max/mean absolute and\n"
                    "relative error, RMSE, KL divergence (for probability outputs) and the count\n"
                    "of elements beyond tolerance. With --per-tensor, also every value both graphs\n"
                    "compute under the same name with the same shape, in the candidate's order.\n"
                    "A candidate .onnx that graphopt quantized or cast to half runs at\n"
                    "ORT_ENABLE_ALL, as deployed: its QDQ pairs become int8 kernels only there.",
        formatter_class=HelpFormatter, epilog=EXAMPLES)
    p.add_argument("reference", type=path_text, help="the reference .onnx model")
    p.add_argument("candidate", type=path_text, help="the model to check: .onnx or a compiled .om")
    p.add_argument("--inputs", type=path_text, metavar="NPZ",
                   help="an .npz with one array per input, named like the input "
                        "(default: seeded random data)")
    p.add_argument("--samples", type=path_text, metavar="DATA",
                   help="compare on every sample of DATA, an .npz of stacked samples or a "
                        "directory of .npz files in any layout --calibration takes, and print "
                        "the accuracy report over them: each output's worst cosine, top-1 "
                        "agreement and perplexity over all samples, and on which samples the "
                        "rule fails")
    p.add_argument("--seed", type=non_negative_int, metavar="N",
                   help="seed for the random inputs used without --inputs (default 0)")
    p.add_argument("--input-shape", type=input_shapes, action=JoinedShapes, metavar="SHAPES",
                   help='dims for the random inputs\' dynamic axes: "x:1,3,224,224;mask:1,128"')
    p.add_argument("--per-tensor", action="store_true",
                   help="also compare the intermediates both models compute (same name and shape)")
    add_rule_options(p)
    p.add_argument("--csv", type=path_text, metavar="FILE",
                   help="also write the rows to FILE (atomically)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead")
    p.set_defaults(func=_cmd_compare, error_status=2)


def add_rule_options(p, scope: str = "",
                     lossy: str = "a candidate (.om or .onnx) graphopt compiled with") -> None:
    """--rtol/--atol/--min-cosine, the rule compare, report and bisect judge outputs by; `scope`
    starts each help text (report's: "--reference: "), `lossy` says where cosine is the
    default (bisect's: "a compile whose passes include")."""
    p.add_argument("--rtol", type=tolerance, metavar="R",
                   help=f"{scope}relative tolerance of the allclose rule (default 1e-4)")
    p.add_argument("--atol", type=tolerance, metavar="A",
                   help=f"{scope}absolute tolerance of the allclose rule (default 1e-5)")
    p.add_argument("--min-cosine", type=cosine, metavar="C",
                   help=f"{scope}pass a float tensor when its cosine similarity is ≥ C, instead "
                        f"of the rtol/atol rule (default for {lossy} QuantizeInt8 or "
                        "ConvertPrecision: 0.999; QuantizeInt4Weights: 0.98)")


def check_rule_options(args) -> None:
    if args.min_cosine is not None and (args.rtol is not None or args.atol is not None):
        raise OptionError("--min-cosine replaces the --rtol/--atol rule; give one or the other")


def _check_options(args) -> None:
    check_rule_options(args)
    if args.samples:
        given = [flag for flag, value in (("--inputs", args.inputs), ("--seed", args.seed),
                                          ("--input-shape", args.input_shape),
                                          ("--per-tensor", args.per_tensor),
                                          ("--csv", args.csv), ("--json", args.json))
                 if value not in (None, False)]
        if given:
            raise OptionError(f"--samples reports over every sample of its data; {given[0]} "
                              "applies to a comparison on one input: drop one or the other")
    if args.seed is not None and args.inputs:
        raise OptionError("--seed only applies to random inputs; drop it or --inputs")
    if args.input_shape and args.inputs:
        raise OptionError("--input-shape only shapes random inputs; drop it or --inputs")
    if args.csv:
        check_output_path("--csv", args.csv, {"the reference": args.reference,
                                              "the candidate": args.candidate,
                                              "--inputs": args.inputs})
        refuse_model_name("--csv", args.csv, "compare writes CSV")


def _winograd_note(pass_log: list) -> str | None:
    """What to say when the candidate is an .om whose -O3 Winograd convs explain small
    differences."""
    from graphopt.codegen.inspect_om import winograd_rewrites
    from graphopt.passes.winograd import tolerance_hint

    rewrites = winograd_rewrites(pass_log)
    return tolerance_hint(rewrites, "--atol (or --min-cosine)") if rewrites else None


def _pass_log(candidate) -> list:
    """The candidate's pass log when it is an .om (which lossy passes made it, also in an earlier
    compile); for an .onnx, the lossy passes its metadata names when graphopt wrote it (read
    from the proto compare runs, so the model is parsed once)."""
    from graphopt.tools.accuracy_rule import pass_log_of_om, pass_log_of_onnx

    if candidate.session is not None:
        return pass_log_of_om(candidate.session.artifact)
    return pass_log_of_onnx(candidate.proto)


def _cmd_compare(args) -> int:
    from graphopt.lent_weights import lending

    with lending():  # the reference's weights stay mapped in its data file (compare_run)
        return _compare(args)


def _compare(args) -> int:
    from graphopt.tools.accuracy_rule import accuracy_rule
    from graphopt.tools.compare import compare_models
    from graphopt.tools.compare_format import format_report, report_json, write_csv
    from graphopt.tools.compare_run import load_candidate, load_reference

    _check_options(args)
    reference, candidate = load_reference(args.reference), load_candidate(args.candidate)
    pass_log = _pass_log(candidate)
    judge, note = accuracy_rule(pass_log, args.rtol, args.atol, args.min_cosine)
    if args.samples:
        return _compare_samples(args, reference, candidate, judge, note)
    report = compare_models(
        reference, candidate, args.inputs, per_tensor=args.per_tensor, **judge,
        seed=0 if args.seed is None else args.seed, input_shapes=args.input_shape,
        rounding=args.rtol is None and args.atol is None)  # tolerances given apply as given
    # The rule's own note, and what explains a failure, in the notes --json carries too.
    report.notes += [text for text in (
        note, None if report.passed or args.min_cosine is not None else _winograd_note(pass_log))
        if text]
    if args.csv:  # before the report: a reader that stops early (`| head`) must not cost it
        write_csv(report, args.csv)
    print(report_json(report) if args.json else format_report(report))
    if args.csv and not args.json:
        print(f"wrote {args.csv}")
    return 0 if report.passed else 1


def _compare_samples(args, reference, candidate, judge: dict, note: str) -> int:
    """--samples: the accuracy report over every sample, then the rule compare judges each
    sample by, and the samples it fails on. Exit 1 when any fails."""
    from graphopt.quant.calib_data import read_as
    from graphopt.tools.accuracy import accuracy_report
    from graphopt.tools.compare import compare_models
    from graphopt.tools.rule_text import rule_text

    with read_as("--samples"):
        report = accuracy_report(reference, candidate, calibration=args.samples, samples=None)
    failed = []
    for number, sample in enumerate(report.samples or [report.feeds], 1):
        run = compare_models(reference, candidate, sample, **judge,
                             rounding=args.rtol is None and args.atol is None)
        if not run.passed:
            names = ", ".join(repr(row.name) for row in run.outputs if not row.passed)
            failed.append(f"{number} ({names})")
    print(report.format())
    if note:
        print(f"note: {note}")
    count = len(report.samples) or 1
    rule = rule_text(judge["rtol"], judge["atol"], judge["min_cosine"])
    if failed:
        shown = ", ".join(failed[:10]) + (f", and {len(failed) - 10} more" if len(failed) > 10
                                            else "")
        print(f"fails {rule} on {len(failed)} of {count} sample(s): {shown}")
        return 1
    print(f"passes {rule} on all {count} sample(s)")
    return 0
