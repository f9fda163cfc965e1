"""A model's 16-bit floats widened to float32: the result its float16 computation approximates.

A compile that fuses float16 ops into kernels that sum in float32 moves a float16 model's
outputs by a few of float16's steps. Against this reference such a compile is judged by how far
each is from the result itself, the original's own rounding included (rounding.py).
"""

from __future__ import annotations

import numpy as np
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto, TypeProto, numpy_helper

from graphopt.lent_weights import is_lent, tensor_array

HALF = frozenset({TensorProto.FLOAT16, TensorProto.BFLOAT16})
_TYPE_ATTRIBUTES = frozenset({"to", "dtype"})  # Cast's, and the generators' output type


class NotWidened(Exception):
    """A part of the model this widening does not rewrite (external or sparse data)."""


def widened_to_float32(model: ModelProto) -> ModelProto | None:
    """A copy of `model` with every float16 and bfloat16 value, weight, constant and cast made
    float32, or None when it holds data it cannot rewrite."""
    copy = ModelProto()
    copy.CopyFrom(model)
    try:
        _widen_graph(copy.graph)
        for function in copy.functions:
            for node in function.node:
                _widen_node(node)
    except NotWidened:
        return None
    return copy


def widened_feeds(model: ModelProto, feeds: dict) -> dict:
    """The feeds of `model`'s 16-bit float inputs as float32 arrays (the rest as they are)."""
    half = {i.name for i in model.graph.input if i.type.tensor_type.elem_type in HALF}
    return {name: np.asarray(value).astype(np.float32) if name in half else value
            for name, value in feeds.items()}


def _widen_graph(graph: GraphProto) -> None:
    if len(graph.sparse_initializer):
        raise NotWidened("sparse initializers")
    for index, tensor in enumerate(graph.initializer):
        if tensor.data_type in HALF:
            graph.initializer[index].CopyFrom(_widened_tensor(tensor))
    for info in (*graph.input, *graph.output, *graph.value_info):
        _widen_type(info.type)
    for node in graph.node:
        _widen_node(node)


def _widen_node(node) -> None:
    for attribute in node.attribute:
        if attribute.type == AttributeProto.TENSOR and attribute.t.data_type in HALF:
            attribute.t.CopyFrom(_widened_tensor(attribute.t))
        elif attribute.type == AttributeProto.TENSORS:
            for index, tensor in enumerate(attribute.tensors):
                if tensor.data_type in HALF:
                    attribute.tensors[index].CopyFrom(_widened_tensor(tensor))
        elif attribute.type == AttributeProto.INT and attribute.name in _TYPE_ATTRIBUTES \
                and attribute.i in HALF:
            attribute.i = TensorProto.FLOAT
        elif attribute.type == AttributeProto.GRAPH:
            _widen_graph(attribute.g)
        elif attribute.type == AttributeProto.GRAPHS:
            for graph in attribute.graphs:
                _widen_graph(graph)


def _widened_tensor(tensor: TensorProto) -> TensorProto:
    if tensor.data_location == TensorProto.EXTERNAL and not is_lent(tensor):
        raise NotWidened(f"{tensor.name} is stored outside the model")
    widened = numpy_helper.from_array(tensor_array(tensor).astype(np.float32), tensor.name)
    widened.doc_string = tensor.doc_string
    return widened


def _widen_type(value_type: TypeProto) -> None:
    kind = value_type.WhichOneof("value")
    if kind == "tensor_type" and value_type.tensor_type.elem_type in HALF:
        value_type.tensor_type.elem_type = TensorProto.FLOAT
    elif kind == "sparse_tensor_type" and value_type.sparse_tensor_type.elem_type in HALF:
        value_type.sparse_tensor_type.elem_type = TensorProto.FLOAT
    elif kind == "sequence_type":
        _widen_type(value_type.sequence_type.elem_type)
    elif kind == "optional_type":
        _widen_type(value_type.optional_type.elem_type)
    elif kind == "map_type":
        _widen_type(value_type.map_type.value_type)
