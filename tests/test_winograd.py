"""WinogradConv: F(4×4, 3×3) matrices, outputs against the direct conv, when the rewrite applies."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import graphopt
from graphopt import numerics
from graphopt.codegen import load_om
from graphopt.passes import winograd
from graphopt.passes.pipelines import PIPELINES, for_target
from graphopt.partition import load_target
from graphopt.tuner.subgraph_space import Recorder, build_space, gate_for

from helpers import IR_VERSION, ops, run_cli

# The rewrite's error is relative to the layer's outputs, not to each element (module docstring).
SCALED_TOLERANCE = 4e-5


def correlate_1d(d: np.ndarray, g: np.ndarray, m: int) -> np.ndarray:
    return np.array([sum(d[k + i] * g[i] for i in range(len(g))) for k in range(m)])


def test_matrices_compute_a_correlation_exactly():
    at, g, bt = winograd.matrices()
    rng = np.random.default_rng(0)
    for _ in range(20):
        d, f = rng.standard_normal(6), rng.standard_normal(3)
        np.testing.assert_allclose(at @ ((g @ f) * (bt @ d)), correlate_1d(d, f, 4), atol=1e-12)
        tile, filt = rng.standard_normal((6, 6)), rng.standard_normal((3, 3))
        direct = np.array([[np.sum(tile[y:y + 3, x:x + 3] * filt) for x in range(4)]
                           for y in range(4)])
        winograd_form = at @ ((g @ filt @ g.T) * (bt @ tile @ bt.T)) @ at.T
        np.testing.assert_allclose(winograd_form, direct, atol=1e-12)


def conv_model(channels=128, filters=128, size=(30, 30), pads=(1, 1, 1, 1), bias=True,
               activation=None, batch=1, group=1, strides=(1, 1), seed=0,
               opset=17) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    weight = (rng.standard_normal((filters, channels // group, 3, 3))
              / np.sqrt(9 * channels / group)).astype(np.float32)
    inits = [numpy_helper.from_array(weight, "w")]
    inputs = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(filters).astype(np.float32), "b"))
        inputs.append("b")
    nodes = [helper.make_node("Conv", inputs, ["c"], name="conv", pads=list(pads), group=group,
                              strides=list(strides))]
    nodes.append(helper.make_node(activation or "Identity", ["c"], ["y"]))
    height, width = ((side + pads[i] + pads[i + 2] - 3) // strides[i] + 1
                     if isinstance(side, int) else side for i, side in enumerate(size))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, channels, *size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, filters, height, width])
    graph = helper.make_graph(nodes, "conv", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=IR_VERSION)


def run(proto: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The model's one output on `x`, onnxruntime at ORT_DISABLE_ALL."""
    (output,) = numerics.run(proto, {"x": x}).values()
    return output


def compiled(proto, level=3):
    return graphopt.optimize(proto, level=level, target="cpu")


def assert_same_outputs(proto, result):
    onnx.checker.check_model(result.to_onnx(), full_check=True)
    shape = [d.dim_value or 2 for d in proto.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    expected, got = run(proto, x), run(result.to_onnx(), x)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=0,
                               atol=SCALED_TOLERANCE * float(np.abs(expected).max()))


@pytest.mark.parametrize("case", [
    {},                                                  # 30×30: 8×8 tiles, the last ones cut
    {"size": (32, 32)},                                  # whole tiles, no Slice
    {"pads": (0, 0, 0, 0), "size": (34, 34)},           # no padding
    {"pads": (1, 0, 0, 1), "size": (33, 31)},           # uneven padding
    {"bias": False},
    {"filters": 192, "channels": 160},
    {"batch": 3},
    {"batch": "N"},                                      # run with 2 images
    {"opset": 10},                                       # DepthToSpace without a mode
    {"opset": 9},                                        # Slice's bounds as attributes
])
def test_outputs_match_the_direct_conv(case):
    proto = conv_model(**case)
    result = compiled(proto)
    assert result.log.records and "WinogradConv" in [r.name for r in result.log.records]
    assert "DepthToSpace" in ops(result.model)
    assert_same_outputs(proto, result)


@pytest.mark.parametrize("activation", ["Relu", "Sigmoid", "Tanh"])
def test_a_fused_activation_follows_the_output_transform(activation):
    proto = conv_model(activation=activation)
    result = compiled(proto)
    names = ops(result.model)
    # After the rewrite, -O3's FuseElementwise may group the bias Add and the activation.
    assert "DepthToSpace" in names and "com.microsoft::FusedConv" not in names
    assert activation in names or any(n.startswith("graphopt::elementwise") for n in names)
    assert_same_outputs(proto, result)


