"""Deprecated ONNX ops that onnxruntime still runs, rewritten at import into current ones."""

from __future__ import annotations

import numpy as np

from graphopt.ir import DType, Model, Node

# GroupNormalization-18 takes one scale and one bias per group; ONNX deprecated it for
# GroupNormalization-21, which takes them per channel. onnx.checker refuses the old version,
# and onnx.version_converter's move to opset 21 leaves the per-group operands in place, where
# onnxruntime refuses them. onnxruntime runs it as the function ONNX gives its schema; the
# rewrite is that function, op for op, so the results are onnxruntime's to the bit (an
# InstanceNormalization over the grouped view, which computes the same in exact arithmetic,
# was 1e-4 off onnxruntime where a group holds one element and epsilon is tiny).
_GROUP_NORM_OPSETS = range(18, 21)


def replace_deprecated_ops(model: Model) -> list[str]:
    """Rewrite the deprecated ops onnxruntime runs (GroupNormalization-18) into the same
    computation in ops of the model's opset, and raise the opset of a model that uses
    LayerNormalization before ONNX defined it; returns a note per kind of rewrite."""
    return _early_layer_norm(model) + _group_norms(model)


def _early_layer_norm(model: Model) -> list[str]:
    """onnxruntime registers LayerNormalization in the ONNX domain for opsets 1 to 16 as well,
    with opset 17's meaning, and its transformer optimizer writes it into models of those
    opsets; ONNX defines it from 17 only, so such a model gets opset 17 where that changes no
    other node's meaning (passes.opset_raise)."""
    from graphopt.passes.opset_raise import raise_blocker, raise_opset

    opset = model.opset("")
    if opset is None or opset >= 17 or not any(
            node.op_type == "LayerNormalization" and node.domain in ("", "ai.onnx")
            for node in model.graph.all_nodes()):
        return []
    if raise_blocker(model, 17) is not None:
        return []  # the input check then names the node ONNX cannot run at this opset
    raise_opset(model, 17)
    return [f"LayerNormalization at opset {opset} (onnxruntime's own before ONNX defined it at "
            "17): the model's opset is raised to 17, which changes no other node's meaning"]


def _group_norms(model: Model) -> list[str]:
    if model.opset("") not in _GROUP_NORM_OPSETS:
        return []
    group_norms = [node for node in model.graph.all_nodes()
                   if node.op_type == "GroupNormalization" and node.domain in ("", "ai.onnx")
                   and _rewritable(node)]
    for node in group_norms:
        _group_norm_as_its_function(node)
    if not group_norms:
        return []
    return [f"{len(group_norms)} GroupNormalization node(s) of opset {model.opset('')} "
            "(deprecated by ONNX: scale and bias per group) rewritten as the function ONNX "
            "defines it by, which onnxruntime runs"]


def _dtype(node: Node):
    """The element type T of x, scale, bias and y: an input's at import is known for graph
    inputs and weights, not yet for a value another node computes."""
    return next((v.dtype for v in node.inputs if v is not None and v.dtype is not None), None)


def _rewritable(node: Node) -> bool:
    """Whether the rewrite applies: the three operands present, T known, and groups that
    divide the channels where those are static. Anything else is left for the import check
    to report."""
    if len(node.inputs) != 3 or any(v is None for v in node.inputs) or \
            len(node.outputs) != 1 or node.outputs[0] is None:
        return False
    if node.attr("num_groups") is None or set(node.attrs) - {"num_groups", "epsilon"}:
        return False
    x = node.input(0)
    channels = x.shape[1] if x.shape is not None and len(x.shape) > 1 else None
    if isinstance(channels, int) and channels % max(int(node.attr("num_groups")), 1):
        return False  # no input runs it; the later passes could drop the failing Reshape
    return _dtype(node) is not None


def _group_norm_as_its_function(node: Node) -> None:
    """GroupNormalization-18's function body on X viewed as [N, G, C/G · rest]:
        mean = ReduceMean(X3D, [2]); var = ReduceMean(X3D²) - mean²
        Y = Reshape(scale[1,G,1] · (X3D - mean) / √(var + ε) + bias[1,G,1], Shape(X))
    The node itself becomes the last Reshape, so its output keeps its name and readers."""
    graph = node.graph
    x, scale, bias = node.inputs
    dtype = _dtype(node)
    name = node.name or graph.fresh_node_name("GroupNormalization")

    def const(hint: str, array) -> object:
        return graph.make_initializer(f"{name}_{hint}", np.asarray(array))

    def step(op: str, *inputs, sizes: bool = False, **attrs) -> object:
        """A node of the function; `sizes`: of its shape arithmetic (int64), else of T."""
        made = graph.make_node(op, inputs, attrs, name=graph.fresh_node_name(f"{name}_{op}"),
                               before=node, dtype=DType.INT64 if sizes else dtype)
        return made.output

    groups = const("groups", np.array([int(node.attr("num_groups"))], np.int64))
    epsilon = np.array([node.attr("epsilon", 1e-5)], np.float32).astype(dtype.numpy)
    axis = const("axis", np.array([2], np.int64))
    # [N, G, C / G, rest…] first, as the function has it: a C that G does not divide fails
    # there, at run time, as onnxruntime fails it ([N, G, -1] would mix channels of two groups).
    group_size = step("Div", step("Shape", x, start=1, end=2, sizes=True), groups, sizes=True)
    split = step("Concat", step("Shape", x, start=0, end=1, sizes=True), groups, group_size,
                 step("Shape", x, start=2, sizes=True), axis=0, sizes=True)
    grouped = step("Reshape", step("Reshape", x, split),
                   const("grouped", np.array([0, 0, -1], np.int64)))
    mean = step("ReduceMean", grouped, axis)
    mean_of_square = step("ReduceMean", step("Mul", grouped, grouped), axis)
    variance = step("Sub", mean_of_square, step("Mul", mean, mean))
    deviation = step("Div", step("Sub", grouped, mean),
                     step("Sqrt", step("Add", variance, const("epsilon", epsilon))))
    per_group = const("per_group", np.array([1, -1, 1], np.int64))
    scaled = step("Mul", step("Reshape", scale, per_group), deviation)
    shifted = step("Add", scaled, step("Reshape", bias, per_group))
    node.op_type = "Reshape"
    node.attrs = {}
    node.set_inputs([shifted, step("Shape", x, sizes=True)])
