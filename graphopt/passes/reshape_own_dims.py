"""A Reshape's target shape built from its own input's dims: each such dim becomes a 0.

Exporters spell `x.view(x.size(0), x.size(1), 12, 64)` as a chain that reads x's dims at run time:

    %s = Shape(%x<f32[B,S,768]>)
    %t = Concat(Unsqueeze(Gather(%s, 0)), Unsqueeze(Gather(%s, 1)), [12], [64])
    %y = Reshape(%x, %t)                    →   %y = Reshape(%x, [0, 0, 12, 64])

Without allowzero, a 0 in Reshape's shape copies the input's dim at the same position, so an
entry that reads x's dim at its own position is a 0, whatever x's size. When every entry is
such a dim or a constant, the shape is a constant and the chain is dead. The pieces read as x's
own dims: Unsqueeze(Gather(Shape(x), i)), Gather(Shape(x), [i, …]), Slice(Shape(x), a, b) with
step 1, and Shape(x) itself (with its start/end), each at the positions it lands on. Only x's
own Shape counts: a dim of another value with the same symbolic name is not proven equal.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import Node, Value


def own_dims_shape(reshape: Node, opset: int) -> np.ndarray | None:
    """The constant shape equal to `reshape`'s run-time one, with a 0 for each entry that reads
    its input's own dim at that position, or None when some entry is neither."""
    if opset < 5 or reshape.attr("allowzero", 0):
        return None
    x, target = reshape.input(0), reshape.input(1)
    if x is None or target is None or target.is_constant:
        return None
    concat = target.producer
    if concat is None or not concat.is_onnx or concat.op_type != "Concat" \
            or concat.attr("axis") not in (0, -1):
        return None
    rank = len(x.shape) if x.shape is not None and x.type_proto is None else None
    entries: list[int] = []
    found_own = False
    for piece in concat.inputs:
        if piece is None:
            return None
        data = piece.constant()
        if data is not None:
            if data.dtype.kind not in "iu" or data.ndim != 1:
                return None
            entries.extend(int(v) for v in data)
            continue
        count = _own_dims(piece, x, len(entries), rank, opset)
        if count is None:
            return None
        entries.extend([0] * count)
        found_own = True
    return np.array(entries, dtype=np.int64) if found_own else None


def _own_dims(piece: Value, x: Value, position: int, rank: int | None,
              opset: int) -> int | None:
    """How many entries `piece` gives when they are x's dims at positions `position`, …;
    None when they are not."""
    node = piece.producer
    if node is None or not node.is_onnx:
        return None
    if node.op_type == "Unsqueeze":  # of a scalar Gather: one dim
        axes = _ints(node.input(1)) if opset >= 13 else node.attr("axes")
        inner = node.input(0)
        if axes is None or list(axes) not in ([0], [-1]) or inner is None:
            return None
        gather = inner.producer
        if gather is None or not gather.is_onnx or gather.op_type != "Gather":
            return None
        index = _ints(gather.input(1))
        if index is None or index.ndim != 0:
            return None
        dims = _gathered_dims(gather, x, rank, [int(index)])
        return 1 if dims == [position] else None
    if node.op_type == "Gather":
        index = _ints(node.input(1))
        if index is None or index.ndim != 1:
            return None
        dims = _gathered_dims(node, x, rank, [int(i) for i in index])
        return len(dims) if dims and dims == list(range(position, position + len(dims))) \
            else None
    if node.op_type == "Slice":
        dims = _sliced_dims(node, x, rank, opset)
        return len(dims) if dims and dims == list(range(position, position + len(dims))) \
            else None
    if node.op_type == "Shape":
        dims = _shape_range(node, x, rank)
        return len(dims) if dims and dims == list(range(position, position + len(dims))) \
            else None
    return None


def _ints(value: Value | None) -> np.ndarray | None:
    data = value.constant() if value is not None else None
    return data.astype(np.int64) if data is not None and data.dtype.kind in "iu" else None


def _shape_range(shape: Node | None, x: Value, rank: int | None) -> list[int] | None:
    """The dims of x that Shape(x) (with its start/end) returns, or None."""
    if shape is None or not shape.is_onnx or shape.op_type != "Shape" or shape.input(0) is not x:
        return None
    if rank is None:  # where a start or end counted from the back falls
        return None
    start, end = shape.attr("start", 0), shape.attr("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return list(range(start, end))


def _gathered_dims(gather: Node, x: Value, rank: int | None, indices: list[int]) -> list[int] | None:
    """The dims of x that Gather(Shape(x), indices) picks, or None."""
    source = gather.input(0)
    if gather.attr("axis", 0) not in (0, -1) or source is None:
        return None
    dims = _shape_range(source.producer, x, rank)
    if dims is None:
        return None
    size = len(dims)
    if any(not -size <= i < size for i in indices):
        return None
    return [dims[i] for i in indices]


def _sliced_dims(node: Node, x: Value, rank: int | None, opset: int) -> list[int] | None:
    """The dims of x that Slice(Shape(x), a, b) with step 1 picks, or None."""
    from graphopt.passes.fold_shapes import slice_indices

    source = node.input(0)
    if opset < 10:
        starts, ends, axes = node.attr("starts"), node.attr("ends"), node.attr("axes", [0])
        steps = [1]
    else:
        starts, ends = _ints(node.input(1)), _ints(node.input(2))
        axes = _ints(node.input(3)) if node.input(3) is not None else [0]
        steps = _ints(node.input(4)) if node.input(4) is not None else [1]
    if source is None or starts is None or ends is None or axes is None or steps is None:
        return None
    if len(starts) != 1 or len(ends) != 1 or list(axes) not in ([0], [-1]) or list(steps) != [1]:
        return None
    dims = _shape_range(source.producer, x, rank)
    if dims is None:
        return None
    return [dims[i] for i in slice_indices(len(dims), int(starts[0]), int(ends[0]), 1)]
