"""Einsum as the cost models price it: the multiply-adds of its contraction, not its output.

    macs = Π over every distinct index letter of its size        ("abc,cde->abde": a·b·c·d·e)

ATC runs the equations CANN documents (the NPU profiles' allow-list) as BatchMatMul with
transposes, and onnxruntime's CPU kernel reduces through MatMul too. Priced per output element,
as an elementwise op, a [64,128,256]·[256,512] contraction had cost what a [64,128,512] Add does.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from graphopt.ir import Node


def einsum_macs(node: Node) -> int | None:
    """The contraction's multiply-adds of an ONNX Einsum node, or None for another op, an
    ellipsis, or inputs whose shapes are not static (nothing to count)."""
    if node.op_type != "Einsum" or not node.is_onnx:
        return None
    equation = node.attr("equation", "")
    if isinstance(equation, bytes):
        equation = equation.decode()
    terms = equation.replace(" ", "").split("->")[0].split(",")
    if "." in equation or len(terms) != len(node.inputs):
        return None
    sizes: dict[str, int] = {}
    for term, value in zip(terms, node.inputs):
        shape = value.static_shape if value is not None else None
        if shape is None or len(shape) != len(term):
            return None
        for letter, dim in zip(term, shape):
            sizes[letter] = max(sizes.get(letter, 1), dim)  # a broadcast 1 takes the other size
    return math.prod(sizes.values())
