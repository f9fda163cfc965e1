"""UnmergeHeads: the [batch·heads, seq, dim] form of `torch.bmm` attention (DETR, SpeechT5,
BART-style `view(bsz * num_heads, -1, head_dim)`) written on the [batch, heads, seq, dim]
tensors the merge came from, which FuseAttention's rules read.

    MatMul(Reshape(a[p,q,m,k] → [p·q,m,k]), Reshape(b[p,q,k,n] → [p·q,k,n]))
        = Reshape(MatMul(a, b) → [p·q,m,n])
    Transpose(Reshape(x[p,q,n,k] → [p·q,n,k]), [0,2,1]) = Reshape(Transpose(x, [0,1,3,2]))
    Softmax(Reshape(x[p,q,m,n] → [p·q,m,n]), last axis) = Reshape(Softmax(x, last axis))
    Mul/Div(Reshape(x[p,q,m,n] → [p·q,m,n]), scalar) = Reshape(Mul/Div(x, scalar))
    Add(Reshape(x[p,q,m,n] → [p·q,m,n]), bias) = Reshape(Add(x, bias split into [p,q,…]))

Each merges only the two leading dims, which row-major order keeps together, and each op works
on the trailing axes alone, so it commutes with the merge: the same numbers, bit for bit. The
Reshapes move towards the output, where the one that splits the heads again cancels them
(EliminateNoOps), and the rank-4 attention that remains fuses. Shapes must be static (a pinned
model's): the merge is proven from them. The pass runs first in each fusion sweep: at batch 1,
SimplifyLayout's ReshapeChain would otherwise fold the merge into the head split before these
rules see it.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import Value
from graphopt.ir.pattern import Const, Match, Miss
from graphopt.passes.base import register
from graphopt.passes.rules import HandMatchedRule, Rule, RulePass
from graphopt.passes.symbolic_dims import Equalities, proven_dims, reshaped, times


def _merged_heads(x: Value, shape: Value, allowzero: int) -> tuple[int, ...] | None:
    """x's static [p, q, m, n] when Reshape(x, shape) gives [p·q, m, n]; else None."""
    dims, target = x.static_shape, shape.constant()
    if dims is None or len(dims) != 4 or target is None or target.ndim != 1 or len(target) != 3:
        return None
    wanted = (dims[0] * dims[1], dims[2], dims[3])
    resolved = [dims[i] if t == 0 and not allowzero else int(t) for i, t in enumerate(target)]
    if resolved.count(-1) == 1:
        known = int(np.prod([d for d in resolved if d != -1]))
        if known == 0:
            return None
        resolved[resolved.index(-1)] = int(np.prod(dims)) // known
    return tuple(dims) if tuple(resolved) == wanted else None


def _merge_of(op, x, shape, bound_as: str):
    """A Reshape pattern (of x to shape) whose node the match binds as `bound_as`."""
    return op.Reshape(x, shape, _name=bound_as)


def _scalar(data: np.ndarray) -> bool:
    return data.size == 1 and data.ndim <= 1


def _merge_back(op, value: Value, dims: tuple[int, ...], hint: str, like: Value) -> Value:
    """`value` [p, q, m, n] (of `like`'s dtype) as [p·q, m, n]. Both are typed here: the rules
    read static shapes, and a fusion sweep infers none for the values it makes."""
    value.shape, value.dtype = tuple(dims), like.dtype
    merged = (dims[0] * dims[1], dims[2], dims[3])
    out = op.Reshape(value, op.const(np.array(merged, np.int64), f"{hint}_merged_heads"))
    out.shape, out.dtype = merged, like.dtype
    return out


def _not_last_axis(softmax, model) -> str | None:
    """Why a Softmax of a rank-3 tensor is not over its last axis alone (None when it is).
    Before opset 13 Softmax flattens from `axis` (default 1); axis 2 of rank 3 is the last
    axis alone either way, as is -1 (the default from opset 13)."""
    axis = softmax.attr("axis")
    if axis in (2, -1) or axis is None and (model.opset("") or 1) >= 13:
        return None
    return f"the Softmax runs over axis {axis}, not the last"


class _OnMergedHeads(Rule):
    """Checks shared by the rules: the Reshape bound as `merge` merges x's two leading dims."""

    def check(self, x, into, merge):
        if _merged_heads(x, into, merge.attr("allowzero", 0)) is None:
            return "the Reshape does not merge the two leading dims of a static rank-4 tensor"
        return None


