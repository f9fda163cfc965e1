"""`graphopt run` and `graphopt inspect`: execute a compiled .om and look inside one."""

from __future__ import annotations

import json
import os

from graphopt.cli_paths import check_output_path, refuse_model_name
from graphopt.cli_types import (JoinedShapes, input_shapes, non_negative_int, path_text,
                                run_count, thread_count, warmup_count)
from graphopt.errors import InputError, OptionError, UsageError, naming, one_line
from graphopt.help_format import HelpFormatter
from graphopt.input_files import looks_like_zip
from graphopt.source_marks import extra_fixed_inputs, extra_preprocessing
from graphopt.warning_scope import kept_notices

DEFAULT_WARMUP = 3

RUN_EXAMPLES = """examples:
  graphopt run model.om                                 # seeded random inputs, output summary
  graphopt run model.om --inputs x.npz --outputs y.npz  # your inputs, outputs saved by name
  graphopt run model.om --inputs x.npz --repeat 100 --threads 4

--inputs is an .npz holding one array per model input, named like the input:
  np.savez("x.npz", input=np.zeros((1, 3, 224, 224), np.float32))
"""

INSPECT_EXAMPLES = """examples:
  graphopt inspect model.om           # partitions, routing, pass log, checksums verified
  graphopt inspect model.om --json    # the manifest plus per-partition op counts
  graphopt inspect model.om --nodes   # and every partition's nodes (name, op, tensors, attributes)
  graphopt inspect model.om --json --nodes -o model.json   # ATC's --mode=1, as a file
  graphopt inspect model.onnx         # a plain ONNX model: signature, opsets, ops, weight bytes
"""


def add_run_parser(sub) -> None:
    p = sub.add_parser(
        "run", help="run a compiled .om on inputs and report outputs or latency",
        description="Load an .om artifact (every checksum verified), run it once with graphopt's\n"
                    "runtime on onnxruntime and summarize each output. With --repeat, time that\n"
                    "many runs after a warmup and print latency percentiles instead.\n\n"
                    "Without --inputs the inputs are seeded random data shaped by the artifact's\n"
                    "signature, which needs every input dim to be static or pinned with\n"
                    "--input-shape.",
        formatter_class=HelpFormatter, epilog=RUN_EXAMPLES)
    p.add_argument("model", type=path_text, help="the compiled .om artifact")
    p.add_argument("--inputs", type=path_text, metavar="NPZ",
                   help="an .npz with one array per input, named like the input (default: "
                        "seeded random data)")
    p.add_argument("--outputs", type=path_text, metavar="NPZ",
                   help="write the outputs of the first run to this .npz, one array per output "
                        "(written atomically)")
    p.add_argument("--repeat", type=run_count, metavar="N",
                   help="time N runs and print p50/p90/p99, min, max and mean latency")
    p.add_argument("--warmup", type=warmup_count, metavar="N",
                   help=f"untimed runs before the timed ones (default {DEFAULT_WARMUP}; "
                        "needs --repeat)")
    p.add_argument("--threads", type=thread_count, metavar="N",
                   help="onnxruntime intra-op threads per partition (default, or 0: "
                        "onnxruntime chooses, usually one per core)")
    p.add_argument("--seed", type=non_negative_int, metavar="N",
                   help="seed for the random inputs used without --inputs (default 0)")
    p.add_argument("--input-shape", type=input_shapes, action=JoinedShapes, metavar="SHAPES",
                   help='pin the dynamic dims of the random inputs, ATC style: '
                        '"input_ids:1,128" (a dim pinned on one input is pinned on every input '
                        'that shares its name; with --profile, the dims that profile leaves '
                        'open); not with --inputs')
    p.add_argument("--profile", metavar="NAME",
                   help="an artifact with shape profiles (--dynamic-dims): open this profile "
                        "alone and shape the random inputs for it (default: every profile, "
                        "random inputs for the first); not with --inputs, whose shapes "
                        "choose the profile")
    p.set_defaults(func=_cmd_run)


