"""Sizes onnxruntime and ONNX shape inference dispute: graphopt takes onnxruntime's (ceil_mode
pools, Resize by scales, ConvTranspose SAME with output_padding, Loop-carried values that
change shape), and the rules match onnxruntime over grids."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import TensorProto, helper
from helpers import IR_VERSION

import graphopt
from graphopt import numerics
from graphopt.passes.disputed_shapes import (ceil_mode_size, disputed_nodes, range_length,
                                             scaled_size)


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
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)],
                                  ir_version=IR_VERSION)
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


def test_the_scaled_size_rule_gives_onnxruntimes_sizes():
    scales = (0.1, 0.15, 0.3, 0.35, 0.45, 0.55, 0.6, 0.7, 0.85, 0.9, 1.1, 1.3, 1.7, 2.3)
    disputed = 0
    for size, scale in itertools.product(range(1, 30), scales):
        node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")
        graph = helper.make_graph(
            [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, size])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [onnx.numpy_helper.from_array(np.array([1, scale], np.float32), "scales")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)],
                                  ir_version=IR_VERSION)
        (y,) = numerics.run(model, {"x": np.ones((1, size), np.float32)}).values()
        assert y.shape[1] == scaled_size(size, scale), (size, scale)
        inferred = onnx.shape_inference.infer_shapes(model).graph.output[0]
        assert inferred.type.tensor_type.shape.dim[1].dim_value == \
            scaled_size(size, scale, onnx_inference=True), (size, scale)
        disputed += scaled_size(size, scale) != scaled_size(size, scale, onnx_inference=True)
    assert disputed  # 10 · 0.7 among them


# Each model reads the disputed size into a Reshape, which fails at run time (or lays the data
# out otherwise) when the size folds to inference's.
DISPUTES = {
    "Resize by scales": ("float[N,1,10,10] x", "y = Resize(x, , sc)",
                         "<float[4] sc = {1.0, 1.0, 0.7, 0.7}>", (1, 1, 10, 10)),
    "ConvTranspose SAME with output_padding": (
        "float[N,1,5,5] x", "y = ConvTranspose <auto_pad = \"SAME_UPPER\", strides = [2, 2], "
        "output_padding = [1, 1]> (x, w)", "<float[1,1,3,3] w = {1, 1, 1, 1, 1, 1, 1, 1, 1}>",
        (1, 1, 5, 5)),
    "MaxPool SAME dilated": (
        "float[N,1,11,8] x", "y = MaxPool <auto_pad = \"SAME_UPPER\", kernel_shape = [3, 2], "
        "dilations = [2, 2]> (x)", "", (1, 1, 11, 8)),
    "AveragePool-19 SAME ceil_mode": (
        "float[N,1,5,4] x", "y = AveragePool <auto_pad = \"SAME_LOWER\", kernel_shape = [1, 3], "
        "strides = [3, 3], ceil_mode = 1> (x)", "", (1, 1, 5, 4), 19),
    "pool with one static spatial dim": (
        "float[N,1,4,W] x", "y = MaxPool <kernel_shape = [2, 2], strides = [2, 2], "
        "pads = [0, 0, 1, 1], ceil_mode = 1> (x)", "", (1, 1, 4, 6)),
    # onnxruntime takes the default onesided = 1 (9 bins of 16), inference all 16 of them.
    "STFT without onesided": ("float[N,128,1] x", "y = STFT(x, step, , length)",
                              "<int64 step = {8}, int64 length = {16}>", (1, 128, 1)),
}


def _conv_transpose(**attrs) -> onnx.ModelProto:
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2],
                            auto_pad="SAME_LOWER", output_padding=[1, 1], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.ones((1, 1, 3, 3), np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=IR_VERSION)


def test_a_conv_transpose_with_an_output_shape_is_sized_alike_on_both_sides():
    for output_shape in ((9, 9), (10, 10), (11, 11)):
        model = _conv_transpose(output_shape=output_shape)
        (y,) = numerics.run(model, {"x": np.ones((1, 1, 5, 5), np.float32)}).values()
        inferred = onnx.shape_inference.infer_shapes(model).graph.output[0]
        assert [d.dim_value for d in inferred.type.tensor_type.shape.dim] == list(y.shape)
        assert disputed_nodes(graphopt.load_onnx(model)) == []
    assert len(disputed_nodes(graphopt.load_onnx(_conv_transpose()))) == 1


@pytest.mark.parametrize("name", DISPUTES)
@pytest.mark.parametrize("pinned", [False, True])
def test_a_disputed_size_is_not_folded(name, pinned):
    signature, node, weights, shape, *opset = DISPUTES[name]
    weights = weights[:-1] + ", int64[1] two = {2}, int64[1] rest = {-1}>" if weights else \
        "<int64[1] two = {2}, int64[1] rest = {-1}>"
    proto = onnx.parser.parse_model(f"""
        <ir_version: 8, opset_import: ["" : {opset[0] if opset else 17}]>
        g ({signature}) => (float[?,?] out) {weights} {{
          {node}
          s = Shape(y)
          h = Gather(s, two)
          t = Concat <axis = 0> (h, rest)
          out = Reshape(y, t)
        }}""")
    feeds = {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    expected = numerics.run(proto, feeds)
    pins = "x:" + ",".join(map(str, shape)) if pinned else None
    optimized = graphopt.optimize(proto, level=2, input_shapes=pins).to_onnx()
    onnx.checker.check_model(optimized, full_check=True)
    assert numerics.compare(expected, numerics.run(optimized, feeds), 1e-5, 1e-6) == []


def test_a_loop_carried_value_that_grows_is_not_taken_at_its_declared_shape():
    # The body declares %v [1,4] (its first iteration) and appends a row to it each time.
    body = helper.make_graph(
        [helper.make_node("Shape", ["v"], ["vs"]),
         helper.make_node("Gather", ["vs", "zero"], ["rows"]),
         helper.make_node("Slice", ["v", "z1", "o1"], ["first"]),
         helper.make_node("Concat", ["v", "first"], ["v_next"], axis=0),
         helper.make_node("Identity", ["cond"], ["cond_next"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("cond_next", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_next", TensorProto.FLOAT, ["r", 4]),
         helper.make_tensor_value_info("rows", TensorProto.INT64, [])],
        [helper.make_tensor("zero", TensorProto.INT64, [], [0]),
         helper.make_tensor("z1", TensorProto.INT64, [1], [0]),
         helper.make_tensor("o1", TensorProto.INT64, [1], [1])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "x"], ["v_final", "counts"], body=body)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("trips", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("v_final", TensorProto.FLOAT, ["r", 4]),
         helper.make_tensor_value_info("counts", TensorProto.INT64, ["t"])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION)
    feeds = {"x": np.ones((1, 4), np.float32), "trips": np.array(4, np.int64)}
    expected = numerics.run(proto, feeds)
    assert expected["counts"].tolist() == [1, 2, 3, 4]
    for level in (1, 2):
        result = graphopt.optimize(proto, level=level)
        (carried,) = [v for v in result.model.graph.nodes()[0].attr("body").inputs
                      if v.name == "v"]
        assert carried.shape == (None, 4)
        optimized = result.to_onnx()
        onnx.checker.check_model(optimized, full_check=True)
        assert numerics.compare(expected, numerics.run(optimized, feeds), 0, 0) == []


@pytest.mark.parametrize("target", [None, "cpu", "ascend310"])
def test_an_artifact_reading_a_disputed_shape_runs_its_partition_unoptimized(tmp_path, target):
    # onnxruntime's constant folding ("basic" and above) folds Shape(p) to inference's size.
    proto = onnx.parser.parse_model(POOLED.replace("{op}", "MaxPool"))
    x = np.random.default_rng(0).standard_normal((1, 1, 5, 5)).astype(np.float32)
    expected = numerics.run(proto, {"x": x})
    assert numerics.run(proto, {"x": x}, "basic")["s"].tolist() == [1, 1, 4, 4]
    path = tmp_path / "pool.om"
    graphopt.save(graphopt.optimize(proto, level=2, target=target), path)
    with graphopt.load(path) as session:
        assert numerics.compare(expected, session.run({"x": x}), 0, 0) == []


def test_a_blocked_pool_after_the_layout_pass_is_disputed_as_the_pool_it_replaces(tmp_path):
    # Conv → dilated SAME MaxPool: LayoutNchwc blocks both, and the blocked pool went unseen,
    # so its partition ran at the extended level, whose folding sized Shape(p) 11 where the
    # pool made 9 ("9 by 11" at the Add).
    proto = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,8,11,11] x) => (float[1,8,?,?] o)
        <float[8,8,1,1] w = {""" + ", ".join(["0.1"] * 64) + """}> {
          c = Conv (x, w)
          p = MaxPool <auto_pad = "SAME_UPPER", kernel_shape = [3, 3], dilations = [2, 2]> (c)
          s = Shape (p)
          z = ConstantOfShape <value = float[1] {1.0}> (s)
          o = Add (z, p)
        }""")
    x = np.random.default_rng(0).standard_normal((1, 8, 11, 11)).astype(np.float32)
    expected = numerics.run(proto, {"x": x})
    result = graphopt.optimize(proto, level=2, target="cpu")
    assert any(n.domain == "com.microsoft.nchwc" and n.op_type == "MaxPool"
               for n in result.model.graph)
    graphopt.save(result, tmp_path / "p.om")
    with graphopt.load(tmp_path / "p.om") as session:
        assert numerics.compare(expected, session.run({"x": x}), 1e-5, 1e-6) == []
        assert session.artifact.manifest["partitions"][0]["optimization_level"] == "disable"


