"""FuseLayerNorm: decomposed LayerNorm, Add + LayerNorm and RMSNorm into one op; each rule's
firing, refusals and numerics, then zoo BERT and GPT-2 with every LayerNorm fused.

Tolerance: rtol = atol = 1e-4 in float32. The fused kernels accumulate the mean and variance in
another order than the decomposed graph (onnxruntime's in one pass, as E[x²] - E[x]²) and
SkipLayerNormalization (emitted for an NPU target only: onnxruntime's CPU kernel is slower than
Add + LayerNormalization) adds the residual inside the kernel; on unit-scale inputs that moves the
last bits of each output (seen: ≤ 5e-7 here, ≤ 1e-6 on the zoo models), so 1e-4 leaves room for
other inputs yet flags a real fault (a wrong axis or ε moves outputs by > 1e-2). fp16 outputs
use 1e-2: one f16 ulp near 2-4 is 2e-3-4e-3 (seen 1e-3).
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter

import numpy as np
import onnx
import onnx.parser
import pytest
from helpers import parse_model
from onnx import numpy_helper

import graphopt
from graphopt import numerics, to_onnx, zoo
from graphopt.ir import format_node, load_onnx, verify
from graphopt.partition.target import load_target
from graphopt.passes import PASSES, Options, PassContext
from graphopt.passes.fusion import layernorm  # noqa: F401 - registers FuseLayerNorm
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.passes.rules import Tracer

TOL = 1e-4
_rng = np.random.default_rng(0)
GAMMA = ", ".join(f"{v:.4f}" for v in _rng.uniform(0.5, 1.5, 8))
BETA = ", ".join(f"{v:.4f}" for v in _rng.uniform(-0.5, 0.5, 8))
INITS = (f"float[8] gamma = {{{GAMMA}}}, float[8] beta = {{{BETA}}}, float eps = {{1e-5}}, "
         "float two = {2.0}, float half = {-0.5}, float halfpow = {0.5}, float one = {1.0}, "
         "float zero = {0.0}, "
         "float[8] eps8 = {1e-5, 1e-5, 1e-5, 1e-5, 1e-5, 1e-5, 1e-5, 1e-5}, "
         "float[1,1,8] g3 = {%s}" % GAMMA)
# The parser reads no float16 literals: these initializers are added to the parsed model.
F16 = {"g16": np.array(GAMMA.split(", "), np.float16),
       "b16": np.array(BETA.split(", "), np.float16),
       "two16": np.float16(2.0), "eps16": np.float16(1e-5)}

NORM = """
    mean = ReduceMean <axes = [-1]> (x)
    d = Sub(x, mean)
    sq = Pow(d, two)
    var = ReduceMean <axes = [-1]> (sq)
    ve = Add(var, eps)
    std = Sqrt(ve)
"""
LN = NORM + """
    n = Div(d, std)
    s = Mul(n, gamma)
    y = Add(s, beta)
"""
SKIP = "    x = Add(a, b)\n" + LN
RMS = """
    sq = Pow(x, two)
    ms = ReduceMean <axes = [-1]> (sq)
    ve = Add(ms, eps)
    {inverse}
    y = Mul(gamma, n)
"""
RMS_INVERSE = {
    "RmsNormDiv": "std = Sqrt(ve)\n    n = Div(x, std)",
    "RmsNormReciprocal": "std = Sqrt(ve)\n    r = Reciprocal(std)\n    n = Mul(x, r)",
    "RmsNormOneOver": "std = Sqrt(ve)\n    r = Div(one, std)\n    n = Mul(x, r)",
    "RmsNormPowHalf": "r = Pow(ve, half)\n    n = Mul(r, x)",
    # The square as x·x (torch.square), Pow's in RMS replaced: see _rms.
    "RmsNormMulSquare": "std = Sqrt(ve)\n    n = Div(x, std)",
    "RmsNormMulSquareReciprocal": "std = Sqrt(ve)\n    r = Reciprocal(std)\n    n = Mul(x, r)",
}


def _rms(rule: str) -> str:
    body = RMS.format(inverse=RMS_INVERSE[rule])
    return body.replace("Pow(x, two)", "Mul(x, x)") if "MulSquare" in rule else body


def _model(body: str, opset: int = 17, inputs: str = "float[2,5,8] x",
           outputs: str = "float[2,5,8] y", **extra: np.ndarray) -> onnx.ModelProto:
    """Parse the graph (with `extra` initializers besides INITS and F16); from opset 18
    ReduceMean's axes attribute becomes a constant input."""
    if opset >= 18:
        body = re.sub(r"ReduceMean <axes = \[(-?\d)\]> \((\w+)\)",
                      lambda m: f"ReduceMean({m[2]}, axes{m[1].replace('-', 'm')})", body)
    inits = INITS + ", int64[1] axesm1 = {-1}, int64[1] axes1 = {1}, int64[1] axes2 = {2}"
    ir = 10 if opset >= 23 else 8
    proto = onnx.parser.parse_model(f'<ir_version: {ir}, opset_import: ["" : {opset}]>\n'
                                    f"g ({inputs}) => ({outputs}) <{inits}> {{{body}}}")
    proto.graph.initializer.extend(numpy_helper.from_array(np.asarray(a), k)
                                   for k, a in {**F16, **extra}.items())
    onnx.checker.check_model(proto, full_check=True)
    return proto


NPU = load_target("ascend910b")  # has an AddLayerNorm kernel: SkipLayerNormalization is its form


def _fuse(proto: onnx.ModelProto, trace: str | None = None, target=None):
    """The IR model after InferShapes, FuseLayerNorm and EliminateDeadNodes (as the pipeline runs
    them) for `target`, the fusion's stats, the trace lines for `trace`."""
    model = load_onnx(proto)
    infer_shapes(model)
    ctx = PassContext(Options(), tracer=Tracer({trace}) if trace else None, target=target)
    result = PASSES["FuseLayerNorm"]().run(model, ctx)
    PASSES["EliminateDeadNodes"]().run(model, ctx)
    verify(model)
    return model, dict(result.stats), ctx.tracer.report() if trace else []


def _lines(model) -> list[str]:
    """The printed IR without node names (parsed nodes have none; fused ones are named by rule)."""
    return [format_node(n).split("  #")[0] for n in model.graph]


def _ops(model) -> list[str]:
    return [n.qualified_op for n in model.graph]


def _same_numerics(proto, model, tol: float = TOL, checker: bool = True) -> None:
    after = to_onnx(model)
    if checker:
        onnx.checker.check_model(after, full_check=True)
    feeds = numerics.random_feeds(proto, seed=1, dims={"B": 2, "S": 7})
    problems = numerics.compare(numerics.run(proto, feeds), numerics.run(after, feeds), tol, tol)
    assert not problems, [str(p) for p in problems]


# -- LayerNorm -------------------------------------------------------------------------------

