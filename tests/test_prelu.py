"""LowerPRelu: PRelu with a constant slope becomes LeakyRelu, Max/Min(x, x·slope) or
Relu(x) + Min(x, 0)·slope, exactly, where onnxruntime's CPU provider would run it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import parse_model

import graphopt
from graphopt import numerics

PRELU = """
g (float[2, 4, 5, 5] x) => (float[2, 4, 5, 5] y) {
  y = PRelu(x, slope)
}"""
# Every kind of element PRelu treats apart: signs, zeros of both signs, infinities, NaN.
SPECIAL = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, -2.5, 3.0, -1e-30], np.float32)


def _feeds():
    x = np.random.default_rng(0).standard_normal((2, 4, 5, 5)).astype(np.float32)
    x.reshape(-1)[:SPECIAL.size] = SPECIAL
    x.reshape(-1)[-SPECIAL.size:] = SPECIAL
    return {"x": x}


@pytest.mark.parametrize("slope, ops", [
    (np.array([0.25], np.float32), ["LeakyRelu"]),
    (np.array([0.01, 0.3, 1.0, 0.7], np.float32).reshape(4, 1, 1), ["Mul", "Max"]),
    # A slope of 0: x·0 is NaN at +inf, which Max passes on where PRelu gives +inf.
    (np.array([0.0, 0.3, 1.0, 0.7], np.float32).reshape(4, 1, 1),
     ["Relu", "Min", "Mul", "Add"]),
    (np.array([1.0, 1.5, 3.0, 2.0], np.float32).reshape(4, 1, 1), ["Mul", "Min"]),
    (np.array([-1.0, 0.3, 3.5, 0.0], np.float32).reshape(4, 1, 1),
     ["Relu", "Min", "Mul", "Add"]),
    (np.array([0.1, -0.2, 0.3, 0.4, 0.5], np.float32),  # along W: still per element
     ["Relu", "Min", "Mul", "Add"]),
    (np.full((4, 1, 1), 0.25, np.float32), ["LeakyRelu"]),  # per channel, all alike
    (np.array([np.inf], np.float32), ["LeakyRelu"]),
], ids=["one", "unit", "zero", "steep", "mixed", "last-axis", "alike", "infinite"])
def test_each_slope_takes_its_form_and_computes_what_prelu_does(slope, ops):
    proto = parse_model(PRELU, slope=slope)
    out = graphopt.optimize(proto).to_onnx()
    onnx.checker.check_model(out)
    assert sorted(n.op_type for n in out.graph.node) == sorted(ops)
    feeds = _feeds()
    expected, actual = numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]
    # Bit for bit, NaN where PRelu gives NaN, but a zero's sign.
    assert np.array_equal(expected, actual, equal_nan=True)


def test_a_one_slope_prelu_after_a_conv_fuses_into_it_at_o3():
    rng = np.random.default_rng(1)
    proto = parse_model("""
    g (float[1, 3, 8, 8] x) => (float[1, 4, 8, 8] y) {
      c = Conv <pads = [1, 1, 1, 1]> (x, w)
      y = PRelu(c, slope)
    }""", w=rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        slope=np.array(0.1, np.float32))
    out = graphopt.optimize(proto, level=3).to_onnx()
    (node,) = out.graph.node
    assert node.op_type == "FusedConv"
    assert {a.name: a for a in node.attribute}["activation"].s == b"LeakyRelu"
    feeds = numerics.random_feeds(proto, seed=2)
    assert not numerics.compare(numerics.run(proto, feeds), numerics.run(out, feeds), 1e-5, 1e-6)


def test_what_lowering_leaves_as_it_is():
    rng = np.random.default_rng(3)
    slope = rng.uniform(-1, 2, (4, 1, 1)).astype(np.float32)
    # A slope computed at run time; a float16 PRelu (the forms are float32 kernels here);
    # an NPU target, whose device has a PRelu kernel.
    given = parse_model("""
    g (float[2, 4, 5, 5] x, float[4, 1, 1] s) => (float[2, 4, 5, 5] y) {
      y = PRelu(x, s)
    }""")
    half = parse_model(PRELU.replace("float", "float16"), slope=slope.astype(np.float16))
    # Several slopes with an infinity or a NaN (0·inf is NaN where PRelu passes x ≥ 0 as
    # it is); opset 7, whose Min does not broadcast the zero.
    infinite = parse_model(PRELU, slope=np.array([0.5, np.inf, 1, 2], np.float32)
                           .reshape(4, 1, 1))
    nan = parse_model(PRELU, slope=np.array([0.5, np.nan, 1, 2], np.float32).reshape(4, 1, 1))
    old = parse_model(PRELU, header='<ir_version: 3, opset_import: ["" : 7]>\n', slope=slope)
    # A slope of two dims before an input of unknown rank: onnxruntime broadcasts both ways,
    # and the output takes the slope's shape, which LeakyRelu's would not.
    unranked = parse_model(PRELU, slope=np.full((2, 4), 0.25, np.float32))
    for value in (*unranked.graph.input, *unranked.graph.output):
        value.type.tensor_type.ClearField("shape")
    for proto, target in ((given, None), (half, None), (parse_model(PRELU, slope=slope),
                                                        "ascend310"),
                          (infinite, None), (nan, None), (old, None), (unranked, None)):
        result = graphopt.optimize(proto, target=target)
        assert [n.op_type for n in result.model.graph] == ["PRelu"], target
        feeds = _feeds() if proto is not half else {"x": _feeds()["x"].astype(np.float16)}
        if proto is not given and proto is not unranked:
            assert np.array_equal(numerics.run(proto, feeds)["y"],
                                  numerics.run(result.to_onnx(), feeds)["y"], equal_nan=True)
