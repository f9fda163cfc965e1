"""A Reshape's target computed at run time with a single entry unknown at compile time: it becomes
a constant with a -1 there.

The dynamo exporter writes scaled_dot_product_attention's Kᵀ with a target read off another value:

    %k<f32[B,4,64,16]>   %s = Slice(Shape(%k), 0, -2)                     the dims [B, 4]
    %y = Reshape(Transpose(%k3<f32[4·B,64,16]>), Concat(%s, [16], [64]))
                                                →   %y = Reshape(…, [-1, 4, 16, 64])

Where the other entries are sizes known at compile time (all positive), the one left is the
input's element count over their product, which is what a -1 computes. The entries are
evaluated by symbolic_dims.shape_tensor from the dims inference recorded.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import Node
from graphopt.passes.symbolic_dims import shape_tensor, value_dims


def one_unknown_shape(reshape: Node, opset: int) -> np.ndarray | None:
    """The constant target equal to `reshape`'s run-time one, its one entry not known at compile
    time written as -1; None unless exactly one entry is unknown and the others are positive."""
    if opset < 5:
        return None
    target = reshape.input(1)
    if target is None or target.is_constant:
        return None
    got = shape_tensor(target, value_dims)
    if got is None or got[1]:
        return None
    entries, unknown = [], []
    for i, (number, names) in enumerate(got[0]):
        if names and number > 0:  # c · a · b…, a product of sizes
            unknown.append(i)
            entries.append(-1)
        elif number > 0:
            entries.append(number)
        else:  # a 0, a -1 of its own, a negative multiple: a -1 here would not compute it
            return None
    return np.array(entries, dtype=np.int64) if len(unknown) == 1 else None
