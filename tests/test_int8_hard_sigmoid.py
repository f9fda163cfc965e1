"""INT8 hard-swish and hard-sigmoid between quantized layers: a saturating QLinearAdd and a
QLinearMul on the codes (graphopt/quant/hard_sigmoid.py)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import parse_model
from onnx import TensorProto, helper

import graphopt
from graphopt import numerics
from graphopt.ir import onnx_io
from graphopt.quant.hard_sigmoid import hard_sigmoids_on_codes

# These seeded 4-layer nets, ends quantized too, keep 0.9986-0.9994 of their float outputs
# cosine, with the gate run on codes and with it in float alike (the same codes come out).
MIN_COSINE = 0.998
OPSET13 = '<ir_version: 8, opset_import: ["" : 13]>\n'

HARD_SWISH_NET = """
    agraph (float[1, 3, 16, 16] x) => (float[1, 8, 16, 16] y) {
        c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
        a1 = HardSwish(c1)
        c2 = Conv <pads = [1, 1, 1, 1]> (a1, w2, b2)
        a2 = HardSwish(c2)
        c3 = Conv <pads = [1, 1, 1, 1]> (a2, w3, b3)
        a3 = HardSwish(c3)
        c4 = Conv <pads = [1, 1, 1, 1]> (a3, w4, b4)
        y = Relu(c4)
    }"""
# PaddlePaddle's hard-swish at opset 13, which FuseHardSwish makes x · HardSigmoid(x).
DECOMPOSED_NET = """
    agraph (float[1, 3, 16, 16] x) => (float[1, 8, 16, 16] y) {
        c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
        s1 = Add(c1, three)
        r1 = Clip(s1, zero, six)
        m1 = Mul(c1, r1)
        a1 = Div(m1, six)
        c2 = Conv <pads = [1, 1, 1, 1]> (a1, w2, b2)
        s2 = Add(c2, three)
        r2 = Clip(s2, zero, six)
        m2 = Mul(c2, r2)
        a2 = Div(m2, six)
        c4 = Conv <pads = [1, 1, 1, 1]> (a2, w4, b4)
        y = Relu(c4)
    }"""
# A squeeze-excitation gate, as MobileNetV3 has: the feature map times a per-channel
# HardSigmoid of a pooled conv.
SQUEEZE_EXCITE_NET = """
    agraph (float[1, 3, 16, 16] x) => (float[1, 8, 16, 16] y) {
        c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
        r1 = Relu(c1)
        p = GlobalAveragePool(r1)
        e = Conv(p, we, be)
        g = HardSigmoid <alpha = 0.2, beta = 0.5> (e)
        s = Mul(r1, g)
        c2 = Conv <pads = [1, 1, 1, 1]> (s, w2, b2)
        r2 = Relu(c2)
        c4 = Conv <pads = [1, 1, 1, 1]> (r2, w4, b4)
        y = Relu(c4)
    }"""


def _weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def w(o, i, k=3):
        return (rng.standard_normal((o, i, k, k)) * np.sqrt(2 / (k * k * i))).astype(np.float32)

    def b(o):
        return (rng.standard_normal(o) * 0.3).astype(np.float32)

    return {"w1": w(8, 3), "b1": b(8), "w2": w(8, 8), "b2": b(8), "w3": w(8, 8), "b3": b(8),
            "w4": w(8, 8), "b4": b(8)}


def _calibration(tmp_path) -> str:
    path = tmp_path / "calib.npz"
    np.savez(path, x=np.random.default_rng(1).standard_normal((8, 1, 3, 16, 16))
             .astype(np.float32) * 2)
    return str(path)


def _int8(proto, tmp_path, **options):
    result = graphopt.optimize(proto, pass_options={
        "quantize": "int8", "calibration": _calibration(tmp_path), **options})
    out = graphopt.to_onnx(result.model)
    onnx.checker.check_model(out)
    return result, out


def _loaded_ops(proto, tmp_path) -> Counter:
    """The ops onnxruntime runs after its load-time fusions, from its optimized model."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "loaded.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return Counter(n.op_type for n in onnx.load(str(tmp_path / "loaded.onnx")).graph.node)


def _cosine(a, b) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _agrees(proto, out, level="disable") -> float:
    feeds = numerics.random_feeds(proto, seed=5)
    return _cosine(numerics.run(proto, feeds)["y"], numerics.run(out, feeds, level=level)["y"])


