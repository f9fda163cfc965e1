"""EliminateNoOps: remove nodes whose output provably equals one of their inputs.

    Cast(x: f32, to=f32) -> x          Reshape/Expand/Flatten/Squeeze/Unsqueeze to x's own shape
                                        (a Reshape's by its target too: [0, -1, C] on [B, S, C])
    Transpose(perm = identity) -> x     Add(x, -0.0), Sub(x, +0.0), Mul(x, 1), Div(x, 1), Pow(x, 1)
    Concat/Sum/Max/Min/Mean of one input, Split into one part, Tile by ones, Pad by zeros,
    Slice that keeps every element

Arithmetic identities only fire when broadcasting leaves x's shape and dtype unchanged. A float
x + 0.0 is not x: -0.0 + 0.0 is +0.0, which 1/x or atan2 tell apart; x + (-0.0) and x - 0.0
are (integer zeros have no sign).
Also collapses Reshape(Reshape(x, a), b) into Reshape(x, b) when b needs no dims of the middle,
turns Reshape(Reduce(x, keepdims=0)) to the kept-dims shape into Reduce(x, keepdims=1) and
Div(ReduceSum(x), count) into ReduceMean(x), and reads Where(Not(c), a, b) as Where(c, b, a).
Chains that give back a value further up (Relu(Relu(x)), Neg(Neg(x)), a Cast round trip, a
reduction over dims of size 1) are noop_chains'.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from graphopt.ir import Model, Node, Value
from graphopt.passes.base import Pass, PassContext, PassResult, register
from graphopt.passes.edit import bypass
from graphopt.passes.noop_chains import (IDEMPOTENT, INVOLUTIONS, cast_round_trip, repeated,
                                         size_one_axes)
from graphopt.passes.reduce_axes import reduced_axes


def _same_type(a: Value, b: Value) -> bool:
    return a.dtype is not None and a.dtype == b.dtype


def _same_shape(a: Value, b: Value) -> bool:
    """Shapes equal as far as known: static and equal, or symbolically identical."""
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return False
    return all(x is not None and x == y for x, y in zip(a.shape, b.shape))


def _const(value: Value | None) -> np.ndarray | None:
    return None if value is None else value.constant()


def _all_equal(value: Value | None, scalar: float) -> bool:
    data = _const(value)
    if data is None or data.dtype == object or data.size == 0:
        return False
    if data.size == 1 and data.dtype.kind in "biuf":
        # One plain number (most constants here): np.all costs microseconds per call.
        return bool(data.item() == scalar)
    return bool(np.all(data == scalar))


def _broadcast_keeps(x: Value, c: Value, out: Value) -> bool:
    """x op c has exactly x's shape and dtype."""
    if not _same_type(x, out) or c.shape is None or x.shape is None:
        return False
    if len(c.shape) > len(x.shape):
        return False
    if all(d == 1 for d in c.shape):
        return True
    if x.static_shape is not None and c.static_shape is not None:
        return np.broadcast_shapes(x.static_shape, c.static_shape) == x.static_shape
    return False


def _cast(node: Node) -> Value | None:
    x = node.inputs[0]
    if node.op_type == "Cast" and x.dtype is not None and int(x.dtype) == node.attr("to"):
        return x
    if node.op_type == "CastLike" and _same_type(x, node.inputs[1]):
        return x
    return None


def _chain(node: Node) -> tuple[str, Value] | None:
    """(the named rewrite, the value `node`'s output equals) for the chains noop_chains finds:
    Relu(Relu(x)), Neg(Neg(x)) (RepeatedOp), a Cast round trip (CastRoundTrip), a reduction
    over dims of size 1 that keeps them (ReduceOverOnes)."""
    if node.op_type in IDEMPOTENT or node.op_type in INVOLUTIONS:
        keep = repeated(node)
        return None if keep is None else ("RepeatedOp", keep)
    if node.op_type == "Cast":
        keep = cast_round_trip(node)
        return None if keep is None else ("CastRoundTrip", keep)
    keep = _reduce_kept(node) if node.op_type.startswith("Reduce") else None
    return None if keep is None else ("ReduceOverOnes", keep)


def _reduce_kept(node: Node) -> Value | None:
    """A reduction over dims of size 1 that keeps them (noop_chains.size_one_axes): its input."""
    if node.attr("keepdims", 1) and size_one_axes(node) is not None \
            and _same_type(node.inputs[0], node.output):
        return node.inputs[0]
    return None


