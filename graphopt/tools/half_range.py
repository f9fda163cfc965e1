"""float16 overflow the CPU stand-in hides: the values a candidate holds in float16, checked
against float16's range in the float32 reference or, where it has no such value, in the
candidate's own run.

onnxruntime's CPU provider has float16 kernels for few ops; it runs the others in float32
behind Casts it inserts at load, and drops the Casts between two such ops. A value beyond
±65504 then flows on in float32 where float16 hardware (an NPU, a GPU) would make it inf.
A value asked for as an output keeps its Cast to float16, so there the overflow shows as inf.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from graphopt.option_names import from_command_line, option
from graphopt.precision_modes import OP_TYPE_ENTRY

FP16_MAX = float(np.finfo(np.float16).max)


def _half_values(graph: onnx.GraphProto) -> set[str]:
    """The float16 values `graph`'s nodes compute (those its value_info types so)."""
    typed = {v.name: v.type.tensor_type.elem_type
             for v in (*graph.value_info, *graph.output, *graph.input)}
    produced = {out for node in graph.node for out in node.output if out}
    return {name for name, elem_type in typed.items()
            if elem_type == onnx.TensorProto.FLOAT16 and name in produced}


def _cast_to(node: onnx.NodeProto) -> int | None:
    """The dtype a Cast converts to; None for any other node."""
    if node.op_type != "Cast" or node.domain not in ("", "ai.onnx"):
        return None
    return next((a.i for a in node.attribute if a.name == "to"), None)


def half_tensors(models: list[onnx.ModelProto], known: set[str] | None = None) -> dict[str, str]:
    """Each float16 value computed in `models`, by name, mapped to the name the float32
    reference gives it: its own, or, for a value ConvertPrecision renamed because a Cast back
    to float32 took over its name (a graph output `y` computed as `y_f16`), that Cast's.
    `known`, the reference's names: a value it knows by its own name keeps it, though a Cast
    back to float32 reads it (mixed-fp16's Relu output `r` before a float32 Softmax, mapped
    to the Cast's new `r_f32`, had been left out of the overflow warning)."""
    half: dict[str, str] = {}
    for model in models:
        half.update((name, name) for name in _half_values(model.graph))
        for node in model.graph.node:
            if _cast_to(node) == onnx.TensorProto.FLOAT and node.input[0] in half \
                    and (known is None or node.input[0] not in known):
                half[node.input[0]] = node.output[0]
    return half


@dataclass(frozen=True)
class HalfValue:
    """A float16 value of the candidate that the reference has no name for."""

    maker: onnx.NodeProto            # the node that computes it
    readers: tuple[str, ...]         # the names of the nodes that read it
    graph: onnx.GraphProto           # where both are, with any weights they read


def unmatched_half_values(models: list[onnx.ModelProto],
                          known: set[str]) -> dict[str, HalfValue]:
    """The float16 values of `models` (by name) that `half_tensors` maps to no name in
    `known`, the reference's: what a fusion renamed (a Conv with a BatchNormalization folded
    in, a FusedConv in place of Conv and Relu) or a pass made (ConvertPrecision's Cast of a
    float32 value into float16). Only the candidate's own run shows how they overflow."""
    unmatched: dict[str, HalfValue] = {}
    names = half_tensors(models, known)
    for model in models:
        graph = model.graph
        readers: dict[str, list[str]] = {}
        for node in graph.node:
            # An unnamed reader is kept by its op type, the other entry --keep-dtype takes.
            entry = node.name or f"{OP_TYPE_ENTRY}{node.op_type}"
            for name in node.input:
                readers.setdefault(name, []).append(entry)
        for node in graph.node:
            for out in node.output:
                if out in names and names[out] not in known and out not in unmatched:
                    unmatched[out] = HalfValue(node, tuple(readers.get(out, ())), graph)
    return unmatched


def operand_names(values: dict[str, HalfValue]) -> list[str]:
    """The computed values a run of the candidate must return to judge `values`: each, and
    the inputs of the node that makes it; of a Cast into float16, its input alone (graph
    inputs and weights are at hand, so a model whose only such values are its inputs' float16
    copies runs as it deploys). An operand an earlier partition of an .om computes counts:
    judged without it, an inf it brought in would read as made from finite operands."""
    graphs = {id(v.graph): v.graph for v in values.values()}
    produced = {out for graph in graphs.values() for node in graph.node for out in node.output
                if out}
    wanted = set()
    for name, value in values.items():
        needed = (value.maker.input[:1] if _cast_to(value.maker) == onnx.TensorProto.FLOAT16
                  else [name, *value.maker.input])
        wanted.update(n for n in needed if n in produced)
    return sorted(wanted)


# Attention masks fill with float32's lowest value (or near it) on purpose: in float16 that
# becomes -inf, which softmax takes as a zero weight. Magnitudes this large are sentinels, not
# arithmetic that overflowed.
SENTINEL = 1e30


