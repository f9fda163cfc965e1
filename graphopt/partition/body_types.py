"""Dtypes and ranks in a model-local function body (an -O3 elementwise group), as its call
types and shapes it."""

from __future__ import annotations

import functools

import onnx

from graphopt.codegen.om_manifest import dtype_name


def body_types(node, function) -> dict[str, str | None] | None:
    """Value name -> dtype name of the body of `function` (an onnx.FunctionProto) called by
    `node`, inferred from the call's input dtypes by ONNX's inference (a Cast's `to`, a
    comparison's bool, Where's branches); None when an input is untyped or inference fails."""
    if any(v is not None and v.dtype is None for v in node.inputs):
        return None
    dtypes = tuple(int(v.dtype) if v is not None else None for v in node.inputs)
    return _inferred(function.SerializeToString(), dtypes)


@functools.lru_cache(maxsize=1024)
def _inferred(serialized: bytes, dtypes: tuple) -> dict[str, str | None] | None:
    # Cached by body and input dtypes: placement asks it of every call of a group, and a
    # model's groups repeat (one per residual block).
    function = onnx.FunctionProto()
    function.ParseFromString(serialized)
    graph = onnx.helper.make_graph(
        list(function.node), "body",
        [onnx.helper.make_tensor_value_info(name, dtype, None)
         for name, dtype in zip(function.input, dtypes) if dtype is not None],
        [onnx.ValueInfoProto(name=name) for name in function.output])
    proto = onnx.helper.make_model(graph, opset_imports=list(function.opset_import))
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=True).graph
    except Exception:  # noqa: BLE001 - a body inference cannot type is judged as one op
        return None
    return {v.name: _elem_name(v) for v in (*inferred.input, *inferred.value_info,
                                            *inferred.output)}


def _elem_name(info) -> str | None:
    elem = info.type.tensor_type.elem_type if info.type.HasField("tensor_type") else 0
    return dtype_name(elem) if elem else None


def body_ranks(node, function) -> dict[str, int] | None:
    """Value name -> rank in the body of `function` called by `node`, inferred from the call's
    input ranks (an epilogue group's Gemm is rank 2 where the Add after it broadcasts to rank
    3); None when an input's rank is unknown or inference fails."""
    if any(v is not None and (v.dtype is None or v.shape is None) for v in node.inputs):
        return None
    inputs = tuple((int(v.dtype), len(v.shape)) if v is not None else None for v in node.inputs)
    return _inferred_ranks(function.SerializeToString(), inputs)


@functools.lru_cache(maxsize=1024)
def _inferred_ranks(serialized: bytes, inputs: tuple) -> dict[str, int] | None:
    function = onnx.FunctionProto()
    function.ParseFromString(serialized)
    # Each dim a symbol of its own: only the ranks are asked for.
    graph = onnx.helper.make_graph(
        list(function.node), "body",
        [onnx.helper.make_tensor_value_info(name, given[0], [f"{name}_{i}"
                                                             for i in range(given[1])])
         for name, given in zip(function.input, inputs) if given is not None],
        [onnx.ValueInfoProto(name=name) for name in function.output])
    proto = onnx.helper.make_model(graph, opset_imports=list(function.opset_import))
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=True).graph
    except Exception:  # noqa: BLE001 - the call's rank then stands for every op's
        return None
    return {v.name: len(v.type.tensor_type.shape.dim) for v in (
        *inferred.input, *inferred.value_info, *inferred.output)
        if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")}
