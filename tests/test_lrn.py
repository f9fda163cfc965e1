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
