"""ceil_mode pools: graphopt takes onnxruntime's output size, where ONNX shape inference before
opset 22 keeps a last window that starts in the end padding."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import TensorProto, helper

import graphopt
from graphopt import numerics
from graphopt.passes.pool_shapes import ceil_mode_size


def test_the_rule_gives_onnxruntimes_sizes():
    for op, (size, kernel, stride, head, tail, dilation) in itertools.product(
            ("MaxPool", "AveragePool"),
            itertools.product(range(3, 8), (2, 3), (1, 2, 3), (0, 1, 2), (0, 1, 2), (1, 2))):
        if head >= kernel or tail >= kernel:
            continue
        node = helper.make_node(op, ["x"], ["y"], kernel_shape=[kernel], strides=[stride],
                                pads=[head, tail], ceil_mode=1, dilations=[dilation])
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, [1, 1, size])], [helper.make_tensor_value_info(
                "y", TensorProto.FLOAT, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
        try:
            (y,) = numerics.run(model, {"x": np.ones((1, 1, size), np.float32)}).values()
        except Exception:  # noqa: BLE001 - a negative size, which onnxruntime refuses
            continue
        assert y.shape[2] == ceil_mode_size(size, kernel, stride, head, tail, dilation), \
            (op, size, kernel, stride, head, tail, dilation)


POOLED = """
<ir_version: 8, opset_import: ["" : 18]>
g (float[1,1,5,5] x) => (int64[4] s, float[1,?] flat) {
  p = {op} <kernel_shape = [2, 2], strides = [2, 2], pads = [1, 1, 1, 1], ceil_mode = 1> (x)
  s = Shape(p)
  flat = Flatten(p)
}"""


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
@pytest.mark.parametrize("level", [1, 2])
def test_a_pool_whose_last_window_starts_in_the_padding_folds_to_onnxruntimes_shape(op, level):
    proto = onnx.parser.parse_model(POOLED.replace("{op}", op))
    x = np.random.default_rng(0).standard_normal((1, 1, 5, 5)).astype(np.float32)
    expected = numerics.run(proto, {"x": x})
    assert expected["s"].tolist() == [1, 1, 3, 3]  # ONNX's inference says [1, 1, 4, 4]
    result = graphopt.optimize(proto, level=level)
    optimized = result.to_onnx()
    # The sizes stay unknown: onnxruntime's would contradict onnx.checker's own inference.
    onnx.checker.check_model(optimized, full_check=True)
    assert "Shape" in [n.op_type for n in optimized.graph.node]  # not folded to [1, 1, 4, 4]
    flat = next(v for v in result.model.graph.outputs if v.name == "flat")
    assert flat.dtype is not None and not isinstance(flat.shape[1], int)  # not 16
    assert numerics.compare(expected, numerics.run(optimized, {"x": x}), 0, 0) == []


def test_a_pool_inside_a_branch_keeps_onnxruntimes_shape_too():
    proto = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N,1,4,4] x, bool c) => (int64[4] s) <int64[1] one = {1}> {
          s = If (c) <
            then_branch = g1 () => (int64[4] a) {
              p = MaxPool <kernel_shape = [2, 2], strides = [2, 2], pads = [0, 0, 1, 1],
                           ceil_mode = 1> (x)
              d = Shape(p)
              a = Mul(d, one)
            },
            else_branch = g2 () => (int64[4] b) { b = Shape(x) }>
        }""")
    feeds = {"x": np.ones((1, 1, 4, 4), np.float32), "c": np.array(True)}
    expected = numerics.run(proto, feeds)
    assert expected["s"].tolist() == [1, 1, 2, 2]  # ONNX's inference says [1, 1, 3, 3]
    for pins in (None, "x:1,1,4,4"):
        optimized = graphopt.optimize(proto, level=2, input_shapes=pins).to_onnx()
        onnx.checker.check_model(optimized, full_check=True)
        assert numerics.compare(expected, numerics.run(optimized, feeds), 0, 0) == []


def test_from_opset_22_inference_agrees_and_the_shape_folds():
    proto = onnx.parser.parse_model(POOLED.replace("{op}", "MaxPool").replace('"" : 18',
                                                                              '"" : 22'))
    optimized = graphopt.optimize(proto).to_onnx()
    assert "Shape" not in [n.op_type for n in optimized.graph.node]
    x = np.ones((1, 1, 5, 5), np.float32)
    assert numerics.run(optimized, {"x": x})["s"].tolist() == [1, 1, 3, 3]
