"""Whether a QuantizeLinear/DequantizeLinear node has the form that reaches an NPU, and why not.

ATC takes no QDQ node as it is: AMCT's convert_qat_model rewrites a QDQ model for it ("QAT
Model Adaptation to CANN Format"), an activation's Q into AscendQuant, a Conv/Gemm/MatMul whose
inputs are dequantized into an int8 cube kernel with its weights quantized offline, and the
dequantization of its result into AscendDequant. That rewrite takes:
  * activations quantized per tensor (AscendQuant has one scale and offset);
  * Conv/ConvTranspose weights per tensor or per output channel, Gemm and MatMul weights per
    tensor, and a MatMul only with a constant weight ("single-input MatMul");
  * a dequantized constant only as such a weight or its bias.
A node outside that form cannot be compiled for the NPU, so it stays on the host, with the
reason. The partition models keep the QDQ form, which the stand-in provider runs as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from graphopt.ir import Node, Value

QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
# Ops whose quantized weights AMCT stores offline, with the input index of their weight.
_WEIGHT_READERS = {"Conv": 1, "ConvTranspose": 1, "FusedConv": 1, "Gemm": 1, "MatMul": 1}
_PER_CHANNEL_OK = frozenset({"Conv", "ConvTranspose", "FusedConv"})
_FORM = "AMCT's NPU form"


def qdq_problem(node: Node) -> str | None:
    """Why the NPU cannot take this Q/DQ node (None when it can, or when it is no Q/DQ node)."""
    if node.op_type not in QDQ_OPS or not node.is_onnx or not node.inputs:
        return None
    data = node.inputs[0]
    if node.attr("block_size", 0):
        return f"blocked {node.op_type} (block_size): {_FORM} has one scale per tensor or channel"
    if node.op_type == "DequantizeLinear" and data.is_constant:
        return _constant_problem(node)
    if not _per_tensor(node):
        return (f"{node.op_type} of %{data.name} per axis: AscendQuant and AscendDequant take "
                "one scale per activation tensor")
    if node.op_type == "DequantizeLinear":
        for use in node.outputs[0].uses:
            if _WEIGHT_READERS.get(use.node.op_type) == use.index:
                return (f"quantized activation %{data.name} as the weight of "
                        f"{use.node.op_type} {_named(use.node)}: {_FORM} quantizes a "
                        "MatMul only with a constant weight")
    return None


def _constant_problem(node: Node) -> str | None:
    weight = node.inputs[0]
    for use in node.outputs[0].uses:
        reader, op = use.node, use.node.op_type
        if op not in _WEIGHT_READERS or use.index == 0:
            return (f"dequantized constant %{weight.name} read by {reader.qualified_op} "
                    f"{_named(reader)}: {_FORM} quantizes only Conv, Gemm and MatMul weights "
                    "(and their biases) offline")
        if use.index == _WEIGHT_READERS[op] and op not in _PER_CHANNEL_OK \
                and not _per_tensor(node):
            return (f"{op} {_named(reader)} weight %{weight.name} quantized per channel: "
                    f"{_FORM} takes Gemm and MatMul weights per tensor")
    return None


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
