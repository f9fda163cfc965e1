"""FuseMatMul: MatMul with its bias, transposes and scale into Gemm and onnxruntime's FusedMatMul.

    bias        A·W + b                   → Gemm(A, W, b)       A [M,K] (rank 2), W [K,N] const,
                                                                b const [N] or [1,N]
    transpose   Gemm(Aᵀ, B)               → Gemm(A, B, transA=¬transA)   (likewise for B)
                MatMul(A, Bᵀ)             → FusedMatMul(A, B, transB=1)  (likewise for A; ᵀ swaps
                                                                the last two axes only)
    scale       (A · B) · s,  (A · B) / s → FusedMatMul(A, B, alpha=s or 1/s), s a scalar const
                (A · s) · (B · t)          → FusedMatMul(A, B, alpha=s·t)  (either side, or both;
                                                                each a Mul or a Div by a scalar)

                  q     k                           q     k
                  │     │                           │     │
                  │  Transpose(perm=[0,1,3,2])      │     │
                  │     │                           │     │
                  MatMul                   ⇒        FusedMatMul(transB=1, alpha=1/√d)
                    │                                  │
                  Div(√d)                              ▼
                    │
                    ▼

Attention's scores q·kᵀ/√d become one FusedMatMul, also where the scale is applied to q and kᵀ
(√(1/√d) on each, as torch's sdpa decomposition exports it; DeBERTa divides kᵀ). A scaled
operand times a constant (a weight) stays a MatMul, which the quantizers and onnxruntime's
MatMul fusions take. (Exports that split heads and transpose k in one Transpose, perm
[0,2,3,1], cannot use transB; only their scale folds.) A transpose of a constant weight is
folded by FoldConstants before this pass runs, so only transposes of computed values meet these
rules.
MatMul + Add with A of rank > 2 stays as it is: Gemm takes matrices only, and onnxruntime's own
MatMulAddFusion handles that pair when it loads the model. FusedMatMul's transBatchA/B are never
composed; a FusedMatMul using them is left alone.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import DType
from graphopt.ir.pattern import Attr, Const, OneOf, Optional, Var
from graphopt.passes.base import register
from graphopt.passes.fusion.einsum_matmul import EinsumAsMatMul
from graphopt.passes.fusion.flattened_gemm import FlattenedGemm
from graphopt.passes.rules import Rule, RulePass

MS = "com.microsoft"


def _rank(value) -> int | None:
    return None if value.shape is None else len(value.shape)


def _scalar(data) -> bool:
    return data.size == 1


def _no_batch_transpose(flag) -> bool:
    return not flag


def _fused(op, a, b):
    """A FusedMatMul, binding what a rewrite keeps; batch transposes are not ours to compose."""
    return op.FusedMatMul(a, b, _domain=MS, alpha=Attr("alpha", 1.0), transA=Attr("trans_a", 0),
                          transB=Attr("trans_b", 0),
                          transBatchA=Attr("batch_a", 0, pred=_no_batch_transpose),
                          transBatchB=Attr("batch_b", 0, pred=_no_batch_transpose))


def _transposed(op, x):
    return op.Transpose(x, perm=Attr("perm", None))


class MatMulAddToGemm(Rule):
    """MatMul(A, W) + b → Gemm(A, W, b) for a matrix A, a constant matrix W and a bias row."""

    emits = (("", "Gemm"),)
    dtypes = (DType.FLOAT, DType.DOUBLE)

    def pattern(self, op, a):
        return op.Add(op.MatMul(a, Var("w", const=True)), Var("b", const=True))

    def plausible(self, root):
        # check's rank test before the full match: transformers' linear layers read [B, S, C]
        # activations, refused here on every layer in every sweep otherwise.
        for value in root._inputs:
            matmul = value.producer if value is not None else None
            if (matmul is not None and matmul.op_type == "MatMul" and value.index == 0
                    and matmul.input(0) is not None and _rank(matmul.input(0)) == 2):
                return True
        return False

    def check(self, a, w, b):
        if _rank(a) != 2:
            return f"A %{a.name} has rank {_rank(a)}, Gemm takes matrices only"
        if _rank(w) != 2:
            return f"W %{w.name} is not a matrix"
        n = w.shape[1]
        if tuple(b.shape) not in ((n,), (1, n)):
            return f"bias shape {list(b.shape)} is not [{n}] or [1, {n}]"
        return None

    def rewrite(self, op, a, w, b):
        # A bias row [1, N] becomes the vector [N] it broadcasts as: what QuantizeInt8 takes
        # for a Gemm's bias (skl2onnx's MLPs add [1, N] rows).
        if len(b.shape) == 2:
            b = op.const(b.constant().reshape(-1))
        return op.Gemm(a, w, b)


class _TransposeIntoGemm(Rule):
    """Gemm reads its input transposed when told to: flip transA (or transB), drop the Transpose."""

    emits = (("", "Gemm"),)
    flip: str  # "transA" or "transB"

    def rewrite(self, op, a, b, gemm, c=None):
        attrs = dict(gemm.attrs)
        attrs[self.flip] = 1 - int(gemm.attr(self.flip, 0))
        return op.Gemm(*((a, b) if c is None else (a, b, c)), **attrs)


def _swaps_last_two(perm, rank: int) -> bool:
    """Whether Transpose `perm` (None: reverse the axes) swaps the last two of `rank` only."""
    swap = list(range(rank - 2)) + [rank - 1, rank - 2]
    return list(perm if perm is not None else reversed(range(rank))) == swap


def _perm_2d(perm) -> bool:
    return list(perm) == [1, 0]


class TransposeIntoGemmA(_TransposeIntoGemm):
    """Gemm(Transpose(A), B) → Gemm with transA flipped."""

    flip = "transA"

    def pattern(self, op, a, b, c):
        # Gemm's inputs are matrices, so an absent perm (reverse the axes) means [1, 0] too.
        transposed = op.Transpose(a, perm=Attr("perm", [1, 0], pred=_perm_2d))
        return op.Gemm(transposed, b, Optional(c), _name="gemm")


class TransposeIntoGemmB(_TransposeIntoGemm):
    """Gemm(A, Transpose(B)) → Gemm with transB flipped."""

    flip = "transB"

    def pattern(self, op, a, b, c):
        transposed = op.Transpose(b, perm=Attr("perm", [1, 0], pred=_perm_2d))
        return op.Gemm(a, transposed, Optional(c), _name="gemm")


def _composed_alpha(alpha: float, scale=None, divisor=None) -> float:
    if scale is not None:
        alpha = alpha * float(scale.reshape(-1)[0])
    if divisor is not None:
        alpha = alpha / float(divisor.reshape(-1)[0])
    return float(alpha)


def unsafe_scale(scale: float, what: str) -> str | None:
    """Why a scale composed from the model's constants cannot stand for them as one float32
    attribute: infinite or NaN (1/1e-40 overflows), or nonzero but below float32's normal
    range, where it keeps too few bits."""
    with np.errstate(over="ignore"):
        magnitude = abs(float(np.float32(scale)))
    if not np.isfinite(magnitude):
        return f"the composed {what} {scale:g} is not a finite float32"
    if 0 < magnitude < np.finfo(np.float32).tiny or (magnitude == 0 and scale != 0):
        return f"the composed {what} {scale:g} is below float32's normal range"
    return None


class _IntoFusedMatMul(Rule):
    """Rewrites to FusedMatMul(A, B), composing what the match adds to what FusedMatMul had:
    a transpose of A or B (`flip`), a scale (`scale`) or a divisor (`divisor`)."""

    emits = ((MS, "FusedMatMul"),)
    dtypes = (DType.FLOAT,)
    device_dtypes = (DType.FLOAT16,)
    flip: str = ""  # "A" or "B" when the rule swallows a Transpose of that operand

    def plausible(self, root):
        # check's perm test before the full match: attention's head-splitting Transposes
        # (perm [0,2,1,3], [0,2,3,1]) feed MatMuls in every layer.
        if not self.flip:
            return True
        operand = root.input(0 if self.flip == "A" else 1)
        transpose = operand.producer if operand is not None else None
        if transpose is None or transpose.op_type != "Transpose" or transpose.input(0) is None:
            return False
        rank = _rank(transpose.input(0))
        return rank is not None and rank >= 2 and _swaps_last_two(transpose.attr("perm"), rank)

    def check(self, a, b, alpha=1.0, perm=None, scale=None, divisor=None):
        ranks = (_rank(a), _rank(b))
        if None in ranks or min(ranks) < 2:
            return f"operand ranks {ranks} are not both known and at least 2"
        if self.flip:
            rank = ranks[0] if self.flip == "A" else ranks[1]
            if not _swaps_last_two(perm, rank):
                return f"Transpose perm {perm} does not swap the last two axes only"
        constant = scale if scale is not None else divisor
        if constant is not None and constant.ndim > max(ranks):
            return f"the scale has rank {constant.ndim}, it would broadcast the product"
        if divisor is not None and float(divisor.reshape(-1)[0]) == 0.0:
            return "division by zero"
        return unsafe_scale(_composed_alpha(alpha, scale, divisor), "alpha")

    def rewrite(self, op, a, b, alpha=1.0, trans_a=0, trans_b=0, scale=None, divisor=None):
        return op.FusedMatMul(a, b, _domain=MS, alpha=_composed_alpha(alpha, scale, divisor),
                              transA=int(trans_a) ^ (self.flip == "A"),
                              transB=int(trans_b) ^ (self.flip == "B"))


class TransposeIntoMatMulA(_IntoFusedMatMul):
    """MatMul(A with its last two axes swapped, B) → FusedMatMul with transA."""

    flip = "A"

    def pattern(self, op, a, b):
        return op.MatMul(_transposed(op, a), b)


class TransposeIntoMatMulB(_IntoFusedMatMul):
    """q · kᵀ in attention: MatMul(q, Transpose(k, perm=[0,1,3,2]))."""

    flip = "B"

    def pattern(self, op, a, b):
        return op.MatMul(a, _transposed(op, b))


class TransposeIntoFusedMatMulA(_IntoFusedMatMul):
    """FusedMatMul(A with its last two axes swapped, B): transA flipped."""

    flip = "A"

    def pattern(self, op, a, b):
        return _fused(op, _transposed(op, a), b)


class TransposeIntoFusedMatMulB(_IntoFusedMatMul):
    """FusedMatMul(A, B with its last two axes swapped): transB flipped."""

    flip = "B"

    def pattern(self, op, a, b):
        return _fused(op, a, _transposed(op, b))


class ScaledMatMul(_IntoFusedMatMul):
    """MatMul(A, B) · s for a scalar constant s → FusedMatMul with alpha s."""

    def pattern(self, op, a, b):
        return op.Mul(op.MatMul(a, b), Const(pred=_scalar, name="scale"))


class DividedMatMul(_IntoFusedMatMul):
    """The attention scale as exporters write it: scores / √d."""

    def pattern(self, op, a, b):
        return op.Div(op.MatMul(a, b), Const(pred=_scalar, name="divisor"))


class ScaledFusedMatMul(_IntoFusedMatMul):
    """FusedMatMul(A, B) · s for a scalar constant s: s into alpha."""

    def pattern(self, op, a, b):
        return op.Mul(_fused(op, a, b), Const(pred=_scalar, name="scale"))


class DividedFusedMatMul(_IntoFusedMatMul):
    """FusedMatMul(A, B) / s for a scalar constant s: 1/s into alpha."""

    def pattern(self, op, a, b):
        return op.Div(_fused(op, a, b), Const(pred=_scalar, name="divisor"))


def _scaled(op, x, side: str):
    """x, x · s or x / s for a scalar constant s, bound as `<side>_scale` or `<side>_divisor`."""
    return OneOf(op.Mul(x, Const(pred=_scalar, name=f"{side}_scale")),
                 op.Div(x, Const(pred=_scalar, name=f"{side}_divisor")), x)


def _scaled_by_constant(value) -> bool:
    """Whether `value` is a Mul or Div of something by a one-element constant."""
    node = value.producer if value is not None else None
    if node is None or node.op_type not in ("Mul", "Div") or not node.is_onnx:
        return False
    operands = node.inputs if node.op_type == "Mul" else node.inputs[1:]
    return any(v is not None and v.is_constant and v.const.size == 1 for v in operands)


class _ScaledOperands(_IntoFusedMatMul):
    """Scalar scales on the operands move into alpha: (A·s)·(B·t) = s·t·(A·B), transposed or
    not. Each operand binds bare as well, so one rule takes a scale on either side or both."""

    def plausible(self, root):
        return _scaled_by_constant(root.input(0)) or _scaled_by_constant(root.input(1))

    def check(self, a, b, alpha=1.0, a_scale=None, a_divisor=None, b_scale=None,
              b_divisor=None):
        if a_scale is None and a_divisor is None and b_scale is None and b_divisor is None:
            return "neither operand is scaled by a scalar constant"
        if a.is_constant or b.is_constant:
            return f"%{(a if a.is_constant else b).name} is a constant: a weight's MatMul " \
                   "stays one for the quantizers and onnxruntime's MatMul fusions"
        ranks = (_rank(a), _rank(b))
        if None in ranks or min(ranks) < 2:
            return f"operand ranks {ranks} are not both known and at least 2"
        for constant, rank in ((a_scale, ranks[0]), (a_divisor, ranks[0]),
                               (b_scale, ranks[1]), (b_divisor, ranks[1])):
            if constant is not None and constant.ndim > rank:
                return f"a scale of rank {constant.ndim} would broadcast an operand of rank {rank}"
        if any(d is not None and float(d.reshape(-1)[0]) == 0.0 for d in (a_divisor, b_divisor)):
            return "division by zero"
        return unsafe_scale(_operands_alpha(alpha, a_scale, a_divisor, b_scale, b_divisor),
                            "alpha")

    def rewrite(self, op, a, b, alpha=1.0, trans_a=0, trans_b=0, a_scale=None, a_divisor=None,
                b_scale=None, b_divisor=None):
        return op.FusedMatMul(a, b, _domain=MS,
                              alpha=_operands_alpha(alpha, a_scale, a_divisor, b_scale,
                                                    b_divisor),
                              transA=int(trans_a), transB=int(trans_b))


def _operands_alpha(alpha, a_scale, a_divisor, b_scale, b_divisor) -> float:
    return _composed_alpha(_composed_alpha(alpha, a_scale, a_divisor), b_scale, b_divisor)


class ScaledOperandsMatMul(_ScaledOperands):
    """MatMul(q · s, kᵀ · s), as the dynamo exporter writes sdpa's scores (Llama, Mistral,
    Qwen2, Gemma, Phi, Falcon, BART, Marian); MatMul(q, kᵀ / s) as DeBERTa writes them."""

    def pattern(self, op, a, b):
        return op.MatMul(_scaled(op, a, "a"), _scaled(op, b, "b"))


class ScaledOperandsFusedMatMul(_ScaledOperands):
    """FusedMatMul(A · s, B · t): the scalar scales into alpha."""

    def pattern(self, op, a, b):
        return _fused(op, _scaled(op, a, "a"), _scaled(op, b, "b"))


@register
class FuseMatMul(RulePass):
    name = "FuseMatMul"
    description = "MatMul + bias into Gemm; transposes and scalar scales into Gemm/FusedMatMul"
    # Order matters within one sweep: a bias makes a Gemm before a transpose of A can claim the
    # MatMul, and the Mul/Div roots see FusedMatMuls the transpose rules made moments earlier.
    rules = (EinsumAsMatMul, FlattenedGemm, MatMulAddToGemm, TransposeIntoGemmA, TransposeIntoGemmB,
             TransposeIntoMatMulA, TransposeIntoMatMulB, ScaledMatMul, DividedMatMul,
             ScaledFusedMatMul, DividedFusedMatMul, ScaledOperandsMatMul,
             ScaledOperandsFusedMatMul, TransposeIntoFusedMatMulA, TransposeIntoFusedMatMulB)


__all__ = ["FuseMatMul"]