def test_a_steady_loop_carried_value_keeps_its_declared_symbolic_shape():
    body = helper.make_graph(
        [helper.make_node("Relu", ["v"], ["v_next"]),
         helper.make_node("Identity", ["cond"], ["cond_next"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("cond_next", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_next", TensorProto.FLOAT, None)])  # untyped
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "x"], ["v_final"], body=body)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("trips", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("v_final", TensorProto.FLOAT, ["N", 4])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION)
    result = graphopt.optimize(proto, level=2)
    (carried,) = [v for v in result.model.graph.nodes()[0].attr("body").inputs if v.name == "v"]
    assert carried.shape == ("N", 4)


def test_a_flatten_reading_only_the_batch_dim_keeps_onnxruntimes_optimizer(tmp_path):
    # torch's flatten: Shape → Gather(0) → Reshape reads the batch dim alone, which the pool
    # does not dispute; the partition keeps its level.
    from graphopt.codegen import load_om

    proto = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 18]>
        g (float[1,1,5,5] x) => (float[1,?] flat) <int64 zero = {0}, int64[1] rest = {-1}> {
          p = MaxPool <kernel_shape = [2, 2], strides = [2, 2], pads = [1, 1, 1, 1],
                       ceil_mode = 1> (x)
          s = Shape(p)
          n = Gather(s, zero)
          n1 = Unsqueeze(n, zero)
          t = Concat <axis = 0> (n1, rest)
          flat = Reshape(p, t)
        }""")
    path = tmp_path / "flat.om"
    graphopt.save(graphopt.optimize(proto, level=1, target="cpu"), path)
    (partition,) = load_om(path).manifest["partitions"]
    assert partition.get("optimization_level") != "disable"
    x = np.random.default_rng(0).standard_normal((1, 1, 5, 5)).astype(np.float32)
    with graphopt.load(path) as session:
        assert numerics.compare(numerics.run(proto, {"x": x}), session.run({"x": x}), 0, 0) == []


def test_an_stft_without_onesided_is_sized_as_onnxruntime_sizes_it(tmp_path):
    # onnx's inference took the unset onesided as 0: 16 bins where onnxruntime returns 9. The
    # default is written out at import, so the spectrum's shape is static and right, and an
    # fp16 .om (whose Cast after the STFT onnxruntime sizes) loads.
    proto = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,128,1] x) => (float[1,15,9,2] y, int64[4] s)
            <int64 step = {8}, int64 length = {16}> {
          y = STFT(x, step, , length)
          s = Shape(y)
        }""")
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 128, 1)).astype(np.float32)}
    expected = numerics.run(proto, feeds)
    assert expected["s"].tolist() == [1, 15, 9, 2]
    for precision in ("keep", "fp16"):
        result = graphopt.optimize(proto, precision=precision)
        (stft,) = [n for n in result.model.graph if n.op_type == "STFT"]
        assert stft.attr("onesided") == 1 and stft.output.shape == (1, 15, 9, 2)
        graphopt.save(result, tmp_path / f"{precision}.om")
        with graphopt.load(tmp_path / f"{precision}.om") as session:
            assert session.outputs[0]["shape"] == [1, 15, 9, 2]
            got = session.run(feeds)
        assert got["s"].tolist() == [1, 15, 9, 2]
        np.testing.assert_allclose(got["y"], expected["y"], rtol=1e-2 if precision == "fp16"
                                   else 1e-5, atol=1e-2 if precision == "fp16" else 1e-5)


