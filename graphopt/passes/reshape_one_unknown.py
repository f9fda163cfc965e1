"""A Reshape's target computed at run time with a single entry unknown at compile time: it becomes
a constant with a -1 there, and the chain that computed it goes.

The dynamo exporter writes scaled_dot_product_attention's Kᵀ with a target read off another value:

    %k<f32[B,4,64,16]>   %s = Slice(Shape(%k), 0, -2)                     the dims [B, 4]
    %y = Reshape(Transpose(%k3<f32[4*B,64,16]>), Concat(%s, [16], [64]))
                                                →   %y = Reshape(…, [-1, 4, 16, 64])

Where the other entries are sizes known at compile time (all positive), the one left is the
input's element count over their product, which is what a -1 computes. The entries are
evaluated by symbolic_dims.shape_tensor from the dims inference recorded. The rewrite waits
until the input's dims prove the entry (4·B·16·64 over 4·16·64 is B): later passes match heads
and batches by the names a target gives, and a -1 over unproven dims would lose them (a
TorchScript encoder's heads, split by x.view(S, B·N, H) from a Gather of unknown shape, had
stopped packing into Attention).
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import Node
from graphopt.passes.symbolic_dims import (Equalities, over, product, proven_dims, shape_tensor,
                                           value_dims)


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
    if len(unknown) != 1:
        return None
    # The -1 must leave the entry provable from the input's dims, as symbolic_dims reads a
    # Reshape: the named entry (4·batch) is what later passes match heads and batches by.
    equal = Equalities()
    x = proven_dims(reshape.input(0), equal) if reshape.input(0) is not None else None
    others = [d for i, d in enumerate(got[0]) if i != unknown[0]]
    left = over(product(x), product(others)) if x is not None else None
    if left is None or not equal.same(left, got[0][unknown[0]]):
        return None
    return np.array(entries, dtype=np.int64)
