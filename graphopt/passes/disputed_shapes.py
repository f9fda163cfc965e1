"""Output sizes that onnxruntime and ONNX's shape inference compute differently. The size that
counts is onnxruntime's, so graphopt must not take inference's; it cannot write onnxruntime's
either, since onnx.checker's strict inference would then find the model inconsistent. Such an
output keeps its undisputed dims and leaves the disputed ones unknown, as does everything
inferred from it, and inference is kept from filling them in again.

Each dispute was measured against onnxruntime 1.32 and onnx 1.19 over a grid of attributes:
- a `ceil_mode` pool whose last window would start in the end padding: onnxruntime drops that
  window, inference before opset 22 keeps it;
- a pool with `auto_pad` SAME_UPPER or SAME_LOWER over an axis it dilates: onnxruntime pads
  for the undilated kernel (a 3-wide window dilated by 2 over 11 gives 9, not 11), at every
  opset; and an AveragePool at opset 19-21 with `auto_pad` SAME, `ceil_mode` and a stride
  above 1 on an axis, which inference sizes one larger on some inputs (taken as disputed over
  every such axis, a superset of the grid's disputes);
- Resize and Upsample by constant scales: onnxruntime sizes `int(float32(d) · scale)`, rounding
  the product to float32 first (10 · 0.7 → 7); inference sizes `floor(d · scale)` exactly (6);
- ConvTranspose with `auto_pad` SAME_UPPER or SAME_LOWER and an `output_padding` (and no
  `output_shape`): onnxruntime ignores the padding (`d · stride`), inference adds it;
- STFT without an `onesided` attribute: onnxruntime takes the spec's default, 1, and returns
  frame_length / 2 + 1 frequency bins; inference (onnx 1.23) takes 0 and sizes all
  frame_length of them (9 against 16 for frames of 16), which folded a Shape of it to 16;
- a Slice with a negative step to an end of INT32_MAX or INT64_MAX: onnxruntime runs to the
  front (from 2: 3 rows), the spec and inference stop at once (0 rows).
- a float Range of constant bounds: onnxruntime counts `ceil((limit - start) / delta)` with
  the difference taken in double, inference with it rounded to the inputs' type first
  (float32 0.1 to 3.0 by 0.1: 29 elements against 30, and the .om failed every run).

A Loop body declares the shapes of its loop-carried inputs, and inference trusts them; yet a
carried value may change shape from one iteration to the next (onnxruntime runs that). A
declared dim that the Loop's initial value and the body's result do not both repeat is made
unknown, as is what the body and the Loop infer from it.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from graphopt.ir import Graph, Model, Node, Value
from graphopt.ir.onnx_io import graph_protos

POOLS = ("MaxPool", "AveragePool", "LpPool")
NCHWC_DOMAIN = "com.microsoft.nchwc"
# From opset 22 the ONNX spec drops such a window too, and its shape inference agrees.
POOLS_FIXED_IN_OPSET = 22
# The domain a disputed node gets in the copy of the model shape inference reads: no schema,
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


def scaled_size(size: int, scale: float, *, onnx_inference: bool = False) -> int:
    """One output size of Resize or Upsample by `scale` (a float32): onnxruntime's, or with
    `onnx_inference` ONNX inference's."""
    if onnx_inference:
        return math.floor(size * float(np.float32(scale)))
    return int(np.float32(size) * np.float32(scale))


def _spatial_dims(node: Node) -> tuple | None:
    source = node.input(0)
    if source is None or source.shape is None or len(source.shape) < 3:
        return None
    return tuple(source.shape[2:])


