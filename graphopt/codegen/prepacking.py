"""Whether a CPU partition's onnxruntime session should pre-pack its weights at load."""

from __future__ import annotations

from graphopt.ir import Model
from graphopt.ir.dtypes import DType
from graphopt.ir.node import Node
from graphopt.ir.value import Value

# onnxruntime's CPU kernels copy constant weights into a kernel-specific layout ("pre-packing")
# when a session is created, at every start. For a GEMM with one row (a classifier's fully
# connected layers at batch 1) that layout gains little or nothing. bench/prepacking.py, with
# onnxruntime 1.32 on an AVX2 CPU at 1 thread: a [1, K] x [K, N] MatMul runs 0.74-0.97x as long
# unpacked, while packing costs 0.1-70 ms of session creation per weight (190-300 ms for AlexNet's
# three layers); at 2 rows and more, unpacked runs take 1.1-2.7x as long, so any such GEMM keeps
# packing on. At 2 threads the packed one-row GEMM uses both cores and mid-size ones ran
# 1.3-1.6x as long unpacked (2048x1000, two runs), which whole models did not show (AlexNet,
# VGG-19, ZFNet, UNet within 3%, bench/latency.py). fp32 convolutions (Conv,
# ConvTranspose, FusedConv, NCHWc Conv) ran within 1-8% either way, ConvTranspose packing in
# ~4 ms. The option is session-wide, so one kernel that gains from packing keeps it for all.
_GEMMS = {("", "MatMul"), ("", "Gemm"), ("com.microsoft", "FusedMatMul"),
          ("com.microsoft", "FusedGemm")}
_CONVS = {("", "Conv"), ("", "ConvTranspose"), ("com.microsoft", "FusedConv"),
          ("com.microsoft.nchwc", "Conv")}
# Kernels whose pre-packed weights make their runs faster (int8, int4, recurrent, attention),
# and the Q/DQ nodes that onnxruntime fuses into such kernels at session creation.
_PACKED_KERNELS = {
    ("", "MatMulInteger"), ("", "QLinearMatMul"), ("", "QLinearConv"), ("", "ConvInteger"),
    ("", "LSTM"), ("", "GRU"), ("", "RNN"), ("", "QuantizeLinear"), ("", "DequantizeLinear"),
    ("", "DynamicQuantizeLinear"),
    ("com.microsoft", "MatMulNBits"), ("com.microsoft", "MatMulBnb4"),
    ("com.microsoft", "MatMulFpQ4"), ("com.microsoft", "GatherBlockQuantized"),
    ("com.microsoft", "Attention"), ("com.microsoft", "QAttention"),
    ("com.microsoft", "DynamicQuantizeMatMul"), ("com.microsoft", "MatMulIntegerToFloat"),
    ("com.microsoft", "QGemm"), ("com.microsoft", "QLinearConv"),
    ("com.microsoft", "DynamicQuantizeLSTM"), ("com.microsoft", "QuantizeLinear"),
    ("com.microsoft", "DequantizeLinear"), ("com.microsoft", "MoE"), ("com.microsoft", "QMoE"),
}
# Domains whose ops are known: an op from any other (a custom op library's) may pack anything.
_KNOWN_DOMAINS = {"", "com.microsoft", "com.microsoft.nchwc"}


# With AVX-512 (onnxruntime's MLAS on an AMD EPYC, bench/prepacking.py --rows 1) a one-row
# GEMM of a mid-size weight runs 1.20-1.34x as long unpacked (768x3072, 2048x1000), where a
# 4096x4096 one still runs 0.77x: below this many weight elements packing pays there, and a
# model that spends a tenth of its multiply-adds or more on such GEMMs keeps it on (an MLP
# forecaster of small Gemms had run 1.17x the original's time); a classifier's head among its
# convolutions does not tip it.
_WIDE_PACKED_BELOW = 1 << 22
_WIDE_PACKED_SHARE = 0.1


