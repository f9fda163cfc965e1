"""FuseActivation: Conv/Gemm/matrix MatMul + activation into onnxruntime's FusedConv/FusedGemm —
what fires, the exact kernel attributes, what must not fire, and that outputs never change."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx.parser
import pytest
from helpers import as_float16, node, ops, parse_model

from graphopt import numerics, zoo
from graphopt.compiler import optimize
from graphopt.ir import Model, load_onnx, to_onnx, verify
from graphopt.partition.target import load_target
from graphopt.passes.base import PASSES, PassContext
from graphopt.passes.fusion.activation import FLOAT_MAX, FuseActivation, runtime_refuses
from graphopt.passes.fusion.matmul import FuseMatMul
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.passes.options import Options
from graphopt.passes.rules import Tracer

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'
RNG = np.random.default_rng(11)
ACTIVATIONS = {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "HardSigmoid", "HardSwish"}


def build(text: str, header: str = HEADER, **weights: np.ndarray) -> onnx.ModelProto:
    return parse_model(text, header, **weights)


def weight(*shape: int, dtype=np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def scalar(value: float) -> np.ndarray:
    return np.array(value, np.float32)


def fuse(proto: onnx.ModelProto | Model, passes=(FuseActivation,),
         target: str | None = None) -> tuple[Model, Counter]:
    """Run `passes` to a fixed point (as the pipeline does), verifying the IR after each run."""
    model = load_onnx(proto) if isinstance(proto, onnx.ModelProto) else proto
    infer_shapes(model)
    stats: Counter = Counter()
    for _ in range(4):
        changed = False
        for cls in passes:
            result = cls().run(model, PassContext(
                Options(), target=load_target(target) if target else None))
            verify(model)
            assert result.changed == bool(result.stats)
            stats.update(result.stats)
            changed |= result.changed
        if not changed:
            break
    return model, stats


def same_outputs(original: onnx.ModelProto, model: Model, atol: float = 1e-5,
                 feeds: dict | None = None) -> None:
    """onnx.checker on the rewrite, then both models in onnxruntime at ORT_DISABLE_ALL."""
    rewritten = to_onnx(model)
    onnx.checker.check_model(rewritten)
    feeds = feeds or numerics.random_feeds(original, seed=0)
    expected, actual = numerics.run(original, feeds), numerics.run(rewritten, feeds)
    assert not numerics.compare(expected, actual, rtol=1e-4, atol=atol)


def refusal(proto: onnx.ModelProto, rule: str) -> str:
    """Run FuseActivation tracing `rule`; nothing may change. Returns the tracer's report."""
    model = load_onnx(proto)
    infer_shapes(model)
    tracer = Tracer({rule})
    assert not FuseActivation().run(model, PassContext(Options(), tracer=tracer)).changed
    same_outputs(proto, model)  # the negatives are valid models, refused for their own reason
    return "\n".join(tracer.report())


# -- Conv + activation → FusedConv ---------------------------------------------------------------

CONV = ("g (float[1,3,8,8] x, float[4,3,3,3] w, float[4] b{extra}) => (float[1,4,4,4] y) {{"
        " c = Conv<pads=[1,1,1,1], strides=[2,2]>(x, w, b)\n y = {act} }}")
CONV_CASES = {  # rule: (activation, extra inputs, their constants, activation_params)
    "ConvRelu": ("Relu(c)", "", {}, None),
    "ConvLeakyRelu": ("LeakyRelu<alpha=0.2>(c)", "", {}, [0.2]),
    "ConvSigmoid": ("Sigmoid(c)", "", {}, None),
    "ConvTanh": ("Tanh(c)", "", {}, None),
    "ConvClip": ("Clip(c, lo, hi)", ", float lo, float hi", {"lo": 0.0, "hi": 6.0}, [0.0, 6.0]),
    "ConvHardSigmoid": ("HardSigmoid<alpha=0.3, beta=0.4>(c)", "", {}, [0.3, 0.4]),
    "ConvHardSwish": ("HardSwish(c)", "", {}, None),
}


