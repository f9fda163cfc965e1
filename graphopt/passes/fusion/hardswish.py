r"""FuseHardSwish: hard-swish as exporters decompose it, into one HardSwish.

    x · Clip(x + 3, 0, 6) / 6          (PaddlePaddle's hardswish; torch's x * relu6(x + 3) / 6)
    x · Clip(x + 3, 0, 6) · (1/6),  x · (Clip(x + 3, 0, 6) / 6),  x · (Clip(x + 3, 0, 6) · 1/6)
    x · HardSigmoid(x, α = 1/6, β = ½)
                                   →   HardSwish(x)   (opset 14 on; before, x · HardSigmoid(x))

PaddleOCR's MobileNetV3 backbones apply the first form after most convolutions: onnxruntime
runs its four ops one by one (45% of the text detector's time, with the layout conversions
they force around the blocked convolutions), where HardSwish is one pass that FuseActivation
(-O3) or onnxruntime's own NCHWc fusion takes into the conv. The detector runs at 0.74× the
original's time with it, against 0.89× without (1 thread, ORT_ENABLE_ALL). HardSwish computes
x · clamp(x/6 + ½, 0, 1), which rounds differently from (x + 3)/6 by a unit in the last place
or so: onnxruntime's own rounding differences, so at -O2, as FuseGelu. And where the export
multiplies x by 6 before dividing (the first two forms), an x beyond float32's largest value
over 6 (about 5.7e37) overflowed to +inf there; HardSwish gives x, the exact result.
"""

from __future__ import annotations

from graphopt.ir import DType
from graphopt.ir.pattern import Attr
from graphopt.passes.base import register
from graphopt.passes.rules import Rule, RulePass

SIXTH = 1.0 / 6.0


def _relu6_of_shifted(op, x):
    return op.Clip(op.Add(x, 3.0), 0.0, 6.0)


class _ToHardSwish(Rule):
    emits = (("", "HardSwish"), ("", "HardSigmoid"), ("", "Mul"))
    dtypes = (DType.FLOAT,)
    device_dtypes = (DType.FLOAT16,)

    def rewrite(self, op, x, **_):
        if (op.model.opset("") or 0) >= 14:
            return op.HardSwish(x)
        return op.Mul(x, op.HardSigmoid(x, alpha=SIXTH, beta=0.5))


class HardSwishDivided(_ToHardSwish):
    """x · Clip(x + 3, 0, 6) / 6, and with the product scaled by 1/6."""

    def pattern(self, op, x):
        product = op.Mul(x, _relu6_of_shifted(op, x))
        return op.Div(product, 6.0)


class HardSwishScaled(_ToHardSwish):
    """x · Clip(x + 3, 0, 6) · 1/6."""

    def pattern(self, op, x):
        return op.Mul(op.Mul(x, _relu6_of_shifted(op, x)), SIXTH)


class HardSwishGateDivided(_ToHardSwish):
    """x · (Clip(x + 3, 0, 6) / 6)."""

    def pattern(self, op, x):
        return op.Mul(x, op.Div(_relu6_of_shifted(op, x), 6.0))


class HardSwishGateScaled(_ToHardSwish):
    """x · (Clip(x + 3, 0, 6) · 1/6)."""

    def pattern(self, op, x):
        return op.Mul(x, op.Mul(_relu6_of_shifted(op, x), SIXTH))


class HardSwishFromHardSigmoid(_ToHardSwish):
    """x · HardSigmoid(x, 1/6, ½): the same arithmetic as HardSwish, one op (opset 14 on)."""

    def pattern(self, op, x):
        return op.Mul(x, op.HardSigmoid(x, alpha=Attr("alpha", 0.2), beta=Attr("beta", 0.5)))

    def check(self, alpha, beta, model, **_):
        if (model.opset("") or 0) < 14:
            return "HardSwish came with opset 14"
        if abs(alpha - SIXTH) > 1e-7 or beta != 0.5:
            return f"HardSigmoid's alpha {alpha} and beta {beta} are not 1/6 and ½"
        return None


@register
class FuseHardSwish(RulePass):
    name = "FuseHardSwish"
    description = ("hard-swish as exporters decompose it (x · Clip(x + 3, 0, 6) / 6, "
                   "x · HardSigmoid(x)) into HardSwish")
    rules = (HardSwishDivided, HardSwishScaled, HardSwishGateDivided, HardSwishGateScaled,
             HardSwishFromHardSigmoid)


__all__ = ["FuseHardSwish"]