@pytest.mark.parametrize("level, pinned", [(0, False), (2, False), (2, True)])
def test_torch_unbind_pieces_are_sized_as_onnxruntime_sizes_them(level, pinned):
    # The TorchScript exporter writes torch.unbind(x, 0) as SplitToSequence(x, 1, keepdims=0):
    # onnxruntime drops the axis from each piece ([17]), the spec ignores keepdims once a split
    # is given ([1, 17]). graphopt took the spec's size: the pinned .om returned [1, 17], and a
    # Shape of a piece folded to it.
    proto = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N,17] x) => (float[17] y, int64[1] s) <int64 one = {1}, int64 i = {1}> {
          rows = SplitToSequence <axis = 0, keepdims = 0> (x, one)
          y = SequenceAt(rows, i)
          s = Shape(y)
        }""")
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 17)).astype(np.float32)}
    expected = numerics.run(proto, feeds)
    assert expected["y"].shape == (17,) and expected["s"].tolist() == [17]
    result = graphopt.optimize(proto, level=level,
                               input_shapes={"x": [3, 17]} if pinned else None)
    assert numerics.compare(expected, numerics.run(result.to_onnx(), feeds), 0, 0) == []


def test_a_loop_over_torch_unbind_pieces_reads_onnxruntimes_size():
    # A Loop body reshapes each piece by its own Shape: inference's [1, 17] folded that to
    # [17, 17] where onnxruntime computes [17, 1], at open and at pinned shapes alike.
    from onnx import numpy_helper

    scalar = helper.make_tensor_value_info
    body = helper.make_graph([
        helper.make_node("SequenceAt", ["rows", "i"], ["r"]),
        helper.make_node("Shape", ["r"], ["rs"]),
        helper.make_node("Gather", ["rs", "zero"], ["d0"], axis=0),
        helper.make_node("Unsqueeze", ["d0", "ax0"], ["d0v"]),
        helper.make_node("Concat", ["d0v", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["r", "target"], ["column"]),
        helper.make_node("Add", ["acc_in", "column"], ["acc_out"]),
        helper.make_node("Identity", ["c"], ["c_out"])], "body",
        [scalar("i", TensorProto.INT64, []), scalar("c", TensorProto.BOOL, []),
         scalar("acc_in", TensorProto.FLOAT, ["p", "q"])],
        [scalar("c_out", TensorProto.BOOL, []), scalar("acc_out", TensorProto.FLOAT, ["p", "q"])])
    graph = helper.make_graph([
        helper.make_node("SplitToSequence", ["x", "one"], ["rows"], axis=0, keepdims=0),
        helper.make_node("SequenceLength", ["rows"], ["n"]),
        helper.make_node("Loop", ["n", "", "acc0"], ["y"], body=body)], "unbind",
        [scalar("x", TensorProto.FLOAT, ["b", 17])], [scalar("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(v, np.int64), name) for name, v in
         (("one", 1), ("zero", 0), ("ax0", [0]), ("minus1", [-1]))]
        + [numpy_helper.from_array(np.zeros((17, 1), np.float32), "acc0")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION)
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 17)).astype(np.float32)}
    expected = numerics.run(proto, feeds)
    assert expected["y"].shape == (17, 1)
    for pins in (None, {"x": [3, 17]}):
        result = graphopt.optimize(proto, input_shapes=pins)
        got = numerics.run(result.to_onnx(), feeds)
        np.testing.assert_allclose(got["y"], expected["y"], rtol=1e-6, atol=1e-6)


def test_a_mel_matmul_after_an_stft_without_onesided_takes_pinned_shapes():
    # onnx-asr's NeMo front end: strict inference sized the open signal's STFT at 16 bins,
    # and the pinned compile was refused for the [9, 4] mel matrix after it ("incompatible
    # dimensions for matrix multiplication"), a model onnxruntime runs at those shapes.
    proto = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N,L,1] x) => (float[N,?,4] y)
            <int64 step = {8}, int64 length = {16}, float[9,4] mel = {
             1, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0,
             0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1, 1}> {
          spec = STFT(x, step, , length)
          power = ReduceSumSquare <axes = [-1], keepdims = 0> (spec)
          y = MatMul(power, mel)
        }""")
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 128, 1)).astype(np.float32)}
    expected = numerics.run(proto, feeds)
    result = graphopt.optimize(proto, input_shapes="x:2,128,1", verify=True, inputs=feeds)
    assert result.model.graph.outputs[0].shape == (2, 15, 4)
    actual = numerics.run(result.to_onnx(), feeds)
    assert numerics.compare(expected, actual, 1e-5, 1e-5) == []