def conv_model(act: str, extra: str = "", consts: dict | None = None) -> onnx.ModelProto:
    bounds = {k: scalar(v) for k, v in (consts or {}).items()}
    return build(CONV.format(extra=extra, act=act), w=weight(4, 3, 3, 3), b=weight(4), **bounds)


@pytest.mark.parametrize("rule", CONV_CASES)
def test_conv_activation_becomes_fused_conv(rule):
    act, extra, consts, params = CONV_CASES[rule]
    proto = conv_model(act, extra, consts)
    model, stats = fuse(proto)
    assert stats == {rule: 1}
    assert ops(model) == ["com.microsoft::FusedConv"]
    fused = node(model, "FusedConv")
    assert [v.name for v in fused.inputs] == ["x", "w", "b"]
    assert fused.attr("activation") == rule.removeprefix("Conv")
    assert fused.attr("activation_params") == (None if params is None else pytest.approx(params))
    assert (fused.attr("pads"), fused.attr("strides")) == ([1, 1, 1, 1], [2, 2])
    same_outputs(proto, model)


@pytest.mark.parametrize("target, fused", [("ascend310", True), ("cpu", True), (None, True)])
def test_a_float16_conv_and_relu_fuse(target, fused):
    # The NPUs run FusedConv in float16, onnxruntime's CPU provider its float32 one between
    # the Casts it inserts.
    proto = as_float16(conv_model("Relu(c)"))
    model, stats = fuse(proto, target=target)
    assert (stats == {"ConvRelu": 1}) == fused
    assert (ops(model) == ["com.microsoft::FusedConv"]) == fused
    rewritten = to_onnx(model)
    onnx.checker.check_model(rewritten)
    feeds = numerics.random_feeds(proto, seed=0)
    (expected,), (actual,) = (numerics.run(m, feeds).values() for m in (proto, rewritten))
    assert actual.dtype == np.float16
    np.testing.assert_allclose(actual.astype(np.float32), expected.astype(np.float32),
                               rtol=2.0 ** -10, atol=2.0 ** -14)


@pytest.mark.parametrize("act,extra,consts,header,params", [
    ("LeakyRelu(c)", "", {}, HEADER, [0.01]),                          # ONNX default alpha
    ("HardSigmoid(c)", "", {}, HEADER, [0.2, 0.5]),                    # ONNX defaults
    ('Clip(c, "", hi)', ", float hi", {"hi": 6.0}, HEADER, [-FLOAT_MAX, 6.0]),   # no min
    ("Clip<min=-1.0, max=1.0>(c)", "", {}, HEADER.replace("17", "10"), [-1.0, 1.0]),  # opset 10
])
def test_fused_conv_activation_params(act, extra, consts, header, params):
    bounds = {k: scalar(v) for k, v in consts.items()}
    proto = build(CONV.format(extra=extra, act=act), header, w=weight(4, 3, 3, 3), b=weight(4),
                  **bounds)
    model, stats = fuse(proto)
    assert sum(stats.values()) == 1
    assert node(model, "FusedConv").attr("activation_params") == pytest.approx(params)
    same_outputs(proto, model)


def test_conv_without_bias_grouped():
    proto = build("g (float[1,4,6,6] x, float[4,1,3,3] w) => (float[1,4,4,4] y) {"
                  " c = Conv<group=4>(x, w)\n y = Relu(c) }", w=weight(4, 1, 3, 3))
    model, stats = fuse(proto)
    assert stats == {"ConvRelu": 1}
    fused = node(model, "FusedConv")
    assert [v.name for v in fused.inputs] == ["x", "w"] and fused.attr("group") == 4
    same_outputs(proto, model)