def _merge_source(value: Value) -> tuple[Value, tuple[int, ...]] | None:
    """(x, x's static [p, q, m, n]) when `value` is Reshape(x) merging x's two leading dims."""
    node = value.producer
    if node is None or node.op_type != "Reshape" or not node.is_onnx:
        return None
    dims = _merged_heads(node.inputs[0], node.inputs[1], node.attr("allowzero", 0))
    return None if dims is None else (node.inputs[0], dims)


def _heads(a: Value, b: Value) -> tuple[int, int] | None:
    """(p, q) of the operand that merges heads, when both operands are static rank-3 tensors
    with p·q in their leading dim."""
    shapes = a.static_shape, b.static_shape
    if any(s is None or len(s) != 3 for s in shapes) or shapes[0][0] != shapes[1][0]:
        return None
    for value in (a, b):
        source = _merge_source(value)
        if source is not None:
            return source[1][:2]
    return None


def _unmerged(op, value: Value, p: int, q: int) -> Value:
    """`value` [p·q, m, n] as [p, q, m, n]: the tensor it was merged from, or a Reshape."""
    source = _merge_source(value)
    if source is not None and source[1][:2] == (p, q):
        return source[0]
    dims = (p, q, *value.static_shape[1:])
    data = value.constant()
    if data is not None:  # a weight (a bias table) is split now, not by a Reshape at run time
        return op.const(data.reshape(dims), f"{value.name}_unmerged")
    out = op.Reshape(value, op.const(np.array(dims, np.int64), "unmerged_heads"))
    out.shape, out.dtype = dims, value.dtype
    return out


class MatMulOfMergedHeads(HandMatchedRule):
    """A batched MatMul where an operand merges heads → the rank-4 MatMul, merged after. The
    other operand may have come by any way to its [p·q, k, n] (a key's Transpose-then-Reshape
    that TransposeChain shortened): it is split into [p, q, k, n] by a Reshape. The merging
    Reshapes only the MatMul reads belong to the match, so they go with it: left for the
    sweep's EliminateDeadNodes, a merge of a scaled query would still read the Mul, which
    FuseAttention then could not take into the attention's scale."""

    root_op = "MatMul"

    def match(self, node):
        if not node.is_onnx or len(node.inputs) != 2 or None in node.inputs:
            return Miss(node, 0, "not an ONNX MatMul of two inputs")
        merges = [value.producer for value in node.inputs if _merge_source(value) is not None]
        if not merges:
            return Miss(node, 1, "neither operand is a Reshape merging the two leading dims of a "
                                 "static rank-4 tensor")
        owned = [m for m in dict.fromkeys(merges)
                 if len(m.output.uses) == 1 and not m.output.is_graph_output]
        a, b = node.inputs
        return Match(node, {"a": a, "b": b, "root": node}, [node] + owned)

    def check(self, a, b):
        if _heads(a, b) is None:
            return "the operands are not both static and of rank 3 with one leading dim"
        return None

    def rewrite(self, op, a, b):
        p, q = _heads(a, b)
        product = op.MatMul(_unmerged(op, a, p, q), _unmerged(op, b, p, q))
        return _merge_back(op, product, (p, q, a.static_shape[1], b.static_shape[2]), "matmul",
                           a)


def _unbatched(a: Value, b: Value) -> int | None:
    """Which operand of MatMul(a, b) is a rank-3 [q, ·, ·] of heads (0 or 1) beside a rank-4
    [1, q, ·, ·] one, laid out by a Transpose or Reshape; None otherwise."""
    for index, (low, high) in enumerate(((b, a), (a, b))):
        small, big = low.static_shape, high.static_shape
        if small is None or big is None or len(small) != 3 or len(big) != 4:
            continue
        if big[0] == 1 and small[0] == big[1] > 1 and low.producer is not None \
                and low.producer.op_type in ("Transpose", "Reshape"):
            return 1 - index
    return None


