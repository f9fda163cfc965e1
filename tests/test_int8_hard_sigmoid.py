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
from graphopt.ir import onnx_export, onnx_io
from graphopt.quant.hard_sigmoid import dequantized_constant, hard_sigmoids_on_codes

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
    assert ops["HardSwish"] == 2 and ops["HardSigmoid"] == 0 and ops["Mul"] == 1
    # The stem conv stays float too, and a hard-swish of its float output alone would only
    # quantize that output twice more: it stays float, quantized once after.
    assert result.log.totals()["QuantizeInt8"]["rewrites"]["HardSigmoid on codes"] == 1
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


def test_symmetric_activations_start_the_gate_at_the_lowest_code(tmp_path):
    proto = parse_model(HARD_SWISH_NET, **_weights())
    result, out = _int8(proto, tmp_path, quant_keep_ends=False, activation_symmetric=True)
    assert result.log.totals()["QuantizeInt8"]["rewrites"]["HardSigmoid on codes"] == 3
    zeros = {t.name: onnx.numpy_helper.to_array(t) for t in out.graph.initializer}
    producers = {o: n for n in out.graph.node for o in n.output}
    gates = [q for q in out.graph.node if q.op_type == "QuantizeLinear"
             and q.input[0] in producers and producers[q.input[0]].op_type == "Add"]
    # The activations' codes are uint8 around 128 (what onnxruntime's CPU kernels run), so
    # the gate starts at uint8's lowest code.
    assert len(gates) == 3 and all(zeros[q.input[2]].dtype == np.uint8
                                   and zeros[q.input[2]] == 0 for q in gates)
    # Half the codes of uint8 for the convs' outputs: 0.99760 (0.99744 with the gate in float).
    assert _agrees(proto, out) > 0.997
    assert _agrees(proto, out, level="all") > 0.997


def _gate_model(alpha: float, beta: float, codes: int, scale: float, zero: int,
                top: float = 1.0):
    """Every code of an 8-bit tensor (uint8 for codes == TensorProto.UINT8, int8 otherwise)
    through DQ → HardSigmoid → Q → DQ, the Q at a calibrated [0, top]."""
    dtype = helper.tensor_dtype_to_np_dtype(codes)
    low = np.iinfo(dtype).min
    init = [onnx.numpy_helper.from_array(np.asarray(v, t), n) for n, v, t in (
        ("s", scale, np.float32), ("z", zero, dtype), ("gs", top / 255, np.float32),
        ("gz", low, dtype))]
    nodes = [helper.make_node("DequantizeLinear", ["q", "s", "z"], ["x"]),
             helper.make_node("HardSigmoid", ["x"], ["g"], alpha=alpha, beta=beta),
             helper.make_node("QuantizeLinear", ["g", "gs", "gz"], ["gq"]),
             helper.make_node("DequantizeLinear", ["gq", "gs", "gz"], ["y"])]
    graph = helper.make_graph(nodes, "gate", [helper.make_tensor_value_info("q", codes, [256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256])], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                             ir_version=8)


def _rewrite(proto) -> tuple[int, onnx.ModelProto]:
    """hard_sigmoids_on_codes on `proto`, its gate 'g' counting as QuantizeInt8's."""
    model = onnx_io.load_onnx(proto)
    ours = {id(v) for v in model.graph.all_values() if v.name == "g"}
    done = hard_sigmoids_on_codes(model.graph, ours)
    rewritten = onnx_export.to_onnx(model)
    onnx.checker.check_model(rewritten)
    return done, rewritten


@pytest.mark.parametrize("alpha, beta", [(1 / 6, 0.5), (0.2, 0.5), (0.5, 0.0), (0.25, -0.5),
                                         (3.0, 2.0)])
