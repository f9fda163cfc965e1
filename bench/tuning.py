"""Operator tuning against exhaustive search: the 256³ fp16 MatMul on ascend310.

Exhaustive search of the whole tiling space (its size and optimum), the untuned default, and
the tuner (graphopt.tuner.search.tune_kernel; TPE unless --sampler random) at 10/25/50/100/500
trials over several seeds: best cost,
ratio to the default, gap to the optimum, fraction of the space evaluated, wall time per trial.
All costs are the analytical NPU cost model's estimates (deterministic: no timing noise, so
one run suffices; the wall times are this machine's and noisy).

    .venv/bin/python bench/tuning.py [--seeds 5] [--trials 10,25,50] [--sampler tpe] [--json out/tuning.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import optuna

sys.path.insert(0, os.path.dirname(__file__))
from _common import json_path, markdown_table, positive_int, summary, write_json

from graphopt.partition.target import load_target
from graphopt.tuner import (
    GemmShape,
    best_tiling,
    default_tiling,
    estimate,
    tiling_space,
)
from graphopt.tuner.search import tune_kernel

SHAPE = GemmShape(1, 256, 256, 256, "float16")
TRIALS = "10,25,50,100,500"  # 500 trials evaluate ~1% of the space; the 2% goal allows 5%


def _trial_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}")
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"trial counts must be at least 1: {text!r}")
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--seeds", type=positive_int, default=5,
                        help="tuner seeds per trial budget, 0 to N-1 (default 5)")
    parser.add_argument("--trials", type=_trial_counts, default=_trial_counts(TRIALS),
                        metavar="N[,N...]", help=f"trial budgets to run the sampler with ({TRIALS})")
    parser.add_argument("--sampler", default="tpe", choices=("tpe", "random"),
                        help="Optuna sampler (default tpe)")
    parser.add_argument("--json", metavar="FILE", type=json_path,
                        help="also write the results as JSON to FILE")
    args = parser.parse_args()

    device = load_target("ascend310").device("npu")
    start = time.perf_counter()
    space = list(tiling_space(SHAPE, device))
    opt_tiling, opt = best_tiling(SHAPE, device, space)
    exhaustive_s = time.perf_counter() - start
    default = default_tiling(SHAPE, device)
    base = estimate(SHAPE, default, device)
    print(f"space: {len(space)} tilings, exhaustive search {exhaustive_s:.1f} s")
    print(f"default  {default}: {base.seconds * 1e6:.2f} µs ({base.cycles:.0f} cycles)")
    print(f"optimum  {opt_tiling}: {opt.seconds * 1e6:.2f} µs ({opt.cycles:.0f} cycles), "
          f"{base.seconds / opt.seconds:.3f}x in seconds, {base.cycles / opt.cycles:.3f}x in cycles")

    rows, records = [], []
    for trials in args.trials:
        runs = []
        for seed in range(args.seeds):
            storage = optuna.storages.InMemoryStorage()
            t0 = time.perf_counter()
            result = tune_kernel(SHAPE, device, target="ascend310", trials=trials, seed=seed,
                                 sampler=args.sampler, storage=storage)
            wall = time.perf_counter() - t0
            study = optuna.load_study(study_name=result.study_name, storage=storage)
            done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            distinct = {tuple(sorted(t.user_attrs["tiling"].items())) for t in done}
            runs.append({"seed": seed, "best_us": result.best[1] * 1e6,
                         "ratio": base.seconds / result.best[1],
                         "gap": result.best[1] / opt.seconds - 1.0,
                         "distinct": len(distinct),
                         "wall_ms_per_trial": wall / trials * 1e3,
                         "tiling": str(result.best[0])})
        ratios = [r["ratio"] for r in runs]
        gaps = [r["gap"] for r in runs]
        rows.append([str(trials), f"{statistics.median(r['best_us'] for r in runs):.2f}",
                     f"{statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f})",
                     f"{statistics.median(gaps) * 100:.1f}% ({min(gaps) * 100:.1f}–"
                     f"{max(gaps) * 100:.1f}%)",
                     f"{sum(g <= 0.02 for g in gaps)}/{len(gaps)}",
                     f"{statistics.median(r['distinct'] for r in runs) / len(space) * 100:.3f}%",
                     f"{statistics.median(r['wall_ms_per_trial'] for r in runs):.1f}"])
        records.append({"trials": trials, "runs": runs})
    print()
    print(markdown_table(
        ["trials", "best µs (median)", "× default: median (min–max)",
         "gap to optimum: median (min–max)", "seeds within 2%", "space evaluated (median distinct)",
         "ms/trial"], rows))
    print(f"\n{args.seeds} seeds, sampler {args.sampler}; default {base.seconds * 1e6:.2f} µs, "
          f"optimum {opt.seconds * 1e6:.2f} µs ({base.seconds / opt.seconds:.3f}x)")
    if not args.json:
        return 0
    write_json(args.json, {"shape": str(SHAPE), "target": "ascend310", "space": len(space),
                           "default": {"tiling": str(default), "seconds": base.seconds,
                                       "cycles": base.cycles},
                           "optimum": {"tiling": str(opt_tiling), "seconds": opt.seconds,
                                       "cycles": opt.cycles},
                           "sampler": args.sampler, "runs": records})
    return 0


if __name__ == "__main__":
    sys.exit(main())