def test_decomposed_layernorm_becomes_one_op():
    proto = _model(LN)
    model, stats, _ = _fuse(proto)
    assert stats == {"LayerNormDecomposed": 1}
    assert _lines(model) == [
        ("%y<f32[2,5,8]> = LayerNormalization(%x, %gamma, %beta) "
         "{axis=-1, epsilon=9.999999747378752e-06}")]
    _same_numerics(proto, model)


FORMS = {  # rule, body, opset, inputs, outputs
    "opset18-axes-input": ("LayerNormDecomposed", LN, 18, None, None),
    "axis-rank-minus-1": ("LayerNormDecomposed", LN.replace("[-1]", "[2]"), 17, None, None),
    "mul-square": ("LayerNormMulSquare", LN.replace("Pow(d, two)", "Mul(d, d)"), 17, None, None),
    "no-affine": ("LayerNormNoAffine", NORM + "    y = Div(d, std)\n", 17, None, None),
    "no-affine-mul-square": ("LayerNormNoAffine", NORM.replace("Pow(d, two)", "Mul(d, d)")
                             + "    y = Div(d, std)\n", 17, None, None),
    "gamma-1x1xC": ("LayerNormDecomposed", LN.replace("Mul(n, gamma)", "Mul(n, g3)"), 17,
                    None, None),
    "cast-fp16": ("LayerNormCast", "    x = Cast <to = 1> (h)\n" + LN.replace(
        "s = Mul(n, gamma)\n    y = Add(s, beta)",
        "nh = Cast <to = 10> (n)\n    s = Mul(nh, g16)\n    y = Add(s, b16)"), 17,
        "float16[2,5,8] h", "float16[2,5,8] y"),
    # Hand-written: √ as ·^½, and (x - μ) · rsqrt(σ² + ε) in each exporter's spelling.
    "pow-half": ("LayerNormDecomposed", LN.replace("Sqrt(ve)", "Pow(ve, halfpow)"), 17,
                 None, None),
    "rsqrt-reciprocal": ("LayerNormRsqrt", LN.replace("n = Div(d, std)",
                                                      "r = Reciprocal(std)\n    n = Mul(d, r)"),
                         17, None, None),
    "rsqrt-one-over": ("LayerNormRsqrt", LN.replace("n = Div(d, std)",
                                                    "r = Div(one, std)\n    n = Mul(r, d)"),
                       17, None, None),
    "rsqrt-pow-mul-square": ("LayerNormRsqrt", LN.replace("Pow(d, two)", "Mul(d, d)").replace(
        "std = Sqrt(ve)\n\n    n = Div(d, std)", "r = Pow(ve, half)\n    n = Mul(d, r)"), 17,
        None, None),
    "no-affine-rsqrt": ("LayerNormNoAffineRsqrt", NORM + "    r = Reciprocal(std)\n"
                        "    y = Mul(d, r)\n", 17, None, None),
}


@pytest.mark.parametrize("form", FORMS)
def test_layernorm_forms_fire(form):
    rule, body, opset, inputs, outputs = FORMS[form]
    proto = _model(body, opset, inputs or "float[2,5,8] x", outputs or "float[2,5,8] y")
    model, stats, _ = _fuse(proto)
    assert stats == {rule: 1}
    assert _ops(model) == ["LayerNormalization"]
    node = next(iter(model.graph))
    assert node.attr("axis") == -1 and abs(node.attr("epsilon") - 1e-5) < 1e-9
    assert node.inputs[1].shape == (8,)
    _same_numerics(proto, model, 1e-2 if "fp16" in form else TOL)


REFUSALS = {  # body, opset, extra outputs, the refusal reason traced
    "axis-1": (LN.replace("[-1]", "[1]"), 17, "", "not over the last axis"),
    "eps-not-scalar": (LN.replace("Add(var, eps)", "Add(var, eps8)"), 17, "", "not a scalar"),
    "mean-extra-consumer": (LN + "    m2 = Mul(mean, two)\n", 17, ", float[2,5,1] m2",
                            "is also read by Mul"),
    "opset-12": (LN, 12, "", "would change the meaning of ops redefined at 13"),
}


def test_a_layernorm_over_a_zero_width_axis_is_not_fused():
    # onnxruntime's LayerNormalization refuses to normalize nothing ("Size of X.shape[axis:]
    # must be at least 1"), where the decomposed ops return an empty tensor: a model pinned
    # to a width of 0 compiled into an .om that did not run.
    proto = _model(NORM + "    y = Div(d, std)\n", 17, inputs="float[2,5,0] x",
                   outputs="float[2,5,0] y")
    before = [n.op_type for n in proto.graph.node]
    model, stats, report = _fuse(proto, trace="LayerNormNoAffine")
    assert stats == {} and _ops(model) == before
    assert any("the last dim of %x is 0" in line for line in report), report


@pytest.mark.parametrize("case", REFUSALS)
def test_layernorm_refusals_leave_the_graph(case):
    body, opset, extra_out, reason = REFUSALS[case]
    proto = _model(body, opset, outputs="float[2,5,8] y" + extra_out)
    before = [n.op_type for n in proto.graph.node]
    model, stats, report = _fuse(proto, trace="LayerNormDecomposed")
    assert stats == {} and _ops(model) == before
    assert any(reason in line for line in report), report


@pytest.mark.parametrize("form", ["mul-square", "cast-fp16", "no-affine", "rsqrt-one-over",
                                  "no-affine-rsqrt"])
@pytest.mark.parametrize("edit, reason", [
    (("[-1]", "[1]"), "not over the last axis"),
    (("Add(var, eps)", "Add(var, zero)"), "epsilon 0.0 is not positive")])
def test_every_layernorm_form_refuses_what_its_check_refuses(form, edit, reason):
    # The forms share _LayerNorm's check; only LayerNormDecomposed's refusals were tested.
    rule, body, opset, inputs, outputs = FORMS[form]
    proto = _model(body.replace(*edit), opset, inputs or "float[2,5,8] x",
                   outputs or "float[2,5,8] y")
    before = [n.op_type for n in proto.graph.node]
    model, stats, report = _fuse(proto, trace=rule)
    assert stats == {} and _ops(model) == before
    assert any(reason in line for line in report), report


@pytest.mark.parametrize("opset", [13, 14, 16])
def test_layernorm_below_opset_17_raises_the_opset(opset):
    """Every op the model holds means the same at 17: the model is declared at 17 and gets
    LayerNormalization, which onnx.checker then accepts."""
    proto = _model(LN, opset)
    model, stats, _ = _fuse(proto)
    assert stats == {"LayerNormDecomposed": 1} and _ops(model) == ["LayerNormalization"]
    assert model.opset("") == 17
    _same_numerics(proto, model)


