r"""LowerPRelu: PRelu with a constant slope into ops onnxruntime's CPU provider runs fast.

onnxruntime's CPU PRelu kernel is slow: at [1,48,64,64] it takes 0.85 ms where a LeakyRelu of
the same shape takes 0.07 ms and the other forms below 0.10–0.18 ms (bench/prelu.py: 1 thread,
onnxruntime 1.32). MediaPipe's landmark and palm models spend about half their time in it.
Each form computes every element as PRelu does, bit for bit (±0 aside: a zero comes out +0
where PRelu may give -0); NaN and ±inf go through alike:

    one slope value a           LeakyRelu(x, alpha=a)   (also a per-channel slope all a)
    every slope in (0, 1]       Max(x, x·a)          (x ≥ 0: x ≥ x·a; x < 0: x·a ≥ x)
    every slope ≥ 1             Min(x, x·a)
    other slopes                Relu(x) + Min(x, 0)·a

(A slope of 0 takes the last form: x·0 is NaN at x = +inf, which Max would pass on. Slopes of
several values with a NaN or an infinity stay PRelu, as below opset 8, where Max and Min do not
broadcast, and a slope not proven to broadcast to x's known shape as PRelu's must.)

A target whose device for the PRelu is not a CPU (an NPU, which has a PRelu kernel) keeps it.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import DType
from graphopt.ir.pattern import Const
from graphopt.passes.base import register
from graphopt.passes.fusion.lowering import OnTheCpu
from graphopt.passes.rules import RulePass


def _prelu(op, x):
    return op.PRelu(x, Const(pred=lambda data: data.dtype == np.float32, name="slope"))


def _one_value(slope: np.ndarray) -> bool:
    return bool(np.all(slope == slope.reshape(-1)[0]))  # NaN equals nothing: not one value


class _Lowered(OnTheCpu):
    dtypes = (DType.FLOAT,)

    def refusal(self, x, slope, model) -> str | None:
        """Why no form fits: an opset before 8, whose Max and Min do not broadcast; a slope
        not proven to broadcast to x as PRelu's must, x's shape unchanged (onnxruntime's
        PRelu broadcasts both ways, which LeakyRelu would not); a slope of several values
        with a NaN or an infinity (0·inf is NaN in every form but one)."""
        if (model.opset("") or 0) < 8:
            return "Max and Min broadcast from opset 8 on"
        if x.shape is None or slope.ndim > len(x.shape) or any(
                s != 1 and d != s for s, d in zip(slope.shape[::-1], x.shape[::-1])):
            shape = "an unknown shape" if x.shape is None else list(x.shape)
            return f"slope {list(slope.shape)} is not proven to broadcast to {shape}"
        if not _one_value(slope) and not np.isfinite(slope).all():
            return "a slope of several values holds a NaN or an infinity"
        return None


class PReluScalarSlope(_Lowered):
    """PRelu with one slope for every element → LeakyRelu."""

    emits = (("", "LeakyRelu"),)

    def pattern(self, op, x):
        return _prelu(op, x)

    def check(self, x, slope, model, **_):
        return self.refusal(x, slope, model) or (
            None if _one_value(slope) else "the slope has more than one value")

    def rewrite(self, op, x, slope, **_):
        return op.LeakyRelu(x, alpha=float(slope.reshape(-1)[0]))


class _OneSided(_Lowered):
    """Slopes all on one side of 1 (above 0): x and x·slope then bound each other, and the
    larger (Max, slopes in (0, 1]) or the smaller (Min, slopes ≥ 1) of the two is PRelu's."""

    combine: str                 # "Max" or "Min"
    outside: str                 # the refusal when a slope is not on that side

    @staticmethod
    def holds(slope: np.ndarray) -> bool:
        raise NotImplementedError

    def check(self, x, slope, model, **_):
        if _one_value(slope):
            return "one slope: PReluScalarSlope's"
        return self.refusal(x, slope, model) or (None if self.holds(slope) else self.outside)

    def rewrite(self, op, x, slope, **_):
        return getattr(op, self.combine)(x, op.Mul(x, op.const(slope, "prelu_slope")))


class PReluUnitSlopes(_OneSided):
    """PRelu whose slopes all lie in (0, 1] → Max(x, x·slope)."""

    emits = (("", "Max"), ("", "Mul"))
    combine, outside = "Max", "a slope outside (0, 1]"

    def pattern(self, op, x):
        return _prelu(op, x)

    @staticmethod
    def holds(slope):
        return slope.min() > 0 and slope.max() <= 1


class PReluSteepSlopes(_OneSided):
    """PRelu whose slopes are all 1 or more → Min(x, x·slope)."""

    emits = (("", "Min"), ("", "Mul"))
    combine, outside = "Min", "a slope below 1"

    def pattern(self, op, x):
        return _prelu(op, x)

    @staticmethod
    def holds(slope):
        return slope.min() >= 1


class PReluDecomposed(_Lowered):
    """PRelu with slopes on both sides of 1, or of 0 or less → Relu(x) + Min(x, 0)·slope."""

    emits = (("", "Relu"), ("", "Min"), ("", "Mul"), ("", "Add"))

    def pattern(self, op, x):
        return _prelu(op, x)

    def check(self, x, slope, model, **_):
        if _one_value(slope):
            return "one slope: PReluScalarSlope's"
        refused = self.refusal(x, slope, model)
        if refused is None and any(form.holds(slope)
                                   for form in (PReluUnitSlopes, PReluSteepSlopes)):
            return "its slopes take a two-op form (PReluUnitSlopes, PReluSteepSlopes)"
        return refused

    def rewrite(self, op, x, slope, **_):
        negative = op.Min(x, op.const(np.zeros((), np.float32), "zero"))
        return op.Add(op.Relu(x), op.Mul(negative, op.const(slope, "prelu_slope")))


@register
class LowerPRelu(RulePass):
    name = "LowerPRelu"
    description = ("PRelu with a constant slope into LeakyRelu, Max/Min of x and x·slope, or "
                   "Relu(x) + Min(x, 0)·slope: onnxruntime's CPU PRelu kernel is 3-16× slower")
    rules = (PReluScalarSlope, PReluUnitSlopes, PReluSteepSlopes, PReluDecomposed)


__all__ = ["LowerPRelu"]
