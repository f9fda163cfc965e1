"""ONNX export: the IR back to a ModelProto, and single nodes, attributes and types."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Callable, Mapping

from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TypeProto, ValueInfoProto

from graphopt import api_args
from graphopt.errors import OptionError
from graphopt.ir.attributes import Attr
from graphopt.ir.graph import Graph
from graphopt.ir.model import Model
from graphopt.ir.node import Node
from graphopt.ir.value import Value


def to_onnx(model: Model, *, weights_as_inputs_above: int | None = None,
            value_infos: bool | Callable[[Value], bool] = True) -> ModelProto:
    """Export the IR as a ModelProto (no external data; `graphopt.save` decides how to write).

    `weights_as_inputs_above`: main-graph initializers larger than this many bytes are emitted
    as typed graph inputs without data — a cheap model for analyses (shape inference) that need
    every type but not the weights. `value_infos=False` leaves the main graph's intermediate
    types out (for a check that must infer them afresh); a predicate keeps the types of the
    values it accepts.
    """
    if not isinstance(model, Model):
        hint = (" (an OptimizeResult has .to_onnx())" if hasattr(model, "to_onnx")
                else " (a ModelProto is ONNX already)" if isinstance(model, ModelProto) else "")
        raise OptionError(f"to_onnx takes a graphopt Model, not {type(model).__name__}{hint}")
    weights_as_inputs_above = api_args.size(weights_as_inputs_above, "weights_as_inputs_above")
    proto = ModelProto()
    proto.ir_version = model.ir_version
    if model.ir_version < 4 and any(not v.is_input for g in model.graph.all_graphs()
                                    for v in g.initializers.values()):
        # Before IR 4 every initializer had to be a graph input; passes may add ones that are
        # not (folded constants), which only IR 4 allows. At IR 4 an initializer listed as an
        # input is a default the caller may override, so the old weights leave the input list:
        # they stay what they were (fixed), and runtimes may fold them again.
        proto.ir_version = 4
        weights_as_inputs = False
    else:
        weights_as_inputs = True
    for domain, version in model.opset_imports.items():
        entry = proto.opset_import.add()
        entry.domain, entry.version = domain, version
    proto.producer_name = model.producer_name
    proto.producer_version = model.producer_version
    proto.domain = model.domain
    proto.model_version = model.model_version
    proto.doc_string = model.doc_string
    _set_props(proto, model.metadata_props)
    graph_to_proto(model.graph, proto.graph, weights_as_inputs_above,
                   list_fixed_weights=weights_as_inputs, value_infos=value_infos)
    proto.functions.extend(model.functions)
    proto.training_info.extend(model.training_info)
    if model.configuration:
        proto.configuration.extend(model.configuration)
    return proto


def graph_to_proto(graph: Graph, proto: GraphProto | None = None,
                   weights_as_inputs_above: int | None = None,
                   list_fixed_weights: bool = True,
                   value_infos: bool | Callable[[Value], bool] = True) -> GraphProto:
    """Fill `proto` (a fresh GraphProto by default) in place, which avoids copying weights.
    `list_fixed_weights=False` leaves pre-IR-4 weights (non-overridable) out of the inputs;
    `value_infos=False` leaves the types of intermediate values out, a predicate those of the
    values it refuses."""
    proto = GraphProto() if proto is None else proto
    proto.name = graph.name
    proto.doc_string = graph.doc_string
    _set_props(proto, graph.metadata_props)
    listed = set()
    for value in graph.inputs:
        if list_fixed_weights or value.const is None or value.overridable:
            _fill_value_info(proto.input.add(), value)
            listed.add(id(value))
    for value in graph.initializers.values():
        if value.sparse_const is not None and weights_as_inputs_above is not None:
            if id(value) not in listed:  # inference leaves a sparse initializer untyped
                _fill_value_info(proto.input.add(), value)
        elif value.sparse_const is not None:
            proto.sparse_initializer.append(value.sparse_const)
        elif weights_as_inputs_above is not None and value.const.nbytes > weights_as_inputs_above:
            if id(value) not in listed:
                _fill_value_info(proto.input.add(), value)
        else:
            proto.initializer.append(value.const.to_proto(value.name))
    outputs = {id(v) for v in graph.outputs} if value_infos else None
    # Nodes and value infos are filled where they sit (`add()`): appending a finished message
    # copies it, which was half the export's time at 100k nodes (three InferShapes, the input
    # check and the .om writer each export the whole graph).
    nodes, infos = proto.node, proto.value_info
    unsized = _overwritten_in_place(graph) if outputs is not None else set()
    for node in graph:
        _fill_node(nodes.add(), node)
        if outputs is None:
            continue
        for value in node._outputs:
            if value is not None and id(value) not in outputs and _has_type(value) \
                    and (value_infos is True or value_infos(value)):
                info = _fill_value_info(infos.add(), value)
                if id(value) in unsized and info.type.HasField("tensor_type"):
                    info.type.tensor_type.ClearField("shape")
    for value in graph.outputs:
        _fill_value_info(proto.output.add(), value)
    return proto


def _overwritten_in_place(graph: Graph) -> set[int]:
    """The values whose shapes the written model must not declare: the input and the output of
    an L2 `ai.onnx.ml` Normalizer. onnxruntime 1.32's kernel may run in place, and writes x²
    into its output before it reads x's sign; its planner shares the buffer only where it knows
    both sizes, so with both declared every output came out positive (a scikit-learn
    StandardScaler → Normalizer → RandomForest pipeline at a static batch changed class).
    onnxruntime infers no Normalizer's output itself; an input it infers (an Add's) leaves the
    output's declaration as what decides."""
    unsized = set()
    for node in graph:
        if node.op_type == "Normalizer" and node.domain == "ai.onnx.ml" \
                and str(node.attr("norm", "MAX")).upper() == "L2":
            unsized.update(id(v) for v in (node.input(0), node.output) if v is not None)
    return unsized