def test_raising_the_opset_keeps_roialigns_mode():
    """RoiAlign's coordinate_transformation_mode appeared at 16 with a new default: a RoiAlign
    of opset 14 gets its old mode spelled out when the model moves to 17."""
    body = LN + """    rois = Constant <value = float[2,4] {0.5, 0.5, 2.5, 2.5,
                                         0.0, 1.0, 3.0, 2.0}> ()
    idx = Constant <value = int64[2] {0, 0}> ()
    r = RoiAlign <output_height = 2, output_width = 2> (xr, rois, idx)
"""
    proto = _model(body, 14, inputs="float[2,5,8] x, float[1,1,4,4] xr",
                   outputs="float[2,5,8] y, float[2,1,2,2] r")
    model, stats, _ = _fuse(proto)
    assert stats == {"LayerNormDecomposed": 1} and model.opset("") == 17
    (roi,) = [n for n in model.graph if n.op_type == "RoiAlign"]
    assert roi.attr("coordinate_transformation_mode") == "output_half_pixel"
    _same_numerics(proto, model)


def _with_function(proto: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """`proto` whose output y also goes through a local function that imports ai.onnx at
    `opset` and holds a Div (redefined at opset 14)."""
    function = onnx.helper.make_function("local", "Halve", ["a"], ["o"], [
        onnx.helper.make_node("Constant", [], ["two"], value_float=2.0),
        onnx.helper.make_node("Div", ["a", "two"], ["o"])],
        [onnx.helper.make_opsetid("", opset)])
    proto.functions.append(function)
    proto.opset_import.append(onnx.helper.make_opsetid("local", 1))
    proto.graph.node.append(onnx.helper.make_node("Halve", ["y"], ["h"], domain="local"))
    proto.graph.output.append(onnx.helper.make_tensor_value_info("h", onnx.TensorProto.FLOAT,
                                                                 [2, 5, 8]))
    return proto


def test_raising_the_opset_raises_local_functions_with_it():
    proto = _with_function(_model(LN, 13), 13)
    onnx.checker.check_model(proto, full_check=True)
    model, stats, _ = _fuse(proto)
    assert stats == {"LayerNormDecomposed": 1} and model.opset("") == 17
    assert [(o.domain, o.version) for o in model.functions[0].opset_import] == [("", 17)]
    _same_numerics(proto, model)  # onnx.checker refused a Div of 13 in a model of 17
    assert proto.functions[0].opset_import[0].version == 13  # the caller's proto is as it was


def test_a_local_function_below_opset_13_keeps_the_model_at_its_opset():
    proto = _with_function(_model(LN, 13), 12)
    model, stats, report = _fuse(proto, trace="LayerNormDecomposed")
    assert stats == {} and model.opset("") == 13
    assert any("local function local::Halve imports opset 12" in line for line in report), report


def test_runtime_gamma_leaves_the_affine_ops():
    """γ a graph input: the affine rule refuses, the bare normalization still fuses."""
    proto = _model(LN.replace("Mul(n, gamma)", "Mul(n, g)"), inputs="float[2,5,8] x, float[8] g")
    model, stats, report = _fuse(proto, trace="LayerNormDecomposed")
    assert any("gamma %g is not a constant" in line for line in report), report
    assert stats == {"LayerNormNoAffine": 1}
    assert _ops(model) == ["LayerNormalization", "Mul", "Add"]
    _same_numerics(proto, model)


# -- TensorFlow's batchnorm form (tf2onnx's Keras LayerNormalization) -------------------------

def _keras(shape=(2, 5, 8), opset: int = 15, mean: str = "pool", inverse: str = "reciprocal",
           square: str = "mul", gamma=None, runtime_gamma: bool = False, eps: float = 1e-3,
           extra: str | None = None, shift: str = "sub") -> onnx.ModelProto:
    """Keras's LayerNormalization(axis=-1) as tf2onnx exports it: the moments, then
    g = γ·rsqrt(var + ε) and y = x·g + (β - μ·g). `mean`: GlobalAveragePool ("pool") or
    ReduceMean over axis -1 ("axes": the attribute below opset 18, the input from 18);
    `inverse`: rsqrt as Reciprocal(Sqrt), Div(1, Sqrt) or Pow(·, -0.5); `extra`: an
    intermediate of shape [..., 1] also read by a Mul outside the pattern; `shift`: β - μ·g
    ("sub") or Keras 3's (-μ)·g + β ("neg")."""
    make, d = onnx.helper.make_node, shape[-1]
    rng = np.random.default_rng(3)
    inits = {"beta": rng.uniform(-0.5, 0.5, d).astype(np.float32),
             "eps": np.array(eps, np.float32), "two": np.array(2.0, np.float32),
             "one": np.array(1.0, np.float32), "half": np.array(-0.5, np.float32),
             "axes": np.array([-1], np.int64)}
    if not runtime_gamma:
        inits["gamma"] = rng.uniform(0.5, 1.5, d).astype(np.float32) if gamma is None else gamma

    def reduce(src, out):
        if mean == "pool":
            return make("GlobalAveragePool", [src], [out])
        if opset >= 18:
            return make("ReduceMean", [src, "axes"], [out], keepdims=1)
        return make("ReduceMean", [src], [out], axes=[-1], keepdims=1)

    nodes = [reduce("x", "mean"), make("Sub", ["x", "mean"], ["d"]),
             make("Mul", ["d", "d"], ["sq"]) if square == "mul" else
             make("Pow", ["d", "two"], ["sq"]),
             reduce("sq", "var"), make("Add", ["var", "eps"], ["ve"])]
    nodes += {"reciprocal": [make("Sqrt", ["ve"], ["std"]), make("Reciprocal", ["std"], ["rs"])],
              "one_over": [make("Sqrt", ["ve"], ["std"]), make("Div", ["one", "std"], ["rs"])],
              "pow": [make("Pow", ["ve", "half"], ["rs"])]}[inverse]
    nodes.append(make("Mul", ["rs", "gamma"], ["g"]))
    nodes += [make("Mul", ["mean", "g"], ["mg"]), make("Sub", ["beta", "mg"], ["b"])] \
        if shift == "sub" else [make("Neg", ["mean"], ["nm"]), make("Mul", ["nm", "g"], ["mg"]),
                                make("Add", ["mg", "beta"], ["b"])]
    nodes += [make("Mul", ["x", "g"], ["xg"]), make("Add", ["xg", "b"], ["y"])]
    info = onnx.helper.make_tensor_value_info
    inputs = [info("x", onnx.TensorProto.FLOAT, list(shape))]
    if runtime_gamma:
        inputs.append(info("gamma", onnx.TensorProto.FLOAT, [d]))
    outputs = [info("y", onnx.TensorProto.FLOAT, list(shape))]
    if extra:
        nodes.append(make("Mul", [extra, "two"], ["also"]))
        outputs.append(info("also", onnx.TensorProto.FLOAT, [*shape[:-1], 1]))
    graph = onnx.helper.make_graph(nodes, "keras_layernorm", inputs, outputs,
                                   [numpy_helper.from_array(a, k) for k, a in inits.items()])
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)],
                                   ir_version=8)
    onnx.checker.check_model(proto, full_check=True)
    return proto


