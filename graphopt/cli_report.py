"""`graphopt report`: one self-contained HTML page about a compiled .om."""

from __future__ import annotations

import os

from graphopt.cli_compare import add_rule_options, check_rule_options
from graphopt.cli_paths import check_output_path
from graphopt.cli_types import JoinedShapes, input_shapes, path_text
from graphopt.errors import OptionError, UsageError
from graphopt.help_format import HelpFormatter
from graphopt.input_files import looks_like_zip

EXAMPLES = """examples:
  graphopt report model.om -o report.html
  graphopt report model.om -o report.html --reference model.onnx --inputs x.npz
  graphopt report model.om -o report.html --tuning-db tuning.db --reference model.onnx
  graphopt report model_int8.om -o report.html --reference model.onnx --min-cosine 0.9995

The page has no scripts and loads nothing from the network: CSS and pictures (the graph
coloured by partition, the memory plans, the tuning curves) are inline, so it can be mailed
or archived as one file. Sections without data say what is missing and how to add it.
"""


def add_report_parser(sub) -> None:
    p = sub.add_parser(
        "report", help="write a self-contained HTML report of a compiled .om",
        description="Summarize a compiled .om in one HTML page: header and hashes, partitions,\n"
                    "the graph coloured by partition, the pass log, the memory plans, placement\n"
                    "and fallbacks, NPU kernel configs, and optionally the tuning history\n"
                    "(--tuning-db) and an accuracy check against the source model (--reference).",
        formatter_class=HelpFormatter, epilog=EXAMPLES)
    p.add_argument("model", type=path_text, help="the compiled .om")
    p.add_argument("-o", "--output", type=path_text, metavar="FILE.html",
                   help="where to write the page (default: the .om's name with .html)")
    p.add_argument("--reference", type=path_text, metavar="MODEL.onnx",
                   help="the source model: run it and the .om on the same inputs and compare "
                        "their outputs")
    p.add_argument("--inputs", type=path_text, metavar="NPZ",
                   help="--reference: an .npz with one array per input (default: seeded "
                        "random data)")
    p.add_argument("--input-shape", type=input_shapes, action=JoinedShapes, metavar="SHAPES",
                   help="--reference: dims for the random inputs' dynamic axes, "
                        '"x:1,3,224,224"')
    p.add_argument("--per-tensor", action="store_true",
                   help="--reference: also compare the intermediates both models compute")
    add_rule_options(p, "--reference: ", lossy="an .om compiled with")
    storage = p.add_mutually_exclusive_group()
    storage.add_argument("--tuning-db", metavar="FILE.db",
                         help="the tuning knowledge base `graphopt tune` filled")
    storage.add_argument("--storage", metavar="URL", help="an Optuna storage URL instead")
    p.set_defaults(func=_cmd_report)


def _output_path(args) -> str:
    out = args.output or os.path.splitext(args.model)[0] + ".html"
    # Without -o the page is named after the model: the refusal says so, not "-o".
    check_output_path("-o" if args.output else "-o (by default)", out,
                      {"the .om itself": args.model, "--reference": args.reference,
                       "--inputs": args.inputs, "--tuning-db": args.tuning_db})
    if not out.lower().endswith((".html", ".htm")):  # a file named by mistake stays whole
        raise UsageError(f"-o {out}: report writes an HTML page (name it .html)")
    return out


def _check_options(args) -> None:
    if not args.reference:
        given = {"--inputs": args.inputs is not None,
                 "--input-shape": args.input_shape is not None, "--per-tensor": args.per_tensor,
                 "--rtol": args.rtol is not None, "--atol": args.atol is not None,
                 "--min-cosine": args.min_cosine is not None}
        option = next((option for option, present in given.items() if present), None)
        if option:
            raise OptionError(f"{option} applies to the accuracy check; add --reference "
                              "MODEL.onnx")
    check_rule_options(args)
    if args.inputs and args.input_shape:
        raise OptionError("--input-shape only shapes random inputs; drop it or --inputs")


