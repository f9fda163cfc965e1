"""The end-of-compile summary: node counts, op-type deltas and time per pass."""

from __future__ import annotations

from collections import Counter

from graphopt.compiler import OptimizeResult
from graphopt.table import format_table


def op_counts(nodes) -> Counter:
    return Counter(n.qualified_op for n in nodes)


def format_summary(result: OptimizeResult, output: str | None = None) -> str:
    before = Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
                     for n in _proto_nodes(result.source.graph))
    after = op_counts(result.model.graph.all_nodes())
    total_after = sum(after.values())
    head = (f"{result.source_label} -> {output or '(in memory)'}: {result.log.pipeline}, "
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
        worst = max(result.max_abs_error.values(), default=0.0)
        parts.append(f"verified: {len(result.max_abs_error)} output(s) match the original "
                     f"(max abs error {worst:.3g})")
    for note in result.notes:
        parts.append(f"note: {note}")
    return "\n\n".join(parts)


def _proto_nodes(graph):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.g.node:
                yield from _proto_nodes(attr.g)
            for g in attr.graphs:
                yield from _proto_nodes(g)