@pytest.mark.parametrize("opset", [9, 17])
def test_clip_bounds_come_back_as_inputs_or_attributes(opset):
    proto = conv_model(opset=opset)
    if opset >= 11:
        lo, hi = (numpy_helper.from_array(np.float32(v), n) for v, n in ((-1, "lo"), (3, "hi")))
        proto.graph.initializer.extend([lo, hi])
        clip = helper.make_node("Clip", ["c", "lo", "hi"], ["y"])
    else:
        clip = helper.make_node("Clip", ["c"], ["y"], min=-1.0, max=3.0)
    proto.graph.node[1].CopyFrom(clip)
    result = compiled(proto)
    names = ops(result.model)  # the Clip may sit in an elementwise group's function
    assert "DepthToSpace" in names and "com.microsoft::FusedConv" not in names
    assert_same_outputs(proto, result)


@pytest.mark.parametrize("case, why", [
    ({"channels": 64, "filters": 64}, "too few channels"),
    ({"size": (14, 14)}, "too few channels or tiles"),     # 16 tiles of 128 channels
    ({"group": 2}, "group 1"),
    ({"strides": (2, 2), "size": (64, 64)}, "strided"),
    ({"size": ("H", "W")}, "static channels and sizes"),
])
def test_convs_it_would_slow_down_or_cannot_take_stay_direct(case, why):
    proto = conv_model(**case)
    typed = graphopt.optimize(proto, level=1).model  # shapes inferred, the Conv as it was
    assert why in winograd.refusal(next(n for n in typed.graph if n.op_type == "Conv"), 17)
    result = compiled(proto)
    assert "DepthToSpace" not in ops(result.model)
    assert_same_outputs(proto, result)


def test_only_O3_on_the_cpu_target_rewrites():
    cpu = load_target("cpu")
    assert "WinogradConv" in for_target(PIPELINES[3], cpu).pass_names()
    assert "WinogradConv" not in for_target(PIPELINES[2], cpu).pass_names()
    assert "WinogradConv" not in for_target(PIPELINES[3], load_target("ascend310")).pass_names()
    proto = conv_model()
    assert "DepthToSpace" not in ops(compiled(proto, level=2).model)
    assert "DepthToSpace" not in ops(graphopt.optimize(proto, level=3).model)  # no target


def test_the_rule_follows_the_measured_shapes():
    # bench/winograd.py: faster on these ...
    for shape in [(128, 128, 128, 128), (256, 256, 64, 64), (512, 512, 32, 32),
                  (1024, 1024, 16, 16), (256, 256, 28, 28), (192, 192, 35, 35),
                  (512, 512, 14, 14), (768, 768, 17, 17)]:
        assert winograd.pays_off(*shape), shape
    # ... and slower on these.
    for shape in [(64, 64, 256, 256), (64, 64, 56, 56), (256, 256, 14, 14), (512, 512, 7, 7),
                  (1024, 1024, 8, 8), (128, 64, 256, 256)]:
        assert not winograd.pays_off(*shape), shape


def test_the_om_runs_the_rewritten_conv(tmp_path):
    proto = conv_model(activation="Relu")
    path = tmp_path / "conv.om"
    graphopt.save(compiled(proto), path)
    x = np.random.default_rng(2).standard_normal((1, 128, 30, 30)).astype(np.float32)
    (got,) = graphopt.load(path).run({"x": x}).values()
    expected = run(proto, x)
    np.testing.assert_allclose(got, expected, rtol=0,
                               atol=SCALED_TOLERANCE * float(np.abs(expected).max()))


def test_a_static_batch_counts_every_images_tiles():
    # ResNet-50's 256×14×14 layer: 16 tiles are too few for one image, not for eight.
    assert not winograd.pays_off(256, 256, 14, 14)
    assert winograd.pays_off(256, 256, 14, 14, batch=8)
    proto = conv_model(channels=256, filters=256, size=(14, 14), batch=8)
    assert "DepthToSpace" in ops(compiled(proto).model)
    symbolic = conv_model(channels=256, filters=256, size=(14, 14), batch="N")
    assert "DepthToSpace" not in ops(compiled(symbolic).model)  # the batch may be 1