def add_inspect_parser(sub) -> None:
    p = sub.add_parser(
        "inspect", help="show what is inside an .om artifact (or an .onnx model)",
        description="Print an .om artifact readably: format and graphopt version, the source model\n"
                    "and its sha256, the target, the input/output signature, the partitions in\n"
                    "execution order (device, node and op counts, tensors in and out, size), the\n"
                    "routing of tensors between them, the pass log and any extra sections. Every\n"
                    "member's checksum is verified first.\n\n"
                    "Given an .onnx model instead, print its signature, opsets, op counts,\n"
                    "model-local functions and weight bytes.",
        formatter_class=HelpFormatter, epilog=INSPECT_EXAMPLES)
    p.add_argument("model", type=path_text, help="an .om artifact or an .onnx model")
    p.add_argument("--json", action="store_true",
                   help="print JSON: for an .om the manifest plus per-partition op counts")
    p.add_argument("--nodes", action="store_true",
                   help="also list every node (name, op, inputs, outputs, attributes) of each "
                        "partition, or of the .onnx model: under \"graph\" with --json, what "
                        "ATC's --mode=1 JSON gives")
    p.add_argument("-o", "--output", type=path_text, metavar="FILE",
                   help="write to FILE (replaced whole, never half-written) instead of "
                        "standard output (- is standard output)")
    p.set_defaults(func=_cmd_inspect)


# --- run -----------------------------------------------------------------------------------


def _check_run_options(args) -> int:
    """The warmup count to use; OptionError for options that cannot work together."""
    if args.warmup is not None and args.repeat is None:
        raise OptionError("--warmup is only used with --repeat")
    if args.seed is not None and args.inputs:
        raise OptionError("--seed only applies to random inputs; drop it or --inputs")
    if args.input_shape and args.inputs:
        raise OptionError("--input-shape shapes random inputs; with --inputs the arrays' own "
                          "shapes apply")
    if args.profile is not None and args.inputs:
        raise OptionError("--profile shapes random inputs; with --inputs their shapes choose "
                          "the profile")
    if args.outputs:
        check_output_path("--outputs", args.outputs, {"the model": args.model,
                                                      "--inputs": args.inputs})
        if not args.outputs.lower().endswith(".npz"):  # a file named by mistake stays whole
            raise UsageError(f"--outputs {args.outputs}: run writes an .npz (name it .npz)")
    return DEFAULT_WARMUP if args.warmup is None else args.warmup


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.2f} ms" if ms < 10 else f"{ms:.1f} ms"


def _cmd_run(args) -> int:
    from graphopt.codegen.feeds import (BeyondNumpy, check_feeds, inputs_npz, npz_holds,
                                        random_feeds)
    from graphopt.codegen.loader import load
    from graphopt.codegen.run_stats import (
        LatencyStats,
        format_latency,
        format_outputs,
        time_runs,
        timed,
    )

    warmup = _check_run_options(args)
    # A bad file fails before the slow load.
    feeds = inputs_npz(args.inputs) if args.inputs else None
    with kept_notices() as notes:
        # --profile opens that profile's sessions alone.
        session, load_seconds = timed(lambda: load(
            args.model, intra_op_num_threads=args.threads,
            profiles=None if args.profile is None else [args.profile]))
    for note in notes:  # e.g. an NPU partition standing in on the CPU provider
        print(f"note: {note}")

    if feeds is None:
        seed = 0 if args.seed is None else args.seed
        signature = _profile_signature(session)
        if args.input_shape:  # the runtime takes the shape profile the pinned shapes fit
            from graphopt.input_shapes import parse_input_shapes, pinned_signature

            # With --profile, the pins size the dims that profile leaves open.
            signature, label = ((signature, f"{args.model} profile {args.profile}")
                                if args.profile is not None else (session.inputs, args.model))
            signature = pinned_signature(signature, parse_input_shapes(args.input_shape), label)
        images = extra_preprocessing(session.artifact.extra)  # --insert-op-conf's uint8 ones
        try:
            feeds = random_feeds(signature, seed=seed, images=images)
        except BeyondNumpy as exc:
            raise InputError(f"{args.model}: {exc}") from None
        except InputError as exc:
            # An .npz holds arrays: a sequence or map can only be fed from Python.
            held = [e for e in signature if not npz_holds(e)]
            python = "feed it from Python: graphopt.load(path).run({name: value, …})"
            hint = ("pin its dims with --input-shape, or pass --inputs FILE.npz with concrete "
                    "arrays" if not held else
                    f"size the tensors it holds with --input-shape NAME:DIMS, or {python}"
                    if all((e.get("element") or {}).get("shape") is not None for e in held)
                    else python)
            raise InputError(f"{args.model}: {exc}; {hint}") from None
        if feeds:  # a model of no inputs is run as it is, on nothing random
            print(f"note: no --inputs given: running on seeded random inputs (seed {seed}) "
                  "made from the artifact's signature")
    else:
        try:
            unknown = feeds.keys() - {entry["name"] for entry in session.inputs}
            check_feeds(session.inputs, feeds,  # the details are read only to explain a name
                        extra_fixed_inputs(session.artifact.extra) if unknown else ())
        except InputError as exc:
            raise InputError(f"--inputs {args.inputs}: {exc}") from None

    where = args.model + (f" on --inputs {args.inputs}" if args.inputs else "")
    with naming(where):
        outputs, first_seconds = timed(lambda: session.run(feeds))
    types = {e["name"]: e["type"] for e in session.outputs if "type" in e}
    # Written before anything is printed: a reader that stops early (`| head`) must not cost it.
    written = _write_outputs(args.outputs, outputs, types) if args.outputs else None
    print(one_line(f"{args.model}: loaded in {_ms(load_seconds)}, first run "
                   f"{_ms(first_seconds)}"))
    if session.profiles:
        from graphopt.codegen.profile_match import dims_label

        chosen = session.profile_for(feeds)
        dims = next(p["dims"] for p in session.profiles if p["name"] == chosen)
        print(one_line(f"shape profile {chosen} ({dims_label(dims)}) of "
                       f"{len(session.artifact.profiles)}"))
    if args.repeat is not None:
        with naming(where):
            samples = time_runs(lambda: session.run(feeds), args.repeat, warmup)
        threads = "onnxruntime's default threads" if not args.threads else f"{args.threads} thread(s)"
        print(f"\nlatency of {args.repeat} run(s) after {warmup} warmup, {threads}")
        print(format_latency(LatencyStats.from_samples(samples)))
    else:
        print()
        print(format_outputs(outputs, types))
    if written is not None:
        print(written)
    return 0