def prepacking_pays(model: Model, wide_vectors: bool = False) -> bool:
    """False when `model`, run on onnxruntime's CPU provider, has weights its kernels would
    pre-pack (one-row GEMMs, fp32 convolutions) and no kernel whose runs gain from it.
    `wide_vectors`: the CPU has AVX-512, where small one-row GEMMs run faster packed."""
    functions = {(f.domain, f.name) for f in model.functions}
    fixed: dict[int, bool] = {}
    packable = False
    small_gemm_macs = all_macs = 0
    for node in model.graph:
        op = ("" if node.is_onnx else node.domain, node.op_type)
        if op in functions or op[0] not in _KNOWN_DOMAINS or op in _PACKED_KERNELS \
                or node.subgraphs():
            return True  # a body or a kernel this rule does not see into
        if op in _GEMMS:
            if not _fixed_at_load(node.input(1), fixed):
                continue  # both operands computed per run: nothing to pack
            if not _is_float32(node.input(0)) or _rows(node) != 1:
                return True
            packable = True
            size = _size(node.input(1))
            all_macs += size
            small_gemm_macs += size if size < _WIDE_PACKED_BELOW else 0
        elif op in _CONVS and len(node.inputs) > 1 and _fixed_at_load(node.input(1), fixed):
            if not _is_float32(node.input(0)):
                return True
            packable = True
            all_macs += _conv_macs(node)
    if wide_vectors and small_gemm_macs >= _WIDE_PACKED_SHARE * all_macs > 0:
        return True
    return not packable


def _size(value: Value | None) -> int:
    """Elements of a static value (a one-row GEMM's weight: its multiply-adds), else 0."""
    shape = value.static_shape if value is not None else None
    count = 1
    for dim in shape or (0,):
        count *= dim
    return count


def _conv_macs(node: Node) -> int:
    """A convolution's multiply-adds: output elements × weight elements per output channel
    (0 when a shape is not static)."""
    weight, out = node.input(1), node.outputs[0] if node.outputs else None
    shape = weight.static_shape if weight is not None else None
    if not shape or out is None or out.static_shape is None:
        return 0
    channels = shape[1] if node.op_type == "ConvTranspose" else shape[0]
    return _size(out) * _size(weight) // max(channels, 1)


def _is_float32(value: Value | None) -> bool:
    return value is not None and value.dtype == DType.FLOAT


def _rows(node: Node) -> int | None:
    """The rows of the GEMM `node` computes (its A operand's, after any transpose), or None
    when they are not known at compile time."""
    a = node.input(0)
    shape = a.static_shape if a is not None else None
    if shape is None:
        return None
    if len(shape) < 2:
        return 1
    if node.op_type in ("Gemm", "FusedGemm"):
        return shape[1] if node.attr("transA", 0) else shape[0]
    rows = 1
    for dim in shape[:-2]:
        rows *= dim
    return rows * (shape[-1] if node.attr("transA", 0) else shape[-2])


def _fixed_at_load(value: Value | None, fixed: dict[int, bool]) -> bool:
    """Whether onnxruntime knows `value` when it creates the session: a constant, or computed
    from constants only (its constant folding makes an initializer of it, which kernels pack)."""
    if value is None:
        return False
    # Depth-first with a stack of its own: the producers of an activation reach back through
    # the whole network, deeper than Python's recursion allows.
    stack = [value]
    while stack:
        top = stack[-1]
        if id(top) in fixed:
            stack.pop()
            continue
        producer = top.producer
        if producer is None:
            fixed[id(top)] = top.is_constant
            stack.pop()
            continue
        if producer.subgraphs():
            fixed[id(top)] = False
            stack.pop()
            continue
        inputs = [v for v in producer.inputs if v is not None]  # None: an omitted optional
        pending = [v for v in inputs if id(v) not in fixed]
        if pending:
            stack.extend(pending)
            continue
        fixed[id(top)] = all(fixed[id(v)] for v in inputs)
        stack.pop()
    return fixed[id(value)]
