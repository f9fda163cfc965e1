"""Deprecated ONNX ops that onnxruntime still runs, rewritten at import into current ones, and
attributes onnxruntime accepts in some places only, dropped where they mean nothing."""

from __future__ import annotations

import numpy as np

from graphopt.codegen.om_manifest import elem_type_label
from graphopt.errors import InputError
from graphopt.ir import DType, Model, Node

# GroupNormalization-18 takes one scale and one bias per group; ONNX deprecated it for
# GroupNormalization-21, which takes them per channel. onnx.checker refuses the old version,
# and onnx.version_converter's move to opset 21 leaves the per-group operands in place, where
# onnxruntime refuses them. onnxruntime runs it as the function ONNX gives its schema; the
# rewrite is that function, op for op, so the results are onnxruntime's to the bit (an
# InstanceNormalization over the grouped view, which computes the same in exact arithmetic,
# was 1e-4 off onnxruntime where a group holds one element and epsilon is tiny).
_GROUP_NORM_OPSETS = range(18, 21)


def replace_deprecated_ops(model: Model, label: str = "model") -> list[str]:
    """Rewrite the deprecated ops onnxruntime runs (GroupNormalization-18, ImageScaler) into the
    same computation in ops of the model's opset, and raise the opset of a model that uses
    LayerNormalization before ONNX defined it; returns a note per kind of rewrite."""
    _inert_saturate(model)
    return _early_layer_norm(model, label) + _group_norms(model) + _image_scalers(model)


def _image_scalers(model: Model) -> list[str]:
    """ImageScaler (an experimental op of opsets 1-9, at the head of old converted models such
    as the model zoo's Tiny YOLOv2) as the Mul and Add it is, y = scale · x + bias[c]: ops every
    device has, which FoldInputAffine then takes into the Conv after it (an NPU had sent it to
    the host). From opset 7 on, where Mul and Add broadcast."""
    if (model.opset("") or 1) < 7:
        return []
    scalers = [node for node in model.graph.all_nodes()
               if node.op_type == "ImageScaler" and node.domain in ("", "ai.onnx")
               and len(node.inputs) == 1 and node.inputs[0] is not None
               and node.inputs[0].dtype is not None and node.inputs[0].dtype.is_float
               and (node.inputs[0].shape is None or len(node.inputs[0].shape) == 4)]
    for node in scalers:
        graph, x = node.graph, node.inputs[0]
        numpy_type = x.dtype.numpy
        bias = np.asarray(node.attr("bias") or [0.0], np.float64).astype(numpy_type)
        scale = np.array(node.attr("scale", 1.0), np.float64).astype(numpy_type)
        name = node.name or graph.fresh_node_name("ImageScaler")
        scaled = graph.make_node("Mul", [x, graph.make_initializer(f"{name}_scale", scale)],
                                 name=graph.fresh_node_name(f"{name}_Mul"), before=node,
                                 dtype=x.dtype, shape=x.shape)
        node.op_type, node.attrs = "Add", {}
        node.set_inputs([scaled.output,
                         graph.make_initializer(f"{name}_bias", bias.reshape(-1, 1, 1))])
    if not scalers:
        return []
    return [f"{len(scalers)} ImageScaler node(s) (an experimental op of opsets 1-9) rewritten "
            "as the Mul and Add they compute"]


# The types a Cast's `saturate` applies to (opset 19's float8s, opset 23's float4 and e8m0).
_SATURATING = frozenset({DType.FLOAT8E4M3FN, DType.FLOAT8E4M3FNUZ, DType.FLOAT8E5M2,
                         DType.FLOAT8E5M2FNUZ, DType.FLOAT4E2M1, DType.FLOAT8E8M0})


def _inert_saturate(model: Model) -> None:
    """Drop `saturate` from each Cast to a type it does not apply to, where it changes nothing:
    onnxruntime refuses it at load ("only used for cast to float 8 types") in the main graph,
    not inside a Loop body, and a Cast moved out of one had made a model that did not load."""
    for node in model.graph.all_nodes():
        if node.op_type == "Cast" and node.domain in ("", "ai.onnx") and "saturate" in node.attrs \
                and node.attr("to") is not None and node.attr("to") not in _SATURATING:
            del node.attrs["saturate"]


def _early_layer_norm(model: Model, label: str) -> list[str]:
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
    _type_constant_operands(model)
    if _mixes_float_types(model):
        _type_layer_norm_inputs(model)
    mixed = [node for node in model.graph.all_nodes() if _mixed_layer_norm(node)]
    for node in mixed:
        declared = node.output.dtype
        if declared is not None and declared != node.input(1).dtype:
            raise InputError(
                f"{label}: node {node.label} (LayerNormalization): X is "
                f"{elem_type_label(int(node.input(0).dtype))} and its scale "
                f"{elem_type_label(int(node.input(1).dtype))}, so onnxruntime's LayerNormalization "
                f"before opset 17 writes Y in the scale's type, but the model declares Y "
                f"{elem_type_label(int(declared))} (onnxruntime refuses the model too)")
    for node in mixed:
        _one_type_layer_norm(node)
    note = (f"LayerNormalization at opset {opset} (onnxruntime's own before ONNX defined it at "
            "17): the model's opset is raised to 17, which changes no other node's meaning")
    if mixed:
        note += (f"; {len(mixed)} of them (a scale of another type than X) now compute in "
                 "the wider type between Casts, as onnxruntime's did")
    return [note]


