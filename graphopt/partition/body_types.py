"""Dtypes in a model-local function body (an -O3 elementwise group), as its call types it."""

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
