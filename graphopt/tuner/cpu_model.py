"""The CPU cost model: a roofline per node with constants per op class, calibrated or defaulted.

    seconds(node) = max(flops / peak(class), bytes / bandwidth(class)) + overhead(class)

Flops and bytes come from static shapes (`node_work`). The classes group ops that run on the same
kind of kernel, so one measured kernel speaks for its class:

    gemm         MatMul, Gemm, FusedMatMul, FusedGemm…                 2·M·N·K flops
                 Attention, MultiHeadAttention, GroupQueryAttention:   2·MACs of every
                 query-key pair, masked or not (attention.py)
                 LSTM, GRU: a GEMM per time step (recurrent.py)        2·MACs + the gates
    conv         Conv, FusedConv, com.microsoft.nchwc::Conv…           2·outputs·(Cin/g·kh·kw)
    gemm_int8    QLinearMatMul, MatMulInteger…, a QDQ MatMul/Gemm      as gemm, on 8-bit data
    conv_int8    QLinearConv, ConvInteger, a QDQ Conv                  as conv, on 8-bit data
    elementwise  Add, Relu, Gelu, Cast, Where…                         one op per output element
    reduction    Softmax, LayerNormalization, ReduceMean, pooling…     a few ops per input element
    movement     Transpose, Concat, Gather, Slice, NCHWc reorders…     no flops, bytes moved
    view         Reshape, Squeeze, Flatten, Identity…                  free: overhead only

Bytes are every input and output a kernel touches once (Gather and Slice read only what they
output, not their whole data input). Unknown ops count as elementwise.

A QDQ Conv, MatMul or Gemm (both its data and its weight dequantized from 8-bit integers) is what
onnxruntime fuses into QLinearConv or QLinearMatMul at session creation, so it is priced as that
kernel: an int8 class, its bytes those of the integer tensors (a QDQ Add or Mul, fused into
QLinearAdd or QLinearMul, likewise stays elementwise on the integer bytes). The DequantizeLinear
and QuantizeLinear the fusion absorbs cost nothing: they run as no kernel of their own. int8
kernels are a class of their own because MLAS runs them about twice as fast as float32 on AVX2.

The defaults are the `cpu` target profile's figures; `graphopt calibrate` measures this machine's
(graphopt.tuner.calibrate).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace

import numpy as np

from graphopt.ir import Model, Node, Value
from graphopt.partition.estimate import PARTIAL_READ, bytes_moved, value_bytes
from graphopt.tuner.attention import ATTENTION_OPS, attention_work
from graphopt.tuner.einsum import einsum_macs
from graphopt.tuner.recurrent import GATE_COST, GATES, recurrent_work

OP_CLASSES = ("gemm", "conv", "gemm_int8", "conv_int8", "elementwise", "reduction", "movement",
              "view")
INT8_CLASSES = {"gemm_int8": "gemm", "conv_int8": "conv"}  # int8 class → its float class

# MatMulNBits dequantizes its 4-bit weights and multiplies in float: a float gemm.
_GEMM = {"MatMul", "Gemm", "FusedMatMul", "FusedGemm", "MatMulNBits", "Attention",
         "MultiHeadAttention", "GroupQueryAttention", "Einsum"}
_CONV = {"Conv", "FusedConv", "ConvTranspose"}
_GEMM_INT8 = {"MatMulInteger", "QLinearMatMul", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
              "QGemm"}
_CONV_INT8 = {"ConvInteger", "QLinearConv"}
_QDQ_FUSABLE = {"Conv": "conv_int8", "MatMul": "gemm_int8", "Gemm": "gemm_int8"}
# Binary ops onnxruntime fuses the same way when their output is requantized (QLinearAdd…).
_QDQ_BINARY = {"Add", "Mul"}
# Ops per input element, roughly as the kernels do them (Softmax: max, exp, sum, divide).
_REDUCTION = {"Softmax": 4, "LogSoftmax": 4, "LayerNormalization": 8,
              "SimplifiedLayerNormalization": 6, "SkipLayerNormalization": 9,
              "SkipSimplifiedLayerNormalization": 7, "BatchNormalization": 2,
              "InstanceNormalization": 8, "GroupNormalization": 8,
              "ReduceMean": 1, "ReduceSum": 1, "ReduceMax": 1, "ReduceMin": 1, "ReduceProd": 1,
              "ReduceL2": 2, "ReduceSumSquare": 2, "ReduceLogSumExp": 3, "ArgMax": 1, "ArgMin": 1,
              "GlobalAveragePool": 1, "GlobalMaxPool": 1, "AveragePool": 1, "MaxPool": 1,
              "LpNormalization": 3, "CumSum": 1, "TopK": 2}
_POOLS = {"AveragePool", "MaxPool"}  # ops per output element = kernel window
_MOVEMENT = {"Transpose", "Concat", "Split", "Gather", "GatherElements", "GatherND", "Slice",
             "Expand", "Tile", "Pad", "Resize", "Upsample", "DepthToSpace", "SpaceToDepth",
             "ScatterND", "ScatterElements", "ReorderInput", "ReorderOutput", "Compress",
             "OneHot", "Trilu", "ReverseSequence", "NonZero", "GatherBlockQuantized"}
_VIEW = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Shape", "Size", "Constant",
         "Dropout"}


def op_class(node: Node) -> str:
    """The class whose constants price `node` (one of OP_CLASSES)."""
    op = node.op_type
    if op in _GEMM or (op in GATES and node.is_onnx):
        return "gemm" if not _qdq_int8(node) else "gemm_int8"
    if op in _CONV:
        return "conv" if not _qdq_int8(node) else "conv_int8"
    if op in _GEMM_INT8:
        return "gemm_int8"
    if op in _CONV_INT8:
        return "conv_int8"
    if op in _REDUCTION:
        return "reduction"
    if op in _MOVEMENT:
        return "movement"
    if op in _VIEW:
        return "view"
    return "elementwise"


def _int8_source(value: Value | None) -> Value | None:
    """The 8-bit integer tensor `value` is dequantized from, if a DequantizeLinear makes it."""
    producer = value.producer if value is not None else None
    if producer is None or producer.op_type != "DequantizeLinear" or not producer.inputs:
        return None
    source = producer.inputs[0]
    return source if source.dtype is not None and source.dtype.numpy.itemsize == 1 \
        and source.dtype.numpy.kind in "iu" else None


def _qdq_int8(node: Node) -> bool:
    """A Conv/MatMul/Gemm whose data and weight both come dequantized from 8-bit integers, or
    an Add/Mul of two such tensors whose sum is requantized: onnxruntime's QDQ selectors run it
    as QLinearConv, QLinearMatMul, QLinearAdd or QLinearMul."""
    binary = node.op_type in _QDQ_BINARY and node.is_onnx
    if not (node.op_type in _QDQ_FUSABLE or binary) or len(node.inputs) < 2:
        return False
    if not all(_int8_source(v) is not None for v in node.inputs[:2]):
        return False
    return not binary or (node.outputs[0] is not None and _requantized(node.outputs[0]) is not None)


def _requantized(value: Value) -> Value | None:
    """The QuantizeLinear output `value` is requantized into, when that is its only reader."""
    readers = value.consumers()
    if len(readers) == 1 and readers[0].op_type == "QuantizeLinear" and not value.is_graph_output:
        return readers[0].outputs[0]
    return None


def fused_away(node: Node) -> bool:
    """A DequantizeLinear or QuantizeLinear that onnxruntime folds into the int8 kernel beside
    it (every reader of the DequantizeLinear is a QDQ int8 op, or the QuantizeLinear requantizes
    one's output): no kernel of its own runs."""
    if node.op_type == "DequantizeLinear" and node.outputs and node.outputs[0] is not None:
        out = node.outputs[0]
        readers = out.consumers()
        return bool(readers) and not out.is_graph_output and all(map(_qdq_int8, readers)) \
            and _int8_source(out) is not None
    if node.op_type == "QuantizeLinear" and node.inputs:
        producer = node.inputs[0].producer
        return producer is not None and _qdq_int8(producer) \
            and _requantized(node.inputs[0]) is not None
    return False


def node_work(node: Node) -> tuple[float, float]:
    """(flops, bytes) of one run of `node` from static shapes; unknown shapes count as 0."""
    cls = op_class(node)
    if cls == "view" or fused_away(node):
        return 0.0, 0.0
    ins = [v for v in node.inputs if v is not None]
    outs = [v for v in node.outputs if v is not None]
    out_elems = _elems(outs[0]) if outs else 0
    if node.op_type in PARTIAL_READ and ins:
        moved = bytes_moved(node)
    elif _qdq_int8(node):
        # The fused kernel reads the integer tensors and writes the requantized output.
        moved = sum(value_bytes(_int8_source(v) or v) for v in ins) \
            + sum(value_bytes(_requantized(v) or v) for v in outs)
    else:
        moved = sum(value_bytes(v) for v in ins + outs)
    recurrent = recurrent_work(node)
    if recurrent is not None:  # a GEMM per time step, priced as gemm (recurrent.py)
        flops = 2 * recurrent.macs + GATE_COST * recurrent.gate_elements
    elif node.op_type == "Einsum":  # its contraction (einsum.py); unknown shapes count 0
        flops = 2 * (einsum_macs(node) or 0)
    elif cls in ("gemm", "gemm_int8"):
        flops = _gemm_flops(node, out_elems)
    elif cls in ("conv", "conv_int8"):
        flops = _conv_flops(node, out_elems)
    elif cls == "reduction":
        if node.op_type in _POOLS:
            flops = out_elems * math.prod(node.attr("kernel_shape", ()) or (1,))
        else:
            flops = _REDUCTION[node.op_type] * (_elems(ins[0]) if ins else 0)
    elif cls == "movement":
        flops = 0
    elif node.op_type == "STFT":
        flops = _stft_flops(node, out_elems)
    else:
        flops = out_elems
    return float(flops), float(moved)


def _stft_flops(node: Node, out_elems: int) -> int:
    """onnxruntime's STFT: a radix-2 FFT of each frame for a power-of-two frame length N
    (~5·N·log₂N flops a frame), a plain DFT otherwise (a multiply-add of two reals for each
    sample and bin). Priced as one op an output element, a keyword spotter's 400-sample STFT
    was estimated at 9 µs of its 2.5 ms."""
    window = _shape(node, 2) if len(node.inputs) > 2 else None
    length = node.input(3).constant() if len(node.inputs) > 3 and node.input(3) is not None \
        else None
    frame = window[0] if window else int(length.reshape(-1)[0]) if length is not None \
        and length.size == 1 else 0
    out = node.outputs[0].static_shape if node.outputs and node.outputs[0] is not None else None
    if frame < 2 or not out or len(out) != 4:
        return out_elems
    if frame & (frame - 1) == 0:
        return 5 * out[0] * out[1] * frame * int(math.log2(frame))
    return 2 * out_elems * frame


def _elems(value: Value | None) -> int:
    shape = value.static_shape if value is not None else None
    return math.prod(shape) if shape is not None else 0


def _shape(node: Node, index: int) -> tuple[int, ...] | None:
    value = node.input(index) if index < len(node.inputs) else None
    return value.static_shape if value is not None else None


def _gemm_flops(node: Node, out_elems: int) -> int:
    op = node.op_type
    if op in ATTENTION_OPS:  # onnxruntime's CPU kernels score every pair and mask them
        work = attention_work(node)
        return 2 * work.macs() if work is not None else 0
    # QLinearMatMul's inputs are (a, a_scale, a_zero_point, b, …).
    a, b = _shape(node, 0), _shape(node, 1 if op != "QLinearMatMul" else 3)
    if not a or not b:
        return 0
    if op == "Gemm" or op == "FusedGemm":
        k = a[0] if node.attr("transA", 0) else a[-1]
    elif op == "FusedMatMul":
        k = a[-2] if node.attr("transA", 0) and len(a) >= 2 else a[-1]
    else:
        k = a[-1]
    return 2 * out_elems * k


def _conv_flops(node: Node, out_elems: int) -> int:
    w = _shape(node, 1 if node.op_type != "QLinearConv" else 3)
    if not w or len(w) < 2:
        return 0
    # Conv weights are [Cout, Cin/group, k…]: each output element takes prod(w[1:]) MACs
    # (the NCHWc forms keep 4-D padded weights, so the padded work is what is counted).
    # ConvTranspose weights are [Cin, Cout/group, k…]: each input element gives as many.
    if node.op_type == "ConvTranspose":
        x = node.input(0)
        return 2 * _elems(x) * math.prod(w[1:])
    return 2 * out_elems * math.prod(w[1:])


@dataclass(frozen=True)
class ClassConstants:
    """One op class's roofline: peak arithmetic, memory bandwidth, fixed cost per node."""

    peak_gflops: float
    bandwidth_gbs: float
    overhead_us: float

    def to_json(self) -> dict:
        return asdict(self)


def default_constants(device=None) -> dict[str, ClassConstants]:
    """Every class at the `cpu` target profile's figures (or `device`'s): float32 peak (int8
    peak for the int8 classes), memory bandwidth and launch overhead. Views cost only the
    overhead whatever the figures."""
    if device is None:
        from graphopt.partition.target import load_target
        device = load_target("cpu").device("cpu")
    peak = device.peak_ops_per_s.get("float32") or max(device.peak_ops_per_s.values())
    base = ClassConstants(peak / 1e9, device.memory_bandwidth / 1e9,
                          device.launch_overhead_s * 1e6)
    int8 = replace(base, peak_gflops=int8_speedup(device) * base.peak_gflops)
    return {cls: int8 if cls in INT8_CLASSES else base for cls in OP_CLASSES}


def int8_speedup(device=None) -> float:
    """How much faster than float32 a device profile says its int8 arithmetic is (1 when it
    gives no int8 figure)."""
    if device is None:
        from graphopt.partition.target import load_target
        device = load_target("cpu").device("cpu")
    fp32, int8 = device.peak_ops_per_s.get("float32"), device.peak_ops_per_s.get("int8")
    return int8 / fp32 if fp32 and int8 else 1.0


class CpuCostModel:
    """Seconds per node and per model on this CPU. `constants` maps op classes to their
    ClassConstants; missing classes take the `cpu` profile's defaults."""

    def __init__(self, constants: Mapping[str, ClassConstants] | None = None):
        unknown = sorted(set(constants or {}) - set(OP_CLASSES))
        if unknown:
            raise ValueError(f"unknown op class {', '.join(unknown)} "
                             f"(classes: {', '.join(OP_CLASSES)})")
        self.constants = {**default_constants(), **dict(constants or {})}

    def node_seconds(self, node: Node, functions: Mapping | None = None) -> float:
        """`node`'s seconds; `functions` ((domain, name) -> FunctionProto, the model's) prices a
        call of one (an -O3 elementwise group) as its body (_call_seconds)."""
        if fused_away(node):
            return 0.0
        function = functions.get((node.domain, node.op_type)) if functions else None
        if function is not None:
            return self._call_seconds(node, function)
        flops, moved = node_work(node)
        return self._roofline(op_class(node), flops, moved)

    def _roofline(self, cls: str, flops: float, moved: float) -> float:
        c = self.constants[cls]
        compute = flops / (c.peak_gflops * 1e9) if c.peak_gflops > 0 else 0.0
        memory = moved / (c.bandwidth_gbs * 1e9) if c.bandwidth_gbs > 0 else 0.0
        return max(compute, memory) + c.overhead_us * 1e-6

    def _call_seconds(self, call: Node, function) -> float:
        """A call of a model-local function as onnxruntime runs it: it inlines the body, so each
        op is a kernel of its own over the call's output size (its intermediates go through
        memory), and a cube op heading the group (an epilogue group) is that GEMM or conv. Priced
        as one elementwise op, a group of 24 ops read 24 times cheaper on the host than the NPU
        pricing its body, and the partitioner sent it there."""
        from graphopt.tuner.tiling import ANCHORS_OF_GROUPS, CONV_OPS, group_anchor_shape

        outs = [v for v in call.outputs if v is not None]
        elems = max((_elems(v) for v in outs), default=0)
        itemsize = outs[0].dtype.numpy.itemsize if outs and outs[0].dtype is not None else 4
        by_name = dict(zip(function.input, call.inputs))

        def size(name: str) -> float:  # a call input's own bytes; an intermediate's, the call's
            value = by_name.get(name)
            return value_bytes(value) if value is not None else elems * itemsize

        anchor = next((n for n in function.node
                       if n.op_type in ANCHORS_OF_GROUPS and not n.domain), None)
        seconds = 0.0
        for inner in function.node:
            moved = sum(size(name) for name in inner.input if name) \
                + elems * itemsize * len([name for name in inner.output if name])
            if inner is anchor:
                try:
                    found = group_anchor_shape(call, function)
                except ValueError:  # no static operands: its work is unknown, as node_work's
                    found = None
                macs = found[1].macs if found is not None else 0
                cls = "conv" if inner.op_type in CONV_OPS else "gemm"
                seconds += self._roofline(cls, 2.0 * macs, moved)
            else:
                seconds += self._roofline("elementwise", float(elems), moved)
        return seconds

    def nodes_seconds(self, nodes: Iterable[Node], functions: Mapping | None = None) -> float:
        return sum(self.node_seconds(n, functions) for n in nodes)

    def model_seconds(self, model: Model) -> float:
        """The main graph's nodes, summed: one intra-op thread runs them one after another."""
        return self.nodes_seconds(model.graph, model_functions(model))


def model_functions(model: Model) -> dict:
    """(domain, name) -> FunctionProto of `model`'s local functions, as node_seconds takes them."""
    return {(f.domain, f.name): f for f in model.functions}


def ranks(values) -> np.ndarray:
    """1-based ranks of `values`, ties sharing the mean of the ranks they span."""
    x = np.asarray(values, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    out = np.empty(len(x))
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and x[order[j + 1]] == x[order[i]]:
            j += 1
        out[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a, b) -> float:
    """Spearman's rank correlation of two equal-length sequences (Pearson's r of their ranks);
    NaN when either is constant or shorter than 2."""
    if len(a) != len(b):
        raise ValueError(f"spearman: {len(a)} values against {len(b)}")
    if len(a) < 2:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    ra -= ra.mean()
    rb -= rb.mean()
    denom = math.sqrt(float(ra @ ra) * float(rb @ rb))
    return float(ra @ rb) / denom if denom else float("nan")


def host_cost_model(target, device) -> CpuCostModel:
    """The cost model of a target's cpu device: for the `cpu` target (this machine), the
    constants `graphopt calibrate` measured here when there are any; otherwise, and for an NPU
    board's host CPU, the profile's figures (also a custom profile that took the name cpu)."""
    from graphopt.partition.target import is_builtin

    if target.name == "cpu" and is_builtin(target):
        from graphopt.tuner.calibrate import default_path

        path = default_path()
        try:
            stamp = os.stat(path).st_mtime_ns
        except OSError:
            stamp = None
        if stamp is not None:
            calibrated = _calibrated(path, stamp)
            if calibrated is not None:
                return calibrated
    return CpuCostModel(default_constants(device))


def calibration_note() -> str | None:
    """What an estimate for the `cpu` target should say of the calibration it reads, when
    there is something to say: measured elsewhere (StaleCalibrationWarning's words), or not
    loading, which leaves the profile's figures in place. None for none or a fresh one."""
    from graphopt.errors import GraphoptError
    from graphopt.tuner.calibrate import CalibrationResult, default_path
    from graphopt.warning_scope import kept_notices

    path = default_path()
    if not os.path.exists(path):
        return None
    with kept_notices() as kept:  # the stale calibration's words, not shown twice
        try:
            CalibrationResult.load(path)
        except GraphoptError as exc:
            return f"the cpu profile's figures price the host, not the calibration: {exc}"
    return kept[0] if kept else None


@functools.lru_cache(maxsize=4)
def _calibrated(path: str, stamp: int) -> CpuCostModel | None:
    """The calibration at `path` as of `stamp`; None when it does not load (the caller falls
    back to the profile's figures: a damaged file must not stop a compile)."""
    from graphopt.errors import GraphoptError
    from graphopt.tuner.calibrate import CalibrationResult
    from graphopt.warning_scope import warnings_as

    try:
        with warnings_as("ignore"):  # a stale calibration is still the best figure here
            return CalibrationResult.load(path).cost_model()
    except GraphoptError:
        return None
