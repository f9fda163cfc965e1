r"""Estimated times of NPU vector kernels, fused elementwise groups and host↔device copies.

Units: seconds; bytes; every figure an estimate. For a vector kernel:

    vector_rate  = VECTOR_BYTES_PER_CYCLE / element bytes · clock_hz · ai_cores   elements/s
                   (the DaVinci vector unit is 2048 bits wide — 256 bytes, 128 float16 or
                   64 float32 lanes per cycle per AI core: Liao et al., "DaVinci: A Scalable
                   Architecture for Neural Network Computing", Hot Chips 31, 2019)
    compute      = Σ_ops output elements · OP_COST[op] / vector_rate
                   (OP_COST: vector instructions per element, 1 for arithmetic, more for
                   transcendental and normalising ops: estimates)
    memory       = bytes read from and written to GM / device.memory_bandwidth
                   (a Gather or Slice reads the elements it writes, not its whole input)
    seconds      = max(compute, memory) + device.launch_overhead_s         (one kernel)

An Einsum, an LSTM or GRU, a fused attention kernel and a weight-only quantized GEMM
(MatMulNBits) put their multiply-adds on the cube, at its peak and untiled (einsum.py,
recurrent.py, attention.py); an attention's online softmax, and the GEMM's dequantizing of its
weights, run on the vector unit beside them.

Quantization (the QDQ form AMCT converts, partition/quant_fit.py): a DequantizeLinear of a
weight costs nothing (quantized offline), nor does one that only int8 cube kernels read (they
read the 8-bit data and dequantize their own result in their epilogue); any other is an
AscendAntiQuant vector kernel. A QuantizeLinear of a computed value runs in the UB epilogue of
the kernel before it, as ATC fuses AscendQuant: its compute and its int8 output, no launch.

A fused group (a graphopt:: call made by FuseElementwise, or a list of nodes) is one kernel:
its intermediates stay in the Unified Buffer, so `memory` counts only the values it reads from
outside and the values read after it (graph outputs included), and it pays one launch. A group
with a Conv/MatMul/Gemm kernel (FuseElementwise(epilogues=True)) costs that cube kernel
(npu_model.estimate, under the tiling of its signature, as a lone one: the default unless the
knowledge base has one) plus its epilogue's vector compute and the extra inputs
the epilogue reads. A host↔device copy: transfer_latency_s + bytes / transfer_bandwidth.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import onnx

from graphopt.partition.estimate import bytes_moved, value_bytes
from graphopt.partition.quant_fit import qdq_problem, reads
from graphopt.tuner.attention import AttentionWork, attention_work
from graphopt.tuner.einsum import einsum_macs
from graphopt.tuner.npu_model import Estimate, estimate
from graphopt.tuner.recurrent import GATE_COST, RecurrentWork, recurrent_work
from graphopt.tuner.tiling import (ANCHORS_OF_GROUPS, CUBE_OPS, dequantized_8bit,
                                   group_anchor_shape)

if TYPE_CHECKING:
    from graphopt.ir import Model, Node, Value
    from graphopt.partition.target import Device, Target
    from graphopt.tuner.tiling import Tiling

VECTOR_BYTES_PER_CYCLE = 256
OP_COST = {  # vector instructions per output element (estimates)
    "Exp": 4, "Log": 4, "Sqrt": 2, "Reciprocal": 2, "Div": 2, "Pow": 6, "Tanh": 6,
    "Sigmoid": 5, "Erf": 8, "Gelu": 10, "FastGelu": 8, "QuickGelu": 6, "BiasGelu": 10,
    "HardSigmoid": 2, "HardSwish": 3, "Softplus": 8, "Selu": 5, "Elu": 5, "Sin": 6, "Cos": 6,
    "Softmax": 8, "LogSoftmax": 10, "LayerNormalization": 8, "SkipLayerNormalization": 9,
    "RMSNormalization": 6, "SimplifiedLayerNormalization": 6, "BatchNormalization": 2,
    # Series or exp/log/sqrt compositions, as Tanh and Sin are (estimates).
    "Tan": 8, "Asin": 8, "Acos": 8, "Atan": 8, "Asinh": 8, "Acosh": 8, "Atanh": 8,
    "Sinh": 6, "Cosh": 6,
    # Four taps and their weights per output element (bilinear); RoiAlign's bins average
    # about four such samples each (sampling_ratio 0 takes ceil(roi size / output size)).
    "GridSample": 8, "RoiAlign": 32,
}
# Views of their input, and Constant, which onnxruntime turns into an initializer at load.
NO_KERNEL = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Constant"})


def elements(value: Value | None) -> int:
    if value is None or value.static_shape is None:
        return 0
    return math.prod(value.static_shape)


def _elem_bytes(values) -> int:
    for value in values:
        if value is not None and value.dtype is not None:
            return max(1, value.dtype.bits // 8)
    return 4


def vector_rate(device: Device, elem_bytes: int) -> float:
    """Elements per second the vector units of all AI cores process (estimate)."""
    return (VECTOR_BYTES_PER_CYCLE / max(1, elem_bytes) * (device.clock_hz or 1e9)
            * (device.ai_cores or 1))


def _result(compute: float, moved: int, device: Device, kernels: int = 1, **extra) -> Estimate:
    memory = moved / device.memory_bandwidth if device.memory_bandwidth else 0.0
    busy = max(compute, memory)
    seconds = busy + kernels * device.launch_overhead_s
    breakdown = {"compute_s": compute, "memory_s": memory, "bytes": moved,
                 "launch_s": kernels * device.launch_overhead_s,
                 "bound": "memory" if memory >= compute else "compute", **extra}
    return Estimate(busy * (device.clock_hz or 0.0), seconds, breakdown)


def vector_estimate(node: Node, device: Device, functions: dict | None = None) -> Estimate:
    """One vector kernel: elementwise, normalisation, pooling, data movement ops (`functions`:
    the model's, by (domain, name), to see which ops of a fused group read the node)."""
    if node.op_type in NO_KERNEL:
        return Estimate(0.0, 0.0, {"bound": "none", "note": "a view or a constant, no kernel"})
    absorbed = _absorbed_dequantize(node, functions)
    if absorbed:
        return Estimate(0.0, 0.0, {"bound": "none", "note": absorbed})
    if _fused_quantize(node):
        data = node.inputs[0]
        compute = elements(data) / vector_rate(device, _elem_bytes([data]))
        return _result(compute, value_bytes(node.outputs[0]), device, kernels=0,
                       note="AscendQuant in the UB epilogue of the kernel before it")
    outs = [v for v in node.outputs if v is not None]
    ins = [v for v in node.inputs if v is not None]
    recurrent = recurrent_work(node)
    if recurrent is not None:
        return _recurrent_estimate(node, recurrent, device, _elem_bytes(outs + ins))
    macs = einsum_macs(node)
    if macs is not None:
        return _result(2 * macs / _cube_peak(device), bytes_moved(node), device,
                       note="BatchMatMul on the cube at its peak (einsum.py), untiled")
    attention = attention_work(node)
    if attention is not None:
        return _attention_estimate(node, attention, device, _elem_bytes(outs + ins))
    if node.op_type == "MatMulNBits" and node.domain == "com.microsoft":
        return _weight_only_estimate(node, device)
    work = max((elements(v) for v in outs), default=0) * OP_COST.get(node.op_type, 1)
    compute = work / vector_rate(device, _elem_bytes(outs + ins))
    return _result(compute, bytes_moved(node), device)


def _recurrent_estimate(node: Node, work: RecurrentWork, device: Device,
                        elem_bytes: int) -> Estimate:
    """An LSTM or GRU (recurrent.py): each step's GEMM on the cube at its peak rate, its rows
    padded to the cube's 16 (a batch of 1 fills a sixteenth of it), then the gates on the
    vector unit; one kernel."""
    rows = -(-work.batch // 16) * 16
    cube = 2 * work.steps * rows * work.k * work.n / _cube_peak(device)
    gates = work.gate_elements * GATE_COST / vector_rate(device, elem_bytes)
    return _result(cube + gates, bytes_moved(node), device, recurrent_steps=work.steps)


def _attention_estimate(node: Node, work: AttentionWork, device: Device,
                        elem_bytes: int) -> Estimate:
    """A flash attention kernel (CANN's FusedInferAttentionScore, attention.py's work): Q·Kᵀ
    and P·V on the cube at its peak, each head's queries, keys and head sizes padded to the
    cube's 16, the blocks a causal mask hides skipped; the online softmax over the scored
    pairs on the vector unit, overlapping the cube; the scores stay on chip, so the kernel
    reads and writes its inputs and outputs once."""
    padded = _padded_to_cube
    share = work.causal_pairs / work.pairs if work.pairs else 1.0
    rows = work.batch * work.heads * padded(work.queries) * padded(work.keys) * share
    macs = rows * (padded(work.head_size) + padded(work.value_head_size)) \
        + work.projection_macs
    cube = 2 * macs / _cube_peak(device)
    softmax = work.causal_pairs * OP_COST["Softmax"] / vector_rate(device, elem_bytes)
    return _result(max(cube, softmax), bytes_moved(node), device, cube_s=cube,
                   softmax_s=softmax, note="flash attention: the cube at its peak, untiled")


def _weight_only_estimate(node: Node, device: Device) -> Estimate:
    """A weight-only quantized GEMM (CANN's WeightQuantBatchMatmulV2 for MatMulNBits): the
    vector unit dequantizes each weight once (a multiply and an add) into the cube's float16
    operand, the cube multiplies at its peak with M, K and N padded to its 16; memory is the
    packed weights, their scales and the activations, read once. One token's GEMM reads its
    4-bit weights: the bytes, not the cube, bound it."""
    padded = _padded_to_cube
    a = node.inputs[0].static_shape if node.inputs and node.inputs[0] is not None else None
    k, n = node.attr("K"), node.attr("N")
    if a is None or not k or not n:
        return _result(0.0, bytes_moved(node), device)
    rows = math.prod(a[:-1])
    cube = 2 * padded(rows) * padded(k) * padded(n) / _cube_peak(device)
    dequantize = 2 * k * n / vector_rate(device, 2)
    return _result(max(cube, dequantize), bytes_moved(node), device, cube_s=cube,
                   dequantize_s=dequantize, note="weight-only int GEMM: the cube at its peak")


def _padded_to_cube(n: int) -> int:
    """`n` rounded up to the cube's 16 (the side of every fractal it computes on)."""
    return -(-n // 16) * 16


def _cube_peak(device: Device) -> float:
    """The cube's float16 rate, else the device's largest (the schema requires one)."""
    peaks = device.peak_ops_per_s or {}
    return peaks.get("float16") or max(peaks.values(), default=0.0) or float("inf")


def _fused_quantize(node: Node) -> bool:
    """Whether a QuantizeLinear runs as AscendQuant inside the kernel that computes its input:
    ATC fuses it into that kernel's UB epilogue (CANN's UB fusion patterns:
    TbeEltwiseQuantFusionPass for elementwise producers, TbeConv2DAddMulQuantPass and the
    MatMul/BatchMatMul quant passes for cube ones), so it reads nothing back from GM and pays
    no launch."""
    if node.op_type != "QuantizeLinear" or not node.is_onnx or not node.inputs:
        return False
    value = node.inputs[0]
    producer = value.producer
    # Through views (a classifier's Flatten before its quantized Gemm): they move no data,
    # so the kernel before them quantizes in its epilogue and the view reads int8. Only where
    # nothing else reads the float values on the way, which that kernel must then write too.
    while producer is not None and producer.op_type in NO_KERNEL - {"Constant"} \
            and len(value.uses) == 1 and not value.is_graph_output and producer.inputs:
        value = producer.inputs[0]
        producer = value.producer
        if value.is_graph_output or len(value.uses) != 1:
            return False
    return producer is not None and producer.op_type not in NO_KERNEL


def _absorbed_dequantize(node: Node, functions: dict | None = None) -> str | None:
    """Why a DequantizeLinear is no kernel of its own on the NPU (None when it is one, an
    AscendAntiQuant): a constant's is done offline, and an int8 cube kernel reads the 8-bit
    data of the one before it and dequantizes its own result (AscendDequant, its epilogue),
    also when a fused group's anchor is that kernel."""
    if node.op_type != "DequantizeLinear" or not node.is_onnx or not node.inputs:
        return None
    if node.inputs[0].is_constant:
        return "a quantized weight, stored as int8 offline"
    out = node.outputs[0]
    found = reads(out, functions)
    if found and not out.is_graph_output and all(
            read.op in CUBE_OPS and read.index in (0, 1)
            and dequantized_8bit(read.operand(1 - read.index))
            and (read.inner is not None or not qdq_problem(read.node)) for read in found):
        return "read as int8 by the cube kernels after it"
    return None


def group_estimate(nodes: list[Node] | Node, device: Device, model: Model | None = None,
                   tiling: Tiling | None = None) -> Estimate:
    """One fused kernel for `nodes` (its intermediates never reach GM), or for a graphopt::
    function call (`model` supplies the function body; `tiling`, that of the cube kernel
    heading it, the default tiling when None)."""
    if not isinstance(nodes, (list, tuple)):
        nodes = [nodes]
    if len(nodes) == 1 and model is not None:
        function = {(f.domain, f.name): f for f in model.functions}.get(
            (nodes[0].domain, nodes[0].op_type))
        if function is not None:
            return _call_estimate(nodes[0], function, device, tiling)
    members = set(nodes)
    reads, writes, work = [], [], 0.0
    for node in nodes:
        for value in node.inputs:
            if value is not None and value.producer not in members and value not in reads:
                reads.append(value)
        for value in node.outputs:
            if value is not None and (value.is_graph_output
                                      or any(use.node not in members for use in value.uses)):
                writes.append(value)
        work += max((elements(v) for v in node.outputs if v is not None), default=0) \
            * OP_COST.get(node.op_type, 1)
    all_values = [v for n in nodes for v in n.outputs if v is not None] + reads
    compute = work / vector_rate(device, _elem_bytes(all_values))
    return _result(compute, sum(value_bytes(v) for v in reads + writes), device,
                   fused_nodes=len(nodes))


def _call_estimate(call: Node, function: onnx.FunctionProto, device: Device,
                   tiling: Tiling | None = None) -> Estimate:
    ins = [v for v in call.inputs if v is not None]
    outs = [v for v in call.outputs if v is not None]
    elems = max((elements(v) for v in outs), default=0)
    anchor = next((n for n in function.node if n.op_type in ANCHORS_OF_GROUPS and not n.domain), None)
    epilogue = [n for n in function.node if n is not anchor]
    work = elems * sum(OP_COST.get(n.op_type, 1) for n in epilogue)
    compute = work / vector_rate(device, _elem_bytes(outs + ins))
    if anchor is None:
        return _result(compute, sum(value_bytes(v) for v in ins + outs), device,
                       fused_nodes=len(function.node))
    # The cube kernel reads its own operands; the epilogue adds the other inputs it reads.
    by_name = dict(zip(function.input, call.inputs))
    a, b = by_name.get(anchor.input[0]), by_name.get(anchor.input[1])
    _, shape = group_anchor_shape(call, function)
    cube = estimate(shape, tiling, device)
    bias = by_name.get(anchor.input[2]) if len(anchor.input) > 2 else None
    extra = [v for v in ins if v is not a and v is not b and v is not bias]
    extra_s = sum(value_bytes(v) for v in extra) / device.memory_bandwidth
    seconds = cube.seconds + compute + extra_s
    breakdown = dict(cube.breakdown, epilogue_compute_s=compute, epilogue_extra_bytes_s=extra_s,
                     fused_nodes=len(function.node))
    return Estimate(cube.cycles + (compute + extra_s) * device.clock_hz, seconds, breakdown)


def transfer_estimate(nbytes: int, target: Target) -> Estimate:
    """One host↔device copy of `nbytes` over the target's link."""
    if not target.transfer_bandwidth:
        return Estimate(0.0, 0.0, {"bytes": nbytes, "note": "single-device target"})
    seconds = target.transfer_latency_s + nbytes / target.transfer_bandwidth
    return Estimate(0.0, seconds, {"bytes": nbytes, "latency_s": target.transfer_latency_s,
                                   "bandwidth_s": nbytes / target.transfer_bandwidth})