def node_to_proto(node: Node) -> NodeProto:
    return _fill_node(NodeProto(), node)


def anonymous_node(node: Node) -> NodeProto:
    """`node` as ONNX sees it, with inputs i0, i1, … and outputs o0, o1, … (omitted ones
    empty) and no name: equal for every node of a kind."""
    proto = node_to_proto(node)
    proto.name = ""
    proto.doc_string = ""
    if proto.domain == "ai.onnx":
        proto.domain = ""
    del proto.input[:]
    del proto.output[:]
    proto.input.extend(f"i{i}" if v is not None else "" for i, v in enumerate(node._inputs))
    proto.output.extend(f"o{i}" if v is not None else "" for i, v in enumerate(node._outputs))
    return proto


def _fill_node(proto: NodeProto, node: Node) -> NodeProto:
    proto.op_type = node.op_type
    proto.domain = node.domain
    proto.name = node.name
    proto.doc_string = node.doc_string
    if node.overload:
        proto.overload = node.overload
    _set_props(proto, node.metadata_props)
    proto.input.extend([v.name if v is not None else "" for v in node._inputs])
    proto.output.extend([v.name if v is not None else "" for v in node._outputs])
    if node.attrs:
        attributes = proto.attribute
        tables_left_out = _WITHOUT_TREE_TABLES.get() and node.domain == "ai.onnx.ml"
        for attr in node.attrs.values():
            if tables_left_out and _tree_table(attr):
                continue
            _fill_attribute(attributes.add(), attr)
    return proto


# Set while a model is exported for shape inference alone (without_tree_tables).
_WITHOUT_TREE_TABLES: ContextVar[bool] = ContextVar("graphopt_without_tree_tables",
                                                    default=False)


@contextlib.contextmanager
def without_tree_tables() -> Iterator[None]:
    """Exports within leave out the long per-node lists of ai.onnx.ml ops (a tree ensemble's
    splits and leaves, 255,000 values each in a catboost model of 1,000 trees), but their class
    labels: ONNX's shape inference reads none of them, and graphopt types those ops' outputs
    by rule (ml_types)."""
    token = _WITHOUT_TREE_TABLES.set(True)
    try:
        yield
    finally:
        _WITHOUT_TREE_TABLES.reset(token)


def _tree_table(attr: Attr) -> bool:
    return attr.type in _SCALAR_LISTS and len(attr.value) >= _REUSED_LIST \
        and not attr.name.startswith("classlabels")


def attribute_to_proto(attr: Attr) -> AttributeProto:
    return _fill_attribute(AttributeProto(), attr)