def _pool_dims(node: Node, opset: int) -> list[int]:
    spatial, kernel = _spatial_dims(node), node.attr("kernel_shape")
    if spatial is None or not kernel or len(kernel) != len(spatial):
        return []
    auto_pad = node.attr("auto_pad") or "NOTSET"
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return _same_pool_dims(node, opset, len(spatial))
    if opset >= POOLS_FIXED_IN_OPSET or node.attr("ceil_mode", 0) != 1 or auto_pad != "NOTSET":
        return []
    rank = len(spatial)
    strides = node.attr("strides") or [1] * rank
    dilations = node.attr("dilations") or [1] * rank
    pads = node.attr("pads") or [0] * (2 * rank)
    return [2 + i for i, size in enumerate(spatial) if isinstance(size, int) and (
        ceil_mode_size(size, kernel[i], strides[i], pads[i], pads[rank + i], dilations[i])
        != ceil_mode_size(size, kernel[i], strides[i], pads[i], pads[rank + i], dilations[i],
                          onnx_inference=True))]


def _same_pool_dims(node: Node, opset: int, rank: int) -> list[int]:
    """The axes of a pool with auto_pad SAME whose size onnxruntime and inference dispute."""
    strides = node.attr("strides") or [1] * rank
    dilations = node.attr("dilations") or [1] * rank
    # AveragePool-19's inference rounds a SAME ceil_mode size up where onnxruntime does not.
    ceil_dispute = node.op_type == "AveragePool" and node.attr("ceil_mode", 0) == 1 \
        and 19 <= opset < POOLS_FIXED_IN_OPSET
    return [2 + i for i in range(rank)
            if dilations[i] > 1 or ceil_dispute and strides[i] > 1]


def _resize_scales(node: Node, opset: int) -> np.ndarray | None:
    """The constant scales of a Resize or Upsample that has no `sizes`, else None."""
    if node.op_type == "Upsample" and opset < 9:
        scales = node.attr("scales")
        return None if scales is None else np.asarray(scales, np.float32)
    index = 1 if node.op_type == "Upsample" or opset < 11 else 2
    sizes = node.input(3) if node.op_type == "Resize" and opset >= 11 else None
    if sizes is not None and (sizes.shape is None or sizes.shape != (0,)):
        return None
    scales = node.input(index)
    data = scales.constant() if scales is not None else None
    return None if data is None or data.size == 0 else np.asarray(data, np.float32).reshape(-1)


def _resize_dims(node: Node, opset: int) -> list[int]:
    source, scales = node.input(0), _resize_scales(node, opset)
    if source is None or source.shape is None or scales is None:
        return []
    axes = node.attr("axes") or list(range(len(source.shape)))
    if len(axes) != len(scales):
        return []
    axes = [a + len(source.shape) if a < 0 else a for a in axes]
    cropped = node.attr("coordinate_transformation_mode") in ("tf_crop_and_resize",
                                                               b"tf_crop_and_resize")
    return sorted(
        axis for axis, scale in zip(axes, scales)
        if 0 <= axis < len(source.shape) and isinstance(source.shape[axis], int)
        and scale != 1.0 and (cropped or scaled_size(source.shape[axis], scale)
                              != scaled_size(source.shape[axis], scale, onnx_inference=True)))


def _conv_transpose_dims(node: Node) -> list[int]:
    # An explicit output_shape sizes the output on both sides.
    if (node.attr("auto_pad") or "NOTSET") not in ("SAME_UPPER", "SAME_LOWER", b"SAME_UPPER",
                                                   b"SAME_LOWER") \
            or not any(node.attr("output_padding") or ()) or node.attr("output_shape"):
        return []
    spatial = _spatial_dims(node)
    return [] if spatial is None else [2 + i for i in range(len(spatial))]


def disputed_dims(node: Node, opset: int) -> list[int]:
    """The output dims of `node` that onnxruntime and ONNX inference size differently."""
    if node.op_type in POOLS and node.domain == NCHWC_DOMAIN:
        # LayoutNchwc's blocked pool: onnxruntime's kernel sizes it as the ONNX pool it
        # replaces, and its inference as ONNX's does (a dilated SAME MaxPool's Shape, read
        # after the layout pass, folded to 11 where the pool made 9).
        return _pool_dims(node, opset)
    if not node.is_onnx:
        return []
    if node.op_type in POOLS:
        return _pool_dims(node, opset)
    if node.op_type in ("Resize", "Upsample"):
        return _resize_dims(node, opset)
    if node.op_type == "ConvTranspose":
        return _conv_transpose_dims(node)
    if node.op_type == "STFT" and node.attr("onesided") is None:
        return [2]  # [batch, frames, bins, 2]
    if node.op_type == "Slice":
        return _slice_dims(node, opset)
    if node.op_type == "Range":
        return _range_dims(node)
    return []


