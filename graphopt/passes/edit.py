"""Graph edits shared by passes: bypassing a node while keeping graph outputs' names."""

from __future__ import annotations

from graphopt.ir import Node, Value


def can_take_over(keep: Value, out: Value) -> bool:
    """Whether `keep` may become graph output `out` under out's name: it must be a plain node
    output of the same graph, not already an input or output there."""
    return (keep.producer is not None and keep.graph is out.graph and not keep.is_graph_output
            and not keep.is_input and keep.dtype == out.dtype)


def replace_value(out: Value, keep: Value) -> bool:
    """Make every reader of `out` read `keep`. A graph output is never renamed or dropped, so
    when `out` is one, `keep` takes over its name, doc string and metadata and its place in the
    output list; returns False (and changes nothing) when that is not possible."""
    if out.is_graph_output:
        if not can_take_over(keep, out):
            return False
        out.replace_all_uses_with(keep)
        graph = out.graph
        graph.outputs = [keep if o is out else o for o in graph.outputs]
        name = out.name
        out.name = graph.fresh_name(name + "_replaced")
        keep.name = name
        # The output's declaration is the model's interface; keep's was an intermediate's.
        keep.doc_string, keep.metadata_props = out.doc_string, out.metadata_props
        if out.shape is not None and keep.shape is None:
            keep.shape = out.shape
        return True
    out.replace_all_uses_with(keep)
    return True


def bypass(node: Node, keep: Value) -> bool:
    """Remove single-output `node`, whose output equals `keep`, rewiring its readers."""
    if not replace_value(node.output, keep):
        return False
    if not any(v is not None and (v.uses or v.is_graph_output) for v in node.outputs):
        node.graph.remove(node)
    return True