def test_hard_swish_between_int8_convs_runs_on_the_codes(tmp_path):
    # onnxruntime has no int8 HardSwish: DQ → HardSwish → Q ran in float between two
    # conversions after every conv (58 of 92 ms of PicoDet at int8).
    proto = parse_model(HARD_SWISH_NET, **_weights())
    result, out = _int8(proto, tmp_path, quant_keep_ends=False)
    assert result.log.totals()["QuantizeInt8"]["rewrites"]["HardSigmoid on codes"] == 3
    loaded = _loaded_ops(out, tmp_path)
    assert loaded["QLinearAdd"] == 3 and loaded["QLinearMul"] == 3
    assert not {"HardSwish", "HardSigmoid", "Mul", "Add"} & set(loaded)
    assert _agrees(proto, out) > MIN_COSINE
    assert _agrees(proto, out, level="all") > MIN_COSINE


def test_a_hard_swish_before_a_float_layer_stays_one_op(tmp_path):
    # The last conv writes the output and stays float (quant_keep_ends), so the hard-swish
    # before it has no int8 reader: it is one HardSwish again, as in the float model.
    proto = parse_model(HARD_SWISH_NET, **_weights())
    result, out = _int8(proto, tmp_path)
    ops = Counter(n.op_type for n in out.graph.node)
    assert ops["HardSwish"] == 1 and ops["HardSigmoid"] == 0 and ops["Mul"] == 2
    # The first two still run on codes: the stem conv stays float, but its output is
    # quantized for the int8 Mul that reads it.
    assert result.log.totals()["QuantizeInt8"]["rewrites"]["HardSigmoid on codes"] == 2
    assert _agrees(proto, out) > MIN_COSINE


def test_a_decomposed_hard_swish_is_typed_and_quantized(tmp_path):
    # FuseHardSwish leaves its HardSigmoid's output untyped; QuantizeInt8 quantizes float32
    # values only, and kept 93 of PicoDet's 95 hard-swish Muls float before it inferred types.
    three, zero, six = (np.array(v, np.float32) for v in (3, 0, 6))
    proto = parse_model(DECOMPOSED_NET, header=OPSET13, three=three, zero=zero, six=six,
                        **{k: v for k, v in _weights().items() if k[1] != "3"})
    result, out = _int8(proto, tmp_path, quant_keep_ends=False)
    loaded = _loaded_ops(out, tmp_path)
    assert loaded["QLinearMul"] == 2 and loaded["QLinearAdd"] == 2
    assert not {"HardSigmoid", "Mul", "Div", "Clip"} & set(loaded)
    assert _agrees(proto, out) > MIN_COSINE


def test_a_squeeze_excitation_gate_runs_on_the_codes(tmp_path):
    weights = _weights()
    rng = np.random.default_rng(3)
    proto = parse_model(SQUEEZE_EXCITE_NET, we=rng.standard_normal((8, 8, 1, 1))
                        .astype(np.float32), be=np.zeros(8, np.float32),
                        **{k: v for k, v in weights.items() if k[1] != "3"})
    result, out = _int8(proto, tmp_path, quant_keep_ends=False)
    assert result.log.totals()["QuantizeInt8"]["rewrites"]["HardSigmoid on codes"] == 1
    loaded = _loaded_ops(out, tmp_path)
    assert loaded["QLinearMul"] == 1 and "HardSigmoid" not in loaded
    assert _agrees(proto, out) > MIN_COSINE


def test_symmetric_activations_start_the_gate_at_the_lowest_int8_code(tmp_path):
    proto = parse_model(HARD_SWISH_NET, **_weights())
    result, out = _int8(proto, tmp_path, quant_keep_ends=False, activation_symmetric=True)
    assert result.log.totals()["QuantizeInt8"]["rewrites"]["HardSigmoid on codes"] == 3
    zeros = {t.name: onnx.numpy_helper.to_array(t) for t in out.graph.initializer}
    producers = {o: n for n in out.graph.node for o in n.output}
    gates = [q for q in out.graph.node if q.op_type == "QuantizeLinear"
             and q.input[0] in producers and producers[q.input[0]].op_type == "Add"]
    assert len(gates) == 3 and all(zeros[q.input[2]] == np.int8(-128) for q in gates)
    # Half the codes of uint8 for the convs' outputs: 0.99760 (0.99744 with the gate in float).
    assert _agrees(proto, out) > 0.997
    assert _agrees(proto, out, level="all") > 0.997


