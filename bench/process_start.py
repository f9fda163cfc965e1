"""Process start: from a new Python process to the first result, as a service or a CLI starts.

For each model, two child processes: one imports onnxruntime, creates a session on the original
at ORT_ENABLE_ALL and runs it once (what a user does without graphopt); the other imports
graphopt, loads the `.om` that `graphopt optimize model.onnx -o model.om` writes and runs it once.
Each child's wall time counts everything: starting the interpreter, the imports, the session or
load, the first inference. Without a model, the same for `import onnxruntime`, `import graphopt`,
`import graphopt.compiler` (what `import graphopt` cost while it imported the compiler eagerly)
and `graphopt --help`. Children are interleaved, medians reported; each model's children write
their outputs once, before the timed rounds, and those are checked against the original's at
ORT_DISABLE_ALL.

The children run as an installed package runs, with bytecode caches: they write theirs under a
temporary PYTHONPYCACHEPREFIX in the first, untimed round and read them after. (Without that, an
editable install under PYTHONDONTWRITEBYTECODE, as on this machine, compiles graphopt's sources
in every process, while pip compiled onnx's and onnxruntime's at install.)

`--pythonpath DIR` adds, beside each graphopt child, the same child with DIR first on its
PYTHONPATH: another version of a dependency, say (`pip install --target DIR ml_dtypes==0.7.0`).

    python bench/process_start.py
    python bench/process_start.py --only tiny --only resnet50 --runs 30
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import graphopt  # noqa: E402
from _common import (Stats, compare_outputs, geomean, json_path, markdown_table,  # noqa: E402
                     positive_int, run_model, short_reason, summary, write_json)
from _models import ZOO_FULL, matching, sized_zoo_models, unmatched  # noqa: E402

# The children: argv[1] model or .om, argv[2] input .npz, argv[3] where to write the outputs ("" to
# skip). One intra-op and one inter-op thread, as every bench session here.
ORT_CHILD = """
import sys, numpy as np, onnxruntime as ort
options = ort.SessionOptions()
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
options.intra_op_num_threads = 1
options.inter_op_num_threads = 1
options.log_severity_level = 3
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
feeds = dict(np.load(sys.argv[2]))
names = [o.name for o in session.get_outputs()]
outputs = session.run(names, {i.name: feeds[i.name] for i in session.get_inputs()})
if sys.argv[3]:
    np.savez(sys.argv[3], **dict(zip(names, outputs)))
"""
OM_CHILD = """
import sys, numpy as np, graphopt
session = graphopt.load(sys.argv[1], intra_op_num_threads=1, inter_op_num_threads=1)
feeds = dict(np.load(sys.argv[2]))
outputs = session.run({e["name"]: feeds[e["name"]] for e in session.inputs})
if sys.argv[3]:
    np.savez(sys.argv[3], **outputs)
"""
COMMANDS = {  # rows without a model: what the imports alone cost
    "import onnxruntime": [sys.executable, "-c", "import onnxruntime"],
    "import graphopt": [sys.executable, "-c", "import graphopt"],
    "import graphopt.compiler": [sys.executable, "-c", "import graphopt.compiler"],
    "graphopt --help": [sys.executable, "-m", "graphopt", "--help"],
}


_PYCACHE: list[str] = []  # the children's bytecode folder, made on first use, removed by main


def pycache() -> str:
    if not _PYCACHE:
        _PYCACHE.append(tempfile.mkdtemp(prefix="graphopt-process-start-pycache-"))
    return _PYCACHE[0]


def timed(command: list[str], pythonpath: str | None = None) -> float:
    """Wall seconds of one child process; RuntimeError with its stderr when it fails."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = os.path.join(pycache(), "extra" if pythonpath else "plain")
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip()
                           else f"exit status {done.returncode}")
    return elapsed


def variants(om_path: str | None, model_path: str | None, inputs: str | None,
             pythonpath: str | None) -> dict[str, list[str] | tuple[list[str], str]]:
    """name -> command (or (command, PYTHONPATH)) of each child to interleave."""
    if model_path is None:
        found: dict = dict(COMMANDS)
        if pythonpath:
            found.update({f"{name}, PYTHONPATH": (command, pythonpath)
                          for name, command in COMMANDS.items() if "graphopt" in name})
        return found
    found = {"original": [sys.executable, "-c", ORT_CHILD, model_path, inputs, ""],
             "om": [sys.executable, "-c", OM_CHILD, om_path, inputs, ""]}
    if pythonpath:
        found["om, PYTHONPATH"] = (found["om"], pythonpath)
    return found


def interleaved(children: dict, runs: int) -> dict[str, Stats]:
    times: dict[str, list[float]] = {name: [] for name in children}
    for round_ in range(runs + 1):  # the first round warms the page cache and is not counted
        for name, child in children.items():
            command, path = child if isinstance(child, tuple) else (child, None)
            elapsed = timed(command, path)
            if round_:
                times[name].append(elapsed)
    return {name: Stats.of(values) for name, values in times.items()}


