"""What a precision pass leaves alone inside control-flow subgraphs, said in a note: the passes
convert the main graph, and a model whose work sits in an If's branches (silero-vad's whole
network) would otherwise compile unchanged without a word."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from graphopt.ir import Graph, Node


def nested_note(graph: Graph, what: str, counted: Callable[[Node], bool]) -> str | None:
    """"`what`: N node(s) inside the subgraphs of If, Loop … stay as they are (ops)", over the
    nodes `counted` accepts in the subgraphs of `graph`'s nodes; None when there are none."""
    holders: Counter = Counter()
    ops: Counter = Counter()
    for node in graph:
        inner = [n for sub in node.subgraphs() for n in sub.all_nodes()
                 if counted(n) and not n.subgraphs()]  # a nested If's nodes count, not it
        if inner:
            holders[node.qualified_op] += 1
            ops.update(n.qualified_op for n in inner)
    if not ops:
        return None
    more = " …" if len(ops) > 6 else ""
    return (f"{what}: {sum(ops.values())} node(s) inside the subgraphs of {listing(holders)} "
            f"stay as they are ({listing(ops, 6)}{more}): the pass works on the main graph")


def listing(counts: Counter, most: int | None = None) -> str:
    """"MatMul ×2, Conv": op counts as notes show them, the commonest first."""
    return ", ".join(f"{op} ×{n}" if n > 1 else op for op, n in counts.most_common(most))