def _gate_model(alpha: float, beta: float, codes: int, scale: float, zero: int):
    """Every code of an 8-bit tensor (uint8 for codes == TensorProto.UINT8, int8 otherwise)
    through DQ → HardSigmoid → Q → DQ, the Q at a calibrated [0, 1]."""
    dtype = helper.tensor_dtype_to_np_dtype(codes)
    low = np.iinfo(dtype).min
    init = [onnx.numpy_helper.from_array(np.asarray(v, t), n) for n, v, t in (
        ("s", scale, np.float32), ("z", zero, dtype), ("gs", 1 / 255, np.float32),
        ("gz", low, dtype))]
    nodes = [helper.make_node("DequantizeLinear", ["q", "s", "z"], ["x"]),
             helper.make_node("HardSigmoid", ["x"], ["g"], alpha=alpha, beta=beta),
             helper.make_node("QuantizeLinear", ["g", "gs", "gz"], ["gq"]),
             helper.make_node("DequantizeLinear", ["gq", "gs", "gz"], ["y"])]
    graph = helper.make_graph(nodes, "gate", [helper.make_tensor_value_info("q", codes, [256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256])], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                             ir_version=8)


@pytest.mark.parametrize("alpha, beta", [(1 / 6, 0.5), (0.2, 0.5), (0.5, 0.0), (0.25, -0.5),
                                         (3.0, 2.0)])
@pytest.mark.parametrize("codes, zero", [(TensorProto.UINT8, 100), (TensorProto.INT8, -20)])
def test_the_saturating_add_computes_hard_sigmoid_to_half_a_step(alpha, beta, codes, zero):
    scale = 0.05
    proto = _gate_model(alpha, beta, codes, scale, zero)
    model = onnx_io.load_onnx(proto)
    assert hard_sigmoids_on_codes(model.graph) == 1
    rewritten = onnx_io.to_onnx(model)
    onnx.checker.check_model(rewritten)
    assert [n.op_type for n in rewritten.graph.node].count("HardSigmoid") == 0
    dtype = helper.tensor_dtype_to_np_dtype(codes)
    q = np.arange(256).astype(np.int64) + np.iinfo(dtype).min
    exact = np.clip(alpha * (q - zero) * scale + beta, 0, 1)
    feeds = {"q": q.astype(dtype)}
    for level in ("disable", "all"):  # the float reading and onnxruntime's QLinearAdd
        got = numerics.run(rewritten, feeds, level=level)["y"]
        assert np.max(np.abs(got - exact)) <= 0.5 / 255 + 1e-6
    assert np.max(np.abs(numerics.run(rewritten, feeds)["y"] - exact)) > 0  # rounded, not exact


def test_a_gate_read_by_a_float_op_is_left_alone():
    proto = _gate_model(0.2, 0.5, TensorProto.UINT8, 0.05, 100)
    proto.graph.node.append(helper.make_node("Relu", ["g"], ["r"]))
    proto.graph.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [256]))
    model = onnx_io.load_onnx(proto)
    assert hard_sigmoids_on_codes(model.graph) == 0


@pytest.mark.parametrize("gate", ["Sigmoid", "HardSigmoid", "HardSwish"])
def test_a_gated_activation_before_the_output_keeps_the_last_layer_an_end(tmp_path, gate):
    # x · Sigmoid(x) (SiLU), x · HardSigmoid(x), and HardSwish, which the pass splits into the
    # second: an activation between the last conv and the output, which keeps it the last layer.
    last = "y = HardSwish(c4)" if gate == "HardSwish" else f"g = {gate}(c4)\n y = Mul(c4, g)"
    text = HARD_SWISH_NET.replace("y = Relu(c4)", last)
    proto = parse_model(text, **_weights())
    result, out = _int8(proto, tmp_path)
    assert any("2 × a first or last layer" in note for note in result.notes), result.notes
    last_conv = [n for n in out.graph.node if n.op_type == "Conv"][-1]
    assert last_conv.input[1] == "w4"  # the float weight, not a DequantizeLinear's output