CONV_NEGATIVES = {  # case: (model, traced rule, reason)
    "conv read twice": (lambda: build(
        "g (float[1,3,8,8] x, float[4,3,3,3] w) => (float[1,4,8,8] y, float[1,4,8,8] z) {"
        " c = Conv<pads=[1,1,1,1]>(x, w)\n y = Relu(c)\n z = Neg(c) }", w=weight(4, 3, 3, 3)),
        "ConvRelu", "is also read by Neg"),
    "conv kept": (lambda: build(
        "g (float[1,3,8,8] x, float[4,3,3,3] w) => (float[1,4,8,8] y, float[1,4,8,8] c) {"
        " c = Conv<pads=[1,1,1,1]>(x, w)\n y = Relu(c) }", w=weight(4, 3, 3, 3)),
        "ConvRelu", "%c (from '') is a graph output"),
    "clip min fed": (lambda: conv_model("Clip(c, lo, hi)", ", float lo, float hi",
                                        {"hi": 6.0}),
                     "ConvClip", "%lo is not constant"),
}


@pytest.mark.parametrize("case", CONV_NEGATIVES)
def test_conv_negatives(case):
    make, rule, reason = CONV_NEGATIVES[case]
    assert reason in refusal(make(), rule)


def test_silu_stays():
    # x·sigmoid(x): neither kernel has a SiLU, and the conv output is read twice anyway.
    proto = build("g (float[1,3,8,8] x, float[4,3,3,3] w) => (float[1,4,8,8] y) {"
                  " c = Conv<pads=[1,1,1,1]>(x, w)\n s = Sigmoid(c)\n y = Mul(c, s) }",
                  w=weight(4, 3, 3, 3))
    assert "is also read by Mul" in refusal(proto, "ConvSigmoid")
    assert runtime_refuses("FusedConv", "Swish") and runtime_refuses("FusedConv", "SiLU")


# -- Gemm and matrix MatMul + activation → FusedGemm --------------------------------------------

GEMM_CASES = {  # activation: FusedGemm's activation_* attributes
    "Relu": ("Relu(m)", {}),
    "LeakyRelu": ("LeakyRelu<alpha=0.2>(m)", {"activation_alpha": 0.2}),
    "Sigmoid": ("Sigmoid(m)", {}),
    "Tanh": ("Tanh(m)", {}),
    "HardSigmoid": ("HardSigmoid<alpha=0.3, beta=0.4>(m)",
                    {"activation_alpha": 0.3, "activation_beta": 0.4}),
}


def activation_attrs(fused) -> dict:
    return {k: pytest.approx(fused.attr(k)) for k in fused.attrs if k.startswith("activation_")}


@pytest.mark.parametrize("act", GEMM_CASES)
def test_gemm_activation_becomes_fused_gemm(act):
    text, attrs = GEMM_CASES[act]
    proto = build("g (float[4,8] a, float[16,8] w, float[16] c) => (float[4,16] y) {"
                  f" m = Gemm<alpha=0.5, beta=2.0, transB=1>(a, w, c)\n y = {text} }}",
                  w=weight(16, 8), c=weight(16))
    model, stats = fuse(proto)
    assert stats == {f"Gemm{act}": 1}
    assert ops(model) == ["com.microsoft::FusedGemm"]
    fused = node(model, "FusedGemm")
    assert fused.attr("activation") == act and activation_attrs(fused) == attrs
    assert (fused.attr("alpha"), fused.attr("beta"), fused.attr("transB")) == (0.5, 2.0, 1)
    same_outputs(proto, model)


@pytest.mark.parametrize("act", GEMM_CASES)
def test_matrix_matmul_activation_becomes_fused_gemm(act):
    text, attrs = GEMM_CASES[act]
    proto = build(f"g (float[4,8] a, float[8,16] w) => (float[4,16] y) {{ m = MatMul(a, w)\n"
                  f" y = {text} }}")  # w is fed: FusedGemm does not need a constant weight
    model, stats = fuse(proto)
    assert stats == {f"MatMul{act}": 1}
    assert ops(model) == ["com.microsoft::FusedGemm"]
    fused = node(model, "FusedGemm")
    assert [v.name for v in fused.inputs] == ["a", "w"]
    assert fused.attr("activation") == act and activation_attrs(fused) == attrs
    same_outputs(proto, model)


