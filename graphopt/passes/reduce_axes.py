"""The axes a Reduce* node reduces over, in one canonical spelling: sorted and non-negative."""

from __future__ import annotations

import numpy as np

from graphopt.ir import Node

REDUCTIONS = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd",
                        "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
                        "ReduceSumSquare"})


def reduced_axes(node: Node) -> tuple[int, ...] | None:
    """The axes `node` reduces over, sorted and counted from 0, or None when that is not known
    at compile time (axes computed at run time, an input of unknown rank, an axis out of range)
    or the node reduces nothing (empty axes with noop_with_empty_axes). Axes come from the
    second input (ReduceSum from opset 13, every reduction from 18) or the attribute before
    that; none at all reduces every axis. The exporters spell one reduction many ways: dynamo
    writes `x.mean(-1)` with axes [-1] and `x.var(-1)`'s inner mean with [2] at rank 3."""
    if node.op_type not in REDUCTIONS or not node.is_onnx or not node.inputs \
            or node.inputs[0] is None or node.inputs[0].shape is None:
        return None
    rank = len(node.inputs[0].shape)
    given = node.inputs[1] if len(node.inputs) > 1 else None
    if given is not None:
        data = given.constant()
        if data is None or data.dtype.kind not in "iu" or data.ndim > 1:
            return None
        axes = [int(a) for a in np.ravel(data)]
    else:
        axes = node.attr("axes")
        axes = None if axes is None else [int(a) for a in axes]
    if not axes:
        return None if node.attr("noop_with_empty_axes", 0) else tuple(range(rank))
    if any(not -rank <= a < rank for a in axes):
        return None
    canonical = sorted({a % rank for a in axes})
    return tuple(canonical) if len(canonical) == len(axes) else None
