"""INT8 Add and Mul that take a constant number: the number as one exact code, so that
onnxruntime runs them as QLinearAdd and QLinearMul (graphopt/quant/constant_codes.py)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import parse_model

import graphopt
from graphopt import numerics
from graphopt.ir import onnx_io
from graphopt.quant.constant_codes import dequantized_constant

# PP-LCNetV3's learnable affine block: a scale and a shift after each hard-swish.
AFFINE_NET = """
    agraph (float[1, 3, 16, 16] x) => (float[1, 8, 16, 16] y) {
        c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
        a1 = HardSwish(c1)
        m1 = Mul(scale, a1)
        p1 = Add(m1, shift)
        c2 = Conv <pads = [1, 1, 1, 1]> (p1, w2, b2)
        a2 = HardSwish(c2)
        m2 = Mul(a2, scale)
        p2 = Add(shift, m2)
        c3 = Conv <pads = [1, 1, 1, 1]> (p2, w3, b3)
        y = Relu(c3)
    }"""


def _model(scale=np.array([1.7], np.float32), shift=np.array(-0.4, np.float32)):
    rng = np.random.default_rng(0)

    def w(o, i):
        return (rng.standard_normal((o, i, 3, 3)) * np.sqrt(2 / (9 * i))).astype(np.float32)

    return parse_model(AFFINE_NET, w1=w(8, 3), w2=w(8, 8), w3=w(8, 8), scale=scale,
                       shift=shift, **{f"b{i}": (rng.standard_normal(8) * 0.3)
                                       .astype(np.float32) for i in (1, 2, 3)})


def _int8(proto, tmp_path, **options):
    calibration = tmp_path / "calib.npz"
    np.savez(calibration, x=np.random.default_rng(1).standard_normal((8, 1, 3, 16, 16))
             .astype(np.float32))
    result = graphopt.optimize(proto, pass_options={
        "quantize": "int8", "calibration": str(calibration), "quant_keep_ends": False,
        **options})
    out = graphopt.to_onnx(result.model)
    onnx.checker.check_model(out)
    return result.log.totals()["QuantizeInt8"]["rewrites"], out


def _loaded_ops(proto, tmp_path) -> Counter:
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "loaded.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return Counter(n.op_type for n in onnx.load(str(tmp_path / "loaded.onnx")).graph.node)


def _cosine(proto, out, level) -> float:
    feeds = numerics.random_feeds(proto, seed=5)
    a = numerics.run(proto, feeds)["y"].ravel().astype(np.float64)
    b = numerics.run(out, feeds, level=level)["y"].ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("symmetric", [False, True])
def test_a_scale_and_a_shift_between_int8_layers_run_as_qlinear_ops(tmp_path, symmetric):
    # Each kept its layer's hard-swish output in float between a DQ and a Q: PaddleOCR's
    # text detector at int8 ran at 0.86x its float time, 0.57x with them on the codes.
    proto = _model()
    rewrites, out = _int8(proto, tmp_path, activation_symmetric=symmetric)
    assert rewrites["constant operand as codes"] == 4
    if not symmetric:  # onnxruntime fuses int8 (symmetric) QDQ convs here only in part
        loaded = _loaded_ops(out, tmp_path)
        assert loaded["QLinearMul"] == 4 and loaded["QLinearAdd"] == 4
        assert not {"Mul", "Add", "HardSwish"} & set(loaded)
    for level in ("disable", "all"):
        assert _cosine(proto, out, level) > (0.997 if symmetric else 0.998)


def test_a_per_channel_constant_keeps_its_op_float(tmp_path):
    # One code per tensor cannot hold a vector of scales: that Mul stays float.
    proto = _model(scale=np.linspace(0.5, 2.0, 8, dtype=np.float32).reshape(1, 8, 1, 1))
    rewrites, out = _int8(proto, tmp_path)
    assert rewrites["constant operand as codes"] == 2  # the two shifts
    ops = Counter(n.op_type for n in out.graph.node)
    assert ops["Mul"] == 2 and ops["HardSwish"] == 2  # the hard-swishes a float Mul reads
    assert _cosine(proto, out, "disable") > 0.998


@pytest.mark.parametrize("value", [1.7, -0.4, 0.0, 3.0e-8, -2.5e30, 1 / 3])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_a_dequantized_constant_is_the_float32_number_exactly(value, dtype):
    proto = parse_model("""
        agraph (float[1] x) => (float[1] y) {
            y = Identity(x)
        }""")
    model = onnx_io.load_onnx(proto)
    graph = model.graph
    identity = next(iter(graph))
    identity.set_input(0, dequantized_constant(graph, identity, value, np.dtype(dtype), "c"))
    out = onnx_io.to_onnx(model)
    onnx.checker.check_model(out)
    got = numerics.run(out, {"x": np.zeros(1, np.float32)})["y"]
    assert got.reshape(()) == np.float32(value)