def test_linear_relu_becomes_one_fused_gemm():
    proto = build("g (float[4,8] x, float[8,16] w, float[16] b) => (float[4,16] y) {"
                  " m = MatMul(x, w)\n s = Add(m, b)\n y = Relu(s) }", w=weight(8, 16),
                  b=weight(16))
    model, stats = fuse(proto, passes=(FuseMatMul, FuseActivation))
    assert stats == {"MatMulAddToGemm": 1, "GemmRelu": 1}
    assert ops(model) == ["com.microsoft::FusedGemm"]
    same_outputs(proto, model)


def test_gemm_negatives():
    # FusedGemm's functors take neither Clip nor HardSwish: no rule, and the probe says why.
    for act in ("Clip", "HardSwish"):
        proto = build("g (float[4,8] a, float[8,16] w, float lo, float hi) => (float[4,16] y) {"
                      f" m = Gemm(a, w)\n y = {act}(m{', lo, hi' if act == 'Clip' else ''}) }}",
                      lo=scalar(0.0), hi=scalar(6.0))
        model, stats = fuse(proto)
        assert not stats and ops(model) == ["Gemm", act]
    assert "does not take activation 'Clip'" in runtime_refuses("FusedGemm", "Clip")
    assert "does not take activation 'HardSwish'" in runtime_refuses("FusedGemm", "HardSwish")
    # A batched MatMul is not a Gemm.
    batched = build("g (float[2,4,8] a, float[8,16] w) => (float[2,4,16] y) {"
                    " m = MatMul(a, w)\n y = Relu(m) }")
    assert "not both known to be matrices" in refusal(batched, "MatMulRelu")
    # Double stays: the fused kernels are fp32 here.
    double = build("g (double[4,8] a, double[8,16] w) => (double[4,16] y) {"
                   " m = Gemm(a, w)\n y = Relu(m) }")
    assert "does not take f64" in refusal(double, "GemmRelu")


def test_runtime_takes_every_activation_the_rules_emit():
    for fused, acts in (("FusedConv", ACTIVATIONS),
                        ("FusedGemm", ACTIVATIONS - {"Clip", "HardSwish"})):
        for act in acts:
            assert runtime_refuses(fused, act) is None, (fused, act)


# -- Realistic models ---------------------------------------------------------------------------

def test_small_convnet():
    proto = build("g (float[1,3,16,16] x, float[8,3,3,3] w1, float[8] b1, float[8,1,3,3] w2,"
                  " float[16,8,1,1] w3, float[16] b3, float lo, float hi, float[10,16] wf,"
                  " float[10] bf) => (float[1,10] y) {"
                  " c1 = Conv<pads=[1,1,1,1], strides=[2,2]>(x, w1, b1)\n r1 = Relu(c1)\n"
                  " c2 = Conv<pads=[1,1,1,1], group=8>(r1, w2)\n r2 = Clip(c2, lo, hi)\n"
                  " c3 = Conv(r2, w3, b3)\n r3 = HardSwish(c3)\n p = GlobalAveragePool(r3)\n"
                  " f = Flatten(p)\n t = Transpose(wf)\n m = MatMul(f, t)\n s = Add(m, bf)\n"
                  " y = Tanh(s) }",
                  w1=weight(8, 3, 3, 3), b1=weight(8), w2=weight(8, 1, 3, 3),
                  w3=weight(16, 8, 1, 1), b3=weight(16), lo=scalar(0.0), hi=scalar(6.0),
                  wf=weight(10, 16), bf=weight(10))
    # optimize() folds the weight's Transpose first; the classifier then becomes one Gemm.
    model, stats = fuse(optimize(proto, disable_passes=UNDER_TEST).model,
                         passes=(FuseMatMul, FuseActivation))
    assert stats == {"ConvRelu": 1, "ConvClip": 1, "ConvHardSwish": 1, "MatMulAddToGemm": 1,
                     "GemmTanh": 1}
    assert Counter(ops(model)) == {"com.microsoft::FusedConv": 3, "GlobalAveragePool": 1,
                                   "Flatten": 1, "com.microsoft::FusedGemm": 1}
    same_outputs(proto, model)


