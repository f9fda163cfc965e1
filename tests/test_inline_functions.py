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
