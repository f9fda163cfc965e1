"""Pooling output sizes under ceil_mode, where onnxruntime and ONNX's shape inference (before
opset 22) disagree: onnxruntime drops a last window that would start in the end padding, ONNX
inference keeps it. The size is onnxruntime's, so graphopt must not take inference's; it
cannot write onnxruntime's either, since onnx.checker's strict inference would then find the
model inconsistent. Such an output keeps its batch and channel dims and leaves the spatial
ones unknown, as does everything inferred from it, and inference is kept from filling them in
again."""

from __future__ import annotations

import math

import onnx

from graphopt.ir import Model, Node, Value
from graphopt.ir.onnx_io import graph_protos

POOLS = ("MaxPool", "AveragePool", "LpPool")
# From opset 22 the ONNX spec drops such a window too, and its shape inference agrees.
FIXED_IN_OPSET = 22
# The domain a disputed pool gets in the copy of the model shape inference reads: no schema,
# so inference leaves its output as declared.
_HIDDEN_DOMAIN = "graphopt.uninferred"


def ceil_mode_size(size: int, kernel: int, stride: int, head: int, tail: int,
                   dilation: int = 1, *, onnx_inference: bool = False) -> int:
    """One spatial output size under ceil_mode: rounded up, less a last window that would
    start past the input and its head padding (onnxruntime's rule; `onnx_inference`: without
    that last step, as ONNX infers it before opset 22)."""
    span = size + head + tail - dilation * (kernel - 1) - 1
    out = math.ceil(span / stride) + 1
    if not onnx_inference and (out - 1) * stride >= size + head:
        out -= 1
    return out


def _disputed(node: Node, opset: int) -> bool:
    """Whether onnxruntime and ONNX inference give this pool different output sizes."""
    if opset >= FIXED_IN_OPSET or node.op_type not in POOLS or not node.is_onnx \
            or node.attr("ceil_mode", 0) != 1 \
            or (node.attr("auto_pad") or "NOTSET") not in ("NOTSET", b"NOTSET"):
        return False
    source = node.input(0)
    if source is None or source.shape is None or len(source.shape) < 3:
        return False
    spatial = source.shape[2:]
    kernel = node.attr("kernel_shape")
    if not kernel or len(kernel) != len(spatial) \
            or not all(isinstance(d, int) for d in spatial):
        return False
    rank = len(spatial)
    strides = node.attr("strides") or [1] * rank
    dilations = node.attr("dilations") or [1] * rank
    pads = node.attr("pads") or [0] * (2 * rank)
    return any(ceil_mode_size(spatial[i], kernel[i], strides[i], pads[i], pads[rank + i],
                              dilations[i])
               != ceil_mode_size(spatial[i], kernel[i], strides[i], pads[i], pads[rank + i],
                                 dilations[i], onnx_inference=True)
               for i in range(rank))


def disputed_pools(model: Model) -> list[Node]:
    opset = model.opset("") or 0
    if opset >= FIXED_IN_OPSET:
        return []
    return [node for node in model.graph.all_nodes() if _disputed(node, opset)]


def forget_disputed_sizes(model: Model) -> int:
    """Leave the spatial dims of each disputed pool's output unknown, and forget the shapes
    inferred downstream of it. Returns how many outputs changed."""
    changed: list[Value] = []
    for node in disputed_pools(model):
        out = node.outputs[0]
        if out is None or out.shape is None:
            continue
        unknown = tuple(out.shape[:2]) + (None,) * (len(out.shape) - 2)
        if tuple(out.shape) != unknown:
            out.shape = unknown
            changed.append(out)
    if changed:
        _forget_downstream(changed)
    return len(changed)


def hide_from_inference(model: Model, proto: onnx.ModelProto) -> None:
    """In `proto` (`model` exported for shape inference, value infos included), give the
    disputed pools whose output is typed a domain without schemas: inference then keeps the
    output as the model declares it (unknown spatial dims) instead of its own sizes."""
    outputs = {node.outputs[0].name for node in disputed_pools(model)
               if node.outputs[0] is not None and node.outputs[0].dtype is not None}
    if not outputs:
        return
    for graph in graph_protos(proto.graph):  # names are unique model-wide
        for node in graph.node:
            if node.output and node.output[0] in outputs and node.domain in ("", "ai.onnx"):
                node.domain = _HIDDEN_DOMAIN
    proto.opset_import.add(domain=_HIDDEN_DOMAIN, version=1)


def _forget_downstream(values: list[Value]) -> None:
    seen = {id(v) for v in values}
    stack = [use.node for v in values for use in v.uses]
    while stack:
        node = stack.pop()
        for out in node.outputs:
            if out is None or id(out) in seen:
                continue
            seen.add(id(out))
            out.shape = None
            stack.extend(use.node for use in out.uses)