@pytest.mark.parametrize("end", [2**63 - 1, 2**31 - 1])
@pytest.mark.parametrize("level", [1, 2, 3])
def test_a_backward_slice_to_int_max_is_not_sized_as_inference_sizes_it(end, level):
    # onnxruntime runs Slice(x, 2, INT_MAX, -1) to the front (3 rows of 3), the spec and
    # inference stop at once (0 rows): FoldShapes folded Shape(y) to [0, 4], and a slice of a
    # shape with an open dim to [], where onnxruntime gives [5, 4, N].
    def constants(*pairs):
        return [onnx.numpy_helper.from_array(np.array([v], np.int64), n) for n, v in pairs]

    data = helper.make_model(helper.make_graph(
        [helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"]),
         helper.make_node("Shape", ["y"], ["s"]),
         helper.make_node("ReduceSum", ["y"], ["total"], keepdims=0)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("s", TensorProto.INT64, None),
         helper.make_tensor_value_info("total", TensorProto.FLOAT, None)],
        constants(("st", 2), ("en", end), ("ax", 0), ("sp", -1))),
        opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION)
    shape = helper.make_model(helper.make_graph(
        [helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("Slice", ["s", "st", "en", "ax", "sp"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
        constants(("st", 2), ("en", end), ("ax", 0), ("sp", -1))),
        opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION)
    for proto, feeds in ((data, {"x": np.ones((3, 4), np.float32)}),
                         (shape, {"x": np.zeros((3, 4, 5), np.float32)})):
        out = graphopt.optimize(proto, level=level).to_onnx()
        onnx.checker.check_model(out, full_check=True)
        expected, actual = numerics.run(proto, feeds), numerics.run(out, feeds)
        for name, value in expected.items():
            np.testing.assert_array_equal(actual[name], value)


@pytest.mark.parametrize("level", [1, 2])
def test_a_float_range_is_as_long_as_onnxruntime_makes_it(tmp_path, level):
    # Range(0.1, 3.0, 0.1) in float32: onnxruntime makes 29 elements, ONNX inference says 30;
    # at -O1 the .om declared [30] and refused every run.
    bounds = [onnx.numpy_helper.from_array(np.array(v, np.float32), n)
              for n, v in (("a", 0.1), ("l", 3.0), ("d", 0.1))]
    proto = helper.make_model(helper.make_graph(
        [helper.make_node("Range", ["a", "l", "d"], ["r"]),
         helper.make_node("Add", ["r", "i"], ["y"])], "g",
        [helper.make_tensor_value_info("i", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], bounds),
        opset_imports=[helper.make_opsetid("", 21)], ir_version=IR_VERSION)
    feeds = {"i": np.array(0.5, np.float32)}
    path = tmp_path / "range.om"
    graphopt.save(graphopt.optimize(proto, level=level), path)
    np.testing.assert_array_equal(graphopt.load(path).run(feeds)["y"],
                                  numerics.run(proto, feeds)["y"])


def test_range_lengths_follow_onnxruntime_and_inference_each():
    f32 = np.float32
    assert range_length(f32(0.1), f32(3.0), f32(0.1)) == 29
    assert range_length(f32(0.1), f32(3.0), f32(0.1), narrow=f32) == 30
    assert range_length(f32(0.0), f32(3.0), f32(1.0)) == 3  # exact: no dispute
    assert range_length(f32(3.0), f32(0.0), f32(1.0)) == 0  # the wrong way: empty


@pytest.mark.parametrize("level", [0, 1, 2])
def test_an_output_after_a_disputed_size_keeps_its_rank(level):
    # A Resize-11 with tf_crop_and_resize (disputed sizes) before a Conv: at -O0 the graph
    # output was written without a shape, which onnx.checker's full check refuses.
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Resize", ["x", "roi", "s"], ["u"], mode="linear",
                          coordinate_transformation_mode="tf_crop_and_resize",
                          extrapolation_value=3.0),
         helper.make_node("Conv", ["u", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 12, 12])],
        [onnx.numpy_helper.from_array(np.array([0, 0, .1, .2, 1, 1, .9, 1.2], np.float32), "roi"),
         onnx.numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s"),
         onnx.numpy_helper.from_array(rng.standard_normal((4, 2, 3, 3)).astype(np.float32), "w")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=6)
    out = graphopt.optimize(proto, level=level).to_onnx()
    onnx.checker.check_model(out, full_check=True)
    assert len(out.graph.output[0].type.tensor_type.shape.dim) == 4
    x = {"x": rng.standard_normal((1, 2, 6, 6)).astype(np.float32)}
    np.testing.assert_allclose(numerics.run(out, x)["y"], numerics.run(proto, x)["y"],
                               rtol=1e-4, atol=1e-5)
