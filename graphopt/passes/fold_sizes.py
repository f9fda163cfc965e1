"""Shapes and byte sizes of values FoldConstants might materialize, estimated before evaluating."""

from __future__ import annotations

import math

import numpy as np

from graphopt.ir import DType, Node, Tensor, Value

_UNARY = {"Identity", "Cast", "CastLike", "Neg", "Abs", "Relu", "Sigmoid", "Exp", "Log", "Sqrt",
          "Not", "Sign", "Floor", "Ceil", "Round", "Erf", "Tanh", "Reciprocal", "Sin", "Cos",
          "LeakyRelu", "Elu", "Selu", "Softplus", "Clip", "HardSigmoid", "IsNaN", "IsInf", "Gelu",
          "Softmax", "LogSoftmax", "Dropout"}
_BROADCAST = {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Equal", "Less", "Greater", "LessOrEqual",
              "GreaterOrEqual", "And", "Or", "Xor", "Where", "Max", "Min", "Sum", "Mean",
              "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "PRelu"}


class Sizes:
    """Shapes and byte sizes of region values, known or estimated from inputs where cheap."""

    def __init__(self, known: dict[int, Tensor]):
        self.known = known  # values already evaluated (Constant nodes)
        self.shapes: dict[int, tuple[int, ...]] = {}

    def shape(self, value: Value) -> tuple[int, ...] | None:
        if id(value) in self.known:
            return self.known[id(value)].shape
        if value.is_constant:
            return value.const.shape
        if value.static_shape is not None:
            return value.static_shape
        return self.shapes.get(id(value))

    def data(self, value: Value | None) -> np.ndarray | None:
        """Data of a small constant input (shape operands), else None."""
        if value is None:
            return None
        tensor = self.known.get(id(value)) or (value.const if value.is_constant else None)
        if tensor is None or tensor.size > 64 or tensor.dtype == DType.STRING:
            return None
        return tensor.numpy()

    def nbytes(self, value: Value) -> int | None:
        if id(value) in self.known:
            return self.known[id(value)].nbytes
        if value.is_constant:
            return value.const.nbytes
        shape = self.shape(value)
        if shape is None:
            return None
        dtype = value.dtype
        bits = dtype.bits if dtype is not None and dtype.bits else 64  # unknown: assume 8 bytes
        return (math.prod(shape) * bits + 7) // 8

    def estimate(self, node: Node) -> None:
        """Record output shapes of `node` that shape inference did not provide."""
        for value in node.outputs:
            if value is not None and self.shape(value) is None:
                shape = _estimate_shape(node, self)
                if shape is not None and len(node.outputs) == 1:
                    self.shapes[id(value)] = shape


def _estimate_shape(node: Node, sizes: Sizes) -> tuple[int, ...] | None:
    op, inputs = node.op_type, node.inputs
    shapes = [sizes.shape(v) if v is not None else None for v in inputs]
    try:
        if op in _UNARY:
            return shapes[0]
        if op in _BROADCAST:
            present = [s for v, s in zip(inputs, shapes) if v is not None]
            return None if any(s is None for s in present) else tuple(np.broadcast_shapes(*present))
        if op == "ConstantOfShape":
            dims = sizes.data(node.input(0))
            return None if dims is None else tuple(int(d) for d in dims)
        if op == "Expand":
            dims = sizes.data(node.input(1))
            if dims is None or shapes[0] is None:
                return None
            return tuple(np.broadcast_shapes(shapes[0], tuple(int(d) for d in dims)))
        if op == "Tile":
            reps = sizes.data(node.input(1))
            if reps is None or shapes[0] is None:
                return None
            return tuple(int(d) * int(r) for d, r in zip(shapes[0], reps))
        if op == "Range":
            start, limit, delta = (sizes.data(node.input(i)) for i in range(3))
            if start is None or limit is None or delta is None or float(delta) == 0:
                return None
            count = (float(limit) - float(start)) / float(delta)
            return (max(int(math.ceil(count)), 0),) if math.isfinite(count) else None
        if op == "EyeLike":
            return shapes[0]
        if op == "Pad" and shapes[0] is not None:
            pads = sizes.data(node.input(1)) if node.input(1) is not None else node.attr("pads")
            if pads is None or node.input(3) is not None:
                return None
            rank = len(shapes[0])
            pads = [int(p) for p in pads]
            return tuple(d + pads[i] + pads[i + rank] for i, d in enumerate(shapes[0]))
    except (ValueError, TypeError, IndexError):
        return None
    return None