# optimize() runs these passes itself; the tests switch them off there to count their work.
UNDER_TEST = ["FuseMatMul", "FuseActivation"]
ZOO = {"mobilenetv2": {"width": 0.25, "image_size": 64, "num_classes": 10},
       "resnet50": {"blocks": (1, 2, 1, 1), "width": 0.25, "image_size": 64, "num_classes": 10}}


def fusable(model: Model) -> int:
    """Activations reading a Conv output that nothing else reads: what FuseActivation must fuse."""
    return sum(1 for n in model.graph if n.op_type in ACTIVATIONS
               and (c := n.inputs[0].producer) is not None and c.op_type == "Conv"
               and len(n.inputs[0].uses) == 1 and not n.inputs[0].is_graph_output)


def after_batchnorm(proto: onnx.ModelProto) -> int:
    outputs = {o for n in proto.graph.node if n.op_type == "BatchNormalization" for o in n.output}
    return sum(1 for n in proto.graph.node if n.op_type in ACTIVATIONS and n.input[0] in outputs)


def without_batchnorm(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every BatchNormalization bypassed: the Conv → activation shape a folded
    BatchNorm leaves, with its own reference outputs."""
    bypass = {n.output[0]: n.input[0] for n in proto.graph.node
              if n.op_type == "BatchNormalization"}
    stripped = onnx.ModelProto()
    stripped.CopyFrom(proto)
    keep = [n for n in stripped.graph.node if n.op_type != "BatchNormalization"]
    for n in keep:
        n.input[:] = [bypass.get(i, i) for i in n.input]
    del stripped.graph.node[:]
    stripped.graph.node.extend(keep)
    return stripped


@pytest.mark.parametrize("name", ZOO)
def test_zoo_after_optimize(name):
    proto = zoo.build(name, **ZOO[name])
    model = optimize(proto, disable_passes=UNDER_TEST).model
    infer_shapes(model)
    expected = fusable(model)
    if "BatchNormalization" not in ops(model):  # BatchNorm folding is wired into optimize()
        assert expected == after_batchnorm(proto) > 0
    model, stats = fuse(model, passes=(FuseMatMul, FuseActivation))
    assert Counter(ops(model))["com.microsoft::FusedConv"] == expected
    assert sum(n for rule, n in stats.items() if rule.startswith("Conv")) == expected
    feeds = zoo.sample_inputs(proto, dims={"batch_size": 2})
    same_outputs(proto, model, atol=1e-4, feeds=feeds)


@pytest.mark.parametrize("name,fused", [("mobilenetv2", 35), ("resnet50", 11)])
def test_zoo_with_batchnorm_bypassed(name, fused):
    # Every Clip(0, 6) of MobileNetV2 and every ResNet ReLU except the five after a residual Add.
    proto = without_batchnorm(zoo.build(name, **ZOO[name]))
    model = optimize(proto, disable_passes=UNDER_TEST).model
    model, stats = fuse(model, passes=(FuseMatMul, FuseActivation))
    rule = "ConvClip" if name == "mobilenetv2" else "ConvRelu"
    assert stats == {rule: fused}
    counts = Counter(ops(model))
    assert counts["com.microsoft::FusedConv"] == fused
    # The rest are linear: MobileNetV2's projections, ResNet's conv3 and downsample convs.
    assert counts["Conv"] == sum(n.op_type == "Conv" for n in proto.graph.node) - fused
    feeds = zoo.sample_inputs(proto, dims={"batch_size": 2})
    same_outputs(proto, model, atol=1e-4, feeds=feeds)


def test_pass_is_registered():
    assert PASSES["FuseActivation"] is FuseActivation
