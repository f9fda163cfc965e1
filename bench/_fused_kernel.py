"""One onnxruntime contrib kernel against the ops it replaces: the shared run and command line.

Per shape, two one-op-deep models run interleaved in onnxruntime's CPU provider at 1 thread and
ORT_DISABLE_ALL (so neither is rewritten), medians of the per-call wall time, with their outputs
compared. A bench names the pair, builds the two models and the feeds for a shape, and calls
`main`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import onnxruntime as ort

from _common import (json_path, markdown_table, positive_int, session_options, shape_list,
                     write_json)


def compare(shape: tuple[int, ...], models: dict[str, bytes], feeds: dict[str, np.ndarray],
            runs: int, warmup: int = 20) -> list[str]:
    """The table row of one shape: µs per call of each model (fused first), their ratio and
    the largest difference between their outputs."""
    sessions = {name: ort.InferenceSession(model, session_options("disable"),
                                           providers=["CPUExecutionProvider"])
                for name, model in models.items()}
    times: dict[str, list[float]] = {name: [] for name in sessions}
    outputs = {}
    for i in range(warmup + runs):
        for name, session in sessions.items():
            start = time.perf_counter()
            outputs[name] = session.run(None, feeds)[0]
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    fused, unfused = (float(np.median(t)) * 1e6 for t in times.values())
    first, second = outputs.values()
    diff = float(np.max(np.abs(first - second)))
    return ["x".join(map(str, shape)), f"{fused:.1f}", f"{unfused:.1f}",
            f"{fused / unfused:.2f}", f"{diff:.1e}"]


def main(doc: str, names: tuple[str, str], shapes: tuple[tuple[int, ...], ...], example: str,
         row: Callable[[tuple[int, ...], int], list[str]], argv: list[str] | None = None) -> int:
    """The bench's command line (--shapes, --runs, --json) over `row(shape, runs)`; `names`
    head the fused and the unfused columns."""
    columns = ["shape", f"{names[0]} µs", f"{names[1]} µs", "×", "max abs Δ"]
    return table_main(doc, columns, shapes, "BxSxC", example,
                      lambda shape, runs: [row(shape, runs)], argv=argv)


def table_main(doc: str, columns: list[str], shapes: tuple[tuple[int, ...], ...], dims: str,
               example: str, rows_of: Callable[[tuple[int, ...], int], list[list[str]]],
               runs: int = 300, argv: list[str] | None = None) -> int:
    """A one-op bench's command line (--shapes of `dims`, --runs, --json): the table of
    `rows_of(shape, runs)` over the shapes, under `columns`."""
    parser = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    default = ",".join("x".join(map(str, shape)) for shape in shapes)
    parser.add_argument("--shapes", type=shape_list(dims, example), default=list(shapes),
                        help=f"{dims} shapes, comma-separated (default {default})")
    parser.add_argument("--runs", type=positive_int, default=runs,
                        help=f"timed calls per variant ({runs})")
    parser.add_argument("--json", metavar="FILE", type=json_path,
                        help="also write the table as JSON to FILE")
    args = parser.parse_args(argv)
    rows = [r for shape in args.shapes for r in rows_of(shape, args.runs)]
    print(f"median µs per call of {args.runs} interleaved calls, 1 thread, ORT_DISABLE_ALL, "
          f"onnxruntime {ort.__version__}\n")
    print(markdown_table(columns, rows))
    if args.json:
        write_json(args.json, {"runs": args.runs, "onnxruntime": ort.__version__,
                               "columns": columns, "rows": rows})
    return 0
