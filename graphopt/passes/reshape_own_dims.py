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

from graphopt.ir import Node
from graphopt.passes.shape_pieces import dims_read


def own_dims_shape(reshape: Node, opset: int) -> np.ndarray | None:
    """The constant shape equal to `reshape`'s run-time one, with a 0 for each entry that reads
    its input's own dim at that position, or None when some entry is neither."""
    if opset < 5 or reshape.attr("allowzero", 0):
        return None
    x, target = reshape.input(0), reshape.input(1)
    if x is None or target is None or target.is_constant:
        return None
    concat = target.producer
    if concat is None or not concat.is_onnx:
        return None
    if concat.op_type == "Concat":
        if concat.attr("axis") not in (0, -1):
            return None
        pieces = concat.inputs
    else:  # one piece alone: Shape(x) {start, end}, a Slice of it, …
        pieces = (target,)
    entries: list[int] = []
    found_own = False
    for piece in pieces:
        if piece is None:
            return None
        data = piece.constant()
        if data is not None:
            if data.dtype.kind not in "iu" or data.ndim != 1:
                return None
            entries.extend(int(v) for v in data)
            continue
        read = dims_read(piece, opset)
        if read is None or read[0] is not x or not read[1] \
                or read[1] != list(range(len(entries), len(entries) + len(read[1]))):
            return None
        entries.extend([0] * len(read[1]))
        found_own = True
    return np.array(entries, dtype=np.int64) if found_own else None