def overflows(values: dict[str, np.ndarray]) -> list[tuple[str, float]]:
    """(name, largest |finite value|) of each array beyond float16's range, largest first
    (mask sentinels aside)."""
    found = []
    for name, array in values.items():
        array = np.asarray(array)
        if array.dtype.kind != "f" or not array.size:
            continue
        finite = np.abs(array[np.isfinite(array)], dtype=np.float64)
        peak = float(finite[finite < SENTINEL].max(initial=0.0))
        if peak > FP16_MAX:
            found.append((name, peak))
    return sorted(found, key=lambda item: -item[1])


def own_overflows(values: dict[str, HalfValue],
                  arrays: Mapping[str, np.ndarray]) -> list[tuple[str, float]]:
    """(name, largest |value|) of each of `values` that overflowed float16 in the candidate's
    run (`arrays`: its values and feeds), largest first: a Cast to float16 of a float32 value
    beyond the range (mask sentinels aside), or an infinity a node made from finite operands,
    whose peak is inf (the float16 value keeps no larger one)."""
    found = []
    for name, value in values.items():
        if _cast_to(value.maker) == onnx.TensorProto.FLOAT16:
            source = _operands(value, arrays)
            found += overflows({name: source[0]}) if source else []
        elif _holds_inf(arrays.get(name)) and _operands_finite(_operands(value, arrays)):
            found.append((name, float("inf")))
    return sorted(found, key=lambda item: -item[1])


def _operands(value: HalfValue, arrays: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The inputs of the node making `value` that are at hand: in `arrays`, or weights whose
    data the graph holds (an .om partition's large ones are beside it: left out)."""
    weights = {init.name: init for init in value.graph.initializer
               if init.data_location != onnx.TensorProto.EXTERNAL}
    return [np.asarray(arrays[n]) if n in arrays else numpy_helper.to_array(weights[n])
            for n in value.maker.input if n in arrays or n in weights]


def _holds_inf(array) -> bool:
    return array is not None and np.asarray(array).dtype.kind == "f" \
        and bool(np.isinf(array).any())


def _operands_finite(operands: list[np.ndarray]) -> bool:
    """Whether an infinity the node made is its own: every float operand finite (one that
    came in overflowed before, and is named there), and none at float16's largest magnitude,
    where ConvertPrecision clips a mask's float32 lowest value: adding to that makes the -inf
    softmax takes as a zero weight, on purpose."""
    floats = [a for a in operands if a.dtype.kind == "f" and a.size]
    return all(np.isfinite(a).all() and np.abs(a).max() < FP16_MAX for a in floats)


def makers_of(values: dict[str, HalfValue]) -> dict[str, str]:
    """The node --keep-dtype takes for each of `values` a node of the candidate makes, as the
    candidate names it; not for a Cast into float16 (`cast_readers`), nor for a graphopt::
    group, which FuseElementwise formed after the precision was chosen."""
    return {name: value.maker.name for name, value in values.items()
            if _cast_to(value.maker) != onnx.TensorProto.FLOAT16
            and value.maker.domain != "graphopt" and value.maker.name}


def cast_readers(values: dict[str, HalfValue]) -> dict[str, tuple[str, ...]]:
    """For each of `values` that is ConvertPrecision's float16 copy of a float32 value, the
    nodes that read the copy: --keep-dtype cannot name the Cast, and those nodes kept in
    float32 need no copy."""
    return {name: value.readers for name, value in values.items()
            if _cast_to(value.maker) == onnx.TensorProto.FLOAT16 and value.readers}


def overflow_note(found: list[tuple[str, float]], makers: dict[str, str] | None = None,
                  readers: dict[str, tuple[str, ...]] | None = None) -> str:
    """The warning for `found` (overflows' and own_overflows' lists); `makers` names each
    tensor's node, which is what --keep-dtype takes, and `readers` the nodes that read a
    float16 copy a Cast made, which --keep-dtype takes in its place."""
    if not found:
        return ""
    makers, readers = makers or {}, readers or {}

    def shown_one(name: str, peak: float) -> str:
        size = "inf in float16" if np.isinf(peak) else f"max {peak:.3g}"
        if makers.get(name):
            return f"{name} ({size}, node {makers[name]})"
        if readers.get(name):
            nodes = [n if n.startswith(OP_TYPE_ENTRY) else f"node {n}" for n in readers[name]]
            return f"{name} ({size}, read by {', '.join(nodes)})"
        return f"{name} ({size})"

    shown = ", ".join(shown_one(name, peak) for name, peak in found[:5])
    more = f", and {len(found) - 5} more" if len(found) > 5 else ""
    # A float16 copy is named by the nodes that read it: those are what to keep, not its Cast.
    nodes = "the nodes named" if any(readers.get(name) for name, _ in found[:5]) \
        else "the nodes that make them"
    keep = (f"{option('keep_dtype')} {nodes}" if from_command_line()
            else f"list {nodes} in {option('keep_dtype')}")
    return (f"float16 overflow: {len(found)} tensor(s) the model holds in float16 exceed "
            f"±{FP16_MAX:g} on this input: {shown}{more}. float16 hardware makes them inf; "
            f"onnxruntime's CPU provider computes many float16 ops in float32, so its outputs "
            f"need not show it. {keep}, or "
            "use a bf16 mode (float32's range) on a target with bfloat16 kernels (ascend910b; "
            "not cpu or ascend310)")
