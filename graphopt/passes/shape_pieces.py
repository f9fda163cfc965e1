"""Which dims of which value a piece of a shape computation reads: Shape(x) and what picks from it.

    Shape(x) {start, end}, Gather(Shape(x), i) (scalar or 1-D i), Unsqueeze(Gather(…, i), [0])
    and Slice(Shape(x), a, b) with step 1

each stand for a list of x's dims, which FoldShapes compares with positions (a Reshape's own
dims, see reshape_own_dims), joins (a Concat of consecutive dims is one Shape) or, where they
are static, folds. Slice's bounds and ONNX's clamping of them are read here for all three.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import Node, Value


def dims_read(piece: Value, opset: int) -> tuple[Value, list[int]] | None:
    """(x, the indices of x's dims that `piece` holds, in order), or None when it is not one
    of the forms above or x's rank is needed and unknown."""
    node = piece.producer
    if node is None or not node.is_onnx:
        return None
    if node.op_type == "Shape":
        return _shape_range(node)
    if node.op_type == "Unsqueeze":  # of a scalar Gather: one dim
        axes = _list(node.input(1)) if opset >= 13 else node.attr("axes")
        inner = node.input(0)
        if axes is None or list(axes) not in ([0], [-1]) or inner is None:
            return None
        gather = inner.producer
        if gather is None or not gather.is_onnx or gather.op_type != "Gather":
            return None
        index = ints(gather.input(1))
        return None if index is None or index.ndim != 0 else _gathered(gather, [int(index)])
    if node.op_type == "Gather":
        index = ints(node.input(1))
        return None if index is None or index.ndim != 1 else \
            _gathered(node, [int(i) for i in index])
    if node.op_type == "Slice":
        return _sliced(node, opset)
    return None


def ints(value: Value | None) -> np.ndarray | None:
    """A constant integer input as int64, or None."""
    data = value.constant() if value is not None else None
    return data.astype(np.int64) if data is not None and data.dtype.kind in "iu" else None


def _list(value: Value | None) -> list[int] | None:
    """A constant 1-D integer input as a list, or None (a scalar where ONNX wants a list
    included: the rewrite is not worth guessing what a runtime makes of it)."""
    data = ints(value)
    return None if data is None or data.ndim != 1 else [int(v) for v in data]


def known_rank(x: Value) -> int | None:
    return len(x.shape) if x.shape is not None and x.type_proto is None else None


def _shape_range(shape: Node | None) -> tuple[Value, list[int]] | None:
    """(x, the dims Shape(x) returns with its start/end), or None."""
    if shape is None or not shape.is_onnx or shape.op_type != "Shape" or shape.input(0) is None:
        return None
    x = shape.input(0)
    rank = known_rank(x)
    if rank is None:  # where a start or end counted from the back falls
        return None
    start, end = shape.attr("start", 0), shape.attr("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return x, list(range(start, end))


def _gathered(gather: Node, indices: list[int]) -> tuple[Value, list[int]] | None:
    """(x, the dims Gather(Shape(x), indices) picks), or None."""
    source = gather.input(0)
    if gather.attr("axis", 0) not in (0, -1) or source is None:
        return None
    read = _shape_range(source.producer)
    if read is None:
        return None
    x, dims = read
    if any(not -len(dims) <= i < len(dims) for i in indices):
        return None
    return x, [dims[i] for i in indices]


def _sliced(node: Node, opset: int) -> tuple[Value, list[int]] | None:
    """(x, the dims Slice(Shape(x), a, b) with step 1 picks), or None."""
    bounds = slice_bounds(node, opset)
    source = node.input(0)
    if bounds is None or bounds[2] != 1 or source is None:
        return None
    read = _shape_range(source.producer)
    if read is None:
        return None
    x, dims = read
    return x, [dims[i] for i in slice_indices(len(dims), *bounds)]


def slice_bounds(node: Node, opset: int) -> tuple[int, int, int] | None:
    """(start, end, step) of a Slice along axis 0 of a 1-D input (a shape), from its
    attributes before opset 10 and its constant inputs from 10 on; None for anything else (a
    scalar where ONNX wants a list included)."""
    if opset < 10:
        starts, ends, axes = node.attr("starts"), node.attr("ends"), node.attr("axes", [0])
        steps = [1]
    else:
        starts, ends = _list(node.input(1)), _list(node.input(2))
        axes = _list(node.input(3)) if node.input(3) is not None else [0]
        steps = _list(node.input(4)) if node.input(4) is not None else [1]
    if starts is None or ends is None or axes is None or steps is None:
        return None
    if len(starts) != 1 or len(ends) != 1 or list(axes) not in ([0], [-1]) or len(steps) != 1 \
            or int(steps[0]) == 0 or runs_to_the_front(int(ends[0]), int(steps[0])):
        return None
    return int(starts[0]), int(ends[0]), int(steps[0])


# The ends onnxruntime reads as "to the front" under a negative step, where ONNX's spec (its
# reference, its shape inference) clamps them to the last index: Slice(x, 2, INT64_MAX, -1)
# over 3 takes [2, 1, 0] in onnxruntime and nothing in ONNX. Such a Slice is not folded.
_MAX_ENDS = (2**31 - 1, 2**63 - 1)


def runs_to_the_front(end: int, step: int) -> bool:
    """Whether onnxruntime and ONNX read this Slice end differently (_MAX_ENDS)."""
    return step < 0 and end in _MAX_ENDS


def slice_indices(size: int, start: int, end: int, step: int) -> range:
    """The indices ONNX Slice takes along an axis of `size`. Its clamping differs from
    Python's for a negative step: a start below -size counts from 0 (Python: nothing)."""
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), size), min(max(end, 0), size)
    else:
        start, end = min(max(start, 0), size - 1), min(max(end, -1), size - 1)
    return range(start, end, step)
