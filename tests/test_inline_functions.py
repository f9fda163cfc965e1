"""A model's own local functions: inlined at import from -O1 on (as onnxruntime inlines them),
kept where ONNX's inliner refuses them, and placed and run right when kept."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import pytest

import graphopt
from graphopt import numerics
from graphopt.codegen import load_om

RNG = np.random.default_rng(0)
X = {"x": RNG.standard_normal((1, 8, 6, 6)).astype(np.float32)}

# A Conv + BatchNorm + an activation whose slope is a function attribute (onnxscript's
# @slope), and a Softmax whose axis is one with a default: onnx 1.23's inliner drops defaults.
BLOCK = """
<ir_version: 10, opset_import: ["" : 17, "local" : 1]>
g (float[1,8,6,6] x) => (float[1,8,6,6] y, float[1,8,6,6] z) {
   a = local.Block <slope: float = 0.2> (x)
   y = Add (a, x)
   z = local.Soft (a)
}
<domain: "local", opset_import: ["" : 17]>
Block <slope> (x) => (y) {
   w = Constant <value = float[8,8,1,1] {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8,
       0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8,
       0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8,
       0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8,
       0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8}> ()
   s = Constant <value = float[8] {1, 2, 1, 2, 1, 2, 1, 2}> ()
   t = Constant <value = float[8] {0, 1, 0, 1, 0, 1, 0, 1}> ()
   m = Constant <value = float[8] {0.5, 0, 0.5, 0, 0.5, 0, 0.5, 0}> ()
   v = Constant <value = float[8] {1, 2, 3, 4, 1, 2, 3, 4}> ()
   c = Conv (x, w)
   b = BatchNormalization (c, s, t, m, v)
   y = LeakyRelu <alpha: float = @slope> (b)
}
<domain: "local", opset_import: ["" : 17]>
Soft <axis: int = 1> (x) => (y) {
   y = Softmax <axis: int = @axis> (x)
}
"""


def _ops(model) -> list[str]:
    return [n.op_type for n in model.graph]


def test_local_functions_are_inlined_and_fused_from_O1():
    # torch's export_modules_as_functions and onnxscript put the work in functions, which no
    # pass enters: an int8 compile "quantized nothing", and an .om whose Convs sat in them ran
    # 1.81x the original's time.
    proto = onnx.parser.parse_model(BLOCK)
    expected = numerics.run(proto, X)
    for level in (1, 2, 3):
        result = graphopt.optimize(proto, level=level)
        assert "2 call(s) of 2 model-local function(s) inlined, as onnxruntime inlines them " \
               "when it loads the model" in result.notes, result.notes
        assert not result.model.functions or level == 3  # -O3 makes groups of its own
        out = numerics.run(result.to_onnx(), X)
        for name in ("y", "z"):  # z: the Softmax at its default axis 1, not the inliner's -1
            np.testing.assert_allclose(out[name], expected[name], rtol=1e-5, atol=1e-6)
    assert "BatchNormalization" not in _ops(graphopt.optimize(proto, level=2).model)
    kept = graphopt.optimize(proto, level=0)
    assert {f.name for f in kept.model.functions} == {"Block", "Soft"}


def test_calls_inside_if_and_loop_bodies_are_inlined_too():
    proto = onnx.parser.parse_model("""
    <ir_version: 10, opset_import: ["" : 17, "local" : 1]>
    g (float[1,8,6,6] x, bool c) => (float[1,8,6,6] ly) <int64 trip = {3}, float one = {0.25}> {
       iy = If (c) <else_branch: graph = e () => (float[1,8,6,6] e_out) { e_out = Neg (x) },
                    then_branch: graph = t () => (float[1,8,6,6] t_out) {
                        t_out = local.Swish (x) }>
       ly = Loop (trip, "", iy) <body: graph = body (int64 i, bool cond_in,
                                                     float[1,8,6,6] acc_in)
                                  => (bool cond_out, float[1,8,6,6] acc_out) {
          b1 = local.Swish (acc_in)
          acc_out = Add (b1, one)
          cond_out = Identity (cond_in)
       }>
    }
    <domain: "local", opset_import: ["" : 17]>
    Swish (x) => (y) { s = Sigmoid (x)
                       y = Mul (x, s) }
    """)
    result = graphopt.optimize(proto)
    assert "2 call(s) of 1 model-local function(s) inlined" in " ".join(result.notes)
    for flag in (True, False):
        feeds = {**X, "c": np.array(flag)}
        np.testing.assert_allclose(numerics.run(result.to_onnx(), feeds)["ly"],
                                   numerics.run(proto, feeds)["ly"], rtol=1e-5, atol=1e-6)


MIXED_OPSETS = """
<ir_version: 10, opset_import: ["" : 17, "custom" : 1]>
g (float[1,8,6,6] x) => (float[1,8,6,6] y) {
   y = custom.Block (x)
}
<domain: "custom", opset_import: ["" : 13]>
Block (x) => (y) {
   w = Constant <value = float[8,8,1,1] {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8,
       0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8,
       0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8,
       0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8,
       0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8}> ()
   c = Conv (x, w)
   y = Relu (c)
}
"""


def test_a_function_the_inliner_refuses_is_kept_and_its_convs_left_to_onnxruntime(tmp_path):
    # A body importing another opset than the model: ONNX's inliner refuses it, onnxruntime
    # runs it. The passes cannot block its Convs, so the partition runs at "all", where
    # onnxruntime does (1.81x the original's time at "extended").
    proto = onnx.parser.parse_model(MIXED_OPSETS)
    result = graphopt.optimize(proto, target="cpu")
    assert any(n.startswith("1 model-local function(s) kept as they are, which the passes do "
                            "not enter (ONNX's inliner refused them") for n in result.notes)
    path = tmp_path / "m.om"
    graphopt.save(result, path)
    (part,) = load_om(path).partitions
    assert part.optimization_level == "all"
    with graphopt.load(path) as session:
        np.testing.assert_allclose(session.run(X)["y"], numerics.run(proto, X)["y"],
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("level", [0, 2])
def test_a_kept_function_with_a_reference_attribute_is_placed_on_an_npu(level):
    # At -O0 (and wherever the inliner refuses) the call is placed as one kernel: reading the
    # body's `alpha = @slope` had been an internal error, and its Constants had sent a GELU's
    # or LayerNorm's function to the host as ops without an NPU kernel.
    proto = onnx.parser.parse_model("""
    <ir_version: 10, opset_import: ["" : 17, "local" : 1]>
    g (float[1,8,6,6] x) => (float[1,8,6,6] y) {
       a = local.Act <slope: float = 0.2> (x)
       b = local.Scaled (a)
       y = Add (b, x)
    }
    <domain: "local", opset_import: ["" : 17]>
    Act <slope> (x) => (y) { y = LeakyRelu <alpha: float = @slope> (x) }
    <domain: "local", opset_import: ["" : 17]>
    Scaled (x) => (y) { k = Constant <value = float {0.5}> ()
                        y = Mul (x, k) }
    """)
    result = graphopt.optimize(proto, target="ascend310", level=level)
    assert {p.device for p in result.partitioning.partitions} == {"npu"}
    outputs = numerics.run(result.to_onnx(), X)
    np.testing.assert_allclose(outputs["y"], numerics.run(proto, X)["y"], rtol=1e-5, atol=1e-6)


def _model_with(functions, main_nodes, opsets=None, x_shape=(2, 3, 4)):
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        main_nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x_shape))])
    return helper.make_model(graph, functions=functions, ir_version=10, opset_imports=[
        helper.make_opsetid(domain, version)
        for domain, version in (opsets or {"": 17, "local": 1}).items()])


def _ref(node, name: str, referred: str):
    """`node` with attribute `name` (an int) referring to its function's `referred`."""
    from onnx import AttributeProto

    node.attribute.add(name=name, type=AttributeProto.INT, ref_attr_name=referred)
    return node


