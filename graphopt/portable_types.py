"""How a portable .onnx keeps onnxruntime from re-fusing a residual Add and LayerNormalization
into its slow CPU SkipLayerNormalization: the residual sum written as Sum, and the types that
would prove it fusible left out."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from graphopt.ir import Model, Node, Value
from graphopt.passes.fusion.elementwise import DOMAIN as FUNCTIONS

# onnxruntime's SkipLayerNormFusion (its extended level) fuses Add (→ bias Add) →
# LayerNormalization where the first Add's inputs are known to have one shape. The types
# graphopt infers prove it where onnxruntime's own inference of an exporter's symbolic dims does
# not, and the fused CPU kernel runs 3-5× slower than the ops it replaces (bench/
# skip_layernorm.py): a session at ORT_ENABLE_ALL ran graphopt's 4-layer BERT at 1.04× the
# original's time with those types, 0.96× without. Left untyped, onnxruntime infers them itself
# and leaves the ops apart, as it does for the original. residual_sums goes further, for inputs
# of static shapes; the types are left out where it does not apply (an -O3 function's Adds).


def residual_types_kept(model: Model) -> Callable[[Value], bool]:
    """A to_onnx value_infos predicate: False for the inputs and output of each Add that feeds a
    LayerNormalization directly or through a second Add (its bias), or of the elementwise
    function that holds them at -O3 (onnxruntime inlines it before it fuses). Inside
    residual_sums the Adds it writes as Sum are no longer such Adds, and keep their types."""
    # ONNX inference cannot see through a function whose body holds a contrib op (a SiLU's
    # QuickGelu): its outputs keep their types, or onnx.checker's full check refuses the
    # nodes that read them.
    opaque = {f.name for f in model.functions if f.domain == FUNCTIONS
              and any(n.domain not in ("", "ai.onnx") for n in f.node)}
    untyped: set[int] = set()
    for node in model.graph:
        if node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx"):
            continue
        for add in _adds_before(node):
            untyped.update(id(v) for v in (*add.inputs, add.output) if v is not None
                           and not (v.producer is not None and v.producer.domain == FUNCTIONS
                                    and v.producer.op_type in opaque))
    return lambda value: id(value) not in untyped


def _adds_before(norm: Node) -> list[Node]:
    first = norm.input(0).producer if norm.input(0) is not None else None
    if first is not None and first.domain == FUNCTIONS:
        return [first]
    if first is None or first.op_type != "Add" or not first.is_onnx:
        return []
    adds = [first]
    for value in first.inputs:
        if value is not None and value.producer is not None \
                and value.producer.op_type == "Add" and value.producer.is_onnx:
            adds.append(value.producer)
    return adds


@contextlib.contextmanager
def residual_sums(model: Model) -> Iterator[None]:
    """Inside the block, each residual Add right before a LayerNormalization (no operand a
    bias broadcast over it) is a two-input Sum: the same sum, broadcast alike (LayerNormalization
    means opset 17, Sum broadcasts from 8) and as fast, which onnxruntime's SkipLayerNormFusion,
    matching Add alone, leaves apart. Leaving types out is not enough where the model's input
    shapes are static: onnxruntime's own inference then proves the shapes equal, and a BERT
    export's .onnx ran 0.98x the original where its .om ran 0.71x. residual_types_kept, called
    inside the block, then finds no Add there and keeps those values' types."""
    changed = []
    try:
        for node in model.graph:
            if node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx"):
                continue
            add = node.input(0).producer if node.input(0) is not None else None
            if add is not None and add.op_type == "Add" and add.is_onnx \
                    and not any(_bias(v, add.output) for v in add.inputs):
                add.op_type = "Sum"
                changed.append(add)
        yield
    finally:
        for add in changed:
            add.op_type = "Add"


def _bias(operand: Value | None, total: Value) -> bool:
    """Whether `operand` is a constant broadcast over `total` (a bias, which onnxruntime's
    MatMulAddFusion takes into a Gemm), rather than a residual of its rank: an embedding sum's
    folded token-type row is one, and SkipLayerNormFusion fused it."""
    if operand is None:
        return True
    constant = operand.is_constant or getattr(operand.producer, "op_type", "") == "Constant"
    return constant and (operand.shape is None or total.shape is None
                         or len(operand.shape) < len(total.shape))
