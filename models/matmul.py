"""`matmul256`: one MatMul against a square weight, the seed benchmark for the tuner."""

from __future__ import annotations

import onnx

from ._builder import FLOAT, GraphBuilder


def build_matmul(*, size: int = 256) -> onnx.ModelProto:
    """y = x @ W with x [size, size] static; W ~ N(0, 1/size) so y stays near unit scale."""
    gb = GraphBuilder(seed=2)
    x = gb.input("x", FLOAT, [size, size])
    w = gb.param("weight", [size, size], std=size ** -0.5)
    gb.op("MatMul", x, w, out="y")
    gb.output("y", FLOAT, [size, size])
    return gb.model("matmul256", f"y = x @ W, {size}x{size} float32")
