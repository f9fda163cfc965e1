"""A float constant as 8-bit codes behind a DequantizeLinear, exactly: the operand form
onnxruntime's QLinearAdd and QLinearMul take (it fuses `DQ, DQ → Add → Q` only with both inputs
dequantized, of one code type)."""

from __future__ import annotations

import numpy as np

from graphopt.ir import Graph, Node, Value


def scalar_constant(value: Value | None) -> float | None:
    """The one float32 number a constant `value` holds (any shape of one element), else None."""
    data = value.constant() if value is not None else None
    if data is None or data.dtype != np.float32 or data.size != 1:
        return None
    number = float(data.reshape(()))
    return number if np.isfinite(number) else None


def dequantized_constant(graph: Graph, before: Node, value: float, dtype: np.dtype,
                         hint: str) -> Value:
    """`value` as one code of `dtype` (uint8 or int8) behind a DequantizeLinear inserted before
    `before`: code 1 at scale `value` (code 0 with zero point 1 at scale -`value` for a negative
    one, code 0 at scale 1 for 0), so that it dequantizes to float32(`value`) exactly."""
    code, zero, scale = (1, 0, value) if value > 0 else (0, 1, -value) if value < 0 \
        else (0, 0, 1.0)
    dequantize = graph.make_node(
        "DequantizeLinear",
        [graph.make_initializer(f"{hint}_code", np.asarray(code, dtype)),
         graph.make_initializer(f"{hint}_scale", np.asarray(scale, np.float32)),
         graph.make_initializer(f"{hint}_zero_point", np.asarray(zero, dtype))],
        name=graph.fresh_node_name(f"{hint}/DequantizeLinear"), before=before,
        dtype=before.output.dtype, shape=())
    return dequantize.output