KERAS_FORMS = {  # _keras arguments
    "pool-op15": {},
    "pool-op13": {"opset": 13},
    "pool-op17": {"opset": 17},
    "reducemean-attr-op13": {"mean": "axes", "opset": 13},
    "reducemean-input-op18": {"mean": "axes", "opset": 18},
    "one-over-sqrt": {"inverse": "one_over"},
    "pow-minus-half": {"inverse": "pow"},
    "pow-square": {"square": "pow"},
    "gamma-1x1xC": {"gamma": np.linspace(0.5, 1.5, 8, dtype=np.float32).reshape(1, 1, 8)},
    "rank-4-reducemean": {"shape": (2, 3, 5, 8), "mean": "axes", "opset": 17},
    "keras3-negated-mean": {"shift": "neg"},  # tf2onnx 1.17 on Keras 3.15
}


@pytest.mark.parametrize("form", KERAS_FORMS)
def test_keras_batchnorm_layernorm_becomes_one_op(form):
    """Numerics at rtol = atol = 1e-5 against the decomposed graph (seen ≤ 1e-6) on unit-scale
    inputs; the large-mean case is the test below."""
    proto = _keras(**KERAS_FORMS[form])
    model, stats, _ = _fuse(proto)
    assert stats == {"LayerNormBatchnorm": 1}
    assert _ops(model) == ["LayerNormalization"] and model.opset("") >= 17
    node = next(iter(model.graph))
    assert [v.name for v in node.inputs][0] == "x" and node.inputs[1].shape == (8,)
    assert node.attr("axis") == -1 and abs(node.attr("epsilon") - 1e-3) < 1e-9
    _same_numerics(proto, model, 1e-5)


def test_keras_layernorm_structure():
    model, _, _ = _fuse(_keras())
    assert _lines(model) == [
        "%y<f32[2,5,8]> = LayerNormalization(%x, %gamma, %beta) "
        "{axis=-1, epsilon=0.0010000000474974513}"]


@pytest.mark.parametrize("shift", [0.0, 1000.0])
def test_keras_layernorm_numerics_with_a_large_mean(shift):
    """The batchnorm form computes x·g + (β - μ·g): for a large mean the two terms cancel
    (x + 1000 at σ = 1: 3e-4 off the float64 result). LayerNormalization subtracts the mean
    first: its error is the float32 rounding of μ itself, half an ulp of |μ| times γ/σ
    (≤ 5e-5 at |μ| = 1000). Tolerance: 1e-5 against the decomposed graph at shift 0; at either
    shift, against float64 numpy, atol = 1e-5 + spacing(|μ|)·max|γ|/min σ, and never further
    from it than the decomposed graph."""
    proto = _keras(shape=(2, 64, 128))
    model, stats, _ = _fuse(proto)
    assert stats == {"LayerNormBatchnorm": 1}
    x = (np.random.default_rng(7).standard_normal((2, 64, 128)) + shift).astype(np.float32)
    before = numerics.run(proto, {"x": x})["y"]
    after = numerics.run(to_onnx(model), {"x": x})["y"]
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    x64 = x.astype(np.float64)
    mu, sigma = x64.mean(-1, keepdims=True), x64.std(-1, keepdims=True)
    exact = (x64 - mu) / np.sqrt(sigma ** 2 + 1e-3) * inits["gamma"] + inits["beta"]
    if shift == 0.0:
        np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)
    atol = 1e-5 + float(np.spacing(np.float32(shift))) * np.abs(inits["gamma"]).max() / sigma.min()
    np.testing.assert_allclose(after, exact, rtol=1e-5, atol=atol)
    assert np.abs(after - exact).max() <= np.abs(before - exact).max()


KERAS_REFUSALS = {  # _keras arguments, the refusal reason traced
    "rank-4-pool": ({"shape": (2, 3, 5, 8)}, "of rank 4 over every axis from 2 on"),
    "runtime-gamma": ({"runtime_gamma": True}, "gamma %gamma is not a constant"),
    "gamma-over-another-axis": ({"gamma": np.linspace(0.5, 1.5, 5, dtype=np.float32)
                                 .reshape(5, 1)}, "does not broadcast to exactly [8]"),
    "rsqrt-also-read": ({"extra": "rs"}, "%rs (from '') is also read by Mul"),
    "mean-also-read": ({"extra": "mean"}, "%mean (from '') is also read by Mul"),
    "eps-zero": ({"eps": 0.0}, "epsilon 0.0 is not positive"),
    "opset-12": ({"opset": 12}, "would change the meaning of ops redefined at 13"),
}


@pytest.mark.parametrize("case", KERAS_REFUSALS)
def test_keras_layernorm_refusals_leave_the_graph(case):
    arguments, reason = KERAS_REFUSALS[case]
    proto = _keras(**arguments)
    before = [n.op_type for n in proto.graph.node]
    model, stats, report = _fuse(proto, trace="LayerNormBatchnorm")
    assert stats == {} and _ops(model) == before
    assert any(reason in line for line in report), report
    _same_numerics(proto, model, 1e-5)


def test_tf2onnx_keras_transformer_block_end_to_end():
    """A block as tf2onnx writes a Keras encoder (opset 15): residual Add, LayerNorm in the
    batchnorm form over GlobalAveragePool, Dense, residual Add, LayerNorm again; the two
    LayerNorms share their ε, γ and β initializers, as tf2onnx deduplicates equal constants.
    The full pipeline fuses both and declares the model at opset 17."""
    make, rng = onnx.helper.make_node, np.random.default_rng(11)
    nodes, d = [], 16

    def layernorm(x, p):
        nodes.extend([
            make("GlobalAveragePool", [x], [f"{p}/moments/mean:0"]),
            make("Sub", [x, f"{p}/moments/mean:0"], [f"{p}/moments/SquaredDifference:0"]),
            make("Mul", [f"{p}/moments/SquaredDifference:0"] * 2, [f"{p}/moments/sq:0"]),
            make("GlobalAveragePool", [f"{p}/moments/sq:0"], [f"{p}/moments/variance:0"]),
            make("Add", [f"{p}/moments/variance:0", "batchnorm/add/y:0"], [f"{p}/add:0"]),
            make("Sqrt", [f"{p}/add:0"], [f"{p}/Rsqrt:0"]),
            make("Reciprocal", [f"{p}/Rsqrt:0"], [f"{p}/Rsqrt__1:0"]),
            make("Mul", [f"{p}/Rsqrt__1:0", "batchnorm/mul/ReadVariableOp:0"], [f"{p}/mul:0"]),
            make("Mul", [f"{p}/moments/mean:0", f"{p}/mul:0"], [f"{p}/mul_2:0"]),
            make("Sub", ["batchnorm/ReadVariableOp:0", f"{p}/mul_2:0"], [f"{p}/sub:0"]),
            make("Mul", [x, f"{p}/mul:0"], [f"{p}/mul_1:0"]),
            make("Add", [f"{p}/mul_1:0", f"{p}/sub:0"], [f"{p}/add_1:0"])])
        return f"{p}/add_1:0"

    nodes.append(make("MatMul", ["x", "attention/W:0"], ["attention/out:0"]))
    nodes.append(make("Add", ["x", "attention/out:0"], ["add/AddV2:0"]))
    h = layernorm("add/AddV2:0", "layer_normalization/batchnorm")
    nodes.append(make("MatMul", [h, "dense/W:0"], ["dense/out:0"]))
    nodes.append(make("Add", [h, "dense/out:0"], ["add_1/AddV2:0"]))
    nodes.append(make("Identity", [layernorm("add_1/AddV2:0", "layer_normalization_1/batchnorm")],
                      ["y"]))
    inits = {"attention/W:0": rng.standard_normal((d, d)) / 4, "dense/W:0":
             rng.standard_normal((d, d)) / 4, "batchnorm/add/y:0": np.array(1e-3),
             "batchnorm/mul/ReadVariableOp:0": rng.uniform(0.5, 1.5, d),
             "batchnorm/ReadVariableOp:0": rng.uniform(-0.5, 0.5, d)}
    info = onnx.helper.make_tensor_value_info
    graph = onnx.helper.make_graph(
        nodes, "tf2onnx", [info("x", onnx.TensorProto.FLOAT, [1, 12, d])],
        [info("y", onnx.TensorProto.FLOAT, [1, 12, d])],
        [numpy_helper.from_array(np.asarray(a, np.float32), k) for k, a in inits.items()])
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 15)],
                                   ir_version=8)
    onnx.checker.check_model(proto, full_check=True)
    assert len(proto.graph.node) == 29
    result = graphopt.optimize(proto)
    ops = Counter(_ops(result.model))
    assert ops["LayerNormalization"] == 2 and result.model.opset("") == 17
    assert not {"GlobalAveragePool", "Reciprocal", "Sqrt", "Sub"} & set(ops), ops
    assert sum(ops.values()) <= 7, ops
    _same_numerics(proto, result.model, 1e-5)