def _write_outputs(path: str, outputs: dict, types: dict[str, str]) -> str:
    """Save the tensor outputs to an .npz; returns the lines that say so, naming a sequence,
    map or empty optional, which an .npz cannot hold, as left out."""
    import numpy as np

    from graphopt.codegen.feeds import output_label, save_npz

    arrays = {name: value for name, value in outputs.items() if isinstance(value, np.ndarray)}
    save_npz(path, arrays)
    # one_line: an output's name comes from the model and may hold a line break, which would
    # print a line of the model's making (the table above escapes it already).
    text = "\n" + one_line(f"wrote {path}: {', '.join(arrays) or 'no tensors'}")
    left = [f"{name} ({output_label(value, types.get(name))})" for name, value in outputs.items()
            if name not in arrays]
    if left:
        text += "\n" + one_line(f"note: not written, an .npz holds only tensors: "
                                f"{', '.join(left)}")
    return text


def _profile_signature(session) -> list[dict]:
    """The signature random inputs are made for: the first open shape profile's, if any."""
    return session.profiles[0]["inputs"] if session.profiles else session.inputs


# --- inspect -------------------------------------------------------------------------------


def _cmd_inspect(args) -> int:
    from graphopt.atomic import atomic_write_bytes
    from graphopt.codegen.inspect_nodes import format_nodes, node_records
    from graphopt.codegen.inspect_om import describe_om, format_om, partition_graphs
    from graphopt.codegen.inspect_onnx import describe_onnx, format_onnx, read_onnx
    from graphopt.codegen.om_read import is_om, load_om, looks_like_onnx

    path = args.model
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, expected an .om or .onnx file")
    if args.output == "-":  # standard output, as in most tools
        args.output = None
    if args.output:
        check_output_path("-o", args.output, {"the model": path})
        refuse_model_name("-o", args.output, "inspect writes text or JSON")
    # By content, with the suffix as a tie-breaker: a broken .om gets load_om's precise reason,
    # an ONNX model named .om is shown as one.
    if is_om(path) or looks_like_zip(path) or (path.lower().endswith(".om")
                                         and not looks_like_onnx(path)):
        artifact = load_om(path)
        if args.json:
            text = json.dumps(describe_om(artifact, nodes=args.nodes), indent=2)
        else:
            text = "\n\n".join([format_om(artifact)] + [
                format_nodes(node_records(graph), f"nodes of {title} ({len(graph.node)})")
                for title, graph in (partition_graphs(artifact) if args.nodes else ())])
    else:
        model = read_onnx(path)
        summary = describe_onnx(model, path)
        if args.json:
            if args.nodes:
                summary["graph"] = node_records(model.graph)
            text = json.dumps(summary, indent=2)
        else:
            text = format_onnx(summary) + (
                f"\n\n{format_nodes(node_records(model.graph), f'nodes ({len(model.graph.node)})')}"
                if args.nodes else "")
    if args.output:
        atomic_write_bytes(args.output, (text + "\n").encode())
        print(f"wrote {args.output}")
    else:
        print(text)
    return 0
