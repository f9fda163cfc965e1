"""LowerLRN: LRN as x / Pow(bias + alpha · AveragePool of x² over the channels, beta), to
float32 rounding, at every window size and opset form; NPU targets keep LRN."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import parse_model

import graphopt
from graphopt import numerics

LRN = """
g (float[2, 7, 5, 6] x) => (float[2, 7, 5, 6] y) {
  y = LRN <size = SIZE, alpha = ALPHA, beta = BETA, bias = BIAS> (x)
}"""


def _model(size=5, alpha=1e-4, beta=0.75, bias=1.0, opset=17):
    text = (LRN.replace("SIZE", str(size)).replace("ALPHA", str(alpha))
            .replace("BETA", str(beta)).replace("BIAS", str(bias)))
    return parse_model(text, header=f'<ir_version: 8, opset_import: ["" : {opset}]>\n')


@pytest.mark.parametrize("options", [
    {},                                                  # AlexNet's, Inception-v1's
    {"alpha": 5e-4, "bias": 2.0},                         # ZFNet's
    {"size": 3, "beta": 0.5},
    {"size": 1}, {"size": 9, "alpha": 0.01},
    {"opset": 9}, {"opset": 13},                          # Unsqueeze's axes attribute; input
], ids=["alexnet", "zfnet", "three", "one", "wide", "opset9", "opset13"])
def test_lrn_becomes_a_pool_of_squares_to_float32_rounding(options):
    proto = _model(**options)
    result = graphopt.optimize(proto)
    out = result.to_onnx()
    onnx.checker.check_model(out)
    assert "LRN" not in [n.op_type for n in out.graph.node]
    assert result.log.totals()["LowerLRN"]["rewrites"] == {"LRNDecomposed": 1}
    x = (np.random.default_rng(0).standard_normal((2, 7, 5, 6)) * 30).astype(np.float32)
    expected, actual = numerics.run(proto, {"x": x})["y"], numerics.run(out, {"x": x})["y"]
    np.testing.assert_allclose(actual, expected, rtol=2e-6, atol=1e-7)


def test_a_nan_reaches_its_own_window_only():
    # As ONNX defines LRN. onnxruntime's kernel slides one running sum along the channels, so
    # a NaN (or inf - inf) there spreads to every channel after it.
    proto = _model()
    out = graphopt.optimize(proto).to_onnx()
    x = np.ones((2, 7, 5, 6), np.float32)
    x[0, 0, 0, 0] = np.nan
    actual = numerics.run(out, {"x": x})["y"]
    assert np.isnan(actual[0, :3, 0, 0]).all()  # channels 0-2: the window of channel 0
    assert not np.isnan(actual[0, 3:, 0, 0]).any() and not np.isnan(actual[1]).any()
    assert np.isnan(numerics.run(proto, {"x": x})["y"][0, 3:, 0, 0]).all()  # the kernel's


def test_a_target_whose_device_has_lrn_keeps_it():
    result = graphopt.optimize(_model(), target="ascend310")
    assert "LRN" in [n.op_type for n in result.model.graph]


def test_squares_past_float32s_range_are_scaled_before_they_are_summed():
    # Five values of 1e19: their squares sum past float32's range, and x / inf was 0 where
    # onnxruntime's kernel (alpha/size times each square, then the sum) gives 3-5e-7.
    proto = _model()
    out = graphopt.optimize(proto).to_onnx()
    x = np.zeros((2, 7, 5, 6), np.float32)
    x[0, :5, 0, 0] = 1e19
    expected, actual = numerics.run(proto, {"x": x})["y"], numerics.run(out, {"x": x})["y"]
    assert (actual[0, :5, 0, 0] > 3e-7).all()
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-12)
    # Each square alone passes float32's range from 1.8e19 on: x / inf made the window 0 (and
    # onnxruntime's kernel gives NaN there); √alpha scales x before it is squared.
    x[0, :3, 0, 0] = [2e19, 3e19, 4e19]
    window = x[0, :5, 0, 0].astype(np.float64)
    sums = np.convolve(window ** 2, np.ones(5), "same")
    exact = window / (1 + 1e-4 / 5 * sums) ** 0.75
    actual = numerics.run(out, {"x": x})["y"]
    np.testing.assert_allclose(actual[0, :5, 0, 0], exact, rtol=1e-5)


def test_what_lowering_leaves_as_lrn():
    # An alpha or beta onnxruntime's kernel refuses; a compile that converts precision, where
    # a mixed mode keeps LRN in float32 and would not keep its lowered squares so (float16
    # overflows from 256).
    for proto, precision in ((_model(alpha=0.0), "keep"), (_model(beta=-0.5), "keep"),
                             (_model(), "mixed-fp16")):
        result = graphopt.optimize(proto, precision=precision)
        assert "LRN" in [n.op_type for n in result.model.graph], precision


def test_an_om_of_a_conv_net_with_lrn_keeps_its_memory_plan(tmp_path):
    # The lowered ops' values were untyped when LayoutNchwc blocked the convs around them, and
    # a Reorder of an untyped value left the partition without a memory plan.
    from graphopt.codegen import load_om

    rng = np.random.default_rng(2)
    proto = parse_model("""
    g (float[1, 3, 16, 16] x) => (float[1, 16, 16, 16] y) {
      c = Conv <pads = [1, 1, 1, 1]> (x, w1)
      n = LRN <size = 5> (c)
      y = Conv <pads = [1, 1, 1, 1]> (n, w2)
    }""", w1=rng.standard_normal((16, 3, 3, 3)).astype(np.float32),
        w2=rng.standard_normal((16, 16, 3, 3)).astype(np.float32))
    graphopt.save(graphopt.optimize(proto, target="cpu"), tmp_path / "m.om")
    (plan,) = load_om(tmp_path / "m.om").extra["memory_plan"].values()
    assert plan["arena_bytes"] > 0 and not plan.get("unplanned")