# -- SkipLayerNormalization ------------------------------------------------------------------

@pytest.mark.parametrize("opset", [14, 17])
@pytest.mark.parametrize("rule", ["SkipLayerNormDecomposed", "SkipLayerNormNoAffine"])
def test_residual_add_and_decomposed_layernorm_become_skip_layernorm(rule, opset):
    body = SKIP if rule == "SkipLayerNormDecomposed" else "    x = Add(a, b)\n" + NORM + \
        "    y = Div(d, std)\n"
    proto = _model(body, opset, inputs="float[B,S,8] a, float[B,S,8] b",
                   outputs="float[B,S,8] y")
    model, stats, _ = _fuse(proto, target=NPU)
    assert stats == {rule: 1}
    assert _ops(model) == ["com.microsoft::SkipLayerNormalization"]
    assert [v.name for v in next(iter(model.graph)).inputs][:2] == ["a", "b"]
    _same_numerics(proto, model)


ADD_LN = "    x = Add(a, b)\n    y = LayerNormalization <epsilon = 1e-5> (x, gamma, beta)"


def test_add_then_layernormalization_becomes_skip_layernorm():
    proto = _model(ADD_LN, inputs="float[B,S,8] a, float[B,S,8] b", outputs="float[B,S,8] y")
    model, stats, _ = _fuse(proto, target=NPU)
    assert stats == {"SkipLayerNorm": 1}
    assert _lines(model) == [
        ("%y<f32[B,S,8]> = com.microsoft::SkipLayerNormalization(%a, %b, %gamma, %beta) "
         "{epsilon=9.999999747378752e-06}")]
    _same_numerics(proto, model)


def test_add_of_a_broadcast_bias_then_layernormalization_stays():
    proto = _model(ADD_LN, inputs="float[B,S,8] a, float[8] b", outputs="float[B,S,8] y")
    model, stats, report = _fuse(proto, trace="SkipLayerNorm", target=NPU)
    assert stats == {} and _ops(model) == ["Add", "LayerNormalization"]
    assert any("are not of one known shape [B,S,C]" in line for line in report), report


@pytest.mark.parametrize("target", [None, "cpu"])
def test_residual_layernorm_stays_add_and_layernormalization_on_onnxruntime_cpu(target):
    proto = _model(SKIP, inputs="float[B,S,8] a, float[B,S,8] b", outputs="float[B,S,8] y")
    model, stats, report = _fuse(proto, trace="SkipLayerNormDecomposed",
                                 target=target and load_target(target))
    assert any("CPU SkipLayerNormalization kernel runs 6× slower" in line for line in report)
    assert stats == {"LayerNormDecomposed": 1}
    assert _ops(model) == ["Add", "LayerNormalization"]
    _same_numerics(proto, model)
    model, stats, _ = _fuse(to_onnx(model), target=target and load_target(target))
    assert stats == {} and _ops(model) == ["Add", "LayerNormalization"]


# A pre-LN block: the residual sum x feeds the norm and the next residual Add.
PRE_LN = SKIP + "    z = Add(x, y)\n"


@pytest.mark.parametrize("body", [PRE_LN, ADD_LN + "\n    z = Add(x, y)\n"],
                         ids=["decomposed", "layernormalization"])
def test_a_residual_sum_read_again_comes_out_of_skip_layernorm(body):
    proto = _model(body, inputs="float[B,S,8] a, float[B,S,8] b", outputs="float[B,S,8] z")
    model, stats, _ = _fuse(proto, target=NPU)
    assert len(stats) == 1 and sum(stats.values()) == 1
    skip, add = model.graph
    assert skip.qualified_op == "com.microsoft::SkipLayerNormalization" and add.op_type == "Add"
    assert skip.outputs[1] is None and skip.outputs[2] is None  # mean, 1/σ left out
    assert add.inputs == (skip.outputs[3], skip.outputs[0])
    assert skip.outputs[3].shape == ("B", "S", 8)
    _same_numerics(proto, model)


def test_every_pre_ln_residual_fuses_on_an_npu_target():
    proto = zoo.build("gpt2_small", layers=2, hidden=64, heads=2, vocab=100, positions=32)
    result = graphopt.optimize(proto, target="ascend910b", input_shapes={"input_ids": [1, 16]})
    ops = Counter(n.qualified_op for n in result.model.graph)
    # ln_1 and ln_2 of each layer and ln_f after the last residual Add; the first ln_1 on the
    # sum of the token and position embeddings.
    assert ops["com.microsoft::SkipLayerNormalization"] == 5 and ops["LayerNormalization"] == 0
    feeds = {"input_ids": np.random.default_rng(0).integers(0, 100, (1, 16))}
    assert numerics.compare(numerics.run(proto, feeds), numerics.run(result.to_onnx(), feeds),
                            TOL, TOL) == []


SKIP_F16 = SKIP.replace("gamma", "g16").replace("beta", "b16").replace("two", "two16") \
    .replace("eps)", "eps16)")
SKIP_REFUSALS = {  # body, inputs, outputs, the reason; the plain LayerNorm rule fires instead
    "bias-broadcast": (SKIP, "float[B,S,8] a, float[8] b", "float[B,S,8] y",
                       "not of one known shape"),
    "sum-read-twice": (SKIP, "float[B,S,8] a, float[B,S,8] b", "float[B,S,8] y, float[B,S,8] x",
                       "is a graph output"),
}


