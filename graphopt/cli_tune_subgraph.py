"""`graphopt tune --job subgraph`: fusion and layout decisions searched per model and target."""

from __future__ import annotations

import os
import sys

from graphopt.errors import OptionError
from graphopt.progress import ProgressLine
from graphopt.table import format_table, wrap_to_terminal


def _ms(seconds: float, objective: str) -> str:
    # Measured: four significant digits, which tell 0.03112 ms from 0.03084 where three
    # decimals printed 0.031 for both; trailing zeros kept, so that 0.03700 sits beside
    # 0.03802 as the same precision.
    if objective == "measured":
        return f"{seconds * 1e3:#.4g}".rstrip(".")
    return f"{seconds * 1e6:.2f}"


def cmd_tune_subgraph(args, storage) -> int:
    from graphopt.tuner.storage import storage_url
    from graphopt.tuner.subgraph import MIN_MEASURED_GAIN, tune_subgraph
    from graphopt.tuner.subgraph_job import SubgraphJob, checked_target

    url = storage_url(storage, option="--storage" if args.storage else "--tuning-db")
    given = [flag for flag, value, default in (("--repeat", args.repeat, 20),
                                               ("--threads", args.threads, None))
             if value != default]
    if given and args.objective != "measured":
        raise OptionError(f"{' and '.join(given)} time candidates of --objective measured; "
                          "the estimate objective prices them with the cost models")
    job = SubgraphJob(args.model, args.target, args.level, args.input_shape, args.objective,
                      tuning_db=url, repeat=args.repeat, threads=args.threads,
                      granularity=args.granularity, allow_custom_ops=args.allow_custom_ops)
    line = ProgressLine(not args.quiet)
    unit = "ms" if args.objective == "measured" else "µs"

    def progress(done: int, total: int, best: float) -> None:
        line.update(f"subgraph trial {done}/{total}  best {_ms(best, args.objective)} {unit}",
                    done, total)

    target = checked_target(job)

    def recording() -> None:  # once the study is known to be new and this job's
        if not args.quiet:
            print(f"recording the default compile's decisions ({args.objective})…",
                  file=sys.stderr)

    with line:  # ended on Ctrl-C too: "graphopt: interrupted" gets a line of its own
        line.begin(1, args.timeout)
        result = tune_subgraph(job, trials=args.trials, timeout=args.timeout, seed=args.seed,
                               storage=url, study_name=args.study, sampler=args.sampler,
                               progress=progress, workers=args.workers, recording=recording)
    combinations = "1 combination" if result.space.size == 1 else \
        f"{result.space.size} combinations"
    trials = "1 trial" if result.trials == 1 else f"{result.trials} trials"
    title = wrap_to_terminal(f"subgraph tuning on {args.target} -O{args.level} "
                             f"({args.objective}; {combinations}, {trials}; {url})")
    decisions = _decision_rows(result)
    # A compile without decisions gets its title alone, not a table of headers.
    print(format_table(["partition", "decision", "rewrites", "default", "tuned"], decisions,
                       title=title) if decisions else title)
    if result.hint:  # why the device's share is what it is (tune --job op says it too)
        print(wrap_to_terminal(f"note: --target {args.target}: {result.hint}"))
    from graphopt.partition.target import is_builtin
    from graphopt.tuner.cpu_model import calibration_note

    if args.objective == "estimate" and target.name == "cpu" and is_builtin(target):
        calibrated = calibration_note()  # what priced every trial, when it is not as it should
        if calibrated:
            print(wrap_to_terminal(f"note: {calibrated}"))
    costs = _cost_rows(result, args)
    if costs:
        print(format_table(["where", f"default {unit}", f"tuned {unit}"], costs))
        note = host_note(result, target.primary, target.host)
        if note:
            print(wrap_to_terminal(note))
    what = "measured, interleaved medians" if result.confirmed else args.objective
    default, best = result.confirmed or (result.default.seconds, result.best.seconds)
    # When the default is kept, the best candidate is only what the search found, not the result.
    label = "search's best" if result.kept_default else "tuned"
    # The ratio of the two figures on the line (the best's, also when the default is kept).
    gain = default / best if best > 0 else 1.0  # a compile priced at nothing: all folded
    print(f"whole model ({what}): default {_ms(default, args.objective)} {unit}, {label} "
          f"{_ms(best, args.objective)} {unit}, {gain:.3f}x")
    if result.kept_default:
        print(wrap_to_terminal(
            f"re-timed side by side, the search's best was {gain:.3f}x the default's speed, "
            f"under the {MIN_MEASURED_GAIN:.0%} a measured choice must gain over noise: the "
            "default decisions are kept"))
    elif result.space.size <= 1:
        print(wrap_to_terminal(
            f"nothing to tune: the compile on {args.target} at -O{args.level} makes no "
            "decision to switch (no rewrite of a tunable pass fires, no knob applies); the "
            "default compile was priced once"))
    elif not result.changes():
        print("the default decisions are the best found")
    if args.plot:
        from graphopt.tuner.history_plot import draw_histories

        kind = "measured" if args.objective == "measured" else "estimated"
        # Named by what was tuned: the study's own name keys the model by a hash of its bytes.
        name = f"{os.path.basename(args.model)} on {args.target} -O{args.level}"
        if result.kept_default:  # the curve is the search's; the verdict came after it
            name += f" (re-timed, its best {gain:.3f}x: default kept)"
        elif result.confirmed:  # the curve's ratio is the search's, noise included
            name += f" (re-timed side by side: {gain:.3f}x)"
        draw_histories([(name, result.history, result.default.seconds)], args.plot, kind=kind)
        print(f"wrote {args.plot}")
    return 0


def _decision_rows(result) -> list[list]:
    tuned = result.chosen
    rows = []
    for group in result.space.groups:
        on = tuned.get(group.param, True)
        rows.append([group.partition, group.key, len(group.anchors), "on", "on" if on else "off"])
    for knob, choices in result.space.knobs.items():
        rows.append(["*", knob, "", choices[0], tuned.get(knob, choices[0])])
    return rows


def host_note(result, primary: str, host: str) -> str:
    """A note when the chosen decisions win by moving work off the target's device onto its
    host: the cost model prices host kernels by the host profile's figures, and a deployment
    that counts on the device should know ("" otherwise)."""
    default, tuned = result.default.by_device, result.best.by_device
    if result.kept_default or result.chosen == result.default.params or primary == host:
        return ""
    if not (tuned.get(host, 0.0) > default.get(host, 0.0)
            and tuned.get(primary, 0.0) < default.get(primary, 0.0)):
        return ""
    moved = "all of the work" if not tuned.get(primary) else "work"
    return (f"note: the tuned decisions move {moved} from {primary} to {host} ({primary} "
            f"{default.get(primary, 0.0) * 1e6:.2f} → {tuned.get(primary, 0.0) * 1e6:.2f} µs, "
            f"{host} {default.get(host, 0.0) * 1e6:.2f} → {tuned.get(host, 0.0) * 1e6:.2f} µs): "
            f"the cost model prices it lower there, by the {host} profile's figures; "
            "`graphopt optimize --tuning-db` then `graphopt inspect` shows where each "
            "partition runs")


def _cost_rows(result, args) -> list[list]:
    if args.objective == "measured":
        return []
    places = sorted(set(result.default.by_device) | set(result.best.by_device))
    return [[place, _ms(result.default.by_device.get(place, 0.0), args.objective),
             _ms(result.best.by_device.get(place, 0.0), args.objective)] for place in places]