def _reduce_dropped(node: Node, opset: int, ctx: PassContext) -> bool:
    """A reduction over dims of size 1 (size_one_axes) that drops them becomes a Squeeze of them,
    which onnxruntime runs as a view of its input instead of a pass over it."""
    axes = size_one_axes(node)
    if axes is None or node.attr("keepdims", 1) or not _same_type(node.inputs[0], node.output) \
            or not ctx.allows("ReduceOverOnes", node):
        return False
    graph, x = node.graph, node.inputs[0]
    if opset >= 13:  # axes an input
        inputs, attrs = [x, graph.make_initializer("axes", np.array(axes, np.int64))], {}
    else:
        inputs, attrs = [x], {"axes": list(axes)}
    squeeze = graph.make_node("Squeeze", inputs, attrs, before=node, dtype=node.output.dtype,
                              shape=node.output.shape)
    return bypass(node, squeeze.output)


def _same_shape_op(node: Node) -> Value | None:
    x = node.inputs[0]
    return x if _same_shape(x, node.output) and _same_type(x, node.output) else None


def _reshape(node: Node) -> Value | None:
    """A Reshape to x's own shape: the inferred shapes say so, or the target does, dim by dim:
    each entry a 0 (x's dim there, without allowzero), x's own static dim, or the one -1,
    which then is x's dim too, the element count being kept. Shape inference names a -1 dim
    afresh, so [0, -1, C] on [B, S, C] compares unequal (dynamo exports write it on the key
    path of every attention)."""
    same = _same_shape_op(node)
    if same is not None:
        return same
    x, target = node.inputs[0], _const(node.input(1))
    # (A Reshape's output has its input's type: no dtype check, as a value a rewrite just made
    # has none until the next inference.)
    if target is None or x.shape is None or target.ndim != 1 or len(target) != len(x.shape) \
            or node.attr("allowzero", 0):
        return None
    free = [t for d, t in zip(x.shape, target.tolist())
            if not (t == 0 or (isinstance(d, int) and t == d))]
    return x if free in ([], [-1]) else None


def _transpose(node: Node) -> Value | None:
    perm = node.attr("perm")
    if perm is not None and list(perm) == list(range(len(perm))):
        return node.inputs[0]
    return None


_NEUTRAL = {"Add": (0, True), "Sub": (0, False), "Mul": (1, True), "Div": (1, False),
            "Pow": (1, False)}


def _arithmetic(node: Node) -> Value | None:
    neutral, commutative = _NEUTRAL[node.op_type]
    a, b = node.inputs[0], node.inputs[1]
    candidates = [(a, b)] + ([(b, a)] if commutative else [])
    for x, c in candidates:
        if x is not None and c is not None and _all_equal(c, neutral) \
                and _keeps_signed_zero(node.op_type, c) and _broadcast_keeps(x, c, node.output):
            return x
    return None


def _keeps_signed_zero(op_type: str, zero: Value) -> bool:
    """Whether adding (or subtracting) the float zeros `zero` leaves a -0.0 as it is: only
    -0.0 added, or +0.0 subtracted, does."""
    if op_type not in ("Add", "Sub"):
        return True
    data = _const(zero)
    if data.dtype.kind in "biu":
        return True
    signs = np.signbit(data.astype(np.float64))  # bfloat16 and float8 too
    return bool(signs.all()) if op_type == "Add" else not bool(signs.any())


def _single_input(node: Node) -> Value | None:
    present = [v for v in node.inputs if v is not None]
    if len(present) == 1 and _same_type(present[0], node.output):
        return present[0]
    return None


def _split(node: Node) -> Value | None:
    if len(node.outputs) == 1 and _same_shape_op(node):
        return node.inputs[0]
    return None


def _tile(node: Node) -> Value | None:
    return node.inputs[0] if _all_equal(node.input(1), 1) else None


def _pad(node: Node) -> Value | None:
    pads = node.input(1) if len(node.inputs) > 1 else None
    if pads is None:
        return node.inputs[0] if node.attr("pads") and not any(node.attr("pads")) else None
    return node.inputs[0] if _all_equal(pads, 0) and _same_shape_op(node) else None


def _slice(node: Node) -> Value | None:
    steps = node.input(4)
    if steps is not None and not _all_equal(steps, 1):
        return None
    return _same_shape_op(node)