def _softmax_chain():
    """F <ax> calls G <axis = @ax>; G's axis defaults to 1; the main graph calls F without ax:
    G's default applies (onnx 1.23's inliner dropped it, and Softmax took its own -1)."""
    from onnx import helper

    g = helper.make_function("local", "G", ["x"], ["y"], [
        _ref(helper.make_node("Softmax", ["x"], ["y"]), "axis", "axis")],
        [helper.make_opsetid("", 17)], attributes=[])
    g.attribute_proto.append(helper.make_attribute("axis", 1))
    f = helper.make_function("local", "F", ["x"], ["y"], [
        _ref(helper.make_node("G", ["x"], ["y"], domain="local"), "axis", "ax")],
        [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)], attributes=["ax"])
    return _model_with([f, g], [helper.make_node("F", ["x"], ["y"], domain="local")])


@pytest.mark.parametrize("case", ["nested default", "shadowed kernel", "domain in the body",
                                  "unused function of another opset"])
def test_inlining_computes_what_onnxruntime_runs(case):
    from onnx import helper

    if case == "nested default":
        proto = _softmax_chain()
    elif case == "shadowed kernel":  # onnxruntime runs its Gelu kernel, not this body
        gelu = helper.make_function("com.microsoft", "Gelu", ["x"], ["y"],
                                    [helper.make_node("Neg", ["x"], ["y"])],
                                    [helper.make_opsetid("", 17)])
        proto = _model_with([gelu], [helper.make_node("Gelu", ["x"], ["y"],
                                                      domain="com.microsoft")],
                            {"": 17, "com.microsoft": 1})
    elif case == "domain in the body":  # the inliner did not import com.microsoft
        fast = helper.make_function("local", "F", ["x"], ["y"], [helper.make_node(
            "FastGelu", ["x"], ["y"], domain="com.microsoft")],
            [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
        proto = _model_with([fast], [helper.make_node("F", ["x"], ["y"], domain="local")])
    else:  # one function the inliner refuses, and nothing calls it
        neg = helper.make_function("local", "F", ["x"], ["y"],
                                   [helper.make_node("Neg", ["x"], ["y"])],
                                   [helper.make_opsetid("", 17)])
        old = helper.make_function("local", "Unused", ["x"], ["y"],
                                   [helper.make_node("Neg", ["x"], ["y"])],
                                   [helper.make_opsetid("", 13)])
        proto = _model_with([neg, old], [helper.make_node("F", ["x"], ["y"], domain="local")])
    x = {"x": RNG.standard_normal((2, 3, 4)).astype(np.float32)}
    expected = numerics.run(proto, x)["y"]
    for level in (1, 2):
        result = graphopt.optimize(proto, level=level, verify=True)
        np.testing.assert_allclose(numerics.run(result.to_onnx(), x)["y"], expected,
                                   rtol=1e-5, atol=1e-6)
        if case != "shadowed kernel":
            assert any("model-local function(s) inlined" in n for n in result.notes)


def test_verify_checks_the_inlining_against_the_model_as_given(monkeypatch):
    # Its reference had been the model after inlining: an inliner's error passed as "max abs
    # error 0".
    import graphopt.inline_functions as inline
    from graphopt.errors import VerificationError

    proto = _softmax_chain()
    real = inline._spell_out_defaults
    monkeypatch.setattr(inline, "_spell_out_defaults", lambda p: None)  # the inliner's bug back
    with pytest.raises(VerificationError, match="differs from the original"):
        graphopt.optimize(proto, verify=True)
    monkeypatch.setattr(inline, "_spell_out_defaults", real)
    graphopt.optimize(proto, verify=True)


def test_a_kept_function_holding_a_conv_runs_on_the_host_of_an_npu_target():
    # Placed as one kernel, its Conv's weight (a Constant of the body) was invisible to the
    # tiling: an internal error at -O0 on ascend310.
    proto = onnx.parser.parse_model(MIXED_OPSETS)
    result = graphopt.optimize(proto, target="ascend310", level=0)
    assert [p.device for p in result.partitioning.partitions] == ["cpu"]
    np.testing.assert_allclose(numerics.run(result.to_onnx(), X)["y"],
                               numerics.run(proto, X)["y"], rtol=1e-5, atol=1e-6)


def test_a_model_without_local_functions_is_not_exported_to_look_for_them(tmp_path, monkeypatch):
    # The export reads every weight stored outside the model into memory: a 2.3 GiB table had
    # failed to serialize at the default -O2, and a 1 GiB model peaked at 1.6 GB, not 143 MB.
    import graphopt.inline_functions as inlining
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])],
        [numpy_helper.from_array(np.eye(256, dtype=np.float32), "w")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path,
              save_as_external_data=True, location="m.data", size_threshold=0)

    def refuse(*_):
        raise AssertionError("exported a model without local functions")

    monkeypatch.setattr(inlining, "to_onnx", refuse)
    result = graphopt.optimize(str(path))
    assert [n.op_type for n in result.model.graph] == ["MatMul"]
