"""Attention masks that mask nothing: what transformers builds for a model without padding.

    Where(Expand(True), 0, lowest)                       (ViT: every key kept, at the batch)
    Where(Unsqueeze(Range(0, S)) >= 0, 0, lowest)        (audio encoders: every position >= 0)

Both are built at run time, which FuseAttention otherwise refuses on the CPU (the bias would be
built on every run); proven to add 0 to every score, they are simply dropped.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import Value

# Ops whose output holds only values of their first input (rearranged, repeated).
_REARRANGING = ("Expand", "Unsqueeze", "Squeeze", "Reshape", "Identity", "Transpose")


def _at_least(value: Value, bound: float, depth: int = 8) -> bool:
    """Whether every element of `value` is provably ≥ bound: a constant, or a Range from a
    start ≥ bound upwards (positions), through ops that only rearrange it."""
    data = value.constant()
    if data is not None:
        return data.dtype.kind in "iuf" and bool(np.all(data >= bound))
    node = value.producer
    if depth == 0 or node is None or not node.is_onnx:
        return False
    if node.op_type in _REARRANGING:
        return node.input(0) is not None and _at_least(node.input(0), bound, depth - 1)
    if node.op_type == "Range":
        start, delta = (v.constant() if v is not None else None for v in
                        (node.input(0), node.input(2)))
        return start is not None and delta is not None and start.size == delta.size == 1 \
            and float(start.reshape(-1)[0]) >= bound and float(delta.reshape(-1)[0]) > 0
    return False


def _all_true(value: Value, depth: int = 8) -> bool:
    """Whether a bool `value` is provably true everywhere: a constant, x ≥ c where x is at
    least c (a padding mask over positions that never pads, as transformers builds for models
    without one), an And of such, through ops that only rearrange it."""
    data = value.constant()
    if data is not None:
        return data.dtype == np.bool_ and bool(np.all(data))
    node = value.producer
    if depth == 0 or node is None or not node.is_onnx:
        return False
    if node.op_type in _REARRANGING:
        return node.input(0) is not None and _all_true(node.input(0), depth - 1)
    if node.op_type == "And":
        return all(v is not None and _all_true(v, depth - 1) for v in node.inputs)
    if node.op_type == "GreaterOrEqual":
        bound = node.input(1).constant() if node.input(1) is not None else None
        return bound is not None and bound.size == 1 and bound.dtype.kind in "iuf" \
            and _at_least(node.input(0), float(bound.reshape(-1)[0]), depth - 1)
    return False


def adds_nothing(mask: Value | None, keep: Value | None) -> bool:
    """Whether the mask leaves every score as it is: an additive mask that is 0 everywhere
    (Where(always true, 0, fill), or a zero constant), or a Where keeping every score. Adding
    0 before Softmax changes nothing, not even a -0.0 (exp(±0) = 1)."""
    if keep is not None:
        return _all_true(keep)
    if mask is None:
        return False
    data = mask.constant()
    if data is not None:
        return bool(np.all(data == 0))
    node = mask.producer
    if node is None or not node.is_onnx or node.op_type != "Where" or node.input(0) is None:
        return False
    zero = node.input(1).constant() if node.input(1) is not None else None
    return zero is not None and bool(np.all(zero == 0)) and _all_true(node.input(0))


__all__ = ["adds_nothing"]