def test_verify_names_winograd_when_its_rounding_exceeds_the_tolerance():
    proto = conv_model(size=(32, 32))
    with pytest.raises(graphopt.errors.VerificationError, match="as Winograd, exact to ~2e-5"):
        graphopt.optimize(proto, level=3, target="cpu", verify=True, rtol=0, atol=1e-7)
    graphopt.optimize(proto, level=3, target="cpu", verify=True, rtol=0, atol=1e-3)


def test_subgraph_tuning_can_switch_winograd_per_conv_shape():
    proto = conv_model()
    recorder = Recorder("shape")
    result = graphopt.optimize(proto, level=3, target="cpu", rewrite_gate=recorder)
    space = build_space(recorder, result.partitioning, elementwise=False, npu=False)
    (group,) = [g for g in space.groups if g.key.startswith("WinogradConv")]
    assert group.key == "WinogradConv@Conv[1,128,30,30]"
    direct = graphopt.optimize(proto, level=3, target="cpu",
                               rewrite_gate=gate_for({**space.default_params(),
                                                      group.param: False}, space))
    assert "DepthToSpace" not in ops(direct.model)


def test_the_rewrite_does_not_ask_for_onnxruntimes_layout_level(tmp_path):
    # Every conv it emits has constant filters, and LayoutNchwc blocks what it can: "all" would
    # only cost session time.
    proto = conv_model(activation="Relu")
    # A 1×1 conv after it, which LayoutNchwc blocks.
    proto.graph.node[1].output[0] = "r"
    proto.graph.node.append(helper.make_node("Conv", ["r", "w1"], ["y"]))
    proto.graph.initializer.append(numpy_helper.from_array(
        np.full((128, 128, 1, 1), 0.01, np.float32), "w1"))
    result = compiled(proto)
    assert "com.microsoft.nchwc::Conv" in ops(result.model) and "DepthToSpace" in ops(result.model)
    graphopt.save(result, tmp_path / "w.om")
    (part,) = load_om(tmp_path / "w.om").partitions
    assert part.optimization_level != "all"


@settings(max_examples=int(os.environ.get("GRAPHOPT_FUZZ_EXAMPLES", 40)), deadline=None,
          derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(channels=st.integers(1, 6), filters=st.integers(1, 6), height=st.integers(1, 11),
       width=st.integers(1, 11), pads=st.tuples(*[st.integers(0, 2)] * 4),
       batch=st.sampled_from([1, 2, "N"]), bias=st.booleans(),
       activation=st.sampled_from([None, "Relu", "Sigmoid"]))
def test_any_small_conv_forced_through_the_rewrite_matches(monkeypatch, channels, filters, height,
                                                           width, pads, batch, bias, activation):
    # The rule would refuse these shapes; forcing it checks the rewrite's arithmetic and every
    # edge of the tiling (a 1×1 output, uneven pads, tiles cut at both borders).
    assume(height + pads[0] + pads[2] >= 3 and width + pads[1] + pads[3] >= 3)
    monkeypatch.setattr(winograd, "pays_off", lambda *args: True)
    proto = conv_model(channels=channels, filters=filters, size=(height, width), pads=pads,
                       bias=bias, activation=activation, batch=batch)
    result = compiled(proto)
    assert "DepthToSpace" in ops(result.model)
    assert_same_outputs(proto, result)


def test_compare_and_report_say_when_winograd_explains_a_failed_comparison(tmp_path, capsys):
    proto = conv_model(size=(32, 32))
    onnx.save(proto, tmp_path / "conv.onnx")
    graphopt.save(compiled(proto), tmp_path / "conv.om")
    strict = ["--rtol", "0", "--atol", "1e-9"]
    rc, out, _ = run_cli(capsys, "compare", tmp_path / "conv.onnx", tmp_path / "conv.om", *strict)
    assert rc == 1 and "rewrote 1 conv(s) as Winograd" in out
    rc, out, _ = run_cli(capsys, "report", tmp_path / "conv.om", "-o", tmp_path / "r.html",
                         "--reference", tmp_path / "conv.onnx", *strict)
    assert rc == 0 and "accuracy: FAIL" in out and "rewrote 1 conv(s) as Winograd" in out
    rc, out, _ = run_cli(capsys, "report", tmp_path / "conv.om", "-o", tmp_path / "r.html",
                         "--reference", tmp_path / "conv.onnx", "--atol", "1e-3")
    assert rc == 0 and "accuracy: PASS" in out and "Winograd" not in out