def bench_model(model, runs: int, workdir: str, pythonpath: str | None) -> dict:
    om_path = os.path.join(workdir, "model.om")
    inputs = os.path.join(workdir, "inputs.npz")
    try:
        graphopt.save(graphopt.optimize(model.path, target="cpu"), om_path)
    except Exception as e:  # noqa: BLE001 - a compile failure is a row, not a crash
        return {"model": model.name, "error": short_reason(e)}
    np.savez(inputs, **model.feeds)
    expected = run_model(model.path, model.feeds)
    children = variants(om_path, model.path, inputs, pythonpath)
    checks = []
    for name in ("original", "om"):  # the outputs, once: a child that writes them is slower
        written = os.path.join(workdir, f"{name}.npz")
        try:
            timed(children[name][:-1] + [written])
        except RuntimeError as e:
            return {"model": model.name, "error": f"{name}: {short_reason(e)}"}
        with np.load(written) as outputs:
            checks.append(compare_outputs(expected, dict(outputs)))
    stats = interleaved(children, runs)
    row = {"model": model.name, "runs": runs,
           **{f"{name}_ms": s.median * 1e3 for name, s in stats.items()},
           "ratio": stats["om"].median / stats["original"].median,
           "stats": {name: vars(s) for name, s in stats.items()},
           "check": checks[1].cell(), "ok": all(c.ok for c in checks)}
    if pythonpath:
        row["pythonpath_ratio"] = stats["om, PYTHONPATH"].median / stats["original"].median
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--runs", type=positive_int, default=20,
                        help="timed children per variant (20)")
    parser.add_argument("--only", action="append", default=[],
                        help="zoo models whose name contains this; repeatable (the import rows "
                             "always run)")
    parser.add_argument("--pythonpath", metavar="DIR",
                        help="also time each graphopt child with DIR first on its PYTHONPATH")
    parser.add_argument("--json", metavar="FILE", type=json_path,
                        help="also write the rows as JSON")
    args = parser.parse_args(argv)
    if args.pythonpath and not os.path.isdir(args.pythonpath):
        parser.error(f"--pythonpath {args.pythonpath}: no such directory")

    problem = unmatched(args.only, lambda wanted: sized_zoo_models("", ZOO_FULL, wanted))
    if problem:  # before the import rows, which are timed whatever --only says
        print(problem, file=sys.stderr)
        return 1
    try:
        imports = interleaved(variants(None, None, None, args.pythonpath), args.runs)
        print(format_imports(imports, args.runs), flush=True)
        rows = []
        with tempfile.TemporaryDirectory(prefix="graphopt-process-start-") as workdir:
            for model in sized_zoo_models(workdir, ZOO_FULL, matching(args.only)):
                row = bench_model(model, args.runs, workdir, args.pythonpath)
                rows.append(row)
                print(_line(row), flush=True)
    finally:
        for folder in _PYCACHE:
            shutil.rmtree(folder, ignore_errors=True)
    print()
    print(format_rows(rows, args.runs, args.pythonpath))
    if args.json:
        write_json(args.json, {"runs": args.runs, "onnxruntime": ort.__version__,
                               "pythonpath": args.pythonpath, "python": sys.version.split()[0],
                               "imports": {name: vars(s) for name, s in imports.items()},
                               "rows": rows})
    return 0


def format_imports(imports: dict, runs: int) -> str:
    base = imports["import onnxruntime"].median
    rows = [[name, f"{s.median * 1e3:.0f}", f"{s.low * 1e3:.0f}–{s.high * 1e3:.0f}",
             f"{s.median / base:.2f}"] for name, s in imports.items()]
    return (f"a new process per command, median of {runs} interleaved runs; × = / import "
            "onnxruntime\n\n" + markdown_table(["command", "ms", "min–max", "×"], rows))


def _line(row: dict) -> str:
    if "error" in row:
        return f"{row['model']}: error: {row['error']}"
    return (f"{row['model']}: original {row['original_ms']:.0f} ms, .om {row['om_ms']:.0f} ms "
            f"({row['ratio']:.2f}×), outputs {row['check']}")


def format_rows(rows: list[dict], runs: int, pythonpath: str | None) -> str:
    table = []
    for row in rows:
        if "error" in row:
            table.append([row["model"], "", "", "", *([""] * bool(pythonpath)),
                          f"error: {row['error']}"])
            continue
        extra = [f"{row['om, PYTHONPATH_ms']:.0f} ({row['pythonpath_ratio']:.2f})"] \
            if pythonpath else []
        table.append([row["model"], f"{row['original_ms']:.0f}", f"{row['om_ms']:.0f}",
                      f"{row['ratio']:.2f}", *extra, row["check"]])
    mean = geomean([r["ratio"] for r in rows if "error" not in r])
    if mean is not None:
        table.append(["geomean", "", "", f"{mean:.2f}", *([""] * bool(pythonpath)), ""])
    head = (f"process start = a new Python process to its first result (interpreter, imports, "
            f"session or load, first inference), median of {runs} interleaved runs, 1 thread; "
            "× = .om / original" + (f"; PYTHONPATH: {pythonpath} first on the child's path"
                                    if pythonpath else ""))
    headers = ["model", "onnxruntime process ms", "graphopt .om process ms", "×"]
    if pythonpath:
        headers.append(".om, PYTHONPATH ms (×)")
    return head + "\n\n" + markdown_table(headers + ["max abs Δ vs original"], table)


if __name__ == "__main__":
    sys.exit(main())
