"""The note for names a user gave (nodes to skip or pin, op types) that match nothing in the
optimized graph, with the nearest names: fusions rename the nodes they replace."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from graphopt.option_names import option


def unmatched_note(checks: Iterable[tuple[str, Iterable[str], set[str]]]) -> str | None:
    """For each (option, entries, names it may match), the entries outside those names, each
    with its nearest names; None when every entry matches."""
    problems = []
    for name, entries, known in checks:
        for entry in sorted(set(entries) - known):
            near = difflib.get_close_matches(entry, known, n=2, cutoff=0.6)
            problems.append(f"{name} {entry!r}" + (f" (nearest: {', '.join(map(repr, near))})"
                                                     if near else ""))
    if not problems:
        return None
    return ("; ".join(problems) + " matches nothing in the optimized graph, whose fused nodes "
            f"have new names ({option('dump_dir')} shows them)")


def op_spellings(node) -> set[str]:
    """The names an op-type list may give `node` (a graphopt.ir Node): its bare op type (any
    domain) and the `domain::Op` graphopt's own messages print for a contrib op."""
    return {node.op_type, node.qualified_op}
