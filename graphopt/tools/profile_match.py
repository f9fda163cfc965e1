"""Which IR node a profiled kernel comes from, by the names onnxruntime gives its nodes.

onnxruntime names a kernel after its node, `<Op>_<index>` when the node has no name. Its own
rewrites name the new node after one of the old ones or after an output:

    <first node>/MatMulAddFusion, <node>/…     a fusion: the longest IR node name prefixing it at "/"
    <output value>_nchwc                       an NCHWc conversion: the node producing that value,
                                               or the producer above it whose op the kernel runs
                                               (Conv+BatchNorm+Relu are named after the Relu's output)
    <node>_token_<N>                           a node replacing one of the same name, such as the
                                               QLinearConv of a QDQ Conv (Graph::GenerateNodeName
                                               adds `_token_<N>` when the name is taken)
    fused <Gemm>[_token_<N>]                   Gemm + activation as FusedGemm

A replacement of an unnamed node is `_token_<N>` or `fused ` alone, or `<Op>_<index>` (the name
onnxruntime shows for a new node it left unnamed, QGemm_24), N and the index counting up as the
fusions run in topological order: it is matched by that order to the unnamed nodes of its source
op that nothing else matched, when there are as many as kernels and each reaches the next (so
every topological order agrees). Kernels onnxruntime created from nothing in the IR
(ReorderInput/ReorderOutput of its own NCHWc pass, the Transposes around an NHWC QLinearConv)
stay unmatched and are reported as such.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from graphopt.ir import Model, Node

EXACT, FUSED, NCHWC, ORDER = "name", "fused", "nchwc", "order"
_NCHWC_SUFFIX = "_nchwc"
_FUSED_PREFIX = "fused "  # GemmActivationFusion's FusedGemm: "fused " + the Gemm's name
_TOKEN = re.compile(r"_token_(\d+)$")
_MAX_CHAIN = 4  # how far above an output's producer a fused NCHWc kernel's op may sit
# The IR op a kernel replaces when its op differs; the QLinear… ops drop their prefix.
_SOURCE_OPS = {"QGemm": "Gemm", "FusedGemm": "Gemm", "FusedConv": "Conv",
               "FusedMatMul": "MatMul", "MatMulIntegerToFloat": "MatMul",
               "DynamicQuantizeMatMul": "MatMul"}


def name_nodes(model: Model) -> None:
    """Give each unnamed main-graph node the name onnxruntime shows for it: `<Op>_<index>`, the
    index counting the model's nodes in order (so only for the model exactly as onnxruntime
    reads it)."""
    taken = {n.name for n in model.graph if n.name}
    for index, node in enumerate(model.graph):
        if not node.name:
            name = f"{node.op_type}_{index}"
            if name not in taken:
                node.name = name
                taken.add(name)


def base_name(kernel: str) -> str:
    """The node name a replacement kernel was made from: without `_token_<N>` and `fused `."""
    return _TOKEN.sub("", kernel).removeprefix(_FUSED_PREFIX)


def source_op(op_type: str) -> str | None:
    """The IR op a fused or quantized kernel op replaces; None for an op that runs as itself."""
    if op_type.startswith("QLinear"):
        return op_type[len("QLinear"):]
    return _SOURCE_OPS.get(op_type)


class Matcher:
    """Maps onnxruntime kernel names to the nodes of one IR model."""

    def __init__(self, model: Model) -> None:
        self.nodes = {n.name: n for n in model.graph if n.name}
        self.values = {v.name: v for v in model.graph.all_values()}
        # Nodes onnxruntime saw without a name: name_nodes (or profile's .onnx path) called
        # them `<Op>_<index>`.
        self.unnamed = [n for i, n in enumerate(model.graph)
                        if n.name in ("", f"{n.op_type}_{i}")]

    def match(self, kernel: str, op_type: str) -> tuple[Node | None, str]:
        """(node, how) for a kernel name; (None, "") when nothing in the IR accounts for it."""
        if kernel in self.nodes:
            return self.nodes[kernel], EXACT
        # The name it was made from says more than a prefix of the decorated one.
        base = base_name(kernel)
        if base and base != kernel:
            node, how = self._by_name(base, op_type)
            if node is not None:
                return node, FUSED if how == EXACT else how
        return self._by_name(kernel, op_type)

    def match_all(self, kernels: Iterable[tuple[str, str]]) -> dict[str, tuple[Node | None, str]]:
        """`match` for every (kernel name, op) of one session, then the replacements of unnamed
        nodes by their order (module docstring)."""
        kernels = dict(kernels)
        found = {name: self.match(name, op) for name, op in kernels.items()}
        taken = {id(node) for node, _ in found.values() if node is not None}
        groups: dict[str, list[tuple[str, int, str]]] = {}
        for name, op in kernels.items():
            rank = _anonymous_rank(name, op)
            if found[name][0] is None and rank is not None:
                groups.setdefault(source_op(op), []).append((*rank, name))
        for op, ranked in groups.items():
            nodes = [n for n in self.unnamed if n.op_type == op and id(n) not in taken]
            # Token numbers and node indices are different counters: a mix has no one order.
            if len({form for form, _, _ in ranked}) == 1 and len(nodes) == len(ranked) \
                    and _in_line(nodes):
                found.update({name: (node, ORDER)
                              for (_, _, name), node in zip(sorted(ranked), nodes)})
        return found

    def _by_name(self, kernel: str, op_type: str) -> tuple[Node | None, str]:
        if kernel in self.nodes:
            return self.nodes[kernel], EXACT
        prefix = kernel.rpartition("/")[0]
        while prefix:
            if prefix in self.nodes:
                return self.nodes[prefix], FUSED
            prefix = prefix.rpartition("/")[0]
        if kernel.endswith(_NCHWC_SUFFIX):
            node = self._producer_running(kernel[: -len(_NCHWC_SUFFIX)], op_type)
            if node is not None:
                return node, NCHWC
        return None, ""

    def _producer_running(self, value_name: str, op_type: str) -> Node | None:
        value = self.values.get(value_name)
        node = value.producer if value is not None else None
        for _ in range(_MAX_CHAIN):
            if node is None:
                return None
            if node.op_type == op_type:
                return node
            first = node.input(0) if node.inputs else None
            node = first.producer if first is not None else None
        return None


def _anonymous_rank(kernel: str, op_type: str) -> tuple[str, int] | None:
    """For the replacement of an unnamed node, which counter orders it and its place there (the
    bare `fused ` came first); None for any other kernel."""
    if source_op(op_type) is None:
        return None
    if not base_name(kernel):
        token = _TOKEN.search(kernel)
        return "token", int(token.group(1)) if token else -1
    index = re.fullmatch(rf"{re.escape(op_type)}_(\d+)", kernel)
    return ("index", int(index.group(1))) if index else None


def _in_line(nodes: list[Node]) -> bool:
    """Whether each node reaches the next through the graph: then every topological order,
    onnxruntime's too, visits them in this order."""
    return all(_reaches(a, b) for a, b in zip(nodes, nodes[1:]))


def _reaches(start: Node, goal: Node) -> bool:
    seen, stack = {id(start)}, [start]
    while stack:
        for value in stack.pop().outputs:
            for node in value.consumers() if value is not None else ():
                if node is goal:
                    return True
                if id(node) not in seen:
                    seen.add(id(node))
                    stack.append(node)
    return False