@pytest.mark.parametrize("codes, zero", [(TensorProto.UINT8, 100), (TensorProto.INT8, -20)])
@pytest.mark.parametrize("top", [1.0, 0.6])
def test_the_saturating_add_gives_the_codes_of_the_calibrated_gate(alpha, beta, codes, zero,
                                                                   top):
    # A gate whose calibrated range stops at 0.6 (one that never opens fully) keeps its finer
    # step: the codes are those its calibrated Q gave, not those of a [0, 1] range.
    scale = 0.0473  # a step that puts few codes of x on a tie of the gate's rounding
    proto = _gate_model(alpha, beta, codes, scale, zero, top)
    done, rewritten = _rewrite(proto)
    assert done == 1 and "HardSigmoid" not in [n.op_type for n in rewritten.graph.node]
    dtype = helper.tensor_dtype_to_np_dtype(codes)
    q = np.arange(256).astype(np.int64) + np.iinfo(dtype).min
    exact = np.clip(alpha * (q - zero) * scale + beta, 0, top)
    feeds = {"q": q.astype(dtype)}
    calibrated = numerics.run(proto, feeds)["y"]
    step = np.float32(top / 255)
    for level in ("disable", "all"):  # the float reading and onnxruntime's QLinearAdd
        got = numerics.run(rewritten, feeds, level=level)["y"]
        assert np.max(np.abs(got - exact)) <= step / 2 + 1e-6
        # the same codes, but where float rounding tips a tie the other way
        assert np.mean(got == calibrated) > 0.98
        assert np.max(np.abs(got - calibrated)) <= step * 1.0001


def test_a_gate_read_by_a_float_op_is_left_alone():
    proto = _gate_model(0.2, 0.5, TensorProto.UINT8, 0.05, 100)
    proto.graph.node.append(helper.make_node("Relu", ["g"], ["r"]))
    proto.graph.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [256]))
    assert _rewrite(proto)[0] == 0


def test_a_gate_the_model_quantized_itself_is_left_alone():
    # The model's own DQ → HardSigmoid → Q: its scale is the model's, not a range QuantizeInt8
    # calibrated.
    model = onnx_io.load_onnx(_gate_model(0.2, 0.5, TensorProto.UINT8, 0.05, 100))
    assert hard_sigmoids_on_codes(model.graph, set()) == 0


@pytest.mark.parametrize("alpha, beta", [(1e-39, 0.5), (1e-42, 0.0), (0.0, 0.5), (-0.2, 0.5)])
def test_an_alpha_whose_scales_float32_cannot_hold_is_left_alone(alpha, beta):
    assert _rewrite(_gate_model(alpha, beta, TensorProto.UINT8, 0.05, 100))[0] == 0


def test_quant_skip_naming_hard_swish_finds_it(tmp_path):
    proto = parse_model(HARD_SWISH_NET, **_weights())
    result, _ = _int8(proto, tmp_path, quant_skip={"HardSwish"})
    assert not any("matches nothing" in note for note in result.notes), result.notes


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


def test_a_long_activation_chain_before_the_output_is_walked_without_recursion(tmp_path):
    chain = "\n".join(f"r{i} = Relu({'c4' if i == 0 else f'r{i - 1}'})" for i in range(1500))
    text = HARD_SWISH_NET.replace("y = Relu(c4)", f"{chain}\n y = Identity(r1499)")
    result, _ = _int8(parse_model(text, **_weights()), tmp_path)
    assert any("2 × a first or last layer" in note for note in result.notes), result.notes


@pytest.mark.parametrize("value", [1.7, -0.4, 0.0, 3.0e-8, -2.5e30, 1 / 3])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_the_offset_dequantizes_to_the_float32_number_exactly(value, dtype):
    model = onnx_io.load_onnx(parse_model("""
        agraph (float[1] x) => (float[1] y) {
            y = Identity(x)
        }"""))
    identity = next(iter(model.graph))
    identity.set_input(0, dequantized_constant(model.graph, identity, value, np.dtype(dtype), "c"))
    out = onnx_export.to_onnx(model)
    onnx.checker.check_model(out)
    got = numerics.run(out, {"x": np.zeros(1, np.float32)})["y"]
    assert got.reshape(()) == np.float32(value)
