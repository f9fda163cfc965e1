"""The int8 rewrites of a planned layer: Q/DQ pairs around its activations, int8 weights and
int32 biases behind DequantizeLinear, Pads on codes, and dynamically quantized MatMuls."""

from __future__ import annotations

import numpy as np

from graphopt.ir import DType, Node, Value
from graphopt.passes.edit import replace_value
from graphopt.quant.attention_split import split_attention
from graphopt.quant.qparams import (QParams, bias_fitting_scale, dequantize_weight, quantize_bias,
                                    quantize_weight)
from graphopt.quant.select import MS, Plan


def _scalar(graph, hint: str, value) -> Value:
    return graph.make_initializer(hint, np.asarray(value))


def insert_qdq(graph, value: Value, p: QParams, readers: list[Node] | None = None) -> None:
    """Q after `value`'s producer, and a DQ before each reader (`readers`, default all), which
    then reads the DQ. A reader inside a branch or loop body (it captures the value) keeps
    reading the float value: a DQ there would sit in the body, reading a Q the body cannot
    order itself after."""
    readers = [r for r in (value.consumers() if readers is None else readers)
               if r.graph is graph]
    scale = _scalar(graph, f"{value.name}_scale", p.scale)
    zero = _scalar(graph, f"{value.name}_zero_point", p.zero_point)
    q = Value(graph.fresh_name(f"{value.name}_quantized"), DType.from_numpy(p.dtype), value.shape)
    q_node = Node("QuantizeLinear", [value, scale, zero], outputs=[q],
                  name=graph.fresh_node_name(f"{value.name}/QuantizeLinear"))
    if value.producer is not None:
        graph.insert_after(value.producer, q_node)
    else:
        graph.insert_before(next(iter(graph)), q_node)
    for reader in readers:
        dq = Value(graph.fresh_name(f"{value.name}_dequantized"), DType.FLOAT, value.shape)
        graph.insert_before(reader, Node(
            "DequantizeLinear", [q, scale, zero], outputs=[dq],
            name=graph.fresh_node_name(f"{value.name}/DequantizeLinear")))
        for index, read in enumerate(reader.inputs):
            if read is value:
                reader.set_input(index, dq)


def pads_on_codes(graph, chosen: Plan) -> int:
    """A Pad that keeps its input's scale reads that input's codes and writes its own, which
    its readers dequantize: DQ → Pad → Q, run in float between two conversions by
    onnxruntime, becomes one Pad of 8-bit values, filling with the zero point (the code of 0)
    where it fills. Returns how many."""
    done = 0
    for pad in chosen.same_scale:
        dq = pad.input(0).producer if pad.op_type == "Pad" else None
        quantize = [r for r in pad.output.consumers() if r.op_type == "QuantizeLinear"]
        if dq is None or dq.op_type != "DequantizeLinear" or len(quantize) != 1 \
                or pad.output.is_graph_output or len(pad.output.uses) != 1 \
                or not _same_params(dq, quantize[0]):
            continue
        codes, zero = dq.input(0), dq.input(2)
        pad.set_input(0, codes)
        if pad.attr("mode", "constant") == "constant":
            while len(pad.inputs) < 3:
                pad.set_inputs([*pad.inputs, None])
            pad.set_input(2, zero)
        pad.output.dtype = codes.dtype
        replace_value(quantize[0].output, pad.output)
        graph.remove(quantize[0])
        if not dq.output.uses:
            graph.remove(dq)
        done += 1
    return done


def _same_params(dq: Node, q: Node) -> bool:
    """Whether a DequantizeLinear and a QuantizeLinear take one scale and zero point."""
    given = [node.inputs[1:3] for node in (dq, q)]
    if any(len(pair) != 2 or None in pair for pair in given):
        return False
    return all(a.constant() is not None and b.constant() is not None
               and a.constant().dtype == b.constant().dtype
               and np.array_equal(a.constant(), b.constant()) for a, b in zip(*given))


def _dequantized(graph, before: Node, hint: str, data: np.ndarray, scale: np.ndarray,
                 axis: int | None) -> Value:
    """An initializer `data` (int8 or int32) behind a DequantizeLinear inserted before
    `before`."""
    zero = np.zeros(scale.shape, data.dtype)
    inputs = [graph.make_initializer(f"{hint}_quantized", data),
              graph.make_initializer(f"{hint}_scale", scale),
              graph.make_initializer(f"{hint}_zero_point", zero)]
    out = Value(graph.fresh_name(f"{hint}_dequantized"), DType.FLOAT, data.shape)
    attrs = {"axis": axis} if axis is not None and scale.ndim else {}
    graph.insert_before(before, Node("DequantizeLinear", inputs, attrs, outputs=[out],
                                     name=graph.fresh_node_name(f"{hint}/DequantizeLinear")))
    return out