def range_length(start: float, limit: float, delta: float, *, narrow=None) -> int:
    """The length of Range(start, limit, delta): onnxruntime's, which divides the difference
    in double, or with `narrow` (the inputs' numpy type) ONNX inference's, which rounds the
    difference to that type first (float32 0.1 to 3.0 by 0.1: 29 elements against 30)."""
    span = float(narrow(limit - start)) if narrow is not None else float(limit) - float(start)
    return max(0, math.ceil(span / float(delta)))


def _range_dims(node: Node) -> list[int]:
    """[0] for a float Range of constant bounds whose length the two compute differently."""
    bounds = [value.constant() if value is not None else None for value in node.inputs[:3]]
    if len(bounds) != 3 or any(b is None or b.size != 1 or b.dtype.kind != "f" for b in bounds):
        return []
    start, limit, delta = (b.reshape(-1)[0] for b in bounds)
    if delta == 0 or not all(map(np.isfinite, (start, limit, delta))):
        return []
    with np.errstate(over="ignore"):
        narrow = range_length(start, limit, delta, narrow=start.dtype.type)
    return [0] if narrow != range_length(start, limit, delta) else []


def _slice_dims(node: Node, opset: int) -> list[int]:
    """The axes a Slice walks backwards to an end of INT32_MAX or INT64_MAX: onnxruntime runs
    to the front (shape_pieces.runs_to_the_front), inference stops at once."""
    from graphopt.passes.shape_pieces import runs_to_the_front

    if opset < 10 or len(node.inputs) < 5 or node.input(4) is None:
        return []  # no steps: every step is 1
    ends, steps = node.input(2).constant(), node.input(4).constant()
    x = node.input(0)
    if ends is None or steps is None or x is None or x.shape is None:
        return []
    axes = node.input(3).constant() if node.input(3) is not None else None
    axes = list(range(ends.size)) if axes is None else [int(a) for a in axes.reshape(-1)]
    rank = len(x.shape)
    return sorted({a + rank if a < 0 else a for a, end, step in zip(
        axes, ends.reshape(-1), steps.reshape(-1)) if runs_to_the_front(int(end), int(step))})


def disputed_nodes(model: Model) -> list[tuple[Node, list[int]]]:
    opset = model.opset("") or 0
    found = []
    for node in model.graph.all_nodes():
        dims = disputed_dims(node, opset)
        if dims:
            found.append((node, dims))
    return found


def forget_disputed_sizes(model: Model) -> int:
    """Leave the disputed dims of each disputed node's output unknown, and the declared dims
    of loop-carried inputs that change between iterations; forget the shapes inferred
    downstream of them. Returns how many values changed."""
    changed = _relax_carried_inputs(model)
    for node, dims in disputed_nodes(model):
        out = node.outputs[0]
        if out is None or out.shape is None:
            continue
        unknown = tuple(None if i in dims else d for i, d in enumerate(out.shape))
        if tuple(out.shape) != unknown:
            out.shape = unknown
            changed.append(out)
    if changed:
        _forget_downstream(changed)
    return len(changed)


