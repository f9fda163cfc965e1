r"""LowerLRN: local response normalization as ops onnxruntime's CPU provider runs 3× faster.

    LRN(x)[n, c, …] = x / (bias + alpha/size · Σ x[n, i, …]²)^beta,
                       i over the `size` channels around c (fewer at the edges)
      →  x / Pow(bias + AveragePool((√alpha · x)², window size × 1 × …, zeros padded), beta)

The channel window is a pool over a view of the squares with the channels as a spatial axis
(Unsqueeze at 1): its average over `size` places, the padding counted as zeros, is the window's
sum over size. onnxruntime's CPU LRN kernel took 48% of Inception-v1's time, 40% of ZFNet's and
29% of AlexNet's (1 thread, onnxruntime 1.32); the form runs about 3× faster (bench/lrn.py),
within a few units in the last place of float32 (the sum runs in another order, the power
through Pow), onnxruntime's own rounding differences, so at -O2. A NaN or an infinity in the
input reaches the outputs of its own window only, as ONNX defines LRN; onnxruntime's kernel,
which slides one running sum along the channels, spreads it to every channel after it. Inputs
of rank 4 and odd window sizes (onnxruntime's kernel takes no others); a target whose device
for LRN is not a CPU keeps it (the Ascend profiles have its kernel). A compile that converts precision keeps LRN
too: as a normalization it stays float32 under a mixed mode, where the squares of its lowered
form would not (float16 overflows from |x| = 256).

Where a window's values span many orders of magnitude, this form is the closer of the two to
the exact result: onnxruntime's running sum adds and subtracts large squares (relative error
1e-3 at size 1 on inputs near 1e6, against graphopt's 1.5e-7), so `compare` against onnxruntime
may flag such inputs.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import DType
from graphopt.ir.pattern import Attr
from graphopt.passes.base import register
from graphopt.passes.fusion.lowering import FloatOnlyLowering, OnTheCpu


class LRNDecomposed(OnTheCpu):
    """LRN → x / Pow(bias + AveragePool over the channels of alpha · x², beta)."""

    dtypes = (DType.FLOAT,)
    emits = (("", "Mul"), ("", "Unsqueeze"), ("", "AveragePool"), ("", "Squeeze"), ("", "Add"),
             ("", "Pow"), ("", "Div"))

    def pattern(self, op, x):
        return op.LRN(x, size=Attr("size"), alpha=Attr("alpha", 1e-4), beta=Attr("beta", 0.75),
                      bias=Attr("bias", 1.0))

    def check(self, x, size, alpha, beta, model, **_):
        if x.shape is None or len(x.shape) != 4:
            return "the input is not known to be of rank 4"
        if size is None or int(size) < 1 or int(size) % 2 == 0 or alpha <= 0 or beta <= 0:
            return "an even window or a non-positive alpha or beta (onnxruntime's kernel " \
                   "refuses those)"
        if (model.opset("") or 0) < 7:
            return "AveragePool counts padding from opset 7 on"
        return None

    def rewrite(self, op, x, size, alpha, beta, bias, **_):
        size = int(size)
        before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
        spatial = len(x.shape) - 2  # the pool's axes: the channels, then the input's own
        new_axes = (op.model.opset("") or 0) >= 13  # Unsqueeze/Squeeze take axes as an input
        one = op.const(np.array([1], np.int64), "channel_axis") if new_axes else None

        def unsqueezed(value):
            return op.Unsqueeze(value, one) if new_axes else op.Unsqueeze(value, axes=[1])

        def squeezed(value):
            return op.Squeeze(value, one) if new_axes else op.Squeeze(value, axes=[1])

        # √alpha scales x before it is squared: x² alone passes float32's range from |x| ≈
        # 1.8e19 on (and a window's sum of them from 1.8e19/√size), which made every output
        # of the window 0, where (x·√alpha)² stays in range to 1.8e19/√alpha.
        scaled = op.Mul(x, op.const(np.array(np.sqrt(alpha), np.float32), "lrn_sqrt_alpha"))
        squares = op.Mul(scaled, scaled)
        pooled = op.AveragePool(unsqueezed(squares), kernel_shape=[size] + [1] * spatial,
                                pads=[before] + [0] * spatial + [after] + [0] * spatial,
                                count_include_pad=1)
        base = op.Add(squeezed(pooled), op.const(np.array(bias, np.float32), "lrn_bias"))
        return op.Div(x, op.Pow(base, op.const(np.array(beta, np.float32), "lrn_beta")))


@register
class LowerLRN(FloatOnlyLowering):
    name = "LowerLRN"
    description = ("LRN as x / Pow(bias + AveragePool of alpha · x² over the channels, beta): "
                   "onnxruntime's CPU LRN kernel is about 3× slower")
    rules = (LRNDecomposed,)


__all__ = ["LowerLRN"]