def _fill_attribute(proto: AttributeProto, attr: Attr) -> AttributeProto:
    A = AttributeProto
    proto.name = attr.name
    proto.type = attr.type
    proto.doc_string = attr.doc_string
    if attr.ref_attr_name:
        proto.ref_attr_name = attr.ref_attr_name
        if attr.value is None:
            return proto
    kind, value = attr.type, attr.value
    if kind == A.INT:
        proto.i = int(value)
    elif kind == A.FLOAT:
        proto.f = float(value)
    elif kind == A.STRING:
        proto.s = _encode(value)
    elif kind == A.TENSOR:
        proto.t.CopyFrom(value.to_proto())
    elif kind == A.GRAPH:
        graph_to_proto(value, proto.g)
    elif kind == A.SPARSE_TENSOR:
        proto.sparse_tensor.CopyFrom(value)
    elif kind == A.TYPE_PROTO:
        proto.tp.CopyFrom(value)
    elif kind in _SCALAR_LISTS and len(value) >= _REUSED_LIST:
        _fill_long_list(proto, attr)
    elif kind == A.INTS:
        proto.ints.extend([int(v) for v in value])
    elif kind == A.FLOATS:
        proto.floats.extend([float(v) for v in value])
    elif kind == A.STRINGS:
        proto.strings.extend([_encode(v) for v in value])
    elif kind == A.TENSORS:
        proto.tensors.extend(t.to_proto() for t in value)
    elif kind == A.GRAPHS:
        for g in value:
            graph_to_proto(g, proto.graphs.add())
    elif kind == A.SPARSE_TENSORS:
        proto.sparse_tensors.extend(value)
    elif kind == A.TYPE_PROTOS:
        proto.type_protos.extend(value)
    return proto


# A tree ensemble's attributes hold a value per node (a catboost model of 1000 trees: 255,000
# each), and a compile exports the model about nine times (inference, checks, the partitions):
# encoding them value by value took most of its 7 s. A long list's encoding is kept on its Attr
# and reused while the list holds the same values (compared whole, at C speed).
_SCALAR_LISTS = (AttributeProto.INTS, AttributeProto.FLOATS, AttributeProto.STRINGS)
_REUSED_LIST = 1024


def _fill_long_list(proto: AttributeProto, attr: Attr) -> None:
    kept = getattr(attr, "_encoded", None)
    if kept is None or kept[0] != attr.type or kept[1] != attr.value:
        encoded = AttributeProto()
        if attr.type == AttributeProto.INTS:
            encoded.ints.extend([int(v) for v in attr.value])
        elif attr.type == AttributeProto.FLOATS:
            encoded.floats.extend([float(v) for v in attr.value])
        else:
            encoded.strings.extend([_encode(v) for v in attr.value])
        kept = (attr.type, list(attr.value), encoded)
        attr._encoded = kept
    proto.MergeFrom(kept[2])


def _encode(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8")


def _has_type(value: Value) -> bool:
    return value.type_proto is not None or value.dtype is not None


def value_info(value: Value) -> ValueInfoProto:
    return _fill_value_info(ValueInfoProto(), value)


def _fill_value_info(proto: ValueInfoProto, value: Value) -> ValueInfoProto:
    proto.name = value.name
    proto.doc_string = value.doc_string
    _set_props(proto, value.metadata_props)
    if value.type_proto is not None:
        proto.type.CopyFrom(value.type_proto)
    elif value.dtype is not None or value.shape is not None:
        _fill_tensor_type(proto.type.tensor_type, value)
    return proto


def type_proto(value: Value) -> TypeProto | None:
    if value.type_proto is not None:
        return value.type_proto
    if value.dtype is None and value.shape is None:
        return None
    tp = TypeProto()
    _fill_tensor_type(tp.tensor_type, value)
    return tp


def _fill_tensor_type(tensor_type, value: Value) -> None:
    tensor_type.elem_type = int(value.dtype or 0)
    if value.shape is not None:
        shape = tensor_type.shape
        shape.SetInParent()
        dims = shape.dim
        for dim in value.shape:
            entry = dims.add()
            if isinstance(dim, int):
                entry.dim_value = dim
            elif isinstance(dim, str):
                entry.dim_param = dim


def _set_props(proto, props: Mapping[str, str]) -> None:
    if not props or not hasattr(proto, "metadata_props"):
        return
    for key, value in props.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
