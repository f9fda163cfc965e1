"""FoldInputAffine: a per-channel Mul, Div or Add on a Conv's input goes into the Conv's weights
and bias where that is exact to rounding, and stays where the Conv's zero padding would read
the shift."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import ops, parse_model

import graphopt
from graphopt import numerics

RNG = np.random.default_rng(0)
SCALE = (RNG.uniform(0.5, 2.0, (1, 8, 1, 1)) * RNG.choice([-1, 1], (1, 8, 1, 1))).astype(
    np.float32)
SHIFT = RNG.standard_normal((1, 8, 1, 1)).astype(np.float32)


def _model(body: str, group: int = 1, kernel: int = 3, pads: int = 1, **extra) -> onnx.ModelProto:
    text = f"""
    g (float[2, 8, 9, 9] x) => (float[2, 8, {9 + 2 * pads - kernel + 1}, \
{9 + 2 * pads - kernel + 1}] y) {{
      {body}
      y = Conv<group = {group}, pads = [{pads}, {pads}, {pads}, {pads}]>(h, w, b)
    }}"""
    weights = {"w": RNG.standard_normal((8, 8 // group, kernel, kernel)).astype(np.float32),
               "b": RNG.standard_normal(8).astype(np.float32)}
    declared = "".join(f", float{list(a.shape)} {n}" for n, a in {**weights, **extra}.items())
    text = text.replace("float[2, 8, 9, 9] x", "float[2, 8, 9, 9] x" + declared)
    return parse_model(text, **weights, **extra)


def _compiled(proto, atol: float = 1e-5) -> list[str]:
    """The compiled model's ops, once its outputs are checked against the original's."""
    result = graphopt.optimize(proto)
    out = result.to_onnx()
    onnx.checker.check_model(out)
    feeds = {"x": RNG.standard_normal((2, 8, 9, 9)).astype(np.float32) * 3}
    expected, actual = numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=atol)
    return ops(result.model)


@pytest.mark.parametrize("group", [1, 2, 8])
@pytest.mark.parametrize("order", ["h = Mul(x, s)", "h = Mul(s, x)"])
def test_a_scale_goes_into_any_conv(group, order):
    # Padded or not: the padding's 0 times s is 0. Each group scales its own input channels.
    assert _compiled(_model(order, group=group, s=SCALE)) == ["Conv"]


def test_a_scalar_scale_and_a_divisor_go_in():
    assert _compiled(_model("h = Mul(x, s)", s=np.array(-1.5, np.float32))) == ["Conv"]
    assert _compiled(_model("h = Div(x, s)", s=SCALE)) == ["Conv"]


def test_a_shift_goes_into_an_unpadded_conv_only():
    assert _compiled(_model("h = Add(x, t)", kernel=1, pads=0, t=SHIFT)) == ["Conv"]
    assert _compiled(_model("h = Add(t, x)", group=8, kernel=3, pads=0, t=SHIFT)) == ["Conv"]
    # Padded, the border outputs would gain W·t over the taps that read the padding.
    assert _compiled(_model("h = Add(x, t)", t=SHIFT)) == ["Add", "Conv"]


def test_scale_and_shift_before_an_unpadded_conv_both_go_in():
    body = "m = Mul(x, s)\n      h = Add(m, t)"
    assert _compiled(_model(body, kernel=1, pads=0, s=SCALE, t=SHIFT)) == ["Conv"]


@pytest.mark.parametrize("group", [1, 8])
def test_before_a_padded_conv_the_scale_goes_in_and_the_shift_stays(group):
    # h·s + t = (h + t/s)·s: the Add stays outside, with t/s, and the Mul goes into W.
    body = "m = Mul(s, x)\n      h = Add(m, t)"
    assert _compiled(_model(body, group=group, s=SCALE, t=SHIFT)) == ["Add", "Conv"]
    scalars = {"s": np.array(0.25, np.float32), "t": np.array(3.0, np.float32)}
    out = graphopt.optimize(_model(body, **scalars)).to_onnx()
    moved = {i.name: onnx.numpy_helper.to_array(i) for i in out.graph.initializer}
    assert moved[out.graph.node[0].input[1]].shape == ()  # still a scalar: t/s = 12
    assert float(moved[out.graph.node[0].input[1]]) == 12.0


def test_what_stays_outside():
    zero = SCALE.copy()
    zero[0, 3] = 0
    body = "m = Mul(x, s)\n      h = Add(m, t)"
    # t/s has no value where s is 0: the Mul and Add stay as they are.
    assert _compiled(_model(body, s=zero, t=SHIFT)) == ["Mul", "Add", "Conv"]
    # A constant over the spatial axes is not per channel.
    spatial = RNG.standard_normal((1, 1, 9, 9)).astype(np.float32)
    assert _compiled(_model("h = Mul(x, s)", s=spatial)) == ["Mul", "Conv"]
    # A vector broadcasts along the last axis (the width), not the channels.
    along_width = RNG.standard_normal(9).astype(np.float32)
    assert _compiled(_model("h = Mul(x, s)", s=along_width)) == ["Mul", "Conv"]
    # An input that is not a constant.
    text = """
    g (float[2, 8, 9, 9] x, float[1, 8, 1, 1] s, float[4, 8, 1, 1] w) => (float[2, 4, 9, 9] y) {
      h = Mul(x, s)
      y = Conv(h, w)
    }"""
    proto = parse_model(text, w=RNG.standard_normal((4, 8, 1, 1)).astype(np.float32))
    assert [n.op_type for n in graphopt.optimize(proto).to_onnx().graph.node] == ["Mul", "Conv"]


def test_a_scaled_value_another_op_reads_stays():
    text = """
    g (float[2, 8, 9, 9] x, float[4, 8, 1, 1] w) => (float[2, 4, 9, 9] y, float[2, 8, 9, 9] h) {
      h = Mul(x, s)
      y = Conv(h, w)
    }"""
    proto = parse_model(text, s=SCALE, w=RNG.standard_normal((4, 8, 1, 1)).astype(np.float32))
    assert [n.op_type for n in graphopt.optimize(proto).to_onnx().graph.node] == ["Mul", "Conv"]


def test_auto_pad_same_keeps_the_shift():
    text = """
    g (float[2, 8, 9, 9] x, float[4, 8, 3, 3] w) => (float[2, 4, 9, 9] y) {
      h = Add(x, t)
      y = Conv<auto_pad = "SAME_UPPER">(h, w)
    }"""
    proto = parse_model(text, t=SHIFT, w=RNG.standard_normal((4, 8, 3, 3)).astype(np.float32))
    assert _compiled(proto) == ["Add", "Conv"]


@pytest.mark.parametrize("x_type, op", [("float[2, 1, 9, 9]", "Add"),
                                         ("float[2, C, 9, 9]", "Mul"),
                                         ("float[8, 9, 9]", "Mul")])
def test_a_constant_that_widens_the_input_stays(x_type, op):
    # x · s broadcasts x's one channel (or its missing axis) to the Conv's eight: the Conv
    # alone, with s in W, would read x as it is.
    text = f"""
    g ({x_type} x, float[4, 8, 1, 1] w) => (float[2, 4, 9, 9] y) {{
      h = {op}(x, s)
      y = Conv(h, w)
    }}"""
    proto = parse_model(text, s=SCALE, w=RNG.standard_normal((4, 8, 1, 1)).astype(np.float32))
    out = graphopt.optimize(proto).to_onnx()
    assert [n.op_type for n in out.graph.node] == [op, "Conv"]
    x = RNG.standard_normal((2, 1, 9, 9) if "8, 9" not in x_type else (8, 9, 9))
    feeds = {"x": x.astype(np.float32)}
    np.testing.assert_allclose(numerics.run(out, feeds)["y"], numerics.run(proto, feeds)["y"],
                               rtol=1e-5, atol=1e-5)


def test_float16_weights_stay_unfolded():
    # W · s rounded to float16 once differs from x · s rounded per element by an ulp in a
    # fifth of the outputs: more than --verify allows, so 16-bit models keep their Mul/Add.
    text = """
    g (float16[1, 8, 9, 9] x, float16[4, 8, 3, 3] w) => (float16[1, 4, 7, 7] y) {
      h = Add(x, t)
      y = Conv(h, w)
    }"""
    proto = parse_model(text, t=(SHIFT * 10).astype(np.float16),
                        w=RNG.standard_normal((4, 8, 3, 3)).astype(np.float16))
    result = graphopt.optimize(proto, verify=True)
    assert ops(result.model) == ["Add", "Conv"]


def test_a_hard_swish_keeps_its_sixth():
    # The / 6 that ends PaddlePaddle's hard-swish is a scale on the next Conv's input too:
    # FoldInputAffine runs after FuseHardSwish, which takes it first.
    text = """
    g (float[2, 8, 9, 9] x, float[8, 8, 1, 1] w) => (float[2, 8, 9, 9] y) {
      a = Add(x, three)
      r = Clip(a, zero, six)
      p = Mul(x, r)
      h = Div(p, six)
      y = Conv(h, w)
    }"""
    constants = {"three": np.array(3.0, np.float32), "zero": np.array(0.0, np.float32),
                 "six": np.array(6.0, np.float32)}
    proto = parse_model(text, w=RNG.standard_normal((8, 8, 1, 1)).astype(np.float32),
                        **constants)
    assert _compiled(proto) == ["HardSwish", "Conv"]


def test_an_input_normalized_before_an_unpadded_conv_folds_entirely():
    # (x − mean) / std before a ViT-style patch embedding (a 3×3 stride-3 Conv, no padding).
    text = """
    g (float[2, 8, 9, 9] x, float[8, 8, 3, 3] w) => (float[2, 8, 3, 3] y) {
      c = Sub(x, mean)
      h = Div(c, std)
      y = Conv<strides = [3, 3]>(h, w)
    }"""
    proto = parse_model(text, mean=SHIFT, std=np.abs(SCALE),
                        w=RNG.standard_normal((8, 8, 3, 3)).astype(np.float32))
    assert _compiled(proto) == ["Conv"]
    # Sub(t, x) is −x + t: not a shift of x, and it stays.
    flipped = parse_model(text.replace("Sub(x, mean)", "Sub(mean, x)"), mean=SHIFT,
                          std=np.abs(SCALE), w=RNG.standard_normal((8, 8, 3, 3)).astype(
                              np.float32))
    assert _compiled(flipped) == ["Sub", "Conv"]


PERMUTATION = np.array([3, 0, 7, 1, 6, 2, 5, 4], np.int64)
# The permuted Conv sums its input channels in another order: float32 rounding at the outputs'
# scale (up to ~60 here), not an error of the fold.
SUM_ORDER = 1e-6 * 60


@pytest.mark.parametrize("indices", [PERMUTATION, PERMUTATION - 8])
def test_a_channel_permutation_goes_into_the_conv(indices):
    # An image read as BGR by a model trained on RGB: x[:, [2, 1, 0]] exports as a Gather.
    assert _compiled(_model("h = Gather<axis = 1>(x, p)", p=indices), SUM_ORDER) == ["Conv"]
    # With a scale before it, both go in (the permutation first exposes the Mul).
    body = "m = Mul(x, s)\n h = Gather<axis = -3>(m, p)"
    assert _compiled(_model(body, s=SCALE, p=indices), SUM_ORDER) == ["Conv"]


@pytest.mark.parametrize("body, extra", [
    ("h = Gather<axis = 1>(x, p)", {"p": np.array([0, 1, 1, 2, 3, 4, 5, 6], np.int64)}),
    ("h = Gather<axis = 2>(x, p)", {"p": np.arange(9)[::-1].copy()}),
])
def test_gathers_that_are_no_channel_permutation_stay(body, extra):
    # A repeated channel, or a permutation of rows: not a reordering of the Conv's inputs.
    assert "Gather" in _compiled(_model(body, **extra))


def test_a_grouped_conv_keeps_its_permutation():
    assert _compiled(_model("h = Gather<axis = 1>(x, p)", group=2, p=PERMUTATION)) == \
        ["Gather", "Conv"]


def test_indices_past_the_channels_are_no_permutation():
    # Taken modulo the channel count, [11, 8, 15, …] had read as PERMUTATION: the fold made a
    # model onnxruntime refuses (indices out of bounds) into one that runs.
    model = _model("h = Gather<axis = 1>(x, p)", p=PERMUTATION + 8)
    assert "Gather" in ops(graphopt.optimize(model).model)
