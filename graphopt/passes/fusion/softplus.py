r"""LowerSoftplus (-O3): Softplus and Mish as ops onnxruntime's CPU provider runs 3× faster.

onnxruntime's CPU kernels for Softplus and Mish compute element by element with the C library's
exp and log: at [1,64,56,56] they take 1.76 and 1.86 ms where a Relu takes 0.04 ms, and the
forms below 0.54 and 0.66 ms (bench/softplus.py: 1 thread, onnxruntime 1.32). YOLOv4-style
detectors apply Mish after nearly every convolution.

    Softplus(x) = log(1 + exp(x))  →  Relu(x) + Log(1 + Exp(-|x|))
    Mish(x)     = x · tanh(Softplus(x))  →  x · Tanh(that)

The form never overflows (exp of a value ≤ 0), and NaN and ±inf come out as the kernels give
them. It is not bit for bit: Log(1 + e) rounds 1 + e, so for x below about -9 (an output under
1e-4) the result loses relative precision, down to 0 for x below about -17 where Softplus gives
exp(x). Against onnxruntime's kernels the largest absolute difference is about 1e-6 (Softplus)
and 3.4e-6 (Mish, at x ≈ 6.96, where the two round in opposite directions); that is why the
pass runs at -O3, whose Winograd convolutions are not exact either, and not at -O2. A target
whose device for the op is not a CPU keeps it, and so does a model before opset 7, whose Add
does not broadcast, and a compile that converts precision (a mixed mode keeps Softplus and
Mish in float32, which their lowered ops would not all be).
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import DType
from graphopt.passes.base import register
from graphopt.passes.fusion.lowering import FloatOnlyLowering, OnTheCpu


def _softplus(op, x):
    negative_abs = op.Neg(op.Abs(x))
    tail = op.Log(op.Add(op.Exp(negative_abs), op.const(np.ones((), np.float32), "one")))
    return op.Add(op.Relu(x), tail)


class _Decomposed(OnTheCpu):
    dtypes = (DType.FLOAT,)
    emits = (("", "Relu"), ("", "Abs"), ("", "Neg"), ("", "Exp"), ("", "Add"), ("", "Log"))

    def check(self, model, **_):
        # Before opset 7, Add broadcasts the 1 only with an attribute onnxruntime has no
        # kernel for.
        return "Add broadcasts from opset 7 on" if (model.opset("") or 0) < 7 else None


class SoftplusDecomposed(_Decomposed):
    """Softplus(x) → Relu(x) + Log(1 + Exp(-|x|))."""

    def pattern(self, op, x):
        return op.Softplus(x)

    def rewrite(self, op, x, **_):
        return _softplus(op, x)


class MishDecomposed(_Decomposed):
    """Mish(x) → x · Tanh(Relu(x) + Log(1 + Exp(-|x|)))."""

    emits = _Decomposed.emits + (("", "Tanh"), ("", "Mul"))

    def pattern(self, op, x):
        return op.Mish(x)

    def rewrite(self, op, x, **_):
        return op.Mul(x, op.Tanh(_softplus(op, x)))


@register
class LowerSoftplus(FloatOnlyLowering):
    name = "LowerSoftplus"
    description = ("Softplus and Mish as Relu(x) + Log(1 + Exp(-|x|)) (and x · Tanh of it): "
                   "onnxruntime's CPU kernels are about 3× slower; within 4e-6, so -O3 only")
    rules = (SoftplusDecomposed, MishDecomposed)


__all__ = ["LowerSoftplus"]