RULES: dict[str, Callable[[Node], Value | None]] = {
    "Cast": _cast, "CastLike": _cast,
    "Reshape": _reshape, "Expand": _same_shape_op, "Flatten": _same_shape_op,
    "Squeeze": _same_shape_op, "Unsqueeze": _same_shape_op,
    "Transpose": _transpose,
    "Add": _arithmetic, "Sub": _arithmetic, "Mul": _arithmetic, "Div": _arithmetic,
    "Pow": _arithmetic,
    "Concat": _single_input, "Sum": _single_input, "Max": _single_input, "Min": _single_input,
    "Mean": _single_input,
    "Split": _split, "Tile": _tile, "Pad": _pad, "Slice": _slice,
}


def _collapse_reshape(node: Node, ctx: PassContext) -> bool:
    """Reshape(Reshape(x, a), b) -> Reshape(x, b') when b needs no dim of the middle that x
    does not give as well (_collapsed_shape); allowzero changes nothing then, and the dynamo
    exporter sets it on every Reshape."""
    inner = node.inputs[0].producer
    if inner is None or inner.op_type != "Reshape" or not inner.is_onnx:
        return False
    shape = _collapsed_shape(node, inner)
    if shape is None or not ctx.allows("ReshapeOfReshape", node):
        return False
    if not np.array_equal(shape, _const(node.input(1))):
        node.set_input(1, node.graph.make_initializer("shape", shape))
    node.set_input(0, inner.inputs[0])
    if not inner.output.uses and not inner.output.is_graph_output:
        inner.graph.remove(inner)
    return True


def _collapsed_shape(node: Node, inner: Node) -> np.ndarray | None:
    """The shape b' with Reshape(x, b') = Reshape(Reshape(x, a), b), or None. Without
    allowzero a 0 in b copies the middle's dim there: it stays a 0 where a has a 0 at the same
    place (the middle's dim is x's), becomes the middle's dim where that is static, and
    otherwise ties the result to a."""
    shape = _const(node.input(1))
    if shape is None or node.attr("allowzero", 0) or not (shape == 0).any():
        return shape
    inner_shape = None if inner.attr("allowzero", 0) else _const(inner.input(1))
    middle = inner.output.shape
    resolved = shape.astype(np.int64)
    for i in np.flatnonzero(shape == 0):
        if inner_shape is not None and i < inner_shape.size and inner_shape[i] == 0:
            continue
        dim = middle[i] if middle is not None and i < len(middle) else None
        if not isinstance(dim, int) or dim <= 0:  # a 0 in b' would copy x's dim instead
            return None
        resolved[i] = dim
    return resolved


def _target_is_kept(node: Node, reduced: Value, kept: tuple) -> bool:
    """Whether the Reshape's constant target spells `kept` dim by dim where shapes are open: a
    0 (without allowzero) copies the reduced value's dim there, which must be the kept dim;
    any other entry is that static dim. The dynamo exporter writes [0, 0, 1] at an open batch
    and sequence, whose output inference names afresh ([unk__0, unk__1, 1])."""
    target = _const(node.input(1))
    if target is None or target.ndim != 1 or len(target) != len(kept) \
            or node.attr("allowzero", 0) or reduced.shape is None:
        return False
    for i, (entry, dim) in enumerate(zip(target.tolist(), kept)):
        if entry == 0:
            if i >= len(reduced.shape) or reduced.shape[i] is None or reduced.shape[i] != dim:
                return False
        elif not (isinstance(dim, int) and entry == dim):
            return False
    return True


def _reshape_of_reduce(node: Node, ctx: PassContext) -> bool:
    """Reshape(Reduce(x, keepdims=0), s) -> Reduce(x, keepdims=1) when s is the shape keepdims=1
    gives: what the dynamo exporter writes for `x.var(-1, keepdim=True)`, which hid the
    variance of a LayerNorm from FuseLayerNorm. Only a reduction nothing else reads changes."""
    reduce = node.inputs[0].producer
    if reduce is None or reduce.attr("keepdims", 1) != 0 or len(reduce.outputs) != 1:
        return False
    axes, reduced = reduced_axes(reduce), reduce.output
    if axes is None or len(reduced.uses) != 1 or reduced.is_graph_output:
        return False
    kept = tuple(1 if i in axes else d for i, d in enumerate(reduce.inputs[0].shape))
    if not (_same_shape(Value("kept", shape=kept), node.output)
            or _target_is_kept(node, reduced, kept)) \
            or not ctx.allows("ReshapeOfReduce", node):
        return False
    reduce.set_attr("keepdims", 1)
    reduced.shape = kept
    return bypass(node, reduced)