# onnxruntime runs int8 activations as uint8 (code + 128) on a CPU without VNNI, whose
# vpmaddubsw adds pairs of uint8 × int8 products in 16 bits: 255 · 63 · 2 = 32130 stays below
# 32767 where ±127 weights do not. Pairs saturate only where codes are high, which a ReLU's
# output (zero point 0) reaches in its tail alone but symmetric activations (zero point 128 once
# shifted) and a normalized image (zero point near mid-range) reach everywhere. Measured on the
# zoo's ResNet-50 (bench/precision.py, 64 samples, AVX2): ±63 for every layer costs the default
# compile 2 of 64 top-1 agreements, ±63 for the stem alone (quant_keep_ends off) gains 2 and
# lifts the worst cosine from 0.99931 to 0.99982; on the dev ResNet export with symmetric
# activations it lifts the logits' cosine from 0.9675 to 0.9992.
WEIGHT_LIMIT_HIGH_CODES = 63
HIGH_CODE = 64  # a uint8 zero point from here on counts as "codes sit high"


def codes_sit_high(x: QParams) -> bool:
    """Whether the activation `x` quantizes to codes onnxruntime's uint8 kernels see as high."""
    zero_point = int(x.zero_point) + (128 if x.dtype == np.int8 else 0)
    return zero_point >= HIGH_CODE


def quantize_weights(graph, node: Node, x: QParams, per_channel: bool,
                      x_mean: np.ndarray | None, limit: int = 127) -> None:
    w_value = node.inputs[1]
    w = w_value.constant()
    if node.op_type == "Gemm":
        axis = 0 if node.attr("transB", 0) else 1  # the output (N) axis
    elif node.op_type == "MatMul":
        axis = 1  # [K, N]
    else:
        axis = 0
    bias = node.input(2)
    b = bias.constant() if bias is not None else np.zeros(w.shape[axis], np.float32)
    fitting = bias_fitting_scale(b, x.scale) if bias is not None else None
    wq, w_scale = quantize_weight(w, axis if per_channel else None, limit, fitting)
    node.set_input(1, _dequantized(graph, node, w_value.name, wq, w_scale, axis))
    reads = w.shape[0] if node.op_type in ("Gemm", "MatMul") and not node.attr("transB", 0) \
        else w.shape[1] * int(node.attr("group", 1))  # the input channels the weight reads
    if x_mean is not None and x_mean.shape == (reads,):
        b = b - mean_shift(node, w, dequantize_weight(wq, w_scale, axis), x_mean)
    if bias is not None or np.any(b):
        bq, b_scale = quantize_bias(b, x.scale, w_scale)
        name = bias.name if bias is not None else f"{w_value.name}_bias"
        node.set_inputs([*node.inputs[:2], _dequantized(graph, node, name, bq, b_scale, 0)])


def mean_shift(node: Node, w: np.ndarray, w_deq: np.ndarray, x_mean: np.ndarray
                ) -> np.ndarray:
    """The mean change of each output channel that rounding the weights causes, for inputs of
    per-channel mean `x_mean`: (W_q − W) contracted with the mean. Subtracted from the bias, it
    removes the systematic part of the weight error (bias correction, Nagel et al. 2019), which
    rounding leaves in every output of a layer alike and which adds up across layers. Outputs
    on a zero-padded border read less of the mean; the correction is the interior's."""
    delta = w_deq.astype(np.float64) - w.astype(np.float64)
    if node.op_type == "Gemm":
        return (x_mean @ (delta.T if node.attr("transB", 0) else delta)).astype(np.float32)
    groups = int(node.attr("group", 1))
    per_group = delta.shape[1]
    # Each output channel o reads the input channels of its group.
    group_of = np.arange(delta.shape[0]) // (delta.shape[0] // groups)
    means = x_mean.reshape(groups, per_group)[group_of]             # [O, I/g]
    return np.sum(delta.reshape(*delta.shape[:2], -1).sum(-1) * means, axis=1).astype(np.float32)


def as_conv(node: Node) -> Node:
    """A FusedConv(activation=Relu) turned, in place, into the Conv it wraps; its Relu lives on
    in the uint8 range of the output (calibrated on the output, which is ≥ 0, zero point 0).
    In place, so the output value the plan holds stays the node's."""
    node.op_type, node.domain = "Conv", ""
    for key in [k for k in node.attrs if k.startswith("activation")]:
        del node.attrs[key]
    return node


def _matmul_weight(graph, before: Node, w_value: Value, per_channel: bool):
    wq, scale = quantize_weight(w_value.constant(), 1 if per_channel else None)
    return [graph.make_initializer(f"{w_value.name}_quantized", wq),
            graph.make_initializer(f"{w_value.name}_scale", scale),
            graph.make_initializer(f"{w_value.name}_zero_point", np.zeros(scale.shape, np.int8))]


# A reader that adds a bias before its activation, and the activation left once the bias moves
# into DynamicQuantizeMatMul's bias input. onnxruntime's CPU BiasGelu over [1,128,3072] takes
# 537 µs where Gelu alone takes 301 (AVX-512, 1 thread): the bias rides on the GEMM's output
# pass instead (a 4-layer BERT-base at seq 128 spends 3% of its INT8 run in BiasGelu).
_BIASED_ACTIVATIONS = {(MS, "BiasGelu"): "Gelu", (MS, "FastGelu"): "FastGelu"}


