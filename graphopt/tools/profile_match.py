"""Which IR node a profiled kernel comes from, by the names onnxruntime gives its nodes.

onnxruntime names a kernel after its node, `<Op>_<index>` when the node has no name. Its own
rewrites name the new node after one of the old ones or after an output:

    <first node>/MatMulAddFusion, <node>/…     a fusion: the longest IR node name prefixing it at "/"
    <output value>_nchwc                       an NCHWc conversion: the node producing that value,
                                               or the producer above it whose op the kernel runs
                                               (Conv+BatchNorm+Relu are named after the Relu's output)

Kernels onnxruntime created from nothing in the IR (ReorderInput/ReorderOutput of its own NCHWc
pass) stay unmatched and are reported as such.
"""

from __future__ import annotations

from graphopt.ir import Model, Node

EXACT, FUSED, NCHWC = "name", "fused", "nchwc"
_NCHWC_SUFFIX = "_nchwc"
_MAX_CHAIN = 4  # how far above an output's producer a fused NCHWc kernel's op may sit


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


class Matcher:
    """Maps onnxruntime kernel names to the nodes of one IR model."""

    def __init__(self, model: Model) -> None:
        self.nodes = {n.name: n for n in model.graph if n.name}
        self.values = {v.name: v for v in model.graph.all_values()}

    def match(self, kernel: str, op_type: str) -> tuple[Node | None, str]:
        """(node, how) for a kernel name; (None, "") when nothing in the IR accounts for it."""
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