@pytest.mark.parametrize("case", SKIP_REFUSALS)
def test_skip_layernorm_refusals(case):
    body, inputs, outputs, reason = SKIP_REFUSALS[case]
    proto = _model(body, 17, inputs=inputs, outputs=outputs)
    model, stats, report = _fuse(proto, trace="SkipLayerNormDecomposed", target=NPU)
    assert any(reason in line for line in report), report
    assert stats == {"LayerNormDecomposed": 1}
    assert "com.microsoft::SkipLayerNormalization" not in _ops(model)
    _same_numerics(proto, model, TOL)


def test_a_float16_residual_layernorm_stays_add_and_layernormalization():
    # onnxruntime's float16 SkipLayerNormalization, which runs an NPU partition wherever the
    # CANN provider is missing, sums in float16: the unfused ops keep closer to the result.
    proto = _model(SKIP_F16, 17, inputs="float16[B,S,8] a, float16[B,S,8] b",
                   outputs="float16[B,S,8] y")
    model, stats, report = _fuse(proto, trace="SkipLayerNormDecomposed", target=NPU)
    assert any("does not take f16" in line for line in report), report
    assert stats == {"LayerNormDecomposed": 1}
    assert "com.microsoft::SkipLayerNormalization" not in _ops(model)
    _same_numerics(proto, model, 1e-2)


# -- RMSNorm ---------------------------------------------------------------------------------

@pytest.mark.parametrize("opset, fused", [(17, "SimplifiedLayerNormalization"),
                                          (23, "RMSNormalization")])
@pytest.mark.parametrize("rule", RMS_INVERSE)
def test_rmsnorm_forms_fire(rule, opset, fused):
    proto = _model(_rms(rule), opset)
    model, stats, _ = _fuse(proto)
    assert stats == {rule: 1}
    assert _lines(model) == [
        f"%y<f32[2,5,8]> = {fused}(%x, %gamma) {{axis=-1, epsilon=9.999999747378752e-06}}"]
    _same_numerics(proto, model, checker=opset >= 23)
    if opset < 23:  # onnxruntime registers SimplifiedLayerNormalization in ai.onnx; ONNX has none
        with pytest.raises(onnx.checker.ValidationError, match="No Op registered for Simplified"):
            onnx.checker.check_model(to_onnx(model))


@pytest.mark.parametrize("target", ["ascend310", "ascend310b", "ascend910b"])
def test_an_rmsnorm_fused_at_opset_23_stays_on_the_npu(target, tmp_path):
    # The rule checked the profile for SimplifiedLayerNormalization and emitted RMSNormalization,
    # which no profile listed: the fused norm, and the MatMuls around it, went to the host.
    proto = _model(_rms("RmsNormDiv"), 23)
    result = graphopt.optimize(proto, target=target)
    assert [n.op_type for n in result.model.graph] == ["RMSNormalization"]
    assert [p.device for p in result.partitioning.partitions] == ["npu"]
    # and a target without the op keeps the norm unfused there, as for any fusion
    builtin = os.path.join(os.path.dirname(graphopt.__file__), "partition", "targets")
    with open(os.path.join(builtin, f"{target}.json")) as f:
        profile = json.load(f)
    for engine in profile["devices"][0]["engines"].values():
        engine["ops"].pop("RMSNormalization", None)
    (tmp_path / "no_rms.json").write_text(json.dumps(profile))
    without = load_target(str(tmp_path / "no_rms.json"))
    _, stats, report = _fuse(proto, "RmsNormDiv", without)
    assert stats == {} and any("has no ai.onnx::RMSNormalization kernel" in line
                               for line in report), report
    # below opset 23 the fused op is SimplifiedLayerNormalization, which that profile has
    assert _fuse(_model(_rms("RmsNormDiv"), 17), target=without)[1] == {"RmsNormDiv": 1}


def test_a_model_with_onnxruntimes_rmsnorm_compiles_again(tmp_path):
    # onnxruntime's optimizer writes SimplifiedLayerNormalization in the default domain, as
    # FuseLayerNorm does below opset 23; onnx.checker and ONNX inference know no such op, so
    # graphopt refused its own output. Its output is typed now: the MatMul + Add after it is
    # a Gemm only once the rank of its input is known.
    weights = ", ".join(f"{v:.3f}" for v in np.random.default_rng(0).standard_normal(32))
    body = RMS.format(inverse=RMS_INVERSE["RmsNormDiv"]).replace("y = Mul(gamma, n)", f"""
    h = Mul(gamma, n)
    flat = Constant <value = int64[2] {{10, 8}}> ()
    r = Reshape(h, flat)
    w = Constant <value = float[8, 4] {{{weights}}}> ()
    m = MatMul(r, w)
    bias = Constant <value = float[4] {{0.5, -1.0, 2.0, 0.25}}> ()
    y = Add(m, bias)""")
    proto = _model(body, 18, outputs="float[10,4] y")
    first = graphopt.optimize(proto).to_onnx()
    assert [n.op_type for n in first.graph.node] == ["SimplifiedLayerNormalization", "Reshape",
                                                     "Gemm"]
    feeds = numerics.random_feeds(proto, seed=0)
    expected = numerics.run(proto, feeds)
    for target in (None, "cpu", "ascend310"):
        again = graphopt.optimize(first, target=target)
        assert [n.op_type for n in again.model.graph] == ["SimplifiedLayerNormalization",
                                                          "Reshape", "Gemm"]
        assert numerics.compare(expected, numerics.run(again.to_onnx(), feeds), TOL, TOL) == []
    first.graph.node[2].CopyFrom(onnx.helper.make_node("MatMul", ["r", "w"], ["m"]))
    first.graph.node.append(onnx.helper.make_node("Add", ["m", "bias"], ["y"]))
    del first.graph.value_info[:]  # the type of h comes from InferShapes alone
    assert [n.op_type for n in graphopt.optimize(first).model.graph][-1] == "Gemm"


def test_rmsnorm_in_fp16_between_casts():
    body = ("    xf = Cast <to = 1> (x)\n" + RMS.format(inverse=RMS_INVERSE["RmsNormReciprocal"])
            .replace("(x, ", "(xf, ")
            .replace("y = Mul(gamma, n)", "nh = Cast <to = 10> (n)\n    y = Mul(g16, nh)"))
    proto = _model(body, 23, "float16[2,5,8] x", "float16[2,5,8] y")
    model, stats, _ = _fuse(proto)
    assert stats == {"RmsNormCast": 1} and _ops(model) == ["RMSNormalization"]
    _same_numerics(proto, model, 1e-2)


NO_AFFINE_RULE = {"RmsNormDiv": "RmsNormNoAffineDiv", "RmsNormMulSquare": "RmsNormNoAffineDiv"}


@pytest.mark.parametrize("opset, fused", [(17, "SimplifiedLayerNormalization"),
                                          (23, "RMSNormalization")])