def _bias_after(node: Node) -> tuple[Node, Value] | None:
    """The reader that alone adds a constant [N] bias to `node`'s output, and that bias: an Add,
    or a BiasGelu or biased FastGelu reading the output as its data."""
    out = node.outputs[0]
    if len(out.uses) != 1 or out.is_graph_output:
        return None
    use = out.uses[0]
    reader = use.node
    if reader.is_onnx and reader.op_type == "Add" and len(reader.inputs) == 2:
        other = reader.inputs[1 - use.index]
    elif (reader.domain, reader.op_type) in _BIASED_ACTIVATIONS and use.index == 0 \
            and len(reader.inputs) == 2:
        other = reader.inputs[1]
    else:
        return None
    data = other.constant() if other is not None else None
    n = node.inputs[1].shape[1]
    if data is None or data.dtype != np.float32 or data.shape != (n,):
        return None
    return reader, other


def gemm_as_matmul(graph, gemm: Node) -> Node:
    """Gemm(A, W, c) (A not transposed, alpha = beta = 1, c a vector) as MatMul(A, W or Wᵀ) and
    an Add of c as [N]: the form dynamic_matmul quantizes, absorbing the Add. The MatMul."""
    weight = gemm.inputs[1].constant()
    if gemm.attr("transB", 0):
        weight = np.ascontiguousarray(weight.T)
    out = gemm.outputs[0]
    matmul = Node("MatMul", [gemm.inputs[0], graph.make_initializer(
        f"{gemm.inputs[1].name}_kn", weight)], name=gemm.name, outputs=[Value(
            graph.fresh_name(f"{out.name}_matmul"), DType.FLOAT, out.shape)])
    graph.insert_before(gemm, matmul)
    c = gemm.inputs[2] if len(gemm.inputs) > 2 else None
    result = matmul.outputs[0]
    if c is not None:
        bias = np.ascontiguousarray(np.broadcast_to(c.constant().reshape(-1), (weight.shape[1],)))
        add = Node("Add", [result, graph.make_initializer(f"{c.name}_n", bias)],
                   name=graph.fresh_node_name(f"{gemm.name}/bias"), outputs=[Value(
                       graph.fresh_name(f"{out.name}_biased"), DType.FLOAT, out.shape)])
        graph.insert_before(gemm, add)
        result = add.outputs[0]
    replace_value(out, result)
    graph.remove(gemm)
    return matmul


def dynamic_matmul(graph, node: Node, per_channel: bool) -> None:
    """MatMul(A, W) [+ b] → DynamicQuantizeMatMul(A, W int8, scale, 0, b); a BiasGelu(·, b)
    after it keeps a plain Gelu (FastGelu likewise)."""
    reader, bias = _bias_after(node) or (None, None)
    activation = _BIASED_ACTIVATIONS.get((reader.domain, reader.op_type)) if reader else None
    inputs = [node.inputs[0], *_matmul_weight(graph, node, node.inputs[1], per_channel)]
    if bias is not None:
        inputs.append(bias)
    # The node whose output the int8 GEMM computes: an absorbed Add's, else the MatMul's.
    last = reader if reader is not None and activation is None else node
    out = last.outputs[0]
    new = Node("DynamicQuantizeMatMul", inputs, domain=MS, name=node.name, outputs=[Value(
        graph.fresh_name(f"{out.name}_int8"), DType.FLOAT, out.shape)])
    graph.insert_before(last, new)
    replace_value(out, new.outputs[0])
    graph.remove(last)
    if activation:
        result = reader.outputs[0]
        plain = Node(activation, [new.outputs[0]], domain=MS, name=reader.name, outputs=[Value(
            graph.fresh_name(f"{result.name}_unbiased"), result.dtype, result.shape)])
        graph.insert_before(reader, plain)
        replace_value(result, plain.outputs[0])
        graph.remove(reader)
    elif reader is not None:
        graph.remove(node)


def dynamic_attention(graph, node: Node, per_channel: bool) -> None:
    """Attention(x, Wqkv, bqkv, attention_bias=M) → the packed QKV GEMM dynamically quantized,
    split into q, k, v, and MultiHeadAttention(q, k, v, attention_bias=M) in float."""
    x, w_value, bias = node.inputs[0], node.inputs[1], node.inputs[2]

    def gemm(qkv: Value) -> Node:
        return Node("DynamicQuantizeMatMul",
                    [x, *_matmul_weight(graph, node, w_value, per_channel), bias], domain=MS,
                    name=graph.fresh_node_name(f"{node.name or qkv.name}/QKV"), outputs=[qkv])

    split_attention(graph, node, gemm)


def drop_unused_initializers(graph) -> None:
    for value in list(graph.initializers.values()):
        if not value.uses and not value.is_input and not value.is_graph_output:
            graph.remove_initializer(value)
