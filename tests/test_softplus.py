"""LowerSoftplus (-O3): Softplus and Mish as Relu(x) + Log(1 + Exp(-|x|)) (and x · Tanh of
it), within 4e-6 of onnxruntime's kernels, NaN and infinities alike; -O2 and NPU targets keep
the ops."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import parse_model

import graphopt
from graphopt import numerics

MODEL = """
g (float[2, 4, 8, 8] x) => (float[2, 4, 8, 8] y) {
  y = OP(x)
}"""
SPECIAL = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, 100.0, -100.0, 88.8, -20.0, 1e-30],
                   np.float32)


@pytest.mark.parametrize("op, opset", [("Softplus", 17), ("Mish", 18)])
def test_the_op_becomes_exp_and_log_within_4e_6_at_o3_only(op, opset):
    proto = parse_model(MODEL.replace("OP", op),
                        header=f'<ir_version: 8, opset_import: ["" : {opset}]>\n')
    assert [n.op_type for n in graphopt.optimize(proto).to_onnx().graph.node] == [op]
    result = graphopt.optimize(proto, level=3)
    out = result.to_onnx()
    onnx.checker.check_model(out)
    assert result.log.totals()["LowerSoftplus"]["rewrites"] == {f"{op}Decomposed": 1}
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((2, 4, 8, 8)) * np.exp(rng.uniform(-6, 4, (2, 4, 8, 8))))
    x = x.astype(np.float32)
    x.reshape(-1)[:SPECIAL.size] = SPECIAL
    x.reshape(-1)[-1] = 6.9635053  # Mish's largest difference: 3.34e-6
    expected, actual = numerics.run(proto, {"x": x})["y"], numerics.run(out, {"x": x})["y"]
    assert np.array_equal(np.isnan(expected), np.isnan(actual))
    finite = np.isfinite(expected)
    assert np.array_equal(expected[~finite & ~np.isnan(expected)],
                          actual[~finite & ~np.isnan(expected)])  # the infinities
    assert np.max(np.abs(expected[finite] - actual[finite])) < 4e-6


def test_a_target_whose_device_runs_the_op_keeps_it():
    # The Ascend profiles have Softplus; a float16 Softplus is no float32 kernel's either.
    softplus = parse_model(MODEL.replace("OP", "Softplus"))
    result = graphopt.optimize(softplus, level=3, target="ascend910b")
    assert "Softplus" in [n.op_type for n in result.model.graph]
    half = parse_model(MODEL.replace("OP", "Softplus").replace("float", "float16"))
    assert [n.op_type for n in graphopt.optimize(half, level=3).model.graph] == ["Softplus"]
