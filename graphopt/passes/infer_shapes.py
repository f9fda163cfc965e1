"""InferShapes: onnx.shape_inference over the IR, results kept on values."""

from __future__ import annotations

import warnings

import onnx
from onnx import ModelProto

from graphopt.ir import Model, Value
from graphopt.ir.onnx_io import apply_type, to_onnx
from graphopt.passes.base import Pass, PassContext, PassResult, register

# Initializers at most this large keep their data during inference so that data propagation
# (Shape→Gather→Concat→Reshape) can see them; larger ones go in as typed inputs to avoid copying
# weights into a second protobuf.
_DATA_PROP_LIMIT = 4096


def weightless_proto(model: Model) -> ModelProto:
    proto = to_onnx(model, weights_as_inputs_above=_DATA_PROP_LIMIT)
    if proto.ir_version < 4:
        proto.ir_version = 4  # lets initializers stay out of the input list for inference
    return proto


def infer_shapes(model: Model) -> int:
    """Run ONNX shape inference and copy the inferred types onto node outputs.
    Returns how many values gained or changed type information."""
    proto = weightless_proto(model)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            inferred = onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False,
                                                         data_prop=True)
    except Exception:  # noqa: BLE001 - inference is best effort; passes check what they rely on
        return 0
    types = {}
    for graph_proto in _all_graph_protos(inferred.graph):
        for info in list(graph_proto.value_info) + list(graph_proto.output):
            if info.HasField("type"):
                types[info.name] = info.type
    changed = 0
    for value in model.graph.all_values():
        if value.producer is None or value.name not in types:
            continue
        before = (value.dtype, value.shape, value.type_proto)
        probe = Value(value.name)
        apply_type(probe, types[value.name])
        if _more_specific(probe, value):
            value.dtype, value.shape, value.type_proto = probe.dtype, probe.shape, probe.type_proto
        if (value.dtype, value.shape, value.type_proto) != before:
            changed += 1
    return changed


def _more_specific(new: Value, old: Value) -> bool:
    """Take the inferred type unless it knows less than what the value already carries."""
    if new.type_proto is not None or old.type_proto is not None:
        return new.type_proto is not None and old.type_proto is None
    if new.dtype is None and old.dtype is not None:
        return False
    if new.shape is None:
        return old.shape is None
    if old.shape is None or len(old.shape) != len(new.shape):
        return old.shape is None
    known_new = sum(isinstance(d, int) for d in new.shape)
    known_old = sum(isinstance(d, int) for d in old.shape)
    return known_new >= known_old


def _all_graph_protos(graph):
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_graph_protos(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _all_graph_protos(g)


@register
class InferShapes(Pass):
    name = "InferShapes"
    description = "infer dtypes and shapes of every value with onnx.shape_inference"

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        # Type knowledge is not a rewrite: it never makes a fixed-point loop go round again.
        infer_shapes(model)
        return PassResult(changed=False)
