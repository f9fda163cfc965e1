"""The text form of a GraphDiff: -/+ node lines, then initializer and op-type tables."""

from __future__ import annotations

from graphopt.errors import one_line
from graphopt.table import format_table
from graphopt.tools.diff import GraphDiff


def format_diff(diff: GraphDiff, limit: int = 40) -> str:
    """Readable report; each list shows at most `limit` entries (0: all)."""
    # Labels, scopes and names come from the command line and the models (any text): shown
    # escaped, so that none can act on the terminal or pass for a line of the report.
    out = [f"A: {one_line(diff.label_a)}  ({diff.nodes_a} nodes)",
           f"B: {one_line(diff.label_b)}  ({diff.nodes_b} nodes)"]
    if diff.unrelated:
        out.append("note: A and B share no input or output name: they may be two different "
                   "models, and the pairs of nodes below unrelated")
    if diff.empty:
        out.append("no differences")
        return "\n".join(out)
    out.append(f"{len(diff.removed)} node(s) removed, {len(diff.added)} added, "
               f"{len(diff.changed)} changed")

    sections = [("removed", diff.removed, lambda e: [f"  - {one_line(e.scope)}{e.line}"]),
                ("added", diff.added, lambda e: [f"  + {one_line(e.scope)}{e.line}"]),
                ("changed", diff.changed,
                 lambda c: [f"  {one_line(c.scope)}{_renamed(c)}:", f"    - {c.before}",
                            f"    + {c.after}"])]
    for title, entries, render in sections:
        if not entries:
            continue
        out += ["", f"{title} nodes ({len(entries)}):"]
        for entry in _head(entries, limit):
            out.extend(render(entry))
        out.extend(_more(entries, limit))

    inits = ([(v.name, "removed", v.type_before) for v in diff.initializers_removed]
             + [(v.name, "added", v.type_after) for v in diff.initializers_added]
             + [(v.name, "new data" if v.type_before == v.type_after else "new type",
                 _types(v.type_before, v.type_after)) for v in diff.initializers_changed])
    if inits:
        out += ["", (f"initializers: {len(diff.initializers_removed)} removed, "
                     f"{len(diff.initializers_added)} added, "
                     f"{len(diff.initializers_changed)} changed")]
        out.extend("  " + line for line in format_table(
            ["initializer", "change", "type"],
            [list(row) for row in _head(inits, limit)], names={0}).splitlines())
        out.extend(_more(inits, limit))

    if diff.renamed:
        out += ["", f"renamed nodes ({len(diff.renamed)}), alike but for their names:"]
        out.extend(f"  {one_line(scope)}{one_line(a or '(unnamed)')} -> "
                   f"{one_line(b or '(unnamed)')}" for scope, a, b in _head(diff.renamed, limit))
        out.extend(_more(diff.renamed, limit))

    for title, column, changes in (("graph inputs/outputs", "value", diff.io_changed),
                                   ("opset imports", "domain", diff.opsets_changed),
                                   ("model properties", "property", diff.properties_changed)):
        if changes:
            out += ["", f"{title}:"]
            out.extend("  " + line for line in format_table(
                [column, "A", "B"],
                [[v.name, _value(v.type_before), _value(v.type_after)]
                 for v in changes], names={0}).splitlines())

    if diff.functions_changed:
        out += ["", f"model-local functions ({len(diff.functions_changed)}):"]
        for change in _head(diff.functions_changed, limit):
            out.append(f"  {change.change} {one_line(change.name)}")
            out.extend(f"    {one_line(line)}" for line in _head(change.lines, limit))
            out.extend("  " + line for line in _more(change.lines, limit))
        out.extend(_more(diff.functions_changed, limit))

    deltas = diff.op_deltas()
    if deltas:
        rows = [[op, a, b, f"{d:+d}"] for op, a, b, d in deltas]
        rows.append(["(all ops)", diff.nodes_a, diff.nodes_b, f"{diff.nodes_b - diff.nodes_a:+d}"])
        out += ["", "op types whose count changed:"]
        out.extend("  " + line for line in
                   format_table(["op", "A", "B", "delta"], rows).splitlines())
    return "\n".join(out)


def _renamed(change) -> str:
    before, after = change.name_before or "(unnamed)", change.name or "(unnamed)"
    return one_line(after if before == after else f"{before} -> {after}")


def _value(text: str | None) -> str:
    """A table cell of a type, version or property value: a model's metadata may hold any
    text, at any length."""
    if text is None:
        return "(none)"
    return one_line(text if len(text) <= 60 else text[:59] + "…")


def _types(before: str | None, after: str | None) -> str:
    return before if before == after else f"{before} -> {after}"


def _head(entries: list, limit: int) -> list:
    return entries if limit <= 0 else entries[:limit]


def _more(entries: list, limit: int) -> list[str]:
    hidden = len(entries) - limit
    return [f"  … {hidden} more (--limit 0 shows all)"] if limit > 0 and hidden > 0 else []
