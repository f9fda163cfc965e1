"""First-order time estimates the partitioner weighs transfers against: a roofline per node.

time(node, device) = max(work / peak(dtype), bytes moved / memory bandwidth) + launch overhead,
where work is 2·MACs for Conv/ConvTranspose/MatMul/Gemm (and the fused forms) and one operation
per output element otherwise. This only has to rank "keep this island on the NPU" against
"copy its tensors over the host link"; the tuner's cost model is the detailed one.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from graphopt.codegen.om_manifest import dtype_name
from graphopt.ir import Node, Value

if TYPE_CHECKING:
    from graphopt.partition.target import Device, Target

_MATMUL_OPS = {"MatMul", "FusedMatMul", "Gemm", "FusedGemm", "MatMulInteger", "QLinearMatMul"}
_CONV_OPS = {"Conv", "FusedConv", "ConvTranspose", "ConvInteger", "QLinearConv"}


def value_bytes(value: Value | None) -> int:
    """Bytes of a statically shaped tensor; 0 when unknown (dynamic values are not estimated)."""
    if value is None or value.dtype is None or value.static_shape is None:
        return 0
    return math.prod(value.static_shape) * max(1, value.dtype.bits // 8)


def work(node: Node) -> float:
    """Arithmetic operations of one run of `node` (multiply-adds count two)."""
    out = node.outputs[0] if node.outputs else None
    out_elems = math.prod(out.static_shape) if out is not None and out.static_shape is not None else 0
    if node.op_type in _MATMUL_OPS and len(node.inputs) >= 2:
        a = node.inputs[0]
        if a is not None and a.static_shape:
            k = a.static_shape[0] if node.op_type == "Gemm" and node.attr("transA", 0) else a.static_shape[-1]
            return 2.0 * out_elems * k
    if node.op_type in _CONV_OPS and len(node.inputs) >= 2:
        w = node.inputs[1]
        if w is not None and w.static_shape and len(w.static_shape) >= 2:
            # Conv weights are [Cout, Cin/group, k…]: each output element takes prod(w[1:]) MACs.
            # ConvTranspose weights are [Cin, Cout/group, k…]: each input element gives as many.
            per_element = math.prod(w.static_shape[1:])
            if node.op_type == "ConvTranspose":
                x = node.inputs[0]
                return 2.0 * (math.prod(x.static_shape) if x is not None and x.static_shape else 0) * per_element
            return 2.0 * out_elems * per_element
    return float(out_elems)


def node_seconds(node: Node, device: Device) -> float:
    """The roofline estimate of `node` on `device`, launch overhead included."""
    moved = sum(value_bytes(v) for v in list(node.inputs) + list(node.outputs))
    dtype = _dtype(node)
    peak = device.peak_ops_per_s.get(dtype) or max(device.peak_ops_per_s.values(), default=0.0)
    compute = work(node) / peak if peak else 0.0
    memory = moved / device.memory_bandwidth if device.memory_bandwidth else 0.0
    return max(compute, memory) + device.launch_overhead_s


def transfer_seconds(nbytes: int, target: Target) -> float:
    """One host↔device copy of `nbytes`."""
    if not target.transfer_bandwidth:
        return 0.0
    return target.transfer_latency_s + nbytes / target.transfer_bandwidth


def _dtype(node: Node) -> str:
    for value in list(node.inputs) + list(node.outputs):
        if value is not None and value.dtype is not None:
            return dtype_name(int(value.dtype)) or "float32"
    return "float32"