# The message the import check adds when ONNX's inference refuses a LayerNormalization of a
# raised model: one whose X type is known only after import cannot be rewritten as above.
EARLY_LAYER_NORM_HINT = (
    "the model's opset was raised to 17 for its LayerNormalization nodes (onnxruntime's own "
    "before 17, which took a scale and bias of another type than X and wrote Y in the scale's "
    "type); ONNX's takes X, scale and bias of one type: Cast the narrower of X and the scale "
    "and bias to the wider type, and Y to the scale's type, as onnxruntime computed it")


def _type_constant_operands(model: Model) -> None:
    """Type the outputs of the Constant nodes a LayerNormalization reads (its scale and bias,
    as exporters may write them) from their tensors: at import, before ConstantToInitializer
    runs, a Constant's output has no type yet."""
    for node in model.graph.all_nodes():
        if node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx"):
            continue
        for value in node.inputs[1:]:
            maker = value.producer if value is not None else None
            tensor = maker.attr("value") if maker is not None and maker.op_type == "Constant" \
                and maker.is_onnx else None
            if value.dtype is None and tensor is not None and getattr(tensor, "dtype", None):
                value.dtype = DType(int(tensor.dtype))


def _mixes_float_types(model: Model) -> bool:
    """Whether the graph inputs, weights and Casts use more than one float type: otherwise no
    LayerNormalization can have a scale of another type than X."""
    graph = model.graph
    seen = {v.dtype for v in [*graph.inputs, *graph.initializers.values()]}
    seen |= {n.attr("to") for n in graph.nodes() if n.op_type == "Cast"}
    seen |= {n.output.dtype for n in graph.nodes() if n.op_type == "Constant" and n.outputs}
    return len(seen & _NORM_TYPES) > 1  # DType is an IntEnum: Cast's int `to` compares


def _type_layer_norm_inputs(model: Model) -> None:
    """Type the X of every main-graph LayerNormalization whose scale type is known but X's is
    not (X computed by another node): one shape inference of the model, where each such node
    stands in as Cast(X) to the scale's type, the type onnxruntime's kernel writes Y in, so
    one LayerNormalization's Y types the next one's X."""
    import onnx

    from graphopt.ir.onnx_export import to_onnx

    norms = {node.output.name: node for node in model.graph.nodes()  # by Y: always named
             if node.op_type == "LayerNormalization" and node.domain in ("", "ai.onnx")
             and len(node.inputs) > 1 and node.input(0) is not None and node.outputs
             and node.outputs[0] is not None
             and node.input(1) is not None and node.input(1).dtype is not None}
    untyped = {node.input(0).name: node for node in norms.values()
               if node.input(0).dtype is None}
    if not untyped:
        return
    proto = to_onnx(model, weights_as_inputs_above=0)
    for stand_in in proto.graph.node:
        if stand_in.op_type == "LayerNormalization" and stand_in.output[0] in norms:
            scale = norms[stand_in.output[0]].input(1).dtype
            stand_in.op_type, stand_in.domain = "Cast", ""
            del stand_in.input[1:], stand_in.output[1:], stand_in.attribute[:]
            stand_in.attribute.append(onnx.helper.make_attribute("to", int(scale)))
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, check_type=False, data_prop=False)
    except (onnx.shape_inference.InferenceError, ValueError, RuntimeError):
        return  # the import check reports what inference refuses
    for info in inferred.graph.value_info:
        node = untyped.get(info.name)
        if node is not None and info.type.tensor_type.elem_type:
            node.input(0).dtype = DType(info.type.tensor_type.elem_type)


def _mixed_layer_norm(node: Node) -> bool:
    """An early LayerNormalization whose scale (and bias) type V differs from X's type T, both
    known at import; its only output Y is then of type V, as onnxruntime's kernel writes it."""
    if node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx"):
        return False
    if len(node.outputs) != 1 or len(node.inputs) < 2 or any(v is None for v in node.inputs):
        return False
    types = {v.dtype for v in node.inputs}
    return None not in types and len(types) == 2 and node.input(0).dtype != node.input(1).dtype \
        and len({v.dtype for v in node.inputs[1:]}) == 1 and types <= _NORM_TYPES


_NORM_TYPES = {DType.FLOAT16, DType.BFLOAT16, DType.FLOAT, DType.DOUBLE}
_WIDTH = {DType.FLOAT16: 2, DType.BFLOAT16: 2, DType.FLOAT: 4, DType.DOUBLE: 8}


def _one_type_layer_norm(node: Node) -> None:
    """LayerNormalization(X: T, scale: V, bias: V) → Y: V as ONNX-17's of one type C, the wider
    of T and V (float for float16 with bfloat16): the narrower operands Cast up, exactly, and Y
    Cast to V. onnxruntime's kernel computed in float from the same values, so only a double
    operand computes differently, more precisely. The node becomes the Cast to V, so Y keeps
    its name and readers."""
    graph = node.graph
    t, v = node.input(0).dtype, node.input(1).dtype
    wider = max((t, v), key=_WIDTH.get) if _WIDTH[t] != _WIDTH[v] else DType.FLOAT
    name = node.name or graph.fresh_node_name("LayerNormalization")

    def as_wider(value):  # a Cast of a weight is folded by FoldConstants
        if value.dtype == wider:
            return value
        return graph.make_node("Cast", [value], {"to": int(wider)}, before=node, dtype=wider,
                               name=graph.fresh_node_name(f"{name}_cast")).output

    norm = graph.make_node("LayerNormalization", [as_wider(x) for x in node.inputs],
                           dict(node.attrs), name=name, before=node, dtype=wider,
                           shape=node.output.shape)
    node.name = graph.fresh_node_name(f"{name}_cast")
    node.op_type, node.attrs = "Cast", {}
    node.set_attr("to", int(v))
    node.set_inputs([norm.output])


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
