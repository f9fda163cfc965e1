"""Deprecated ONNX ops that onnxruntime still runs, rewritten at import into current ones."""

from __future__ import annotations

import numpy as np

from graphopt.ir import DType, Model, Node

# GroupNormalization-18 takes one scale and one bias per group; ONNX deprecated it for
# GroupNormalization-21, which takes them per channel. onnx.checker refuses the old version,
# and onnx.version_converter's move to opset 21 leaves the per-group operands in place, where
# onnxruntime refuses them. The same computation in ops of opset 18: normalizing [N, G, rest]
# per (n, g) with scale[g] and bias[g] is InstanceNormalization on the grouped view.
_GROUP_NORM_OPSETS = range(18, 21)
# The dtypes onnxruntime's InstanceNormalization takes (float16 through its inserted Casts).
_GROUP_NORM_DTYPES = (DType.FLOAT, DType.FLOAT16)


def replace_deprecated_ops(model: Model) -> list[str]:
    """Rewrite the deprecated ops onnxruntime runs (GroupNormalization-18) into the same
    computation in ops of the model's opset; returns a note per kind of rewrite."""
    if model.opset("") not in _GROUP_NORM_OPSETS:
        return []
    group_norms = [node for node in model.graph.all_nodes()
                   if node.op_type == "GroupNormalization" and node.domain in ("", "ai.onnx")
                   and _rewritable(node)]
    for node in group_norms:
        _group_norm_as_instance_norm(node)
    if not group_norms:
        return []
    return [f"{len(group_norms)} GroupNormalization node(s) of opset "
            f"{model.opset('')} (deprecated by ONNX: scale and bias per group) rewritten as "
            "Reshape, InstanceNormalization, Reshape, which compute the same"]


def _rewritable(node: Node) -> bool:
    """Whether the rewrite applies: the operands present and of a dtype InstanceNormalization
    takes. Anything else is left for the import check to report."""
    if len(node.inputs) != 3 or any(v is None for v in node.inputs) or \
            len(node.outputs) != 1 or node.outputs[0] is None:
        return False
    if node.attr("num_groups") is None or set(node.attrs) - {"num_groups", "epsilon"}:
        return False
    return node.input(0).dtype in _GROUP_NORM_DTYPES


def _group_norm_as_instance_norm(node: Node) -> None:
    """y = Reshape(InstanceNormalization(Reshape(x, [0, G, -1]), scale, bias), Shape(x)).
    The node itself becomes the last Reshape, so its output keeps its name and readers."""
    graph = node.graph
    x, scale, bias = node.inputs
    groups = int(node.attr("num_groups"))
    epsilon = float(node.attr("epsilon", 1e-5))
    name = node.name or graph.fresh_node_name("GroupNormalization")
    grouped_shape = graph.make_initializer(f"{name}_grouped_shape",
                                           np.array([0, groups, -1], np.int64))
    shape = graph.make_node("Shape", [x], name=graph.fresh_node_name(f"{name}_shape"),
                            before=node, dtype=DType.INT64)
    grouped = graph.make_node("Reshape", [x, grouped_shape],
                              name=graph.fresh_node_name(f"{name}_group"), before=node,
                              dtype=x.dtype)
    normed = graph.make_node("InstanceNormalization", [grouped.output, scale, bias],
                             {"epsilon": epsilon}, name=graph.fresh_node_name(f"{name}_norm"),
                             before=node, dtype=x.dtype)
    node.op_type = "Reshape"
    node.attrs = {}
    node.set_inputs([normed.output, shape.output])
