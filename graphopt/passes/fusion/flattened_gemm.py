"""FlattenedGemm: a Linear over rows flattened for a Gemm, and split back, as the MatMul it was.

    x [B, S, K] ─ Reshape [-1, K] ─ Gemm(W, b) ─ Reshape [B, S, N]   →   x·W + b   [B, S, N]

onnxsim writes every N-D MatMul + bias this way (the last Reshape's target built from
Shape(x), at open dims), and so does nn.MultiheadAttention's output projection. Each row of a
Gemm by a constant matrix and a bias the same for every row depends on that row alone, so the
flattening changes nothing, but it hides the projection from the rules that read x·W + b over
[B, S, K]: a BERT export simplified by onnxsim had fused no attention (145 nodes against 85).
onnxruntime's own MatMulAddFusion makes the same Gemm at load where the shapes are static.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import DType, Value
from graphopt.ir.pattern import Optional, Var
from graphopt.passes.rules import Rule
from graphopt.passes.symbolic_dims import Equalities, proven_dims, shape_tensor


class FlattenedGemm(Rule):
    """Reshape(Gemm(Reshape(x, [-1, K]), W, b), [x's leading dims, N]) → x·W + b."""

    emits = (("", "MatMul"), ("", "Add"))
    dtypes = (DType.FLOAT, DType.FLOAT16, DType.DOUBLE)
    # onnxsim flattens a layer's input once for all the Gemms that read it (Q, K and V).
    exposes = ("flat",)

    def pattern(self, op, x):
        rows = op.Reshape(x, Var("rows", const=True), _name="flat")
        gemm = op.Gemm(rows, Var("w", const=True), Optional(Var("c", const=True)), _name="gemm")
        return op.Reshape(gemm, Var("split"))

    def check(self, x, rows, w, gemm, split, c=None, **_):
        if x.shape is None or len(x.shape) < 3:
            return "the rows come from a matrix already"
        k = x.shape[-1]
        if not isinstance(k, int) or [int(d) for d in rows.constant().reshape(-1)][-1:] != [k] \
                or rows.constant().size != 2 or int(rows.constant().reshape(-1)[0]) not in (
                    -1, _static_rows(x)):
            return f"the first Reshape does not flatten %{x.name} to rows of its last axis"
        if int(gemm.attr("transA", 0)):
            return "the Gemm reads its rows transposed"
        if w.constant().ndim != 2:
            return "the weight is not a matrix"
        n = w.constant().shape[0 if int(gemm.attr("transB", 0)) else 1]
        if c is not None and not _one_row(c.constant().shape, n):
            return "the bias differs from row to row"
        equal = Equalities()
        got = shape_tensor(split, lambda v: proven_dims(v, equal))
        leading = proven_dims(x, equal)
        if got is None or got[1] or leading is None or len(got[0]) != len(leading) \
                or got[0][-1] != (n, ()) or not _splits_back(got[0][:-1], leading[:-1], equal):
            return f"the last Reshape does not split the rows back into %{x.name}'s leading dims"
        return None

    def rewrite(self, op, x, rows, w, gemm, exposed, c=None, **_):
        flat = {"flat": op.Reshape(x, rows)} if exposed else {}
        return self._matmul(op, x, w, gemm, c), flat

    @staticmethod
    def _matmul(op, x, w, gemm, c) -> Value:
        weight, alpha = w.constant(), float(gemm.attr("alpha", 1.0))
        if int(gemm.attr("transB", 0)) or alpha != 1.0:
            weight = np.ascontiguousarray(weight.T if int(gemm.attr("transB", 0)) else weight)
            w = op.const(weight * np.asarray(alpha, weight.dtype) if alpha != 1.0 else weight)
        out = op.MatMul(x, w)
        # Typed now, for the rules of this sweep (a BiasGelu after it reads the bias's axis).
        out.dtype, out.shape = x.dtype, (*x.shape[:-1], weight.shape[1])
        if c is None:
            return out
        bias, beta = c.constant(), float(gemm.attr("beta", 1.0))
        if bias.shape != (weight.shape[1],) or beta != 1.0:
            bias = np.broadcast_to(bias.reshape(-1), (weight.shape[1],)) * np.asarray(beta,
                                                                                   bias.dtype)
            c = op.const(np.ascontiguousarray(bias))
        added = op.Add(out, c)
        added.dtype, added.shape = out.dtype, out.shape
        return added


def _splits_back(split: list, leading: list, equal: Equalities) -> bool:
    """Whether the entries `split` give the rows back the dims `leading`: each the same dim, or
    one of them -1 (nn.MultiheadAttention's `view(tgt_len, -1, embed)`), which is then the one
    left, since the other entries account for every other row."""
    unmatched = [i for i, (a, b) in enumerate(zip(split, leading)) if not equal.same(a, b)]
    return not unmatched or len(unmatched) == 1 and split[unmatched[0]] == (-1, ()) \
        and (-1, ()) not in split[:unmatched[0]] + split[unmatched[0] + 1:]


def _one_row(shape: tuple, n: int) -> bool:
    """Whether a Gemm bias of `shape` is the same for every row: a scalar, [N], [1, N] or
    [1, 1] (a [M, 1] or [M, N] bias is one per row)."""
    return len(shape) <= 2 and all(d == 1 for d in shape[:-1]) \
        and (not shape or shape[-1] in (1, n))


def _static_rows(x: Value) -> int | None:
    """The number of rows of `x` flattened, when its leading dims are numbers."""
    leading = x.shape[:-1]
    return int(np.prod(leading)) if all(isinstance(d, int) for d in leading) else None
