"""Structural verifier: single producers, consistent use lists, topological order, no dangling
values, graph outputs produced, unique names — over the main graph and every nested graph."""

from __future__ import annotations

from graphopt.ir.graph import Graph
from graphopt.ir.model import Model


class VerifyError(AssertionError):
    def __init__(self, problems: list[str]):
        self.problems = problems
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(problems[0] + more)


def verify(model_or_graph: Model | Graph) -> None:
    """Raise VerifyError listing every structural problem found."""
    graph = model_or_graph.graph if isinstance(model_or_graph, Model) else model_or_graph
    problems: list[str] = []
    names: dict[str, object] = {}
    _verify_graph(graph, set(), names, problems)
    if problems:
        raise VerifyError(problems)


def _verify_graph(graph: Graph, outer: set[int], names: dict[str, object],
                  problems: list[str]) -> None:
    visible = set(outer)

    def define(value, where: str) -> None:
        if value.name in names and names[value.name] is not value:
            problems.append(f"value name '{value.name}' is defined twice ({where})")
        names[value.name] = value
        visible.add(id(value))

    for value in graph.inputs:
        if not value.is_input:
            problems.append(f"graph input %{value.name} is not flagged as an input")
        define(value, f"input of graph '{graph.name}'")
    for name, value in graph.initializers.items():
        if value.name != name:
            problems.append(f"initializer key '{name}' names value %{value.name}")
        if value.producer is not None:
            problems.append(f"initializer %{name} also has a producer {value.producer}")
        if not value.is_input:
            define(value, f"initializer of graph '{graph.name}'")

    count = 0
    for node in graph.nodes():
        count += 1
        if node.graph is not graph:
            problems.append(f"{node} is linked into '{graph.name}' but points to another graph")
        for index, value in enumerate(node.inputs):
            if value is None:
                continue
            if id(value) not in visible:
                problems.append(f"{node} input {index} reads %{value.name} before it is defined "
                                "(dangling value or order is not topological)")
            if sum(1 for u in value.uses if u.node is node and u.index == index) != 1:
                problems.append(f"%{value.name} use list lacks ({node}, {index})")
        if node.subgraphs() and node not in graph._holders:
            problems.append(f"{node} holds subgraphs that graph '{graph.name}' does not know of "
                            "(a graph attribute set without Node.set_attr or note_subgraphs)")
        for sub in node.subgraphs():
            if sub.parent is not node:
                problems.append(f"subgraph '{sub.name}' of {node} does not point back to it")
            _verify_graph(sub, visible, names, problems)
        for index, value in enumerate(node.outputs):
            if value is None:
                continue
            if value.producer is not node or value.index != index:
                problems.append(f"%{value.name} producer is {value.producer}, expected {node}")
            if value.graph is not graph:
                problems.append(f"%{value.name} does not point to its graph '{graph.name}'")
            define(value, f"output of {node}")
        for value in node.inputs:
            if value is None:
                continue
            for use in value.uses:
                consumer = use.node
                if consumer.graph is None:
                    problems.append(f"%{value.name} is used by removed node {consumer}")
                elif use.index >= len(consumer.inputs) or consumer.inputs[use.index] is not value:
                    problems.append(f"%{value.name} use ({consumer}, {use.index}) is stale")
    if count != len(graph):
        problems.append(f"graph '{graph.name}' node count {len(graph)} != linked nodes {count}")
    for value in graph.outputs:
        if id(value) not in visible:
            problems.append(f"graph '{graph.name}' output %{value.name} is not produced")