@pytest.mark.parametrize("rule", RMS_INVERSE)
def test_rmsnorm_without_gamma_fuses_with_a_unit_gamma(rule, opset, fused):
    # The norm itself is the graph's output: no γ (a unit weight EliminateNoOps removed).
    proto = _model(_rms(rule).replace("y = Mul(gamma, n)", "y = Identity(n)"), opset)
    model, stats, _ = _fuse(proto)
    assert stats == {NO_AFFINE_RULE.get(rule, "RmsNormNoAffineMul"): 1}
    assert [n.qualified_op for n in model.graph][0] == fused
    gamma = model.graph.nodes()[0].inputs[1].constant()
    assert gamma.shape == (8,) and np.all(gamma == 1)
    _same_numerics(proto, model, checker=opset >= 23)


def test_rmsnorm_without_gamma_in_fp16_between_casts():
    body = ("    xf = Cast <to = 1> (x)\n" + RMS.format(inverse=RMS_INVERSE["RmsNormReciprocal"])
            .replace("(x, ", "(xf, ").replace("y = Mul(gamma, n)", "y = Cast <to = 10> (n)"))
    proto = _model(body, 23, "float16[2,5,8] x", "float16[2,5,8] y")
    model, stats, _ = _fuse(proto)
    assert stats == {"RmsNormNoAffineCast": 1} and _ops(model) == ["RMSNormalization"]
    _same_numerics(proto, model, 1e-2)


def test_rmsnorm_with_a_unit_gamma_fuses_in_the_pipeline():
    # Every freshly initialized RMSNorm has γ = 1, which EliminateNoOps removes before the
    # fusion runs: the norm was left as five ops.
    body = _rms("RmsNormDiv").replace("y = Mul(gamma, n)", """ones = Constant <value = float[8] {1, 1, 1, 1, 1, 1, 1, 1}> ()
    m = Mul(ones, n)
    y = Add(m, x)""")
    proto = _model(body, 23)
    result = graphopt.optimize(proto)
    assert [n.op_type for n in result.model.graph] == ["RMSNormalization", "Add"]
    feeds = numerics.random_feeds(proto, seed=0)
    assert numerics.compare(numerics.run(proto, feeds), numerics.run(result.to_onnx(), feeds),
                            TOL, TOL) == []


def test_dynamo_var_layernorm_fuses_in_the_pipeline():
    # `(x - x.mean(-1)) / sqrt(x.var(-1, unbiased=False) + eps) * w + b` through the dynamo
    # exporter: the mean twice (axes [-1], then [2] inside var) and the variance as a
    # keepdims=0 mean with a Reshape back to [2, 5, 1]. CSE and EliminateNoOps make it the
    # decomposed norm FuseLayerNorm knows.
    proto = onnx.parser.parse_model(f"""
    <ir_version: 9, opset_import: ["" : 18]>
    g (float[2,5,8] x) => (float[2,5,8] y)
        <{INITS}, int64[1] last = {{-1}}, int64[1] two_axis = {{2}},
         int64[3] kept = {{2, 5, 1}}> {{
        mean = ReduceMean <keepdims = 1> (x, last)
        mean2 = ReduceMean <keepdims = 1> (x, two_axis)
        d2 = Sub(x, mean2)
        sq = Mul(d2, d2)
        var = ReduceMean <keepdims = 0> (sq, two_axis)
        var3 = Reshape(var, kept)
        d = Sub(x, mean)
        ve = Add(var3, eps)
        std = Sqrt(ve)
        n = Div(d, std)
        m = Mul(n, gamma)
        y = Add(m, beta)
    }}""")
    result = graphopt.optimize(proto)
    assert [n.op_type for n in result.model.graph] == ["LayerNormalization"]
    out = result.to_onnx()
    onnx.checker.check_model(out)
    feeds = numerics.random_feeds(proto, seed=0)
    assert numerics.compare(numerics.run(proto, feeds), numerics.run(out, feeds), TOL, TOL) == []


def test_a_centred_norm_without_gamma_is_a_layernorm():
    model, stats, _ = _fuse(_model(NORM + "    y = Div(d, std)\n"))
    assert stats == {"LayerNormNoAffine": 1} and _ops(model) == ["LayerNormalization"]


def test_rmsnorm_with_a_runtime_gamma_leaves_its_mul():
    """γ a graph input: the rule with γ refuses, the bare norm still fuses (as for LayerNorm)."""
    body = RMS.format(inverse=RMS_INVERSE["RmsNormDiv"]).replace("Mul(gamma, n)", "Mul(g, n)")
    proto = _model(body, inputs="float[2,5,8] x, float[8] g")
    model, stats, report = _fuse(proto, trace="RmsNormDiv")
    assert any("gamma %g is not a constant" in line for line in report), report
    assert stats == {"RmsNormNoAffineDiv": 1}
    assert _ops(model) == ["SimplifiedLayerNormalization", "Mul"]
    _same_numerics(proto, model, checker=False)


@pytest.mark.parametrize("edit, reason", [
    (("[-1]", "[1]"), "not over the last axis"),
    (("Add(ms, eps)", "Add(ms, eps8)"), "not a scalar"),
])
def test_rmsnorm_refusals(edit, reason):
    body = RMS.format(inverse=RMS_INVERSE["RmsNormDiv"]).replace(*edit)
    proto = _model(body, inputs="float[2,5,8] x, float[8] g")
    _, stats, report = _fuse(proto, trace="RmsNormDiv")
    assert stats == {} and any(reason in line for line in report), report


# -- zoo models --------------------------------------------------------------------------------

@pytest.mark.parametrize("name, options", [
    ("bert_base", {"layers": 2, "hidden": 64, "heads": 2, "intermediate": 128, "vocab": 100}),
    ("gpt2_small", {"layers": 2, "hidden": 64, "heads": 2, "vocab": 100, "positions": 32}),
])
def test_zoo_layernorms_all_fused(name, options):
    proto = zoo.build(name, **options)
    emitted = sum(n.op_type == "ReduceMean" for n in proto.graph.node) // 2  # two per LayerNorm
    assert emitted == 5
    model = graphopt.optimize(proto).model
    ctx = PassContext(Options())
    for _ in range(3):  # LayerNormalization first, then SkipLayerNorm on the next run
        infer_shapes(model)
        changed = PASSES["FuseLayerNorm"]().run(model, ctx).changed
        PASSES["EliminateDeadNodes"]().run(model, ctx)
        if not changed:
            break
    verify(model)
    ops = Counter(_ops(model))
    assert ops["LayerNormalization"] + ops["com.microsoft::SkipLayerNormalization"] == emitted
    assert ops["ReduceMean"] == 0
    _same_numerics(proto, model)


# -- what the norm rules must not take ------------------------------------------------------------

NORMALIZED = LN.split("    s = Mul")[0]  # n = (x - mean) / std, before the affine


def test_layernorm_between_casts_to_another_type_than_x_is_not_fused():
    # float32 x normalized in float32, then cast to float16: fused, its output type would change.
    body = "    xf = Cast <to = 1> (x)\n" + NORMALIZED.replace("(x)", "(xf)").replace(
        "Sub(x,", "Sub(xf,") + "    h = Cast <to = 10> (n)\n    s = Mul(h, g16)\n    y = Add(s, b16)\n"
    proto = _model(body, outputs="float16[2,5,8] y")
    model, stats, _ = _fuse(proto)
    assert "LayerNormCast" not in stats, stats
    _same_numerics(proto, model)


