"""FuseHardSwish: hard-swish as exporters decompose it becomes HardSwish (opset 14 on) or
x · HardSigmoid(x) (before), to float32 rounding."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import as_float16, parse_model

import graphopt
from graphopt import numerics

FORMS = {
    "paddle": "p = Mul(x, r)\n  y = Div(p, six)",
    "scaled": "p = Mul(r, x)\n  y = Mul(p, sixth)",
    "gate divided": "g = Div(r, six)\n  y = Mul(x, g)",
    "gate scaled": "g = Mul(sixth, r)\n  y = Mul(g, x)",
}
MODEL = """
g (float[2, 4, 5, 5] x) => (float[2, 4, 5, 5] y) {
  a = Add(x, three)
  r = Clip(a, zero, six)
  FORM
}"""
CONSTANTS = {"three": np.array(3.0, np.float32), "zero": np.array(0.0, np.float32),
             "six": np.array(6.0, np.float32), "sixth": np.array(1 / 6, np.float32)}


def _feeds():
    x = (np.random.default_rng(0).standard_normal((2, 4, 5, 5)) * 4).astype(np.float32)
    x.reshape(-1)[:6] = [np.nan, np.inf, -np.inf, -3.0, 3.0, 0.0]
    return {"x": x}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("opset, ops", [(17, ["HardSwish"]), (12, ["HardSigmoid", "Mul"])])
@pytest.mark.parametrize("target", [None, "cpu"])
def test_each_form_becomes_one_hardswish(form, opset, ops, target):
    # The cpu target too, the command line's default: onnxruntime registers no HardSwish
    # kernel and inlines the op's function body (HardSigmoid, Mul), which its table now counts.
    proto = parse_model(MODEL.replace("FORM", FORMS[form]),
                        header=f'<ir_version: 8, opset_import: ["" : {opset}]>\n',
                        **CONSTANTS)
    result = graphopt.optimize(proto, target=target)
    out = result.to_onnx()
    onnx.checker.check_model(out)
    assert sorted(n.op_type for n in out.graph.node) == sorted(ops)
    feeds = _feeds()
    expected, actual = numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-7)  # NaN where it was
    # Past float32's largest value over 6, the forms that multiply by 6 first overflowed to
    # +inf; HardSwish gives x.
    huge = {"x": np.full((2, 4, 5, 5), 1e38, np.float32)}
    assert (numerics.run(out, huge)["y"] == np.float32(1e38)).all()


def test_hardsigmoid_times_x_becomes_hardswish_only_with_its_constants():
    text = """
    g (float[2, 4, 5, 5] x) => (float[2, 4, 5, 5] y) {
      h = HardSigmoid <alpha = ALPHA, beta = 0.5> (x)
      y = Mul(x, h)
    }"""
    fused = parse_model(text.replace("ALPHA", "0.16666667"))
    assert [n.op_type for n in graphopt.optimize(fused).to_onnx().graph.node] == ["HardSwish"]
    feeds = _feeds()
    np.testing.assert_array_equal(numerics.run(fused, feeds)["y"],
                                  numerics.run(graphopt.optimize(fused).to_onnx(), feeds)["y"])
    kept = parse_model(text.replace("ALPHA", "0.2"))  # onnx's default HardSigmoid: no swish
    assert [n.op_type for n in graphopt.optimize(kept).to_onnx().graph.node] == \
        ["HardSigmoid", "Mul"]


def test_a_shifted_value_read_elsewhere_keeps_the_ops():
    proto = parse_model("""
    g (float[2, 4, 5, 5] x) => (float[2, 4, 5, 5] y, float[2, 4, 5, 5] a) {
      a = Add(x, three)
      r = Clip(a, zero, six)
      p = Mul(x, r)
      y = Div(p, six)
    }""", **CONSTANTS)
    assert "HardSwish" not in [n.op_type for n in graphopt.optimize(proto).to_onnx().graph.node]


def test_a_conv_and_its_hardswish_become_one_fused_conv_at_o3():
    rng = np.random.default_rng(1)
    proto = parse_model("""
    g (float[1, 3, 8, 8] x) => (float[1, 4, 8, 8] y) {
      c = Conv <pads = [1, 1, 1, 1]> (x, w)
      a = Add(c, three)
      r = Clip(a, zero, six)
      p = Mul(c, r)
      y = Div(p, six)
    }""", w=rng.standard_normal((4, 3, 3, 3)).astype(np.float32), **CONSTANTS)
    out = graphopt.optimize(proto, level=3).to_onnx()
    (node,) = out.graph.node
    assert node.op_type == "FusedConv"
    assert {a.name: a for a in node.attribute}["activation"].s == b"HardSwish"
    feeds = numerics.random_feeds(proto, seed=2)
    assert not numerics.compare(numerics.run(proto, feeds), numerics.run(out, feeds), 1e-5, 1e-6)


def test_a_conv_and_its_hardswish_run_as_one_blocked_conv_on_the_cpu():
    # PaddleOCR's and PicoDet's form, at -O2 on the cpu target: the NCHWc conv applies the
    # hard-swish itself, where the four ops of the export ran in NCHW between reorders.
    rng = np.random.default_rng(1)
    proto = parse_model("""
    g (float[1, 16, 8, 8] x) => (float[1, 16, 8, 8] y) {
      c = Conv <pads = [1, 1, 1, 1]> (x, w)
      a = Add(c, three)
      r = Clip(a, zero, six)
      p = Mul(c, r)
      y = Div(p, six)
    }""", w=rng.standard_normal((16, 16, 3, 3)).astype(np.float32), **CONSTANTS)
    out = graphopt.optimize(proto, target="cpu").to_onnx()
    convs = [n for n in out.graph.node if n.op_type == "Conv"]
    assert [n.domain for n in convs] == ["com.microsoft.nchwc"]
    assert {a.name: a for a in convs[0].attribute}["activation"].s == b"HardSwish"
    assert not {"Add", "Clip", "Mul", "Div"} & {n.op_type for n in out.graph.node}
    feeds = numerics.random_feeds(proto, seed=2)  # NCHWc sums the conv in another order
    assert not numerics.compare(numerics.run(proto, feeds), numerics.run(out, feeds), 1e-4, 1e-5)


@pytest.mark.parametrize("target, fused", [("ascend310", True), ("cpu", True)])
def test_a_float16_hardswish_fuses(target, fused):
    # The NPUs run HardSwish in float16; onnxruntime's CPU provider inlines its function in
    # float32 between the Casts it inserts.
    proto = as_float16(parse_model(MODEL.replace("FORM", FORMS["paddle"]),
                                   header='<ir_version: 8, opset_import: ["" : 17]>\n',
                                   **CONSTANTS))
    out = graphopt.optimize(proto, target=target).to_onnx()
    onnx.checker.check_model(out)
    assert (sorted(n.op_type for n in out.graph.node) == ["HardSwish"]) == fused
    x = np.random.default_rng(0).standard_normal((2, 4, 5, 5)).astype(np.float16) * 4
    expected, actual = (numerics.run(m, {"x": x})["y"].astype(np.float32) for m in (proto, out))
    # One rounding where the ops round at each of their three steps.
    np.testing.assert_allclose(actual, expected, rtol=2.0 ** -9, atol=2.0 ** -14)
