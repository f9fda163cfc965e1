"""What graphopt's runtime adds to each call: OmSession.run against onnxruntime on its session.

For each zoo model compiled to a one-partition `.om` (`--target cpu`, open dims kept), one
session at 1 thread is called four ways, interleaved in rotating order after warm-up:
`OmSession.run`; the same with its plain-feeds shortcut off (every feed through the general
checks, as before the shortcut took open dims); onnxruntime's `InferenceSession.run` on the
partition's own session; and that session's C++ binding, the floor. The first outputs are
checked against the original model's at ORT_DISABLE_ALL. The overhead columns are
medians of per-round differences against `InferenceSession.run` (the same session, the same
caches), which cancel the machine's drift better than differences of medians.

    python bench/run_overhead.py
    python bench/run_overhead.py --runs 5000 --only gpt2 --json out/run_overhead.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import graphopt  # noqa: E402
from _common import (compare_outputs, json_path, markdown_table, positive_int,  # noqa: E402
                     run_model, write_json)
from _models import ZOO_QUICK, matching, sized_zoo_models, unmatched  # noqa: E402


def _general(session):
    """session.run with the plain-feeds shortcut off, for the one call."""
    plain, direct = session._plain, session._direct

    def run(feeds):
        session._plain = session._direct = None
        try:
            return session.run(feeds)
        finally:
            session._plain, session._direct = plain, direct

    return run


def bench(om_path: str, source: str, feeds: dict, runs: int) -> dict | None:
    """The four calls' times on the `.om` at `om_path`, its outputs checked against the
    original `source` at ORT_DISABLE_ALL."""
    session = graphopt.load(om_path, intra_op_num_threads=1, inter_op_num_threads=1)
    steps = session._steps
    if len(steps) != 1:
        return None  # the comparison needs one onnxruntime session to stand beside
    ort_session = steps[0].session
    names = [o.name for o in ort_session.get_outputs()]
    binding = ort_session._sess
    general = _general(session)
    variants = {
        "om": lambda: session.run(feeds),
        "general": lambda: general(feeds),
        "ort": lambda: ort_session.run(names, feeds),
        "binding": lambda: binding.run(names, feeds, None),
    }
    check = compare_outputs(run_model(source, feeds), session.run(feeds))
    times = {key: [] for key in variants}
    order = list(variants)
    for round_ in range(runs + 50):  # 50 warm-up rounds
        turn = order[round_ % len(order):] + order[:round_ % len(order)]
        for key in turn:
            start = time.perf_counter()
            variants[key]()
            if round_ >= 50:
                times[key].append(time.perf_counter() - start)
    arrays = {key: np.array(values) * 1e6 for key, values in times.items()}
    over = {key: float(np.median(arrays[key] - arrays["ort"])) for key in variants}
    return {"median_us": {key: float(np.median(a)) for key, a in arrays.items()},
            "over_ort_us": over, "max_abs_diff": check.worst, "check": check.cell(),
            "open_dims": session._plain is not None and session._plain.inputs
            and any(i.static is None for i in session._plain.inputs)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=positive_int, default=2000, help="timed rounds per model")
    parser.add_argument("--only", action="append", default=[],
                        help="models whose name contains this (again for more)")
    parser.add_argument("--json", type=json_path, help="also write the results here")
    args = parser.parse_args()
    only = args.only
    problem = unmatched(only, lambda wanted: sized_zoo_models("", ZOO_QUICK, wanted))
    if problem:
        print(problem, file=sys.stderr)
        return 1
    rows, results = [], {}
    with tempfile.TemporaryDirectory() as workdir:
        for model in sized_zoo_models(workdir, ZOO_QUICK, matching(only)):
            om_path = os.path.join(workdir, "model.om")
            graphopt.save(graphopt.optimize(model.path, target="cpu"), om_path)
            result = bench(om_path, model.path, model.feeds, args.runs)
            os.remove(om_path)
            if result is None:
                print(f"{model.name}: more than one partition, skipped", file=sys.stderr)
                continue
            results[model.name] = result
            med, over = result["median_us"], result["over_ort_us"]
            rows.append([model.name, "open" if result["open_dims"] else "static",
                         f"{med['ort']:.1f}", f"{over['binding']:+.1f}",
                         f"{over['om']:+.1f}", f"{over['om'] / med['ort']:+.1%}",
                         f"{over['general']:+.1f}", result["check"]])
    print(f"{args.runs} interleaved rounds, 1 thread; µs; overheads are medians of per-round "
          "differences against InferenceSession.run on the same session")
    print(markdown_table(["model", "dims", "InferenceSession.run", "binding", ".om run",
                          ".om run %", ".om run, general checks", "max abs Δ vs original"],
                         rows))
    if args.json:
        write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
