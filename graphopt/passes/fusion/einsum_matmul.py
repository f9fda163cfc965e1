"""EinsumAsMatMul: an Einsum that is a product by a constant matrix, x·W, becomes MatMul.

jax2onnx writes `x @ W` for an x of rank 3 or more as Einsum("abc,cd->abd"); so does a
hand-written torch.einsum. onnxruntime runs both alike on the CPU, but what comes after a
MatMul does not reach an Einsum: its bias Add into a Gemm, INT8 quantization, the cube of an
NPU whose profile lists no Einsum (a jax2onnx MLP had gone to the host whole on ascend310).

    Einsum("…j,jk->…k", x, W)  → MatMul(x, W)
    Einsum("…j,kj->…k", x, W)  → MatMul(x, Wᵀ)        (Wᵀ made once, a constant)

with x's letters distinct, j its last, and the output x's other letters in order then k.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import Value
from graphopt.ir.pattern import Attr
from graphopt.passes.rules import Rule


def matmul_form(equation, x: Value, w: Value) -> bool | None:
    """Whether W is read transposed (True) or as it is (False) when `equation` over x and the
    constant matrix W is x·W (or x·Wᵀ); None when it is not such a product."""
    text = equation.decode() if isinstance(equation, bytes) else str(equation or "")
    text = text.replace(" ", "")
    if "->" not in text or "." in text or w.constant() is None or w.constant().ndim != 2:
        return None
    inputs, out = text.split("->")
    if inputs.count(",") != 1:
        return None
    a, b = inputs.split(",")
    if not (a.isalpha() and b.isalpha() and out.isalpha()) or len(b) != 2 \
            or len(set(a)) != len(a) or len(set(out)) != len(out) or len(set(b)) != 2:
        return None
    if x.shape is not None and len(x.shape) != len(a):
        return None
    j = a[-1]
    if j not in b or j in out:
        return None
    k = b[1] if b[0] == j else b[0]
    if k in a or out != a[:-1] + k:
        return None
    return b[0] != j


class EinsumAsMatMul(Rule):
    """Einsum(x, W) that is x·W or x·Wᵀ for a constant matrix W → MatMul (module docstring)."""

    def pattern(self, op, x, w):
        return op.Einsum(x, w, equation=Attr("equation"))

    def check(self, x, w, equation=None):
        if matmul_form(equation, x, w) is None:
            return f"equation {equation!r} is no product of x by a constant matrix"
        return None

    def rewrite(self, op, x, w, equation=None):
        if matmul_form(equation, x, w):
            w = op.const(np.ascontiguousarray(w.constant().T))
        return op.MatMul(x, w)


__all__ = ["EinsumAsMatMul", "matmul_form"]