def _relax_carried_inputs(model: Model) -> list[Value]:
    """Make unknown the declared dims of Loop bodies' carried inputs that the initial value
    and the body's result do not both repeat. Returns the values changed. (The Loop's own
    outputs need nothing: inference gives a carried value's final form no shape, as its
    shape may change, and a scan output must keep one shape over the iterations.)"""
    changed: list[Value] = []
    for node in list(model.graph.all_nodes()):
        body = node.attr("body") if node.op_type == "Loop" and node.is_onnx else None
        if not isinstance(body, Graph):
            continue
        for k, initial in enumerate(node.inputs[2:]):
            if k + 2 >= len(body.inputs) or k + 1 >= len(body.outputs):
                break
            carried, result = body.inputs[k + 2], body.outputs[k + 1]
            # Untyped as yet (the input check keeps static types alone): the next inference
            # round judges it.
            if carried.shape is None or _unknown(initial) or _unknown(result):
                continue
            steady = tuple(d if _repeats(d, i, initial) and _repeats(d, i, result) else None
                           for i, d in enumerate(carried.shape))
            if steady != tuple(carried.shape):
                carried.shape = steady
                changed.append(carried)
    return changed


def _unknown(value: Value | None) -> bool:
    return value is None or value.shape is None


def _repeats(dim, index: int, value: Value | None) -> bool:
    """Whether `value` has `dim` (a declared dim of a carried input) at `index`."""
    return dim is None or value is not None and value.shape is not None \
        and len(value.shape) > index and value.shape[index] == dim


def shape_read_past_dispute(model: Model) -> bool:
    """Whether a Shape or Size (or a node with a body, which may hold one) reads a disputed
    node's output or something computed from it. onnxruntime's constant folding (its "basic"
    level and above) folds such a Shape to inference's size, so only a session at
    ORT_DISABLE_ALL computes what the model means."""
    seen: set[int] = set()
    stack = [use.node for node, _ in disputed_nodes(model) if node.outputs[0] is not None
             for use in node.outputs[0].uses]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.op_type in ("Shape", "Size") and _foldable_to_wrong_size(node) \
                or node.subgraphs():
            return True
        stack.extend(use.node for out in node.outputs if out is not None for use in out.uses)
    return False


def _foldable_to_wrong_size(node: Node) -> bool:
    """Whether onnxruntime could fold this Shape or Size to a wrong constant: not when a dim
    it reads is symbolic (onnxruntime cannot fold it either), nor when only Gathers of dims
    that are static here read it (a flatten's batch dim: the folded value is right there)."""
    shape = node.input(0).shape if node.input(0) is not None else None
    if shape is None:
        return True
    dims = list(shape)
    if node.op_type == "Shape":
        rank = len(dims)
        start, end = node.attr("start", 0), node.attr("end", rank)
        dims = dims[slice(*(max(0, min(rank, i + rank if i < 0 else i)) for i in (start, end)))]
    if any(isinstance(d, str) for d in dims):
        return False
    readers = node.output.consumers() if node.op_type == "Shape" else []
    return not readers or not all(_reads_static_dim(r, dims) for r in readers)


def _reads_static_dim(reader: Node, dims: list) -> bool:
    index = reader.input(1).constant() if reader.op_type == "Gather" and reader.is_onnx \
        and reader.input(1) is not None else None
    if index is None or index.size != 1:
        return False
    i = int(index.reshape(-1)[0])
    return -len(dims) <= i < len(dims) and isinstance(dims[i], int)


def hide_from_inference(model: Model, proto: onnx.ModelProto) -> None:
    """In `proto` (`model` exported for shape inference, value infos included), give the
    disputed nodes whose output has a type and a rank a domain without schemas: inference then
    keeps the output as the model declares it (unknown disputed dims) instead of its own
    sizes. An output without a rank (an export's value_info may give its dtype alone) is left
    to inference, whose sizes forget_disputed_sizes then makes unknown where disputed: hidden,
    it stayed without one, and so did everything after it."""
    outputs = {node.outputs[0].name for node, _ in disputed_nodes(model)
               if node.outputs[0] is not None and node.outputs[0].dtype is not None
               and node.outputs[0].shape is not None}
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
            # A graph output keeps its rank, its dims unknown: written without a shape, its
            # declaration failed onnx.checker's full check (-O0 runs no inference to refill it).
            out.shape = tuple(None for _ in out.shape) \
                if out.is_graph_output and out.shape is not None else None
            stack.extend(use.node for use in out.uses)
