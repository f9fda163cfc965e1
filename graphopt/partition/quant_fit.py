"""Whether a QuantizeLinear/DequantizeLinear node has the form that reaches an NPU, and why not.

ATC takes no QDQ node as it is: AMCT's convert_qat_model rewrites a QDQ model for it ("QAT
Model Adaptation to CANN Format"), an activation's Q into AscendQuant, a Conv/Gemm/MatMul whose
inputs are dequantized into an int8 cube kernel with its weights quantized offline, and the
dequantization of its result into AscendDequant. That rewrite takes:
  * int8 or uint8 activations quantized per tensor (AscendQuant has one scale and offset);
  * symmetric weights (zero point 0): Conv/ConvTranspose weights per tensor or per output
    channel, Gemm weights and 2-D MatMul weights per tensor ("single-input MatMul");
  * a dequantized constant only as such a weight or its bias;
  * a device with an int8 cube.
A node outside that form cannot be compiled for the NPU, so it stays on the host, with the
reason, and so does the layer whose weight it is. The partition models keep the QDQ form, which
the stand-in provider runs as it is. A graphopt:: call (a fused group) reads a value as the ops
of its body that its input feeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from graphopt.ir import Node, Value
    from graphopt.partition.target import Device

QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
# Ops whose quantized weights (input WEIGHT) AMCT stores offline, and the axis of their output
# channels (none listed: per tensor only).
_LAYERS = frozenset({"Conv", "ConvTranspose", "FusedConv", "Gemm", "MatMul"})
WEIGHT = 1
_CHANNEL_AXIS = {"Conv": 0, "FusedConv": 0, "ConvTranspose": 1}
_FORM = "AMCT's NPU form"


@dataclass(frozen=True)
class Read:
    """One read of a value: by `node`, as input `index` of `op` (the node's own op, or the op of
    a graphopt:: call's body that the call's input feeds)."""

    node: Node
    op: str
    index: int
    inner: object = None  # the body's onnx.NodeProto for a call, else None
    function: object = None  # the call's onnx.FunctionProto

    def operand(self, index: int) -> Value | None:
        """The outer value feeding input `index` of the reading op (None when it is computed
        inside the call)."""
        if self.inner is None:
            return self.node.input(index)
        names = list(self.function.input)
        name = self.inner.input[index] if index < len(self.inner.input) else ""
        return self.node.input(names.index(name)) if name in names else None


def reads(value: Value, functions: dict | None = None) -> list[Read]:
    """Every read of `value`, looking into the bodies of graphopt:: calls."""
    found = []
    for use in value.uses:
        node = use.node
        function = (functions or {}).get((node.domain, node.op_type))
        if function is None:
            found.append(Read(node, node.op_type, use.index))
            continue
        name = function.input[use.index] if use.index < len(function.input) else None
        for inner in function.node:
            for j, read in enumerate(inner.input):
                if read == name and not inner.domain:
                    found.append(Read(node, inner.op_type, j, inner, function))
    return found


def qdq_problem(node: Node, device: Device | None = None, functions: dict | None = None,
                follow: bool = True) -> str | None:
    """Why the NPU cannot take this Q/DQ node, or this layer whose weight a DequantizeLinear
    the NPU cannot take makes; None when it can, or when it is neither. With `follow`, a
    DequantizeLinear that only such layers read (their data or bias) stays on the host too:
    its int8 data crosses the link rather than its float result."""
    if node.op_type in _LAYERS:
        return _layer_problem(node, device, functions) if follow else None
    if node.op_type not in QDQ_OPS or not node.is_onnx or not node.inputs:
        return None
    if device is not None and "int8" not in (device.cube or {}):
        return (f"{node.op_type}: the {device.name} profile has no int8 cube (cube.int8), so no "
                "int8 kernels")
    data = node.inputs[0]
    if node.attr("block_size", 0):
        return f"blocked {node.op_type} (block_size): {_FORM} has one scale per tensor or channel"
    if node.op_type == "DequantizeLinear" and data.is_constant:
        problem = _constant_problem(node, functions)
        if problem:
            return problem
    if node.op_type == "DequantizeLinear" and follow:
        problem = _readers_problem(node, device, functions)
        if problem:
            return problem
    if data.is_constant:
        return None
    if not _per_tensor(node):
        return (f"{node.op_type} of %{data.name} per axis: AscendQuant and AscendDequant take "
                "one scale per activation tensor")
    if node.op_type == "DequantizeLinear":
        if data.dtype is not None and data.dtype.numpy not in (np.int8, np.uint8):
            return (f"DequantizeLinear of a {data.dtype.numpy.name} activation %{data.name}: "
                    "AscendDequant and AscendAntiQuant take int8")
        for read in reads(node.outputs[0], functions):
            if read.op in _LAYERS and read.index == WEIGHT:
                return (f"quantized activation %{data.name} as the weight of {read.op} "
                        f"{_named(read.node)}: {_FORM} quantizes only constant weights")
    return None


def _constant_problem(node: Node, functions: dict | None) -> str | None:
    weight = node.inputs[0]
    for read in reads(node.outputs[0], functions):
        op, where = read.op, f"{read.op} {_named(read.node)}"
        if op not in _LAYERS or read.index == 0:
            return (f"dequantized constant %{weight.name} read by {where}: {_FORM} quantizes "
                    "only Conv, Gemm and MatMul weights (and their biases) offline")
        if read.index != WEIGHT:
            continue  # a bias
        if op == "MatMul" and weight.shape is not None and len(weight.shape) != 2:
            return (f"{where} weight %{weight.name} has {len(weight.shape)} dims: {_FORM} "
                    "quantizes a MatMul's 2-D weight only")
        if not _per_tensor(node):
            axis = _CHANNEL_AXIS.get(op)
            rank = len(weight.shape) if weight.shape is not None else 0
            if axis is None:
                return (f"{where} weight %{weight.name} quantized per channel: {_FORM} takes "
                        "Gemm and MatMul weights per tensor")
            if node.attr("axis", 1) % max(rank, 1) != axis:
                return (f"{where} weight %{weight.name} quantized along axis "
                        f"{node.attr('axis', 1)}: {_FORM} takes one scale per output channel "
                        f"(axis {axis})")
        zero = node.input(2).constant() if node.input(2) is not None else None
        if zero is not None and np.any(zero):
            return (f"{where} weight %{weight.name} has a non-zero zero point: {_FORM} "
                    "quantizes weights symmetrically")
    return None


def _layer_problem(node: Node, device: Device | None, functions: dict | None) -> str | None:
    """A Conv/Gemm/MatMul whose weight comes from a DequantizeLinear the NPU cannot take stays
    on the host with it: its weight would cross the link at every run."""
    w = node.input(WEIGHT)
    producer = w.producer if w is not None else None
    if producer is None or producer.op_type != "DequantizeLinear" or not producer.is_onnx:
        return None
    problem = qdq_problem(producer, device, functions, follow=False)
    return f"its weight's DequantizeLinear stays on the host: {problem}" if problem else None


def _readers_problem(node: Node, device: Device | None, functions: dict | None) -> str | None:
    """The reason the layers reading a DequantizeLinear's result as data or bias stay on the
    host, when all of them do (None otherwise)."""
    found = reads(node.outputs[0], functions)
    if not found or node.outputs[0].is_graph_output or any(
            read.inner is not None or read.op not in _LAYERS or read.index == WEIGHT
            for read in found):
        return None
    problems = [_layer_problem(read.node, device, functions) for read in found]
    if not all(problems):
        return None
    return f"read only by layers that stay on the host ({problems[0]})"


def _named(node: Node) -> str:
    """'name', or the node's first output for an unnamed one."""
    return repr(node.name) if node.name else f"(output %{node.outputs[0].name})"


def _per_tensor(node: Node) -> bool:
    scale: Value | None = node.input(1)
    if scale is None or scale.shape is None:
        return False
    size = 1
    for dim in scale.shape:
        if dim is None:
            return False
        size *= dim
    return size == 1