class MatMulOfUnbatchedHeads(HandMatchedRule):
    """A MatMul of a [1, q, m, k] operand and a [q, k, n] one (or the other way round) → the
    rank-3 one reshaped to [1, q, ·, ·], as MatMul broadcasts it anyway: the dynamo
    exporter's key at batch 1, whose Reshape drops the batch before the head transpose
    (TrOCR's decoder: [1, 6, 32] → [6, 4, 8] → [4, 8, 6]), then fuses as rank-4 attention."""

    root_op = "MatMul"

    def match(self, node):
        if not node.is_onnx or len(node.inputs) != 2 or None in node.inputs:
            return Miss(node, 0, "not an ONNX MatMul of two inputs")
        a, b = node.inputs
        return Match(node, {"a": a, "b": b, "root": node}, [node])

    def check(self, a, b):
        if _unbatched(a, b) is None:
            return "not a [1, q, m, k] operand beside a [q, k, n] one laid out by a Transpose " \
                   "or Reshape"
        return None

    def rewrite(self, op, a, b, root):
        operands = [a, b]
        index = _unbatched(a, b)
        small = operands[index]
        source = small.producer
        # The batch axis goes before the head transpose, as a Reshape: the chain of Reshapes
        # and Transposes it joins then collapses (ReshapeChain, TransposeChain), and the
        # attention reads the projection as it is.
        transposed = source.op_type == "Transpose" and source.is_onnx \
            and source.attr("perm") is not None and source.inputs[0].static_shape is not None \
            and len(source.inputs[0].static_shape) == 3
        inner = source.inputs[0] if transposed else small
        dims = (1, *inner.static_shape)
        lifted = op.Reshape(inner, op.const(np.array(dims, np.int64), "batch_axis"))
        lifted.shape, lifted.dtype = dims, small.dtype
        if transposed:
            perm = [0] + [axis + 1 for axis in source.attr("perm")]
            lifted = op.Transpose(lifted, perm=perm)
            lifted.shape, lifted.dtype = (1, *small.static_shape), small.dtype
        operands[index] = lifted
        out = op.MatMul(*operands)
        out.shape, out.dtype = root.outputs[0].shape, a.dtype
        return out


class TransposeOfMergedHeads(_OnMergedHeads):
    """Transpose(merged heads, [0, 2, 1]) → the rank-4 Transpose of the last two axes, merged."""

    def pattern(self, op, x, into):
        return op.Transpose(_merge_of(op, x, into, "merge"), perm=[0, 2, 1])

    def rewrite(self, op, x):
        p, q, m, n = x.static_shape
        return _merge_back(op, op.Transpose(x, perm=[0, 1, 3, 2]), (p, q, n, m), "transpose", x)


class SoftmaxOfMergedHeads(_OnMergedHeads):
    """Softmax over the last axis of merged heads → the rank-4 Softmax, merged."""

    def pattern(self, op, x, into):
        return op.Softmax(_merge_of(op, x, into, "merge"), _name="root")

    def check(self, x, into, merge, root, model):
        return _not_last_axis(root, model) or super().check(x, into, merge)

    def rewrite(self, op, x):
        return _merge_back(op, op.Softmax(x, axis=-1), x.static_shape, "softmax", x)


class ScaledMergedHeads(_OnMergedHeads):
    """Merged heads times a scalar → the rank-4 product, merged."""

    op_type = "Mul"

    def pattern(self, op, x, into):
        return getattr(op, self.op_type)(_merge_of(op, x, into, "merge"),
                                         Const(pred=_scalar, name="scale"))

    def rewrite(self, op, x, scale):
        scaled = getattr(op, self.op_type)(x, op.const(scale, "heads_scale"))
        return _merge_back(op, scaled, x.static_shape, self.op_type.lower(), x)


class DividedMergedHeads(ScaledMergedHeads):
    """Merged heads over a scalar → the rank-4 quotient, merged."""

    op_type = "Div"