def test_a_gamma_of_higher_rank_than_x_is_not_fused():
    # γ [1,1,1,8] broadcasts the output up a rank, which LayerNormalization would drop.
    proto = _model(NORMALIZED + "    s = Mul(n, g4)\n    y = Add(s, beta)\n",
                   outputs="float[1,2,5,8] y", g4=np.array(GAMMA.split(", "), np.float32)
                   .reshape(1, 1, 1, 8))
    model, stats, _ = _fuse(proto)
    assert "LayerNormDecomposed" not in stats, stats
    _same_numerics(proto, model)


def test_an_epsilon_of_higher_rank_than_x_is_not_fused():
    proto = _model(LN.replace("Add(var, eps)", "Add(var, eps4)"), outputs="float[1,2,5,8] y",
                   eps4=np.full((1, 1, 1, 1), 1e-5, np.float32))
    model, stats, _ = _fuse(proto)
    assert "LayerNormDecomposed" not in stats, stats
    _same_numerics(proto, model)


def test_a_variance_of_pow_2_01_is_not_a_square():
    # (x - mean)^2.01 is NaN where x < mean: no variance.
    proto = _model(LN.replace("Pow(d, two)", "Pow(d, p201)"), p201=np.float32(2.01))
    _, stats, _ = _fuse(proto)
    assert stats == {}, stats


def test_rmsnorm_at_opset_22_is_simplified_layernormalization():
    # RMSNormalization exists from opset 23 only.
    model, _, _ = _fuse(_model(_rms("RmsNormDiv"), opset=22))
    assert _ops(model) == ["SimplifiedLayerNormalization"]


def test_add_then_layernormalization_of_epsilon_0_stays_for_an_npu():
    # onnxruntime's SkipLayerNormalization kernel refuses an epsilon of 0 at load.
    body = """
    x = Add(a, b)
    y = LayerNormalization <axis = -1, epsilon = 0.0> (x, gamma, beta)
"""
    _, stats, _ = _fuse(_model(body, inputs="float[2,5,8] a, float[2,5,8] b"), target=NPU)
    assert stats == {}, stats


# -- LayerNorm over the channels (ConvNeXt's and SAM's LayerNorm2d) --------------------------

def _channel_norm(shape=(2, 6, 5, 4), inverse: str = "div", gamma_shape=None, axes=(1,)):
    """x.mean(1, keepdim=True), (x - u).pow(2).mean(1, keepdim=True), (x - u) / sqrt(v + eps)
    (or · rsqrt), then weight[:, None, None] · x + bias[:, None, None]."""
    c, rank = shape[1], len(shape)
    rng = np.random.default_rng(4)
    gamma_shape = gamma_shape or (c,) + (1,) * (rank - 2)
    scale = "n = Div(d, sq)" if inverse == "div" else "r = Reciprocal(sq)\n  n = Mul(d, r)"
    dims = ", ".join(map(str, shape))
    return parse_model(f"""
g (float[{dims}] x) => (float[{dims}] y) {{
  u = ReduceMean <keepdims = 1> (x, axes)
  d = Sub(x, u)
  p = Pow(d, two)
  v = ReduceMean <keepdims = 1> (p, axes)
  ve = Add(v, eps)
  sq = Sqrt(ve)
  {scale}
  m = Mul(gamma, n)
  y = Add(m, beta)
}}""", header='<ir_version: 8, opset_import: ["" : 18]>\n', axes=np.array(axes, np.int64),
        two=np.array(2.0, np.float32),
        eps=np.array(1e-6, np.float32),
        gamma=rng.uniform(0.5, 1.5, gamma_shape).astype(np.float32),
        beta=rng.uniform(-0.5, 0.5, gamma_shape).astype(np.float32))


@pytest.mark.parametrize("shape, inverse", [((2, 6, 5, 4), "div"), ((2, 6, 5, 4), "rsqrt"),
                                            ((2, 6, 9), "div")])
def test_a_channel_layernorm_becomes_layernormalization_between_transposes(shape, inverse):
    proto = _channel_norm(shape, inverse)
    model, stats, _ = _fuse(proto)
    assert stats == {"ChannelLayerNorm" if inverse == "div" else "ChannelLayerNormRsqrt": 1}
    assert _ops(model) == ["Transpose", "LayerNormalization", "Transpose"]
    node = list(model.graph)[1]
    assert node.inputs[1].shape == (6,) and node.attr("axis") == -1
    _same_numerics(proto, model, 1e-5)


@pytest.mark.parametrize("kwargs, why", [
    ({"axes": (2,)}, "not over the channels only"),
    ({"gamma_shape": (6, 5, 1)}, "is not a constant [6, 1, …] over the channels")])
def test_a_norm_over_other_axes_or_with_a_spatial_scale_stays(kwargs, why):
    _, stats, report = _fuse(_channel_norm(**kwargs), trace="ChannelLayerNorm")
    assert stats == {}
    assert any(why in line for line in report), report


def test_a_channel_scale_of_a_higher_rank_stays():
    # γ [1, 1, 6, 1, 1] over x [2, 6, 5, 4] broadcasts the output to rank 5, which the fused
    # op would not (a differential fuzz's case).
    _, stats, report = _fuse(_channel_norm(gamma_shape=(1, 1, 6, 1, 1)), trace="ChannelLayerNorm")
    assert stats == {}
    assert any("has a higher rank than" in line for line in report), report


# Flax's nn.LayerNorm through jax2onnx: the variance from the first two moments, clamped at 0.
MOMENTS = """
    mean = ReduceMean <axes = [-1]> (x)
    d = Sub(x, mean)
    xx = Mul(x, x)
    second = ReduceMean <axes = [-1]> (xx)
    mm = Mul(mean, mean)
    {variance}
    ve = Add(clamped, eps)
    std = Sqrt(ve)
"""


@pytest.mark.parametrize("variance", ["var = Sub(second, mm)\n clamped = Max(var, zero)",
                                      "clamped = Sub(second, mm)"])
@pytest.mark.parametrize("affine", ["n = Div(d, std)\n s = Mul(n, gamma)\n y = Add(s, beta)",
                                    "n = Div(d, std)\n y = Add(n, beta)", "y = Div(d, std)"])
def test_a_layernorm_of_two_moments_becomes_one_op(variance, affine):
    proto = _model(MOMENTS.format(variance=variance) + affine)
    model, stats, _ = _fuse(proto)
    assert _ops(model) == ["LayerNormalization"], _ops(model)
    _same_numerics(proto, model)


def test_a_bias_after_a_layernorm_with_its_own_bias_adds_to_it():
    proto = _model("""
        n = LayerNormalization <axis = -1> (x, gamma, beta)
        y = Add(n, beta)""")
    model, stats, _ = _fuse(proto)
    assert _ops(model) == ["LayerNormalization"] and stats == {"LayerNormThenBias": 1}
    _same_numerics(proto, model)
