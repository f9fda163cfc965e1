"""Start-up: what it costs to go from a file on disk to the first result.

For each model: onnxruntime's `InferenceSession` on the original at ORT_ENABLE_ALL plus its first
run (what a user does without graphopt), against `graphopt.load` of the `.om` that
`graphopt optimize model.onnx -o model.om` writes plus its first run (checksums verified, one
session per partition at the level the artifact records). For an artifact of one partition
without a weights blob, a third start is onnxruntime alone on that partition's bytes: the
floor that graphopt's reading and checking add to. For an artifact whose partitions skip
onnxruntime's weight pre-packing (batch-1 classifiers), the `.om` also starts with pre-packing
forced back on: what that skip saves. Cold starts are interleaved (original, .om, floor, packed
.om, original, …) with the files in the page cache, medians and ratios reported; the first
outputs are checked against the original's at ORT_DISABLE_ALL.

    python bench/startup.py                       # the zoo and the light CNNs
    python bench/startup.py --only resnet50 --runs 20
    python bench/startup.py --only unet --level 3  # the .om compiled at -O3 (Winograd convs)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import graphopt  # noqa: E402
from graphopt.cli_types import parse_size  # noqa: E402
from graphopt.codegen import load_om  # noqa: E402
from _common import (ATOL, Stats, compare_outputs, geomean, json_path, markdown_table,  # noqa: E402
                     positive_int, run_model, session_options, short_reason, summary,
                     write_json)
from _models import ZOO_FULL, light_models, matching, sized_zoo_models, unmatched  # noqa: E402

CPU = ["CPUExecutionProvider"]
WINOGRAD_ERROR = 4e-5  # tests/test_winograd.py's tolerance, relative to an output's largest value
CONV_NETS = ("resnet50", "mobilenetv2", "tiny", "unet", "light/")  # rows the 0.6× goal applies to
# A start-up of a few milliseconds is at the mercy of the scheduler: such rows get more rounds
# (still seconds of wall time) so that their medians settle.
QUICK_SECONDS, QUICK_RUNS = 0.01, 200


def start_original(path: str, feeds: dict) -> tuple[float, float, dict]:
    """(seconds to the first result, of which creating the session, the outputs)."""
    start = time.perf_counter()
    session = ort.InferenceSession(path, session_options("all"), providers=CPU)
    opened = time.perf_counter()
    names = [o.name for o in session.get_outputs()]
    outputs = session.run(names, {i.name: feeds[i.name] for i in session.get_inputs()})
    return time.perf_counter() - start, opened - start, dict(zip(names, outputs))


PACKED = {"session.disable_prepacking": "0"}  # overrides a partition's "prepack_weights": false


def start_om(path: str, feeds: dict, config: dict | None = None) -> tuple[float, float, dict]:
    """(seconds to the first result, of which graphopt.load, the outputs)."""
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = graphopt.load(path, intra_op_num_threads=1, inter_op_num_threads=1,
                                session_config=config)
    opened = time.perf_counter()
    outputs = session.run({e["name"]: feeds[e["name"]] for e in session.inputs})
    return time.perf_counter() - start, opened - start, outputs


def partition_bytes(artifact) -> tuple[bytes, str, bool] | None:
    """The model bytes, onnxruntime level and weight pre-packing of an artifact's only
    partition, when onnxruntime can start it from those bytes alone (one partition, no weights
    blob): the floor column."""
    if len(artifact.partitions) != 1 or artifact.spans:
        return None
    (part,) = artifact.manifest["partitions"]
    return (artifact.members[part["member"]], part.get("optimization_level") or "all",
            part.get("prepack_weights", True))


def start_floor(floor: tuple[bytes, str, bool], feeds: dict) -> float:
    """onnxruntime alone on the partition's bytes, set up as the runtime sets it up, plus its
    first run: what the .om's start costs without graphopt's reading and checking."""
    data, level, prepack = floor
    start = time.perf_counter()
    options = session_options(level)
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
    session = ort.InferenceSession(data, options, providers=CPU)
    session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
    return time.perf_counter() - start


def bench(model, runs: int, workdir: str, fold_size_limit: int | None = None,
          level: int = 2) -> dict:
    om_path = os.path.join(workdir, "model.om")
    try:
        graphopt.save(graphopt.optimize(model.path, target="cpu", fold_size_limit=fold_size_limit,
                                        level=level), om_path)
    except Exception as e:  # noqa: BLE001 - a compile failure is a row, not a crash
        return {"model": model.name, "error": short_reason(e)}
    expected = run_model(model.path, model.feeds)
    artifact = load_om(om_path)
    floor = partition_bytes(artifact)
    unpacked = any(p.get("prepack_weights") is False for p in artifact.manifest["partitions"])
    times: dict[str, list[float]] = {key: [] for key in
                                     ("original", "session", "om", "load", "floor", "packed")}
    # The first round warms the page cache and is not counted.
    start_original(model.path, model.feeds)
    _, _, out = start_om(om_path, model.feeds)
    # -O3's Winograd convs are exact to about 2e-5 of a layer's outputs, not of each element.
    scale = max((float(np.abs(v).max()) for v in expected.values() if np.size(v)), default=0.0)
    check = compare_outputs(expected, out, atol=max(ATOL, WINOGRAD_ERROR * scale)) if level >= 3 \
        else compare_outputs(expected, out)
    # That first round pays one-off costs (imports on first use: 12 ms for tiny's .om, which
    # starts in 1): a second, also not counted, says whether the model starts in under 10 ms.
    if max(start_original(model.path, model.feeds)[0],
           start_om(om_path, model.feeds)[0]) < QUICK_SECONDS:
        runs = max(runs, QUICK_RUNS)

    def time_original() -> None:
        total, opened, _ = start_original(model.path, model.feeds)
        times["original"].append(total)
        times["session"].append(opened)

    def time_om() -> None:
        total, opened, _ = start_om(om_path, model.feeds)
        times["om"].append(total)
        times["load"].append(opened)

    starts = [time_original, time_om]
    if floor is not None:
        starts.append(lambda: times["floor"].append(start_floor(floor, model.feeds)))
    if unpacked:
        starts.append(lambda: times["packed"].append(start_om(om_path, model.feeds, PACKED)[0]))
    # Each round starts one variant later: a start right after another of the same partition
    # finds onnxruntime's and graphopt's code and data warm in the caches, and a fixed order
    # would hand that to the same variant every time.
    for round_ in range(runs):
        shift = round_ % len(starts)
        for start in starts[shift:] + starts[:shift]:
            start()
    stats = {key: Stats.of(values) for key, values in times.items() if values}
    original, om = stats["original"], stats["om"]
    return {"model": model.name, "runs": runs, "original_ms": original.median * 1e3,
            "om_ms": om.median * 1e3, "ratio": om.median / original.median,
            "session_ms": stats["session"].median * 1e3, "load_ms": stats["load"].median * 1e3,
            "load_ratio": stats["load"].median / stats["session"].median,
            "floor_ratio": stats["floor"].median / original.median if floor else None,
            "packed_ratio": stats["packed"].median / original.median if unpacked else None,
            **{key: vars(value) for key, value in stats.items()}, "check": check.cell(),
            "ok": check.ok, "om_mb": os.path.getsize(om_path) / 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--runs", type=positive_int, default=20,
                        help=f"cold starts per variant (20; at least {QUICK_RUNS} for models that "
                             f"start in under {QUICK_SECONDS * 1e3:.0f} ms)")
    parser.add_argument("--only", action="append", default=[],
                        help="rows whose name contains this; repeatable")
    parser.add_argument("--no-light", action="store_true", help="skip the light CNNs")
    parser.add_argument("--fold-size-limit", type=parse_size, metavar="BYTES",
                        help="graphopt's --fold-size-limit for the compiles (default: its own)")
    parser.add_argument("--level", type=int, choices=(2, 3), default=2,
                        help="graphopt's -O level for the .om compiles (default 2; -O3 adds "
                             "Winograd convs, compared at 4e-5 of each output's largest value)")
    parser.add_argument("--json", metavar="FILE", type=json_path,
                        help="also write the rows as JSON")
    args = parser.parse_args(argv)

    def sources(workdir: str, wanted):
        yield from sized_zoo_models(workdir, ZOO_FULL, wanted)
        if not args.no_light:
            yield from light_models(False, wanted)

    problem = unmatched(args.only, lambda wanted: sources("", wanted))
    if problem:
        print(problem, file=sys.stderr)
        return 1
    rows = []
    with tempfile.TemporaryDirectory(prefix="graphopt-startup-") as workdir:
        for model in sources(workdir, matching(args.only)):
            row = bench(model, args.runs, workdir, args.fold_size_limit, args.level)
            rows.append(row)
            print(_line(row), flush=True)
    print()
    if args.level != 2:
        print(f"graphopt's .om compiled at -O{args.level}, not -O2.")
    print(format_rows(rows, args.runs))
    if args.json:
        write_json(args.json, {"runs": args.runs, "level": args.level,
                               "onnxruntime": ort.__version__, "rows": rows})
    return 0


def _line(row: dict) -> str:
    if "error" in row:
        return f"{row['model']}: error: {row['error']}"
    return (f"{row['model']}: original {row['original_ms']:.1f} ms, .om {row['om_ms']:.1f} ms "
            f"({row['ratio']:.2f}×), outputs {row['check']}")


def format_rows(rows: list[dict], runs: int) -> str:
    table = []
    for row in rows:
        if "error" in row:
            table.append([row["model"], "", "", "", "", "", "", f"error: {row['error']}"])
            continue
        floor, packed = row.get("floor_ratio"), row.get("packed_ratio")
        table.append([row["model"], f"{row['original_ms']:.1f} ({_ms(row['session_ms'])})",
                      f"{row['om_ms']:.1f} ({_ms(row['load_ms'])})", f"{row['ratio']:.2f}",
                      f"{row['load_ratio']:.2f}", "-" if floor is None else f"{floor:.2f}",
                      "-" if packed is None else f"{packed:.2f}", row["check"]])
    good = [r for r in rows if "error" not in r]
    conv = [r["ratio"] for r in good if any(c in r["model"] for c in CONV_NETS)]
    other = [r["ratio"] for r in good if not any(c in r["model"] for c in CONV_NETS)]
    for label, ratios in (("geomean conv nets", conv), ("geomean others", other)):
        mean = geomean(ratios)
        if mean is not None:
            table.append([label, "", "", f"{mean:.2f}", "", "", "", ""])
    head = (f"start-up = load + first inference, median of {runs} interleaved cold starts "
            f"({QUICK_RUNS} for rows under {QUICK_SECONDS * 1e3:.0f} ms), 1 thread; "
            "in brackets: creating the session / graphopt.load alone; × = .om / original; "
            "load × = graphopt.load / onnxruntime's session creation; floor × = onnxruntime "
            "alone on the .om's only partition (no weights blob) / original; packed × = the .om "
            "with weight pre-packing forced on (where its compile turned it off) / original")
    return head + "\n\n" + markdown_table(
        ["model", "ORT ENABLE_ALL session + 1st run ms (session)",
         ".om load + 1st run ms (load)", "×", "load ×", "floor ×", "packed ×",
         "max abs Δ vs original"], table)


def _ms(value: float) -> str:
    return f"{value:.1f}" if value >= 1 else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