def _cmd_report(args) -> int:
    from graphopt.atomic import atomic_write_bytes
    from graphopt.codegen.inspect_om import unreadable_extras, winograd_rewrites
    from graphopt.codegen.om_read import is_om
    from graphopt.passes.winograd import tolerance_hint
    from graphopt.tools.report_data import gather
    from graphopt.tools.report_html import render_report

    _check_options(args)
    out = _output_path(args)
    # A damaged .om is left to the loader, which says what is wrong with it.
    if os.path.isfile(args.model) and not is_om(args.model) and not looks_like_zip(args.model):
        if not args.model.lower().endswith(".onnx"):  # neither an artifact nor a model
            raise OptionError(f"{args.model}: not a compiled .om artifact")
        raise OptionError(f"{args.model}: not a compiled .om; compile it first: graphopt "
                          f"optimize {args.model} -o MODEL.om --target cpu")
    from graphopt.cli_tune import named_storage  # --storage: a URL only, as for tune

    data = gather(args.model, reference=args.reference, inputs=args.inputs,
                  input_shapes=args.input_shape, per_tensor=args.per_tensor,
                  rtol=args.rtol, atol=args.atol, min_cosine=args.min_cosine,
                  tuning_db=named_storage(args),
                  tuning_option="--storage" if args.storage else "--tuning-db")
    # A file name that is not UTF-8 reaches the page as surrogate escapes: shown as \udcXX.
    with unreadable_extras(data.artifact):  # a hand-edited artifact's extras, say so
        page = render_report(data).encode("utf-8", errors="backslashreplace")
    atomic_write_bytes(out, page)
    parts = data.artifact.partitions
    # The weights' (de)quantizations are not drawn, but they are nodes of the .om all the same.
    nodes = sum(1 for n in data.graph.nodes if n.partition) + data.graph.weight_casts
    # The partition table counts the nodes inside If/Loop/Scan bodies too: say how many.
    nested = sum(p["nodes"] for p in data.partition_ops
                 if p["name"] in {part.name for part in parts}) - nodes
    inside = f" and {nested} inside If/Loop/Scan bodies" if nested > 0 else ""
    size = len(page) // 1024
    profiles = data.artifact.profiles
    # The graph and the counts are the default profile's: said where there are others.
    of = (f" in {profiles[0].get('name')}, the default of {len(profiles)} shape profiles"
          if len(profiles) > 1 else "")
    lines = [f"wrote {out} ({size} KiB): {len(parts)} partition(s), {nodes} node(s){inside}{of}"]
    if data.accuracy is not None:
        lines.append(f"accuracy: {'PASS' if data.accuracy.passed else 'FAIL'} "
                     f"({sum(r.passed for r in data.accuracy.outputs)}/"
                     f"{len(data.accuracy.outputs)} outputs within {data.accuracy.rule})"
                     # A sequence of one token passes on little: the inputs say what it ran on.
                     + (f" on {data.accuracy.inputs}" if "open dims set to 1"
                        in data.accuracy.inputs else ""))
        if data.accuracy_note:
            lines.append(f"  note: {data.accuracy_note}")
        rewrites = winograd_rewrites(data.artifact.pass_log)
        if not data.accuracy.passed and rewrites:
            lines.append(f"  ({tolerance_hint(rewrites)})")
    elif data.accuracy_skipped:
        lines.append(f"accuracy: not checked: {data.accuracy_skipped}")
    else:
        lines.append("accuracy: not checked (add --reference MODEL.onnx)")
    if data.tuning is None:
        lines.append("tuning: no storage given (add --tuning-db FILE)")
    else:
        tuned = sum(1 for k in data.tuning.kernels if k.get("trials"))
        kernels = (f"{tuned}/{len(data.tuning.kernels)} kernel signature(s) with studies"
                   if data.tuning.kernels else "no NPU cube kernel to tune")
        lines.append(f"tuning: {kernels}; subgraph study: "
                     f"{data.tuning.subgraph['study'] if data.tuning.subgraph else 'none'}")
    print("\n".join(lines))
    return 0
