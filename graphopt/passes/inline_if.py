"""InlineConstantIf: an If whose condition is known at compile time becomes the branch it takes."""

from __future__ import annotations

from collections import Counter

import numpy as np

from graphopt.ir import Graph, Model, Node, Value
from graphopt.passes.base import Pass, PassContext, PassResult, register
from graphopt.passes.edit import replace_value


def constant_condition(node: Node) -> bool | None:
    """The If's condition when it is a compile-time constant holding one element, else None."""
    cond = node.input(0)
    data = cond.constant() if cond is not None else None
    if data is None or np.asarray(data).size != 1:
        return None
    return bool(np.asarray(data).reshape(-1)[0])


def _branch(node: Node, taken: bool) -> Graph | None:
    branch = node.attr("then_branch" if taken else "else_branch")
    return branch if isinstance(branch, Graph) else None


def _hoist(branch: Graph, node: Node, names: "_Names") -> None:
    """Move the branch's initializers and nodes into the If's graph, just before the If: every
    outer value a branch node reads is defined before the If, so the order stays topological."""
    graph = node.graph
    names.rename_clashes(branch)
    for value in list(branch.initializers.values()):
        del branch.initializers[value.name]
        graph.add_initializer(value)
    for inner in branch.nodes():
        graph.move_before(node, inner)
        _forget_shapes(inner)


def _forget_shapes(node: Node) -> None:
    for value in node.outputs:
        if value is not None and not value.is_graph_output:
            value.shape = None


def _forget_shapes_downstream(values: list[Value]) -> None:
    """Clear the shapes of the nodes that read `values`, and of their readers in turn: they
    were inferred from the If's outputs, whose shapes merge both branches' declarations, and
    a declaration may hold only for the branch not taken (torch_geometric's scatter
    aggregation declares rank 1 for a rank-2 result). Trusted after inlining, a wrong rank
    makes onnxruntime refuse the model; the next inference computes them anew."""
    seen: set[int] = set()
    stack = list(values)
    while stack:
        value = stack.pop()
        for use in value.uses:
            if id(use.node) in seen:
                continue
            seen.add(id(use.node))
            _forget_shapes(use.node)
            stack.extend(v for v in use.node.outputs if v is not None)


class _Names:
    """How often each value and node name occurs in the model, counted once per pass run (a
    count per inlined If made the pass quadratic in the Ifs)."""

    def __init__(self, root: Graph):
        self.values = Counter(v.name for v in root.all_values())
        self.nodes = Counter(n.name for n in root.all_nodes() if n.name)

    def rename_clashes(self, branch: Graph) -> None:
        """Rename the values and nodes of `branch` (nested graphs included) whose names
        something outside it uses too. ONNX scopes a branch's names: a sibling If's branch, or
        a node the branch's own initializer shadows, may hold the same name, which the outer
        graph cannot."""
        values, nodes = list(branch.all_values()), list(branch.all_nodes())
        inside_values = Counter(v.name for v in values)
        inside_nodes = Counter(n.name for n in nodes if n.name)
        for value in values:
            if self.values[value.name] > inside_values[value.name]:
                old = value.name
                value.name = branch.fresh_name(old)
                self._moved(self.values, old, value.name)
                inside_values[old] -= 1
                owner = value.graph.initializers  # initializers are keyed by name
                if owner.get(old) is value:
                    del owner[old]
                    owner[value.name] = value
        for inner in nodes:
            if inner.name and self.nodes[inner.name] > inside_nodes[inner.name]:
                old = inner.name
                inner.name = branch.fresh_node_name(old)
                self._moved(self.nodes, old, inner.name)
                inside_nodes[old] -= 1

    @staticmethod
    def _moved(counts: Counter, old: str, new: str) -> None:
        counts[old] -= 1
        counts[new] += 1


def _take_over(out: Value, result: Value, before: Node) -> None:
    """Make the If's output `out` the branch's `result`. A graph output keeps its name: when
    `result` cannot take it over (an outer value, a weight, an output already), an Identity
    carries it."""
    if replace_value(out, result):
        return
    graph = before.graph
    copy = graph.make_node("Identity", [result], before=before,
                           name=graph.fresh_node_name(f"{out.name}_inlined"),
                           dtype=out.dtype or result.dtype, shape=out.shape or result.shape)
    copied = replace_value(out, copy.output)
    assert copied, f"Identity could not take over graph output %{out.name}"


def _can_inline(node: Node, branch: Graph) -> bool:
    """Whether every If output can be given the branch result: an output the graph returns,
    fed by a value of no tensor type, would need an Identity of a sequence or an optional,
    which older opsets lack."""
    if len(branch.outputs) != len(node.outputs) or branch.inputs:
        return False
    for out, result in zip(node.outputs, branch.outputs):
        if out is not None and out.is_graph_output and not result.is_tensor:
            return False
    return True


@register
class InlineConstantIf(Pass):
    name = "InlineConstantIf"
    description = ("replace an If whose condition is a compile-time constant by the nodes of "
                   "the branch it takes")

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        result = PassResult()
        names = None  # counted when a first If is inlined
        for graph in list(model.graph.all_graphs()):
            for node in graph:
                if node.op_type != "If" or not node.is_onnx or node.graph is not graph:
                    continue
                taken = constant_condition(node)
                branch = _branch(node, taken) if taken is not None else None
                if branch is None or not _can_inline(node, branch):
                    continue
                if not ctx.allows("If", node):
                    continue
                outputs, results = node.outputs, list(branch.outputs)
                names = names or _Names(model.graph)
                _hoist(branch, node, names)
                for out, value in zip(outputs, results):
                    if out is not None:
                        _take_over(out, value, node)
                _forget_shapes_downstream(results)
                graph.remove(node)
                result.count("If")
        return result