class BiasOnMergedHeads(_OnMergedHeads):
    """Merged heads plus a bias (SpeechT5's relative positions) → the rank-4 sum, merged. A
    bias of [p·q, m, n] is split into [p, q, m, n]; one of [1, m, n] or of rank 2 or less
    broadcasts over rank 4 as it did over rank 3."""

    def pattern(self, op, x, into, bias):
        return op.Add(_merge_of(op, x, into, "merge"), bias)

    def check(self, x, into, merge, bias):
        problem = super().check(x, into, merge)
        if problem is not None:
            return problem
        p, q, m, n = x.static_shape
        shape = bias.static_shape
        if shape is None or not (len(shape) <= 2 or shape[0] in (1, p * q) and len(shape) == 3):
            return f"the bias's shape {shape} is not [p·q, …], [1, …] or of rank 2 or less"
        if np.broadcast_shapes(shape, (p * q, m, n)) != (p * q, m, n):
            return f"the bias's shape {shape} would broadcast the sum beyond [{p * q}, {m}, {n}]"
        return None

    def rewrite(self, op, x, bias):
        p, q = x.static_shape[:2]
        shape = bias.static_shape
        split = _unmerged(op, bias, p, q) if len(shape) == 3 and shape[0] == p * q > 1 else bias
        return _merge_back(op, op.Add(x, split), x.static_shape, "biased", x)


def _proven_merge(value: Value, equal: Equalities) -> tuple[Value, list] | None:
    """(x, x's dims) when `value` is Reshape(x) merging the two leading dims of a rank-4 x, as
    the ops that computed the target prove it: open dims too (symbolic_dims)."""
    node = value.producer
    if node is None or node.op_type != "Reshape" or not node.is_onnx:
        return None
    x = node.inputs[0]
    dims, out = proven_dims(x, equal), proven_dims(value, equal)
    if dims is None or out is None or len(dims) != 4 or len(out) != 3:
        return None
    if equal.same(out[0], times(dims[0], dims[1])) and equal.same(out[1], dims[2]) \
            and equal.same(out[2], dims[3]):
        return x, dims
    return None


def _producer(value: Value | None, op_type: str):
    """The ONNX `op_type` node computing `value`, or None."""
    node = value.producer if value is not None else None
    return node if node is not None and node.op_type == op_type and node.is_onnx else None


def _split_dims(reshape, merged: list, equal: Equalities) -> list | None:
    """The dims of `reshape`'s output, its input's being `merged` (derived, where inference
    named the product's dims afresh): a -1 is resolved against them."""
    found = reshaped(reshape, merged, lambda v: proven_dims(v, equal))
    return None if found is None or any(d is None for d in found) else found


def _scaled_by(value: Value) -> tuple[str, Value, Value] | None:
    """(op type, scalar constant, x) when `value` is x · s (either order) or x / s."""
    node = value.producer
    if node is None or not node.is_onnx or node.op_type not in ("Mul", "Div"):
        return None
    order = [(0, 1), (1, 0)] if node.op_type == "Mul" else [(0, 1)]
    for x, s in order:
        data = node.inputs[s].constant()
        if data is not None and _scalar(data):
            return node.op_type, node.inputs[s], node.inputs[x]
    return None


def _splits(out, heads, merged, equal: Equalities) -> bool:
    """Whether dims `out` are [p, q, m, n] for `heads`' p, q and `merged`'s [p·q, m, n]."""
    return out is not None and merged is not None and len(out) == 4 and len(merged) == 3 \
        and equal.same(out[0], heads[0]) and equal.same(out[1], heads[1]) \
        and equal.same(out[2], merged[1]) and equal.same(out[3], merged[2])


