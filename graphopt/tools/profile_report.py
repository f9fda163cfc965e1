"""A profile and its hints as text tables for `graphopt profile`."""

from __future__ import annotations

import math

from graphopt.codegen.profile_match import dims_label
from graphopt.errors import one_line
from graphopt.table import elide, format_table, wrap_to_terminal
from graphopt.tools.advisor import Hint
from graphopt.tools.profile import Profile


def _num(value: float | None, spec: str = ".1f") -> str | None:
    return None if value is None else format(value, spec)


def _untimed(warmup: int) -> str:
    # The first run checks the outputs and is never timed: with --warmup 0 it is still dropped.
    return "1 untimed check run (--warmup 0)" if warmup == 0 else f"{warmup} warmup"


def format_profile(profile: Profile, hints: list[Hint], top: int = 10) -> str:
    runs = profile.runs
    threads = ("onnxruntime's default threads" if not profile.threads
               else f"{profile.threads} thread(s)")
    kernel, wall = profile.kernel_us_per_run, profile.wall_us_per_run
    rho = profile.spearman()
    priced = sum(k.predicted_us is not None for k in profile.kernels)
    lines = [
        (f"{profile.path}: {len(profile.partitions)} partition(s), {runs} profiled run(s) "
         f"after {_untimed(profile.warmup)}, {threads}"),
        (f"per run: wall {wall:.1f} µs (profiler on), kernels {kernel:.1f} µs "
         f"({kernel / wall:.0%} of wall); {len(profile.kernels)} kernel(s), "
         f"{profile.matched_share:.0%} of kernel time matched to graph nodes"),
        *_shape_profile(profile),
    ]
    if priced or any(p.device == "cpu" for p in profile.partitions):
        lines += [f"cost model: {profile.cost_model}",
                  "Spearman ρ predicted vs measured µs per call: "
                  + (f"{rho:.2f} over {priced} priced kernel(s)" if not math.isnan(rho)
                     else f"n/a ({profile.spearman_gap()})")]
    else:  # an all-NPU .om on the stand-in: nothing the CPU cost model prices
        lines.append("cost model: not used (it prices host partitions, and every partition "
                     "here is an NPU's)")
    lines += [f"note: {note}" for note in profile.notes]

    # Without a priced kernel (an NPU .om: the CPU cost model prices CPU kernels) the
    # predicted columns would be blank: they are left out.
    rows = [[r.op_type, r.kernels, r.calls, f"{r.total_us / 1e3:.3f}", f"{r.mean_us:.1f}",
             f"{r.share * 100:.1f}"] + ([_num(r.predicted_us), _num(r.measured_predicted_us),
                                         r.bound] if priced else [])
            for r in profile.by_op()]
    headers = ["op", "kernels", "calls", "total ms", "mean µs", "% time"]
    title = "per op type"
    if priced:
        headers += ["predicted µs/run", "measured µs/run", "bound"]
        title += " (predicted/measured: the kernels the cost model priced)"
    lines += ["", format_table(headers, rows, title=title)]

    total = profile.total_us or 1.0
    rows = [[k.partition, elide(k.name), k.op_type, f"{k.mean_us:.1f}",
             f"{k.median_us:.1f}", f"{k.total_us / total * 100:.1f}"]
            + ([_num(k.predicted_us)] if priced else [])
            + [elide(k.node) + (f" ({k.how})" if k.how != "name" else "") if k.node
               else "(unmatched)"] for k in profile.top(top)]
    headers = ["partition", "kernel", "op", "mean µs", "median µs", "% time"]
    headers += (["predicted µs"] if priced else []) + ["graph node"]
    lines += ["", format_table(headers, rows, title=f"top {len(rows)} kernel(s)",
                               names={1, len(headers) - 1})]

    if profile.kind == "om":
        rows = [[i, p.name, p.device, p.level, ", ".join(p.providers), p.nodes, n,
                 f"{us:.1f}", f"{share * 100:.1f}"]
                for i, (p, n, us, share) in enumerate(profile.by_partition())]
        lines += ["", format_table(["#", "partition", "device", "level", "providers", "nodes",
                                    "kernels", "µs/run", "% time"], rows,
                                   title="partitions (in execution order)")]

    lines += ["", "advisor:" if hints else "advisor: nothing to report"]
    # Broken at spaces to a terminal's width, hanging under the text (kept whole in a pipe).
    lines += [wrap_to_terminal(f"- {hint.message}", hang="  ") for hint in hints]
    return "\n".join(lines)


def _shape_profile(profile: Profile) -> list[str]:
    """The header line naming the .om shape profile that ran, as `graphopt run` prints it."""
    chosen = profile.shape_profile
    if not chosen:
        return []
    return [one_line(f"shape profile {chosen['name']} ({dims_label(chosen['dims'])}) of "
                     f"{chosen['of']}: {chosen['how']}")]