def _unsqueeze_of_reduce(node: Node, ctx: PassContext) -> bool:
    """Unsqueeze(Reduce(x, axes, keepdims=0), axes) -> Reduce(x, axes, keepdims=1): the axes
    put back where the reduction took them (`x.mean(-1).unsqueeze(-1)`). Only a reduction
    nothing else reads changes."""
    reduce = node.inputs[0].producer
    if reduce is None or not reduce.is_onnx or reduce.attr("keepdims", 1) != 0 \
            or len(reduce.outputs) != 1 or reduce.inputs[0].shape is None:
        return False
    axes, reduced = reduced_axes(reduce), reduce.output
    put_back = node.attr("axes") if node.input(1) is None else _const(node.input(1))
    if axes is None or put_back is None or len(reduced.uses) != 1 or reduced.is_graph_output:
        return False
    rank = len(reduce.inputs[0].shape)
    put_back = [int(a) for a in np.ravel(put_back)]
    if sorted(a % rank if -rank <= a < rank else -1 for a in put_back) != sorted(axes) \
            or not ctx.allows("UnsqueezeOfReduce", node):
        return False
    reduce.set_attr("keepdims", 1)
    reduced.shape = tuple(1 if i in axes else d for i, d in enumerate(reduce.inputs[0].shape))
    return bypass(node, reduced)


def _mean_of_sum(node: Node, opset: int, ctx: PassContext) -> bool:
    """Div(ReduceSum(x, axes), n) -> ReduceMean(x, axes) where n counts the elements each sum
    adds (static dims): how the dynamo exporter writes the mean `torch.var_mean` returns,
    beside the ReduceMean inside its variance, which CSE could then not merge with it."""
    total = node.inputs[0].producer
    n = _const(node.input(1))
    if total is None or total.op_type != "ReduceSum" or not total.is_onnx or n is None \
            or n.size != 1 or n.dtype.kind != "f" or len(total.output.uses) != 1 \
            or total.output.is_graph_output or not _same_type(total.output, node.output) \
            or not _same_shape(total.output, node.output):
        return False
    axes, x = reduced_axes(total), total.inputs[0]
    if axes is None or x.shape is None:
        return False
    dims = [x.shape[a] for a in axes]
    if not all(isinstance(d, int) for d in dims) or float(np.prod(dims)) != float(n.item()) \
            or not ctx.allows("MeanOfSum", node):
        return False
    # The sum's own attributes, so that CSE finds the mean equal to one spelled alike.
    attrs = dict(total.attrs)
    if opset >= 18:  # axes an input, as ReduceSum's from 13
        inputs = [x, node.graph.make_initializer("axes", np.array(axes, np.int64))]
    else:  # an attribute, and no noop_with_empty_axes before 18
        attrs.pop("noop_with_empty_axes", None)
        inputs, attrs["axes"] = [x], list(axes)
    mean = node.graph.make_node("ReduceMean", inputs, attrs, before=node,
                                dtype=node.output.dtype, shape=node.output.shape)
    return bypass(node, mean.output)


def _where_of_not(node: Node, ctx: PassContext) -> bool:
    """Where(Not(c), a, b) -> Where(c, b, a), exactly (the broadcast shape is the same): what
    `masked_fill(~mask, …)` exports to. The Not is dropped once nothing else reads it."""
    negation = node.inputs[0].producer
    if negation is None or negation.op_type != "Not" or not negation.is_onnx \
            or len(node.inputs) != 3 or not ctx.allows("WhereOfNot", node):
        return False
    node.set_inputs([negation.inputs[0], node.inputs[2], node.inputs[1]])
    return True


def _argmax_of_softmax(node: Node, opset: int, ctx: PassContext) -> bool:
    """ArgMax(Softmax(x)) and ArgMax(LogSoftmax(x)) -> ArgMax(x), where the normalization
    orders the compared elements as x does: one normalization across them. A segmentation
    head's `logits.softmax(1).argmax(1)` spent 97% of its time on the Softmax. Where it rounded
    two logits near the top to one value, the index is now the larger logit's, not the first.
    Not an ArgMin: the smallest values round together far more readily (probabilities ~104
    below the largest logit underflow to 0 in float32; LogSoftmax's x - max - lse rounds two
    logits ~199 below it to one), and its index is the first of them. Not select_last_index,
    whose ties, and rows masked whole (NaN after a Softmax), resolve to another index."""
    soft = node.inputs[0].producer
    x = soft.inputs[0] if soft is not None else None
    if soft is None or soft.op_type not in ("Softmax", "LogSoftmax") or not soft.is_onnx \
            or soft.graph is not node.graph or x is None or x.shape is None \
            or node.attr("select_last_index", 0):
        return False
    rank = len(x.shape)
    compared = node.attr("axis", 0)
    normalized = soft.attr("axis", -1 if opset >= 13 else 1)
    if not (-rank <= compared < rank and -rank <= normalized < rank):
        return False
    compared, normalized = compared % rank, normalized % rank
    # From opset 13 the normalization runs along its axis; before, over the axes from it on.
    if not (compared == normalized if opset >= 13 else compared >= normalized):
        return False
    if not ctx.allows("ArgOfSoftmax", node):
        return False
    node.set_input(0, x)
    return True