class MergedHeadsAttention(HandMatchedRule):
    """A whole attention over merged heads, from the Reshape that splits its context back into
    [batch, heads, seq, dim], written on the rank-4 tensors: for open dims, which the op-by-op
    rules cannot merge back without run-time targets. Merges and the split are proven from the
    Shape arithmetic that builds their targets.

        Reshape(MatMul(Softmax([Reshape(Add(Reshape(S), mask))] | S), merge(V)))  →
            MatMul(Softmax([Add(S4, mask)] | S4), V),  S = MatMul(merge(Q)[·s], Transpose(merge(K)))
                                                       S4 = MatMul(Q[·s], Transpose(K, [0,1,3,2]))
    """

    root_op = "Reshape"

    def match(self, node):
        found = self._structure(node)
        if isinstance(found, str):
            return Miss(node, 0, found)
        return Match(node, found, [node])

    @staticmethod
    def _structure(node) -> dict | str:
        if not node.is_onnx:
            return "not an ONNX Reshape"
        context = _producer(node.inputs[0], "MatMul")
        if context is None:
            return "the Reshape does not split a MatMul's product"
        weights, v3 = context.inputs
        softmax = _producer(weights, "Softmax")
        if softmax is None:
            return "the product's left operand is not a Softmax"
        scores, mask, merged_scores, split_scores = softmax.inputs[0], None, None, None
        remerge = _producer(scores, "Reshape")
        add = _producer(remerge.inputs[0], "Add") if remerge is not None else None
        if add is not None:  # scores split to [B, N, S, T], masked there, and merged again
            split = next((_producer(v, "Reshape") for v in add.inputs
                          if _producer(v, "Reshape") is not None), None)
            if split is None:
                return "the masked scores are not a split of merged scores"
            mask = add.inputs[1] if add.inputs[0] is split.output else add.inputs[0]
            merged_scores, split_scores, scores = remerge.output, split.output, split.inputs[0]
        product = _producer(scores, "MatMul")
        if product is None:
            return "the scores are not a MatMul"
        q3, kt3 = product.inputs
        q_scale = _scaled_by(q3)
        if q_scale is not None:  # q·s or q/s, s a scalar constant
            q3 = q_scale[2]
        transpose = _producer(kt3, "Transpose")
        if transpose is None or list(transpose.attr("perm") or []) != [0, 2, 1]:
            return "the key is not transposed by [0, 2, 1]"
        return {"root": node, "q3": q3, "q_scale": q_scale, "k3": transpose.inputs[0], "v3": v3,
                "softmax": softmax, "mask": mask, "split_scores": split_scores,
                "merged_scores": merged_scores, "context": context.output}

    def check(self, root, q3, k3, v3, softmax, mask, split_scores, merged_scores, model):
        problem = _not_last_axis(softmax, model)
        if problem:
            return problem
        equal = Equalities()
        merges = [_proven_merge(v, equal) for v in (q3, k3, v3)]
        if any(m is None for m in merges):
            return "Q, K or V is not a Reshape proven to merge a rank-4 tensor's leading dims"
        (_, qd), (_, kd), (_, vd) = merges
        if not all(equal.same(a[i], b[i]) for a, b in ((qd, kd), (qd, vd)) for i in (0, 1)):
            return "Q, K and V do not merge the same batch and heads"
        # The products' dims follow from their operands' (a MatMul runs only where they agree).
        heads = times(qd[0], qd[1])
        context_dims, score_dims = [heads, qd[2], vd[3]], [heads, qd[2], kd[2]]
        if not _splits(_split_dims(root, context_dims, equal), qd, context_dims, equal):
            return "the Reshape does not split the context into the merged batch and heads"
        if mask is None:
            return None
        if not _splits(_split_dims(split_scores.producer, score_dims, equal), qd, score_dims,
                       equal):
            return "the masked scores are not split into the merged batch and heads"
        # Merged back to the scores' own dims, the masked sum has their element count: the mask
        # broadcast nothing, so it adds to the rank-4 scores as it did.
        merged = proven_dims(merged_scores, equal)
        if merged is None or len(merged) != 3 or not all(equal.same(a, b)
                                                         for a, b in zip(merged, score_dims)):
            return "the masked scores are not merged back to the scores' own dims"
        return None

    def rewrite(self, op, root, q3, q_scale, k3, v3, mask, context):
        equal = Equalities()
        q4, k4, v4 = (_proven_merge(v, equal)[0] for v in (q3, k3, v3))
        if q_scale is not None:
            op_type, scale, _ = q_scale
            q4 = getattr(op, op_type)(q4, scale)
        kt4 = op.Transpose(k4, perm=[0, 1, 3, 2])
        if k4.shape is not None:
            kt4.shape, kt4.dtype = (*k4.shape[:2], k4.shape[3], k4.shape[2]), k4.dtype
        scores = op.MatMul(q4, kt4)
        if mask is not None:
            scores = op.Add(scores, mask)
        out = op.MatMul(op.Softmax(scores, axis=-1), v4)
        out.dtype = context.dtype
        return out


@register
class UnmergeHeads(RulePass):
    name = "UnmergeHeads"
    description = ("write attention over merged heads ([batch·heads, seq, dim], torch.bmm's) on "
                   "the [batch, heads, seq, dim] tensors it was merged from (static shapes)")
    rules = (MergedHeadsAttention, MatMulOfMergedHeads, MatMulOfUnbatchedHeads,
             TransposeOfMergedHeads, SoftmaxOfMergedHeads, ScaledMergedHeads,
             DividedMergedHeads, BiasOnMergedHeads)


__all__ = ["UnmergeHeads"]
