"""Nodes whose output equals a value further up: f(f(x)) for an idempotent f, g(g(x)) for an
involution, a Cast back from a type that held every value, a reduction over dims of size 1
(Max, Min and Prod; Sum and Mean of integers).

Each is exact, signed zeros and NaNs included: the outer node applies the same function to a
value the inner one already produced (Relu, Abs, Ceil, Floor, Round and Sign leave their own
results unchanged), Neg and Not flip the same bit twice, and widening a type that the wider one
holds exactly, then narrowing it back, returns the value it started from. Not rewritten:
Mul(Mul(x, a), b) → Mul(x, a·b) and its kin, which round once where the model rounds twice.
"""

from __future__ import annotations

from graphopt.ir import DType, Node, Value
from graphopt.passes.reduce_axes import reduced_axes

IDEMPOTENT = frozenset({"Relu", "Abs", "Ceil", "Floor", "Round", "Sign"})
INVOLUTIONS = frozenset({"Neg", "Not"})

# The types each type widens to without losing a value (an integer's float needs as many
# mantissa bits as the integer has value bits: int16 into float16's 11 does not fit).
_HOLDS_EVERY_VALUE: dict[DType, frozenset[DType]] = {
    DType.FLOAT16: frozenset({DType.FLOAT, DType.DOUBLE}),
    DType.BFLOAT16: frozenset({DType.FLOAT, DType.DOUBLE}),
    DType.FLOAT: frozenset({DType.DOUBLE}),
    DType.BOOL: frozenset({DType.INT8, DType.UINT8, DType.INT16, DType.UINT16, DType.INT32,
                           DType.UINT32, DType.INT64, DType.UINT64, DType.FLOAT16, DType.FLOAT,
                           DType.DOUBLE}),
    DType.INT8: frozenset({DType.INT16, DType.INT32, DType.INT64, DType.FLOAT16, DType.FLOAT,
                           DType.DOUBLE}),
    DType.UINT8: frozenset({DType.INT16, DType.UINT16, DType.INT32, DType.UINT32, DType.INT64,
                            DType.UINT64, DType.FLOAT16, DType.FLOAT, DType.DOUBLE}),
    DType.INT16: frozenset({DType.INT32, DType.INT64, DType.FLOAT, DType.DOUBLE}),
    DType.UINT16: frozenset({DType.INT32, DType.UINT32, DType.INT64, DType.UINT64, DType.FLOAT,
                             DType.DOUBLE}),
    DType.INT32: frozenset({DType.INT64, DType.DOUBLE}),
    DType.UINT32: frozenset({DType.INT64, DType.UINT64, DType.DOUBLE}),
}

# Reductions whose result over one element is that element (a mean divides by 1).
_ONE_ELEMENT_IS_ITSELF = frozenset({"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin",
                                    "ReduceProd"})


def _same_op_below(node: Node) -> Node | None:
    inner = node.inputs[0].producer
    if inner is None or inner.op_type != node.op_type or not inner.is_onnx \
            or len(inner.outputs) != 1:
        return None
    return inner


def repeated(node: Node) -> Value | None:
    """Relu(Relu(x)) → Relu(x) (likewise Abs, Ceil, Floor, Round, Sign); Neg(Neg(x)) → x and
    Not(Not(x)) → x."""
    inner = _same_op_below(node)
    if inner is None:
        return None
    return node.inputs[0] if node.op_type in IDEMPOTENT else inner.inputs[0]


def cast_round_trip(node: Node) -> Value | None:
    """Cast(Cast(x: T, to=W), to=T) → x where W holds every value of T (float → double →
    float, int32 → int64 → int32, bool → float → bool)."""
    inner = _same_op_below(node)
    if inner is None:
        return None
    x = inner.inputs[0]
    if x.dtype is None or int(x.dtype) != node.attr("to") or inner.attr("saturate", 1) != 1:
        return None
    wide = inner.attr("to")
    return x if wide in {int(t) for t in _HOLDS_EVERY_VALUE.get(DType(int(x.dtype)), ())} else None


def size_one_axes(node: Node) -> tuple[int, ...] | None:
    """The axes a Max/Min/Prod reduction (or an integer Sum/Mean) takes when each of them has
    size 1 (each result is then the one element it reduces), else None."""
    if node.op_type not in _ONE_ELEMENT_IS_ITSELF:
        return None
    # onnxruntime's float sums start from +0.0: a ReduceSum/ReduceMean over a size-1 dim that is
    # not the innermost turns -0.0 into +0.0, which 1/x tells apart.
    x = node.inputs[0]
    if node.op_type in ("ReduceSum", "ReduceMean") and (x.dtype is None or x.dtype.is_float):
        return None
    axes = reduced_axes(node)
    shape = node.inputs[0].shape
    if not axes or shape is None or any(shape[a] != 1 for a in axes):
        return None
    return axes


__all__ = ["IDEMPOTENT", "INVOLUTIONS", "cast_round_trip", "repeated", "size_one_axes"]
