"""The end-of-compile summary: node counts, op-type deltas and time per pass."""

from __future__ import annotations

import shlex

from graphopt.codegen.inspect_om import largest_index
from graphopt.codegen.om_manifest import order_label
from graphopt.codegen.profile_match import profiles_count
from graphopt.compile_result import OptimizeResult, op_counts
from graphopt.errors import one_line
from graphopt.partition.target import as_given
from graphopt.table import format_bytes, format_table, wrap_to_terminal


def format_summary(result: OptimizeResult, output: str | None = None,
                   flags: list[str] | None = None) -> str:
    """The compile's summary; `flags` are the command line's that decide the compile
    (cli_optimize.compile_flags), which the `graphopt partition` line it suggests repeats."""
    before = result.ops_before
    after = op_counts(result.model.graph.all_nodes())
    total_after = sum(after.values())
    profiles = (f" (shape profile {result.profiles[0].profile.name} of {len(result.profiles)} "
                "below)") if result.profiles else ""
    # File names may hold any character: the line stays one line (errors.one_line).
    target = (f"target {result.partitioning.target.shown}, "
              if result.partitioning is not None else "")
    head = (f"{one_line(result.source_label)} -> {one_line(output or '(in memory)')}{profiles}: "
            f"{target}{result.log.pipeline}, "
            f"{result.seconds:.2f} s; nodes {sum(before.values())} -> {total_after} "
            f"({total_after - sum(before.values()):+d})")
    pass_rows = []
    for name, entry in result.log.totals().items():
        rewrites = ", ".join(f"{rule}={n}" for rule, n in entry["rewrites"].most_common(4))
        more = len(entry["rewrites"]) - 4
        if more > 0:
            rewrites += f", +{more} more"
        pass_rows.append([name, entry["runs"], f"{entry['seconds'] * 1000:.1f}",
                          sum(entry["rewrites"].values()), rewrites])
    op_rows = []
    for op in sorted(set(before) | set(after), key=lambda o: (after[o] - before[o], o)):
        if before[op] != after[op]:
            op_rows.append([op, before[op], after[op], f"{after[op] - before[op]:+d}"])
    parts = [head]
    if pass_rows:
        parts.append(format_table(["pass", "runs", "ms", "rewrites", "by rule"], pass_rows))
    if op_rows:
        parts.append(format_table(["op type", "before", "after", "delta"], op_rows))
    if result.max_abs_error is not None:
        runs = [c.result for c in result.profiles] or [result]
        worst = max((e for r in runs for e in (r.max_abs_error or {}).values()), default=0.0)
        shapes = f" in each of {profiles_count(len(runs))}" if result.profiles else ""
        # Outputs that held no element matched nothing: the headline counts the compared ones
        # (a Mask R-CNN with no detection had read "4 output(s) match").
        empty = len(result.empty_outputs)
        held = f", {empty} held no element to compare" if empty else ""
        parts.append(f"verified{shapes}: {len(result.max_abs_error) - empty} output(s) match "
                     f"the original{held} (max abs error {worst:.3g}, onnxruntime on one thread)"
                     + (f"\nverify: {result.verify_note}" if result.verify_note else ""))
    if result.partitioning is not None and len(result.partitioning.partitions) > 1:
        from graphopt.partition.report import format_partitioning

        source = shlex.quote(result.source_label) if result.source_label != "<model>" else "MODEL"
        parts.append(format_partitioning(
            result.partitioning, more=f"graphopt partition {source} --target "
                                      f"{shlex.quote(as_given(result.partitioning.target))} "
                                      + (f"{shlex.join(flags)} " if flags else "")
                                      + "--all-fallbacks lists them all"))
    if result.profiles:
        parts.append(format_profiles(result))
    else:
        for name, plan in result.memory_plans.items():
            parts.append(wrap_to_terminal(f"memory plan {name}: " + (
                f"none ({plan})" if isinstance(plan, str) else plan.summary()), hang="  "))
    if result.traces:
        parts.append("\n".join(result.traces))
    # Prose wraps on a terminal, as the tables do; piped, each note stays one line for grep.
    for note in result.notes:
        parts.append(wrap_to_terminal(f"note: {note}", hang="  "))
    return "\n\n".join(parts)


def format_profiles(result: OptimizeResult) -> str:
    """One row per shape profile: the sizes it pins, what its compile made and its memory."""
    rows, sizes = [], []
    unplanned: dict[str, list[str]] = {}  # reason -> the partitions it keeps unplanned
    # --memory-reorder searched each plan's order: what it chose, as a one-profile compile's
    # memory-plan line says it (the profile table had left it out).
    searched = any(p.schedule_optimal is not None for c in result.profiles
                   for p in c.result.memory_plans.values() if not isinstance(p, str))
    for compiled in result.profiles:
        run = compiled.result
        for name, plan in run.memory_plans.items():
            if isinstance(plan, str):
                unplanned.setdefault(plan, []).append(f"{compiled.profile.name}.{name}")
        plans = [p for p in run.memory_plans.values() if not isinstance(p, str)]
        planned = bool(plans) and len(plans) == len(run.memory_plans)
        sizes.append(sum(p.arena_bytes for p in plans) if planned else None)
        parts = len(run.partitioning.partitions) if run.partitioning is not None else 1
        orders = "; ".join(dict.fromkeys(
            order_label({"schedule_method": p.schedule_method,
                         "schedule_optimal": p.schedule_optimal}) for p in plans if p.tensors))
        rows.append([compiled.profile.name, compiled.profile.label,
                     sum(op_counts(run.model.graph.all_nodes()).values()), parts,
                     "-" if sizes[-1] is None else format_bytes(sizes[-1]),
                     *([orders or "-"] if searched else []), f"{run.seconds:.2f}"])
    largest = largest_index(sizes)  # what to size a buffer by; as inspect marks it
    if largest is not None:
        rows[largest][4] += " (largest)"
    table = format_table(["profile", "dims", "nodes", "partitions", "work memory",
                          *(["order"] if searched else []), "compile s"],
                         rows, title=f"shape profiles ({len(rows)}): one plan each in the .om")
    # A "-" alone does not say why; profiles that fail alike (every one at -O1) share a line.
    bodies = dict.fromkeys(note for compiled in result.profiles
                           for plan in compiled.result.memory_plans.values()
                           if not isinstance(plan, str) and (note := plan.bodies_note()))
    return "\n".join([table] + [f"memory plan {', '.join(names)}: none ({reason})"
                                for reason, names in unplanned.items()]
                      + [f"work memory: {note}" for note in bodies])
