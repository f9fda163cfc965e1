"""FuseGelu on the GELU and SiLU forms that Hugging Face exports bring: the dynamo exporter's
x·(½·(1+erf)) and x·(½·(1+tanh)), BLOOM's factored tanh argument, TorchScript's x·x·x, and
x·sigmoid(x) — each fires (counted, structurally), keeps outputs at ORT_DISABLE_ALL, and is
refused for a wrong constant, a shared intermediate and float16."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import onnx.printer
import pytest
from helpers import ops
from test_fusion_gelu import HEADER, WIDTH, check_numerics, fuse, to_float16

import graphopt
from graphopt import numerics
from graphopt.ir import format_model, to_onnx

ERF = {"s": 1.4142135, "one": 1.0, "half": 0.5}
TANH = {"k": 0.044715, "c": 0.7978845608, "one": 1.0, "half": 0.5}


def _form(rule, body, consts, fused, intermediate):
    return {"rule": rule, "body": body, "consts": consts, "fused": fused,
            "intermediate": intermediate}


GELU = "com.microsoft::Gelu"
FAST = "com.microsoft::FastGelu"
# The node list as each exporter writes it (x: float[N, 16] in, y out), the rule that takes it,
# the op it fuses into, and an intermediate that an extra consumer can read.
FORMS = {
    # onnxscript's aten_gelu: Div, Erf, Add, Mul(½, a), Mul(x, m) (BERT, BART, Falcon, …).
    "erf, ½ inside (dynamo)": _form(
        "GeluErfHalfInside", ["d = Div(x, s)", "e = Erf(d)", "a = Add(e, one)",
                              "m = Mul(half, a)", "y = Mul(x, m)"], ERF, GELU, "m"),
    "erf, ½ inside, by 1/√2": _form(
        "GeluErfHalfInside", ["d = Mul(x, s)", "e = Erf(d)", "a = Add(one, e)",
                              "m = Mul(a, half)", "y = Mul(m, x)"], {**ERF, "s": 0.70710678},
        GELU, "d"),
    # BLOOM's bloom_gelu_forward: x·0.5·(1 + tanh(0.79788456·x·(1 + 0.044715·x·x))).
    "tanh, BLOOM": _form(
        "GeluTanh", ["h = Mul(x, half)", "cx = Mul(x, c)", "kx = Mul(x, k)", "kxx = Mul(kx, x)",
                     "p = Add(kxx, one)", "t = Mul(cx, p)", "th = Tanh(t)", "a = Add(th, one)",
                     "y = Mul(h, a)"], TANH, FAST, "kxx"),
    "tanh, BLOOM's argument, x·x first": _form(
        "GeluTanh", ["h = Mul(x, half)", "cx = Mul(c, x)", "xx = Mul(x, x)", "kxx = Mul(xx, k)",
                     "p = Add(one, kxx)", "t = Mul(p, cx)", "th = Tanh(t)", "a = Add(th, one)",
                     "y = Mul(a, h)"], TANH, FAST, "xx"),
    # onnxscript's aten_gelu(approximate="tanh") (Gemma's gelu_pytorch_tanh).
    "tanh, ½ inside (dynamo)": _form(
        "GeluTanhHalfInside", ["p = Pow(x, three)", "pk = Mul(k, p)", "inner = Add(x, pk)",
                               "t = Mul(c, inner)", "th = Tanh(t)", "a = Add(th, one)",
                               "m = Mul(half, a)", "y = Mul(x, m)"], {**TANH, "three": 3.0},
        FAST, "m"),
    # `x * x * x` traced by TorchScript: Mul(x, x), then Mul(x, xx).
    "tanh, x·x·x (TorchScript)": _form(
        "GeluTanhHalfLast", ["xx = Mul(x, x)", "p = Mul(x, xx)", "pk = Mul(k, p)",
                             "inner = Add(x, pk)", "t = Mul(c, inner)", "th = Tanh(t)",
                             "a = Add(one, th)", "m = Mul(x, a)", "y = Mul(half, m)"], TANH,
        FAST, "p"),
    # `0.044715 * x * x * x`: the constant first, ((k·x)·x)·x.
    "tanh, k·x·x·x": _form(
        "GeluTanh", ["kx = Mul(k, x)", "kxx = Mul(kx, x)", "pk = Mul(kxx, x)",
                     "inner = Add(x, pk)", "t = Mul(c, inner)", "th = Tanh(t)",
                     "a = Add(one, th)", "h = Mul(x, half)", "y = Mul(h, a)"], TANH,
        FAST, "kxx"),
    "silu": _form("Silu", ["sg = Sigmoid(x)", "y = Mul(x, sg)"], {},
                  "com.microsoft::QuickGelu", "sg"),
}


def model_text(name: str, consts: dict | None = None, extra_consumer: bool = False) -> str:
    form = FORMS[name]
    values = {**form["consts"], **(consts or {})}
    inits = ", ".join(f"float {key} = {{{value}}}" for key, value in values.items())
    body = list(form["body"])
    outputs = f"float[N, {WIDTH}] y"
    if extra_consumer:
        body.append(f"z = Neg({form['intermediate']})")
        outputs += f", float[N, {WIDTH}] z"
    init_text = f"<{inits}>" if inits else ""
    return HEADER + f"g (float[N, {WIDTH}] x) => ({outputs}) {init_text} {{\n  " \
        + "\n  ".join(body) + "\n}"


@pytest.mark.parametrize("name", list(FORMS))
def test_form_fires_counted_and_structure(name):
    form = FORMS[name]
    proto = onnx.parser.parse_model(model_text(name))
    model, stats, _ = fuse(proto)
    assert stats == {form["rule"]: 1}
    assert ops(model) == [form["fused"]]
    text = format_model(model)
    assert f"%y<f32[N,{WIDTH}]> = {form['fused']}(%x)" in text
    for gone in ("Erf(", "Tanh(", "Sigmoid(", "Pow(", "= Add(", "= Mul(", "= Div("):
        assert gone not in text
    check_numerics(proto, model)


def test_silu_is_quick_gelu_with_alpha_one():
    model, _, _ = fuse(onnx.parser.parse_model(model_text("silu")))
    (fused,) = list(model.graph)
    assert fused.attr("alpha") == 1.0


WRONG = {
    "erf, ½ inside (dynamo)": ({"s": 1.5}, "expected constant ≈ 1.4142135623730951, got [1.5]"),
    "erf, ½ inside, by 1/√2": ({"half": 0.6}, "expected constant ≈ 0.5, got [0.6"),
    "tanh, BLOOM": ({"k": 0.05}, "expected constant ≈ 0.044715, got [0.05"),
    "tanh, ½ inside (dynamo)": ({"three": 3.001}, "expected constant ≈ 3.0, got [3.00"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_a_wrong_constant_is_not_fused(name):
    consts, reason = WRONG[name]
    proto = onnx.parser.parse_model(model_text(name, consts))
    model, stats, traces = fuse(proto, trace=(FORMS[name]["rule"],))
    assert stats == {} and not any(op.startswith("com.microsoft") for op in ops(model))
    assert any(reason in line for line in traces), traces


@pytest.mark.parametrize("name", list(FORMS))
def test_intermediate_with_an_extra_consumer_is_not_fused(name):
    form = FORMS[name]
    proto = onnx.parser.parse_model(model_text(name, extra_consumer=True))
    model, stats, traces = fuse(proto, trace=(form["rule"],))
    assert stats == {} and not any(op.startswith("com.microsoft") for op in ops(model))
    assert any(f"refused: %{form['intermediate']} " in line and "is also read by Neg" in line
               for line in traces), traces


@pytest.mark.parametrize("name", list(FORMS))
def test_float16_fuses_without_a_target_too(name):
    # onnxruntime's CPU provider, which runs such a compile, runs its float32 kernel between
    # the Casts it inserts.
    proto = to_float16(onnx.parser.parse_model(model_text(name)))
    model, stats, _ = fuse(proto)
    assert stats == {FORMS[name]["rule"]: 1}
    out = to_onnx(model)
    feeds = numerics.random_feeds(proto, seed=7, dims={"N": 8})
    (expected,), (actual,) = (numerics.run(m, feeds).values() for m in (proto, out))
    assert actual.dtype == np.float16
    error = np.abs(actual.astype(np.float32) - expected.astype(np.float32))
    assert np.all(error <= 2.0 ** -9 * np.maximum(np.abs(expected.astype(np.float32)), 1.0))


def test_silu_of_another_value_is_not_fused():
    """x · sigmoid(z) is a gate (an SE block, GLU), not SiLU."""
    text = model_text("silu").replace("g (float[N, 16] x)", "g (float[N, 16] x, float[N, 16] v)")
    proto = onnx.parser.parse_model(text.replace("Sigmoid(x)", "Sigmoid(v)"))
    model, stats, _ = fuse(proto, trace=("Silu",))
    assert stats == {} and ops(model) == ["Sigmoid", "Mul"]


def test_silu_of_a_conv_is_left_to_the_nchwc_layout():
    """LayoutNchwc keeps a conv's Sigmoid and Mul blocked (onnxruntime fuses them there); a
    QuickGelu would be reordered around (EfficientNet-B0's .om for the cpu target measured
    1.10× slower with it)."""
    proto = onnx.parser.parse_model(HEADER + """
    g (float[1, 8, 6, 6] x) => (float[1, 8, 6, 6] y) <float[8, 8, 1, 1] w = {""" +
        ", ".join(f"{v:.3f}" for v in np.random.default_rng(0).standard_normal(64)) + """}> {
      c = Conv(x, w)
      sg = Sigmoid(c)
      y = Mul(c, sg)
    }""")
    model, stats, traces = fuse(proto, trace=("Silu",))
    assert stats == {} and ops(model) == ["Conv", "Sigmoid", "Mul"]
    assert any("refused: x comes from Conv" in line for line in traces), traces
    # On an NPU the conv keeps its own device format: the SiLU is one vector kernel there.
    for target in ("ascend310", "ascend910b"):
        result = graphopt.optimize(proto, target=target)
        assert [n.op_type for n in result.model.graph] == ["Conv", "QuickGelu"], target
        check_numerics(proto, result.model)
    # At -O3 the QuickGelu still joins the residual Add after it in one elementwise call.
    residual = onnx.parser.parse_model(onnx.printer.to_text(proto).replace(
        "y = Mul (c, sg)", "a = Mul (c, sg)\n   y = Add (a, x)"))
    result = graphopt.optimize(residual, target="ascend310", level=3)
    assert [n.op_type for n in result.model.graph] == ["Conv", "elementwise_0"]
    (body,) = result.model.functions
    assert [n.op_type for n in body.node] == ["QuickGelu", "Add"]
    check_numerics(residual, result.model)
    cpu = [n.op_type for n in graphopt.optimize(proto, target="cpu").model.graph]
    assert "QuickGelu" not in cpu and {"Sigmoid", "Mul"} <= set(cpu)  # blocked NCHWc ops


def test_dynamo_gelu_after_a_linear_becomes_bias_gelu():
    """The pipeline: MatMul + Add(bias) + the dynamo GELU → MatMul + BiasGelu, as BERT's
    intermediate layer compiles (rank 3, so the bias stays out of a Gemm)."""
    rng = np.random.default_rng(3)
    w = ", ".join(f"{v:.3f}" for v in rng.standard_normal(WIDTH * WIDTH) * 0.3)
    b = ", ".join(f"{v:.3f}" for v in rng.standard_normal(WIDTH) * 0.1)
    proto = onnx.parser.parse_model(HEADER + f"""
    g (float[2, N, {WIDTH}] x) => (float[2, N, {WIDTH}] y)
      <float[{WIDTH}, {WIDTH}] w = {{{w}}}, float[{WIDTH}] b = {{{b}}}, float s = {{1.4142135}},
       float one = {{1.0}}, float half = {{0.5}}> {{
      mm = MatMul(x, w)
      h = Add(mm, b)
      d = Div(h, s)
      e = Erf(d)
      a = Add(e, one)
      m = Mul(half, a)
      y = Mul(h, m)
    }}""")
    import graphopt

    result = graphopt.optimize(proto)
    assert ops(result.model) == ["MatMul", "com.microsoft::BiasGelu"]
    assert result.log.totals()["FuseGelu"]["rewrites"] == {"GeluErfHalfInside": 1,
                                                           "BiasGelu": 1}
    check_numerics(proto, result.model)