# The rewrites of this pass that have names of their own (the others count by op type): each
# can be switched off by name, as a rule of a rule pass can (graphopt bisect names them).
NAMED_REWRITES = {
    "ReshapeOfReshape": "Reshape(Reshape(x, a), b) → Reshape(x, b) where b needs no dim of the "
                        "middle.",
    "ReshapeOfReduce": "Reshape(Reduce(x, keepdims=0)) to the kept-dims shape → the reduction "
                       "with keepdims=1.",
    "UnsqueezeOfReduce": "Unsqueeze of the axes a keepdims=0 reduction removed → the reduction "
                         "with keepdims=1.",
    "MeanOfSum": "Div(ReduceSum(x), count of the elements summed) → ReduceMean(x).",
    "WhereOfNot": "Where(Not(c), a, b) → Where(c, b, a).",
    "ArgOfSoftmax": "ArgMax(Softmax(x)) over the normalized axis → ArgMax(x).",
    "ReduceOverOnes": "a Max/Min/Prod (or integer Sum/Mean) reduction over dims of size 1 → "
                      "its input, or a Squeeze where it drops them.",
    "RepeatedOp": "Relu(Relu(x)) → Relu(x) (Abs, Ceil, Floor, Round, Sign alike), Neg(Neg(x)) "
                  "and Not(Not(x)) → x.",
    "CastRoundTrip": "Cast(Cast(x, W), x's type) → x where W holds every value of x's type.",
}


class _Switched:
    """A PassContext's rewrite gate with the named rewrites the options switch off closed."""

    def __init__(self, ctx: PassContext):
        self._ctx, self._off = ctx, set(NAMED_REWRITES) & set(ctx.options.disabled_passes)

    def allows(self, rule: str, anchor: Node) -> bool:
        return rule not in self._off and self._ctx.allows(rule, anchor)


@register
class EliminateNoOps(Pass):
    name = "EliminateNoOps"
    named_rewrites = NAMED_REWRITES
    description = ("remove no-op casts, reshapes, transposes, x+0, x*1, one-input concats, the "
                   "Softmax an ArgMax reads, Relu(Relu(x)), Neg(Neg(x)), Cast round trips, …")

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        result = PassResult()
        opset = model.opset() or 1
        gate = _Switched(ctx)
        for node in list(model.graph.all_nodes()):
            if node.graph is None or not node.is_onnx or not node.inputs:
                continue
            if node.inputs[0] is None or node.outputs[0] is None:
                continue
            if node.op_type == "Reshape" and _collapse_reshape(node, gate):
                result.count("ReshapeOfReshape")
            if node.op_type == "Reshape" and _reshape_of_reduce(node, gate):
                result.count("ReshapeOfReduce")
                continue
            if node.op_type == "Unsqueeze" and _unsqueeze_of_reduce(node, gate):
                result.count("UnsqueezeOfReduce")
                continue
            if node.op_type == "Div" and _mean_of_sum(node, opset, gate):
                result.count("MeanOfSum")
                continue
            if node.op_type == "Where" and _where_of_not(node, gate):
                result.count("WhereOfNot")
                continue
            if node.op_type == "ArgMax" and _argmax_of_softmax(node, opset, gate):
                result.count("ArgOfSoftmax")
                continue
            if node.op_type.startswith("Reduce") and _reduce_dropped(node, opset, gate):
                result.count("ReduceOverOnes")
                continue
            chain = _chain(node)
            if chain is not None and gate.allows(chain[0], node) and bypass(node, chain[1]):
                result.count(chain[0])
                continue
            rule = RULES.get(node.op_type)
            if rule is None or (len(node.outputs) > 1 and node.op_type != "Split"):
                continue
            keep = rule(node)
            if keep is not None and keep is not node.output and ctx.allows(node.op_type, node) \
                    and bypass(node, keep):
                result.count(node.op_type)
        return result
