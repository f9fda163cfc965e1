"""Graph outputs whose declared shape is not what their node computes, declared as computed."""

from __future__ import annotations

import onnx
from onnx import defs, shape_inference

from graphopt.ir import Model, Node
from graphopt.ir.onnx_io import node_to_proto, read_type, type_proto
from graphopt.passes.disputed_shapes import disputed_dims

# Constant inputs up to this many elements are handed to inference as data: a Reshape's
# target, an Expand's shape (weights are never what decides an output's shape).
_DATA_ELEMENTS = 1024


def correct_output_declarations(model: Model) -> list[str]:
    """Give a graph output the shape ONNX inference computes for its node from the node's
    inputs, where the model declares another rank or another static dim: an exporter's stale
    declaration ([1, seqlen] for what is [20, 1, 8210]). onnxruntime warns and returns what it
    computes, but an .om records the declaration as its signature, and its load refused the
    partition's real output. Only the producers of graph outputs are inferred, alone. Returns
    one "'name' declared … computes …" per output corrected."""
    corrected = []
    for value in model.graph.outputs:
        carried = _cast_chain(value)  # the output, and what the Casts before it cast
        source = carried[-1]
        node = source.producer
        if value.shape is None or node is None or not node.is_onnx \
                or disputed_dims(node, model.opset("") or 0):  # onnxruntime sizes these
            continue
        computed = _computed_shape(model, node, source.index)
        if computed is None or not _contradicts(value.shape, computed):
            continue
        corrected.append(f"'{value.name}' declared {_text(value.shape)} computes "
                         f"{_text(computed)}")
        for each in carried:
            each.shape = tuple(computed)
    return corrected


def declared_output_shapes(model: Model) -> dict[str, tuple]:
    """The shapes the model as given declares for its outputs, read before check_input, whose
    inference may forget them (drop_unfounded_declarations)."""
    return {v.name: v.shape for v in model.graph.outputs if v.shape is not None}


def restore_forgotten_declarations(model: Model, declared: dict[str, tuple]) -> None:
    """Give a graph output that the compile left without a shape the one the model declared:
    onnx.checker refuses a main graph's output without one (a [1, 2, 16] Reshape output of a
    computed target, which a MatMul reads too, lost its declaration at import, as inference
    found no rank, and -O0/-O1 exported it so). Forgotten while the passes ran, so that
    nothing folded from it; correct_output_declarations then checks it as any other."""
    for value in model.graph.outputs:
        if value.shape is None and value.type_proto is None and value.name in declared:
            value.shape = declared[value.name]


def _cast_chain(value) -> list:
    """`value`, then the input of each Cast before it: a precision pass hands an output's
    name to the Cast back to float32, which copies the stale declaration from the value it
    casts, where inference of the Cast alone would find it agreeing."""
    chain = [value]
    node = value.producer
    while node is not None and node.op_type == "Cast" and node.is_onnx and node.inputs \
            and node.inputs[0] is not None and node.inputs[0].producer is not None:
        chain.append(node.inputs[0])
        node = node.inputs[0].producer
    return chain


def _computed_shape(model: Model, node: Node, index: int) -> tuple | None:
    """The shape of the node's output `index` as inference computes it from its inputs' types
    and small constant inputs; None when it cannot tell."""
    opset = model.opset("")
    try:
        schema = defs.get_schema(node.op_type, opset or 1, "")
    except defs.SchemaError:
        return None
    types, data = {}, {}
    for value in node.inputs:
        if value is None:
            continue
        known = type_proto(value)
        if known is None:
            return None
        types[value.name] = known
        const = value.const
        if const is not None and len(const.shape) <= 1 and const.size <= _DATA_ELEMENTS:
            data[value.name] = const.to_proto(value.name)
    proto = node_to_proto(node)
    try:
        found = shape_inference.infer_node_outputs(
            schema, proto, types, data,
            opset_imports=[onnx.helper.make_opsetid("", opset or 1)])
    except Exception:  # noqa: BLE001 - inference is best effort; the declaration stays
        return None
    name = node.outputs[index].name
    _, shape, _ = read_type(found[name]) if name in found else (None, None, None)
    target = node.inputs[1] if node.op_type == "Reshape" and len(node.inputs) > 1 else None
    if shape is None and target is not None and target.shape is not None \
            and len(target.shape) == 1 and isinstance(target.shape[0], int):
        shape = (None,) * target.shape[0]  # its rank, which inference gives only with data
    return shape


def _contradicts(declared: tuple, computed: tuple) -> bool:
    return len(declared) != len(computed) or any(
        isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(declared, computed))


def _text(shape: tuple) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
