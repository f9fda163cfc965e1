"""FoldShapes and FoldConstants: what folds, what must not, and that outputs never change."""

from __future__ import annotations

import warnings
from collections import Counter

import ml_dtypes
import numpy as np
import onnx
import onnx.parser
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from helpers import IR_VERSION

import graphopt
from graphopt import numerics
from graphopt.errors import InputError
from graphopt.ir import DType, Model, format_model, load_onnx, to_onnx, verify
from graphopt.passes.base import PassContext
from graphopt.passes.fold_constants import FoldConstants
from graphopt.passes.fold_shapes import FoldShapes
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.passes.options import Options

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'


def parse(text: str, header: str = HEADER) -> onnx.ModelProto:
    return onnx.parser.parse_model(header + text)


def run_passes(model: Model, *passes, options: Options | None = None,
               ctx: PassContext | None = None) -> Counter:
    """Run `passes` in order, verifying the IR after each; return the summed rule counts, with
    FoldConstants' per-op counts summed under "FoldConstants"."""
    ctx = ctx or PassContext(options or Options())
    stats: Counter = Counter()
    for p in passes:
        result = p.run(model, ctx)
        verify(model)
        assert result.changed == bool(result.stats)
        if isinstance(p, FoldConstants):
            if result.stats:
                stats["FoldConstants"] += sum(result.stats.values())
        else:
            stats.update(result.stats)
    return stats


def test_fold_counts_are_reported_per_op_type():
    model = load_onnx(parse("""
        g (float[2] x) => (float[2] y)
        <float[2] a = {1.0, 2.0}, float[2] b = {3.0, 4.0}>
        {
          s = Add(a, b)
          t = Mul(s, b)
          u = Mul(t, a)
          y = Add(x, u)
        }"""))
    result = FoldConstants().run(model, PassContext(Options()))
    assert result.stats == {"Add": 1, "Mul": 2}


def fold(proto: onnx.ModelProto, shapes: bool = True, **option_values) -> tuple[Model, Counter]:
    model = load_onnx(proto)
    if shapes:
        infer_shapes(model)
    return model, run_passes(model, FoldShapes(), FoldConstants(),
                             options=Options(**option_values))


def ops(model: Model) -> list[str]:
    return [n.op_type for n in model.graph]


def init(model: Model, name: str) -> np.ndarray:
    value = model.graph.initializers[name]
    assert value.is_constant
    return value.constant()


def assert_same_outputs(original: onnx.ModelProto, model: Model, feeds=None) -> None:
    folded = to_onnx(model)
    onnx.checker.check_model(folded, full_check=True)
    feeds = feeds if feeds is not None else numerics.random_feeds(original, seed=0)
    expected = numerics.run(original, feeds)
    actual = numerics.run(folded, feeds)
    assert numerics.compare(expected, actual, rtol=1e-6, atol=0) == []


# -------------------------------------------------------------------------------------------
# FoldConstants: positive cases
# -------------------------------------------------------------------------------------------
def test_folds_constant_arithmetic_into_one_initializer():
    proto = parse("""
        g (float[2] x) => (float[2] y)
        <float[2] a = {1.0, 2.0}, float[2] b = {3.0, 4.0}>
        {
          s = Add(a, b)
          t = Mul(s, b)
          y = Mul(x, t)
        }""")
    model, stats = fold(proto)
    assert stats == {"FoldConstants": 2}
    assert ops(model) == ["Mul"]
    np.testing.assert_array_equal(init(model, "t"), [12.0, 24.0])
    text = format_model(model)
    assert "%t<f32[2]> = initializer f32[2][12.0, 24.0]" in text
    assert "y<f32[2]> = Mul(%x, %t)" in text
    assert_same_outputs(proto, model)


def test_second_run_changes_nothing():
    proto = parse("""
        g (float[2] x) => (float[2] y)
        <float[2] a = {1.0, 2.0}>
        { t = Neg(a)
          y = Mul(x, t) }""")
    model, _ = fold(proto)
    assert run_passes(model, FoldShapes(), FoldConstants()) == {}


def test_constant_node_becomes_initializer_of_the_same_name():
    proto = parse("""
        g (float[2] x) => (float[2] y)
        { k = Constant<value = float[2] {5.0, 6.0}>()
          y = Add(x, k) }""")
    model, stats = fold(proto)
    assert stats == {"FoldConstants": 1}
    np.testing.assert_array_equal(init(model, "k"), [5.0, 6.0])
    assert_same_outputs(proto, model)


def test_identity_of_a_constant_reads_the_constant_itself():
    proto = parse("""
        g (float[2] x) => (float[2] y)
        <float[2] a = {1.0, 2.0}>
        { i = Identity(a)
          y = Add(x, i) }""")
    model, stats = fold(proto)
    assert stats == {"FoldConstants": 1}
    assert [v.name for v in model.graph.initializers.values()] == ["a"]  # no copy of the data
    assert model.graph.nodes()[0].input(1).name == "a"


def test_castlike_needs_only_the_dtype_of_its_second_input():
    # The dynamo exporter's zero biases: Expand(CastLike(0, %input), Shape(weight)[0:1]).
    proto = parse("""
        g (float[1,2,4,4] x) => (float[1,3,4,4] y)
        <float[3,2,1,1] w = {1,2,3,4,5,6}, int64[1] one = {1}>
        {
          zero = Constant<value = double {0.0}>()
          s = Shape<start = 0, end = 1>(w)
          n = Expand(s, one)
          z = CastLike(zero, x)
          b = Expand(z, n)
          y = Conv(x, w, b)
        }""")
    model, stats = fold(proto)
    assert stats == {"Shape": 1, "FoldConstants": 4}
    assert ops(model) == ["Conv"]
    bias = model.graph.nodes()[0].input(2)
    assert bias.dtype == DType.FLOAT and bias.constant().tolist() == [0.0, 0.0, 0.0]
    assert_same_outputs(proto, model)


@pytest.mark.parametrize("data, op, expected", [
    (np.array([7, -7, 9], np.int64), "Neg", [-7, 7, -9]),
    (np.array([1.5, -2.0, 3.25], np.float16), "Neg", [-1.5, 2.0, -3.25]),
    (np.array([True, False, True]), "Not", [False, True, False]),
    (np.array([7, -7, 9], np.float64), "Abs", [7.0, 7.0, 9.0]),
    (np.array([7, 249, 9], np.uint8), "Abs", [7, 249, 9]),
])
def test_folds_every_common_dtype(data, op, expected):
    elem = helper.np_dtype_to_tensor_dtype(data.dtype)
    proto = helper.make_model(helper.make_graph(
        [helper.make_node(op, ["a"], ["t"]), helper.make_node("Concat", ["x", "t"], ["y"], axis=0)],
        "g", [helper.make_tensor_value_info("x", elem, [3])],
        [helper.make_tensor_value_info("y", elem, [6])], [numpy_helper.from_array(data, "a")]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    model, stats = fold(proto)
    assert stats == {"FoldConstants": 1}
    folded = model.graph.initializers["t"]
    assert folded.dtype == DType.from_numpy(data.dtype)
    np.testing.assert_array_equal(folded.constant(), np.array(expected, data.dtype))
    assert_same_outputs(proto, model)


def test_bfloat16_comes_back_exactly():
    proto = parse("""
        g (bfloat16[3] x) => (bfloat16[3] y)
        <float[3] a = {1.5, -2.0, 3.0e+38}>
        { t = Cast<to = 16>(a)
          y = Add(x, t) }""")
    model, stats = fold(proto)
    assert stats == {"FoldConstants": 1}
    value = model.graph.initializers["t"]
    assert value.dtype == DType.BFLOAT16
    expected = np.array([1.5, -2.0, 3.0e38], np.float32).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(value.constant().astype(np.float32), expected.astype(np.float32))
    onnx.checker.check_model(to_onnx(model), full_check=True)


def test_strings_fold():
    proto = helper.make_model(helper.make_graph(
        [helper.make_node("Reshape", ["s", "shape"], ["r"]),
         helper.make_node("Concat", ["x", "r"], ["y"], axis=0)],
        "g", [helper.make_tensor_value_info("x", TensorProto.STRING, [2])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, [4])],
        [numpy_helper.from_array(np.array([b"ab", b"cd"], dtype=object), "s"),
         numpy_helper.from_array(np.array([2], np.int64), "shape")]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    model, stats = fold(proto)
    assert stats == {"FoldConstants": 1}
    assert init(model, "r").tolist() == [b"ab", b"cd"]
    feeds = {"x": np.array(["x", "y"], dtype=object)}
    assert numerics.run(to_onnx(model), feeds)["y"].tolist() == ["x", "y", "ab", "cd"]


# -------------------------------------------------------------------------------------------
# FoldShapes and the Shape → Gather → Unsqueeze → Concat → Reshape chain
# -------------------------------------------------------------------------------------------
def test_shape_chain_becomes_reshape_with_constant_shape():
    proto = parse("""
        g (float[2,3,4] x) => (float[2,12] y)
        <int64 zero = {0}, int64[1] axes = {0}, int64[1] minus1 = {-1}>
        {
          s = Shape(x)
          d = Gather(s, zero)
          u = Unsqueeze(d, axes)
          c = Concat<axis = 0>(u, minus1)
          y = Reshape(x, c)
        }""")
    model, stats = fold(proto)
    assert stats == {"Shape": 1, "FoldConstants": 3}
    assert ops(model) == ["Reshape"]
    shape = model.graph.nodes()[0].input(1)
    assert shape.is_constant and shape.constant().tolist() == [2, -1]
    assert "%y<f32[2,12]> = Reshape(%x, %c)" in format_model(model)
    assert_same_outputs(proto, model)


def test_shape_honours_start_and_end_with_symbolic_dims_elsewhere():
    proto = parse("""
        g (float[N,3,4] x) => (int64[2] y, int64[1] z)
        { s = Shape<start = 1>(x)
          t = Shape<start = -1, end = 100>(x)
          y = Identity(s)
          z = Identity(t) }""")
    model, stats = fold(proto, shapes=False)
    assert stats == {"Shape": 2}
    assert init(model, "s").tolist() == [3, 4] and init(model, "t").tolist() == [4]
    assert_same_outputs(proto, model, {"x": np.zeros((5, 3, 4), np.float32)})


def test_gather_and_slice_of_static_dims_fold_when_other_dims_are_symbolic():
    proto = parse("""
        g (float[N,3,4] x) => (int64 a, int64[2] b, int64 n)
        <int64 one = {1}, int64 zero = {0}, int64[1] st = {1}, int64[1] en = {9}>
        { s = Shape(x)
          a = Identity(g1)
          g1 = Gather(s, one)
          b = Identity(sl)
          sl = Slice(s, st, en)
          n0 = Gather(s, zero)
          n = Identity(n0) }""")
    model = load_onnx(proto)
    stats = run_passes(model, FoldShapes())
    assert stats == {"ShapeGather": 1, "ShapeSlice": 1}
    assert init(model, "g1").tolist() == 3 and init(model, "sl").tolist() == [3, 4]
    assert "Shape" in ops(model)  # still needed for the symbolic batch dim
    assert_same_outputs(proto, model, {"x": np.zeros((5, 3, 4), np.float32)})


def test_range_over_bounds_of_shape_one_folds_once_they_are_constants():
    # onnxruntime runs Range on a computed [1] limit, but refuses three constant [1] bounds.
    proto = parse("""
        g (float[N,3,4] x) => (int64[L] y) <int64[1] two = {2}, int64[1] zero = {0},
                                            int64[1] one = {1}> {
          s = Shape(x)
          limit = Gather(s, two)
          y = Range(zero, limit, one)
        }""")
    model, _ = fold(proto)
    assert "Range" not in ops(model)
    assert init(model, "y").tolist() == [0, 1, 2, 3]
    assert_same_outputs(proto, model, {"x": np.ones((2, 3, 4), np.float32)})


def test_a_range_of_infinite_length_in_a_branch_never_taken_is_left_alone():
    # Its size estimate was an OverflowError (ceil of inf) that failed the whole compile.
    proto = parse("""
        g (bool c) => (float y) <float zero = {0.0}, float inf = {inf}, float one = {1.0}> {
          y = If(c) <then_branch = g1 () => (float a) { r = Range(zero, inf, one)
                                                       a = ReduceSum <keepdims = 0> (r) },
                     else_branch = g2 () => (float b) { b = Identity(one) }>
        }""")
    model, _ = fold(proto)
    (branch,) = [g for g in model.graph.all_graphs() if g.name == "g1"]
    assert "Range" in [n.op_type for n in branch]
    assert_same_outputs(proto, model, {"c": np.array(False)})


def test_size_of_static_shape():
    proto = parse("""
        g (float[2,3] x) => (float[2,3] y)
        { n = Size(x)
          f = Cast<to = 1>(n)
          y = Mul(x, f) }""")
    model, stats = fold(proto)
    assert stats == {"Size": 1, "FoldConstants": 1}
    assert init(model, "f").tolist() == 6.0
    assert_same_outputs(proto, model)


def test_shape_of_unknown_or_symbolic_shape_stays():
    proto = parse("""
        g (float[N,3] x) => (int64[2] y)
        { s = Shape(x)
          y = Identity(s) }""")
    model, stats = fold(proto)
    assert stats == {} and ops(model) == ["Shape", "Identity"]


# A Reshape's shape read from its own input's dims (reshape_own_dims): B and S stay open.
OWN_DIMS_FEEDS = [{"x": np.random.default_rng(seed).standard_normal((b, s, 8)).astype(np.float32),
                   "other": np.zeros((b, s, 8), np.float32)}
                  for seed, (b, s) in enumerate([(1, 7), (3, 5), (2, 1), (0, 4)])]
OWN_DIMS_WEIGHTS = {"i0": 0, "i1": 1, "ax": [0], "c2": [2], "c4": [4], "m1": [-1],
                    "first2": [0, 1], "st0": [0], "en2": [2]}


def _own_dims_model(nodes: list[str], concat: list[str], axis: int = 0, allowzero: int = 0,
                    rank: int = 4) -> onnx.ModelProto:
    """Reshape(x, Concat(concat)) of x[B,S,8], after `nodes` ("out = Op(in, …)"; Shape with
    start/end as "Shape:start:end")."""
    made = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Shape", ["other"], ["so"]),
            helper.make_node("Gather", ["s", "i0"], ["g0"]),
            helper.make_node("Gather", ["s", "i1"], ["g1"]),
            helper.make_node("Gather", ["so", "i0"], ["o0"])]
    for text in nodes:
        out, call = text.split(" = ")
        op, args = call.rstrip(")").split("(")
        op, *bounds = op.split(":")
        attrs = {key: int(b) for key, b in zip(("start", "end"), bounds) if b}
        made.append(helper.make_node(op, args.split(", "), [out], **attrs))
    made += [helper.make_node("Concat", concat, ["t"], axis=axis),
             helper.make_node("Reshape", ["x", "t"], ["y"], allowzero=allowzero)]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", "S", 8])
              for n in ("x", "other")]
    weights = [numpy_helper.from_array(np.array(v, np.int64), n)
               for n, v in OWN_DIMS_WEIGHTS.items()]
    graph = helper.make_graph(made, "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                             [None] * rank)], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=IR_VERSION)


@pytest.mark.parametrize("nodes, concat, expected", [
    # Unsqueeze(Gather(Shape(x), i)) at position i, as torch exports x.view(x.size(0), …)
    (["b = Unsqueeze(g0, ax)", "q = Unsqueeze(g1, ax)"], ["b", "q", "c2", "c4"], [0, 0, 2, 4]),
    (["b = Unsqueeze(g0, ax)"], ["b", "m1", "c4"], [0, -1, 4]),
    # a 1-D Gather, a Slice and a Shape with start/end, each covering the positions it lands on
    (["b = Gather(s, first2)"], ["b", "c2", "c4"], [0, 0, 2, 4]),
    (["b = Slice(s, st0, en2)"], ["b", "c2", "c4"], [0, 0, 2, 4]),
    (["b = Shape::-1(x)"], ["b", "c2", "c4"], [0, 0, 2, 4]),
    (["b = Shape::1(x)"], ["b", "m1"], [0, -1]),
])
def test_a_reshape_shape_built_from_its_own_dims_becomes_a_constant(nodes, concat, expected):
    proto = _own_dims_model(nodes, concat, rank=len(expected))
    model, stats = fold(proto)
    assert stats["ReshapeOwnDims"] == 1
    (reshape,) = [n for n in model.graph if n.op_type == "Reshape"]
    assert reshape.input(1).constant().tolist() == expected
    from graphopt.passes.cleanup import EliminateDeadNodes
    run_passes(model, EliminateDeadNodes())
    assert ops(model) == ["Reshape"]
    for feeds in OWN_DIMS_FEEDS:
        if -1 in expected and feeds["x"].size == 0:
            continue  # a -1 beside a 0 dim has no size: onnxruntime refuses both models
        assert_same_outputs(proto, model, feeds)


def test_a_reshape_to_its_own_shape_reads_zeros():
    proto = parse("""
        g (float[B,S,8] x) => (float[B,S,8] y) { s = Shape(x)
                                                y = Reshape(x, s) }""")
    model, stats = fold(proto)
    assert stats["ReshapeOwnDims"] == 1
    assert model.graph.nodes()[-1].input(1).constant().tolist() == [0, 0, 0]


@pytest.mark.parametrize("opset, rank, pieces, shape_attrs", [
    (13, 2, ["u0", "u1"], {}),                        # every dim: Shape(x)
    (13, 3, ["u0", "u1", "u2"], {}),
    (17, 3, ["u0", "u1"], {"start": 0, "end": 2}),    # some: start/end, from opset 15
    (17, 3, ["u1", "last"], {"start": 1, "end": 3}),  # a 1-D Gather continues the run
    (13, 3, ["u0", "u1"], None),                      # some, before opset 15
    (13, 2, ["u0", "u1", "first"], None),             # not consecutive
    (13, 2, ["u0", "o1"], None),                      # another value's dim
])
def test_a_concat_of_consecutive_dims_is_one_shape(opset, rank, pieces, shape_attrs):
    dims = ["B", "S", "T"][:rank]
    made = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Shape", ["other"], ["so"])]
    for i in range(rank):
        made += [helper.make_node("Gather", ["s", f"i{i}"], [f"g{i}"]),
                 helper.make_node("Unsqueeze", [f"g{i}", "ax"], [f"u{i}"])]
    made += [helper.make_node("Gather", ["so", "i1"], ["og"]),
             helper.make_node("Unsqueeze", ["og", "ax"], ["o1"]),
             helper.make_node("Gather", ["s", "lastdim"], ["last"]),
             helper.make_node("Gather", ["s", "ax"], ["first"]),
             helper.make_node("Concat", pieces, ["y"], axis=0)]
    weights = {"i0": 0, "i1": 1, "i2": 2, "ax": [0], "lastdim": [rank - 1]}
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n in ("x", "other")]
    graph = helper.make_graph(
        made, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.INT64, [None])],
        [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in weights.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=IR_VERSION)
    model, stats = fold(proto)
    if shape_attrs is None:
        assert "ConcatOfShapeDims" not in stats
        return
    assert stats["ConcatOfShapeDims"] == 1
    from graphopt.passes.cleanup import EliminateDeadNodes
    run_passes(model, EliminateDeadNodes())
    (shape,) = model.graph.nodes()
    assert shape.op_type == "Shape" and shape.input(0).name == "x"
    assert {key: shape.attr(key) for key in shape.attrs} == shape_attrs
    for sizes in [(2, 3, 4), (1, 1, 1), (0, 5, 2)]:
        feeds = {name: np.zeros(sizes[:rank], np.float32) for name in ("x", "other")}
        assert_same_outputs(proto, model, feeds)


@pytest.mark.parametrize("nodes, concat, allowzero", [
    (["b = Unsqueeze(g1, ax)"], ["b", "m1", "c4"], 0),  # dim 1 at position 0
    (["b = Unsqueeze(g0, ax)"], ["m1", "b", "c4"], 0),  # dim 0 at position 1
    (["b = Unsqueeze(o0, ax)"], ["b", "m1", "c4"], 0),  # another value's dim, equal or not
    (["b = Gather(so, first2)"], ["b", "c4"], 0),  # another value's dims, by a 1-D Gather
    (["b = Slice(s, i0, i1)"], ["b", "m1", "c4"], 0),  # scalar bounds, where ONNX wants lists
    (["b = Unsqueeze(g0, ax)", "n = Neg(m1)"], ["b", "n", "c4"], 0),  # a computed entry
    (["b = Unsqueeze(g0, ax)"], ["b", "m1", "c4"], 1),  # allowzero: a 0 is a size
])
def test_a_reshape_shape_with_an_entry_not_its_own_dim_there_stays(nodes, concat, allowzero):
    proto = _own_dims_model(nodes, concat, allowzero=allowzero, rank=3)
    model = load_onnx(proto)
    infer_shapes(model)
    assert "ReshapeOwnDims" not in run_passes(model, FoldShapes())


def _other_dims_model(pieces: str, allowzero: int = 0, x: str = "B,24") -> onnx.ModelProto:
    """Reshape(x[B, 24], Concat(pieces)) with the pieces read off k[B, 4, 6], as the dynamo
    exporter writes Kᵀ's split back into heads."""
    return parse(f"""
        g (float[{x}] x, float[B,4,6] k) => (float[?,?,?] y)
        <int64[1] zero = {{0}}, int64[1] two = {{2}}, int64[1] one = {{1}}, int64[1] six = {{6}},
         int64[1] zdim = {{0}}, int64[1] m1 = {{-1}}>
        {{ s = Shape(k)
          bh = Slice(s, zero, two)
          b = Slice(s, zero, one)
          t = Concat<axis = 0>({pieces})
          y = Reshape<allowzero = {allowzero}>(x, t) }}""")


@pytest.mark.parametrize("pieces", ["bh, six", "s"])
def test_a_reshape_shape_with_one_entry_unknown_becomes_a_constant_with_a_minus_one(pieces):
    proto = _other_dims_model(pieces)
    model, stats = fold(proto)
    assert stats["ReshapeOneUnknown"] == 1
    (reshape,) = [n for n in model.graph if n.op_type == "Reshape"]
    assert reshape.input(1).constant().tolist() == [-1, 4, 6]
    from graphopt.passes.cleanup import EliminateDeadNodes
    run_passes(model, EliminateDeadNodes())
    assert ops(model) == ["Reshape"]
    rng = np.random.default_rng(0)
    for b in (1, 3, 0):
        feeds = {"x": rng.standard_normal((b, 24)).astype(np.float32),
                 "k": np.zeros((b, 4, 6), np.float32)}
        assert_same_outputs(proto, model, feeds)


@pytest.mark.parametrize("pieces, allowzero, x", [
    ("bh, six", 0, "N,6"),        # N = 4·B only where the model runs: B would be lost
    ("b, b, six", 0, "B,24"),     # two entries unknown
    ("bh, m1", 0, "B,24"),        # a -1 of its own beside the unknown
    ("b, zdim, six", 1, "B,24"),  # a 0 that is a size
    ("b, zdim, six", 0, "B,24"),  # a 0 that copies x's dim: not what a -1 there computes
])
def test_a_reshape_shape_with_an_entry_a_minus_one_would_not_prove_stays(pieces, allowzero, x):
    model = load_onnx(_other_dims_model(pieces, allowzero, x))
    infer_shapes(model)
    assert "ReshapeOneUnknown" not in run_passes(model, FoldShapes())


# -------------------------------------------------------------------------------------------
# what must not fold
# -------------------------------------------------------------------------------------------
BIG = 4 * 1024 * 1024  # float32 elements: 16 MB


def _constant_of_shape(n: int) -> onnx.ModelProto:
    return parse(f"""
        g (float[{n}] x) => (float[{n}] y)
        <int64[1] shape = {{{n}}}>
        {{ z = ConstantOfShape<value = float[1] {{1.0}}>(shape)
          y = Add(x, z) }}""")


@pytest.mark.parametrize("shapes", [True, False])
def test_size_cap_keeps_a_big_generated_tensor_a_node(shapes):
    model, stats = fold(_constant_of_shape(BIG), shapes=shapes)
    assert stats == {} and ops(model) == ["ConstantOfShape", "Add"]


def test_raised_size_cap_lets_it_fold():
    model, stats = fold(_constant_of_shape(BIG), fold_size_limit=BIG * 4)
    assert stats == {"FoldConstants": 1}
    assert init(model, "z").shape == (BIG,)


def _tied_embedding(vocab: int, hidden: int = 4) -> onnx.ModelProto:
    """GPT-2's tied LM head: the token table feeds a Gather and, transposed, the logits MatMul."""
    table = np.arange(vocab * hidden, dtype=np.float32).reshape(vocab, hidden) / (vocab * hidden)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["wte", "ids"], ["h"]),
         helper.make_node("Transpose", ["wte"], ["wt"], perm=[1, 0]),
         helper.make_node("MatMul", ["h", "wt"], ["logits"])], "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [3, vocab])],
        [numpy_helper.from_array(table, "wte")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=IR_VERSION)


def test_shared_weight_transpose_above_the_cap_is_left_for_transb():
    model, stats = fold(_tied_embedding(vocab=64), fold_size_limit=512)  # 1 KiB table
    assert stats == {} and ops(model) == ["Gather", "Transpose", "MatMul"]
    assert list(model.graph.initializers) == ["wte"]  # one copy


def test_a_tied_4bit_table_gathered_through_a_reshape_is_stored_once():
    # onnxruntime-genai's int4 export of a tied head: MatMulNBits reads the packed weight,
    # GatherBlockQuantized a Reshape of it. Folded, the table was stored twice.
    rows, k, block = 64, 64, 32
    packed = np.random.default_rng(0).integers(0, 255, (rows, k // block, block // 2),
                                               dtype=np.uint8)
    scales = np.full((rows, k // block), 0.01, np.float32)
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["w", "shape"], ["table"]),
         helper.make_node("GatherBlockQuantized", ["table", "ids", "s"], ["emb"],
                          domain="com.microsoft", bits=4, block_size=block, gather_axis=0,
                          quantize_axis=1),
         helper.make_node("MatMulNBits", ["emb", "w", "s"], ["logits"], domain="com.microsoft",
                          K=k, N=rows, bits=4, block_size=block)], "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 3, rows])],
        [numpy_helper.from_array(packed, "w"), numpy_helper.from_array(scales, "s"),
         numpy_helper.from_array(np.array([rows, k // 2], np.int64), "shape")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)],
                              ir_version=IR_VERSION)
    model, stats = fold(proto, fold_size_limit=512)  # the 2 KiB table is above it
    assert stats == {} and "Reshape" in ops(model)
    assert sorted(model.graph.initializers) == ["s", "shape", "w"]
    assert_same_outputs(proto, model)


def _genai_tied_head(vocab: int = 64, hidden: int = 4, dtype=np.float32) -> onnx.ModelProto:
    """onnxruntime-genai's float export of a tied head: the logits MatMul reads the head's
    weight [hidden, vocab], and the embedding Gathers from its Transpose."""
    head = (np.random.default_rng(0).standard_normal((hidden, vocab)) * 0.1).astype(dtype)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["w"], ["table"], perm=[1, 0]),
         helper.make_node("Gather", ["table", "ids"], ["h"]),
         helper.make_node("MatMul", ["h", "w"], ["logits"])], "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3])],
        [helper.make_tensor_value_info("logits", elem, [1, 3, vocab])],
        [numpy_helper.from_array(head, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=IR_VERSION)


@pytest.mark.parametrize("target", [None, "cpu", "ascend910b"])
@pytest.mark.parametrize("tie", ["gpt2", "genai"])
def test_a_tied_head_reads_its_one_table_through_trans_b(tie, target):
    # GPT-2's head transposes the table its embedding gathers: the Transpose is left for
    # transB. onnxruntime-genai's embedding gathers from the transposed head weight: folded,
    # that table had been stored beside the weight (a Qwen2-0.5B-like float32 artifact:
    # 1.33 GB for 0.78 GB of weights); the head now reads the table through transB.
    proto = _tied_embedding(vocab=64) if tie == "gpt2" else _genai_tied_head()
    result = graphopt.optimize(proto, level=2, fold_size_limit=512, target=target)
    assert [n.qualified_op for n in result.model.graph] == [
        "Gather", "com.microsoft::FusedMatMul"]
    assert list(result.model.graph)[1].attr("transB") == 1
    assert len(result.model.graph.initializers) == 1
    assert_same_outputs(proto, result.model)


def test_a_tied_head_keeps_its_weight_where_fused_matmul_is_switched_off():
    # The head would read a Transpose of the table at every run: two copies are the lesser cost.
    proto = _genai_tied_head()
    result = graphopt.optimize(proto, level=2, fold_size_limit=256,
                               disable_passes=["FuseMatMul"])
    assert [n.op_type for n in result.model.graph] == ["Gather", "MatMul"]
    assert len(result.model.graph.initializers) == 2


@pytest.mark.parametrize("target", ["cpu", "ascend910b"])
def test_a_float16_tied_head_is_stored_once_too(target):
    proto = _genai_tied_head(dtype=np.float16)
    result = graphopt.optimize(proto, level=2, fold_size_limit=256, target=target)
    assert [n.qualified_op for n in result.model.graph] == [
        "Gather", "com.microsoft::FusedMatMul"]
    assert len(result.model.graph.initializers) == 1


def test_shared_weight_transpose_below_the_cap_folds():
    proto = _tied_embedding(vocab=64)
    model, stats = fold(proto)
    assert stats == {"FoldConstants": 1} and ops(model) == ["Gather", "MatMul"]
    assert_same_outputs(proto, model)


def test_tiny_constant_of_shape_folds():
    proto = _constant_of_shape(4)
    model, stats = fold(proto)
    assert stats == {"FoldConstants": 1}
    assert_same_outputs(proto, model)


def test_generator_whose_shape_is_computed_first_folds_in_one_run():
    proto = parse("""
        g (float[2,3] x) => (float[2,3] y)
        <int64[1] a = {2}, int64[1] b = {3}>
        { shape = Concat<axis = 0>(a, b)
          z = ConstantOfShape<value = float[1] {2.0}>(shape)
          y = Mul(x, z) }""")
    model, stats = fold(proto, shapes=False)  # no shape info: the size comes from `shape`'s data
    assert stats == {"FoldConstants": 2} and ops(model) == ["Mul"]
    assert_same_outputs(proto, model)


def test_generator_of_unknown_size_stays_until_shapes_are_known():
    proto = parse("""
        g (float[1,1,4,4] x) => (float[1,1,4,4] y)
        <float[1,1,2,2] a = {1,2,3,4}, float[4] sc = {1.0, 1.0, 2.0, 2.0}>
        { r = Resize<mode = "nearest">(a, , sc)
          y = Add(x, r) }""")
    model, stats = fold(proto, shapes=False)
    assert stats == {}
    model, stats = fold(proto, shapes=True)
    assert stats == {"FoldConstants": 1}
    assert_same_outputs(proto, model)


def test_result_found_too_big_after_evaluation_is_not_kept():
    # No shape information: the outer product's size is only known once it is computed.
    n = 2048
    proto = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["p"]), helper.make_node("Neg", ["a"], ["na"]),
         helper.make_node("Add", ["x", "p"], ["y"]), helper.make_node("Add", ["x", "na"], ["y2"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("y2", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones((n, 1), np.float32), "a"),
         numpy_helper.from_array(np.ones((1, n), np.float32), "b")]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    model, stats = fold(proto, shapes=False)
    assert stats == {"FoldConstants": 1}  # the Neg
    assert ops(model) == ["MatMul", "Add", "Add"]


def test_non_constant_input_is_not_folded():
    proto = parse("""
        g (float[2] x) => (float[2] y)
        <float[2] a = {1.0, 2.0}>
        { t = Add(x, a)
          y = Neg(t) }""")
    model, stats = fold(proto)
    assert stats == {} and ops(model) == ["Add", "Neg"]


def test_overridable_initializer_is_not_folded():
    proto = parse("""
        g (float[2] x) => (float[2] y)
        <float[2] a = {1.0, 2.0}>
        { t = Neg(a)
          y = Add(x, t) }""")
    proto.graph.input.append(helper.make_tensor_value_info("a", TensorProto.FLOAT, [2]))
    model, stats = fold(proto)
    assert stats == {} and ops(model) == ["Neg", "Add"]


@pytest.mark.parametrize("op", ["RandomNormal<shape = [2]>()", "RandomUniform<shape = [2]>()"])
def test_random_op_is_not_folded(op):
    proto = parse(f"""
        g (float[2] x) => (float[2] y)
        <float[2] a = {{1.0, 2.0}}>
        {{ r = {op}
          t = Add(r, a)
          y = Add(x, t) }}""")
    model, stats = fold(proto)
    assert stats == {} and ops(model) == ["RandomNormal" if "Normal" in op else "RandomUniform",
                                          "Add", "Add"]


def test_dequantized_weight_stays_quantized():
    # A QDQ model's int8 weight: folded, it would lose the int8 kernels and grow 4x.
    proto = parse("""
        g (float[1,4] x) => (float[1,3] y)
        <int8[4,3] wq = {1,2,3,4,5,6,7,8,9,10,11,12}, float s = {0.1}, int8 z = {0}>
        { w = DequantizeLinear(wq, s, z)
          y = MatMul(x, w) }""")
    model, stats = fold(proto)
    assert stats == {} and ops(model) == ["DequantizeLinear", "MatMul"]


def test_dropout_in_training_mode_is_not_folded():
    proto = parse("""
        g (float[2] x) => (float[2] y)
        <float[2] a = {1.0, 2.0}, float r = {0.5}, bool train = {1}>
        { d = Dropout(a, r, train)
          y = Add(x, d) }""")
    model, stats = fold(proto)
    assert stats == {}


def test_graph_output_is_kept():
    proto = parse("""
        g (float[2] x) => (float[2] y, float[2] t)
        <float[2] a = {1.0, 2.0}>
        { m = Mul(a, a)
          t = Add(m, a)
          y = Add(x, t) }""")
    model, stats = fold(proto)
    assert stats == {"FoldConstants": 2}  # output %t becomes an initializer of its name
    assert ops(model) == ["Add"]
    assert [v.name for v in model.graph.outputs] == ["y", "t"]
    np.testing.assert_array_equal(init(model, "t"), [2.0, 6.0])
    assert_same_outputs(proto, model)


PINNED_OUTPUTS = """
    g (float[N,M] x) => (float[N,M] ones, int64[2] dims, float[N,M] y)
    { dims = Shape(x)
      ones = ConstantOfShape<value = float[1] {1.5}>(dims)
      y = Relu(x) }"""


def _signature(proto: onnx.ModelProto) -> list[tuple]:
    return [(o.name, o.type.tensor_type.elem_type,
             [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim])
            for o in proto.graph.output]


def test_outputs_computable_from_pinned_shapes_become_initializers():
    # Shape (FoldShapes) and ConstantOfShape (FoldConstants) outputs: no node runs for them.
    proto = parse(PINNED_OUTPUTS)
    folded = graphopt.optimize(proto, input_shapes={"x": [2, 3]}).to_onnx()
    onnx.checker.check_model(folded, full_check=True)
    assert [n.op_type for n in folded.graph.node] == ["Relu"]
    assert {t.name for t in folded.graph.initializer} == {"ones", "dims"}
    assert _signature(folded) == [("ones", TensorProto.FLOAT, [2, 3]),
                                  ("dims", TensorProto.INT64, [2]),
                                  ("y", TensorProto.FLOAT, [2, 3])]
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)}
    expected, actual = numerics.run(proto, feeds), numerics.run(folded, feeds)
    assert list(actual) == list(expected)
    assert numerics.compare(expected, actual, rtol=0, atol=0) == []


def test_outputs_computable_from_pinned_shapes_leave_no_host_work_beside_the_npu():
    result = graphopt.optimize(parse(PINNED_OUTPUTS), input_shapes={"x": [2, 3]},
                               target="ascend310")
    assert [(p.device, [n.op_type for n in p.nodes]) for p in result.partitioning.partitions] \
        == [("npu", ["Relu"])]
    assert not result.partitioning.fallbacks()


def test_an_output_above_the_size_cap_stays_a_node():
    proto = parse(PINNED_OUTPUTS.replace("N,M", str(BIG)).replace("int64[2]", "int64[1]"))
    model, stats = fold(proto)
    assert stats == {"Shape": 1} and ops(model) == ["ConstantOfShape", "Relu"]
    model, stats = fold(proto, fold_size_limit=BIG * 4)
    assert stats == {"Shape": 1, "FoldConstants": 1} and ops(model) == ["Relu"]
    assert [v.name for v in model.graph.outputs] == ["ones", "dims", "y"]


def test_an_output_copying_a_weight_others_read_stays_a_node_above_the_cap():
    # Reshape(W) as an output: folded, W would be stored twice, since the MatMul still reads W.
    w = np.arange(64, dtype=np.float32).reshape(8, 8)
    proto = parse("""
        g (float[1,8] x) => (float[1,8] y, float[8,8] w_out)
        { y = MatMul(x, w)
          w_out = Reshape(w, shape) }""")
    proto.graph.initializer.extend([numpy_helper.from_array(w, "w"),
                                    numpy_helper.from_array(np.array([8, 8], np.int64), "shape")])
    model, stats = fold(proto, fold_size_limit=100)  # below the weight's 256 bytes
    assert stats == {} and ops(model) == ["MatMul", "Reshape"]
    model, stats = fold(proto, fold_size_limit=1000)
    assert stats == {"FoldConstants": 1} and ops(model) == ["MatMul"]
    np.testing.assert_array_equal(init(model, "w_out"), w)


def test_a_constant_output_stays_a_node_and_its_readers_fold():
    proto = parse("""
        g (float[2] x) => (float[2] y, float[2] k)
        { k = Constant<value = float[2] {5.0, 6.0}>()
          d = Mul(k, k)
          y = Add(x, d) }""")
    model, stats = fold(proto)
    assert stats == {"FoldConstants": 1} and ops(model) == ["Constant", "Add"]
    np.testing.assert_array_equal(init(model, "d"), [25.0, 36.0])
    assert_same_outputs(proto, model)


def test_an_output_that_is_an_identity_of_a_weight_stays_a_node():
    # An initializer of the output's name would store the weight a second time.
    proto = parse("""
        g (float[2] x) => (float[2] y, float[2] w2)
        <float[2] w = {1.0, 2.0}>
        { w2 = Identity(w)
          y = Add(x, w) }""")
    model, stats = fold(proto)
    assert stats == {} and ops(model) == ["Identity", "Add"]


def test_unknown_domain_is_not_folded():
    proto = parse("""
        g (float[2] x) => (float[2] y)
        <float[2] a = {1.0, 2.0}>
        { t = custom.Foo(a)
          y = Add(x, t) }""",
                  header='<ir_version: 8, opset_import: ["" : 17, "custom" : 1]>\n')
    model, stats = fold(proto)
    assert stats == {} and ops(model) == ["Foo", "Add"]


def test_contrib_op_known_to_onnxruntime_folds():
    proto = parse("""
        g (float[2] x) => (float[2] y)
        <float[2] a = {1.0, 2.0}>
        { t = com.microsoft.Gelu(a)
          y = Add(x, t) }""",
                  header='<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>\n')
    model, stats = fold(proto)
    assert stats == {"FoldConstants": 1} and ops(model) == ["Add"]
    assert_same_outputs(proto, model)


def test_onnxruntime_failure_falls_back_per_node_and_keeps_the_failing_node():
    # Relu-14 allows int64 but onnxruntime has no such kernel, so the batched session fails;
    # the Mul must still fold.
    proto = parse("""
        g (float[2] x) => (float[2] y, int64[2] j)
        <float[2] a = {1.0, 2.0}, int64[2] b = {1, -2}>
        { m = Mul(a, a)
          s = Relu(b)
          y = Add(x, m)
          j = Identity(s) }""")
    ctx = PassContext(Options())
    model = load_onnx(proto)
    infer_shapes(model)
    stats = run_passes(model, FoldConstants(), ctx=ctx)
    assert stats == {"FoldConstants": 1}
    assert ops(model) == ["Relu", "Add", "Identity"]
    assert any("1 constant Relu node(s) unfolded" in n for n in ctx.notes)


OUT_OF_RANGE = """
    g (float[3] x) => (float[3] y)
    <float[4] table = {1.0, 2.0, 3.0, 4.0}, int64[3] idx = {1, 2, 4}>
    { picked = Gather(table, idx)
      y = Add(x, picked) }"""


def test_constant_node_that_fails_at_run_time_is_a_clear_input_error():
    # A position table indexed past its end (a sequence pinned longer than the model allows)
    # would fail at every inference: refused, naming the node, the inputs and the cause.
    model = load_onnx(parse(OUT_OF_RANGE))
    infer_shapes(model)
    with pytest.raises(InputError, match=r"node writing 'picked' \(Gather\) fails on its "
                                         r"constant inputs, so the model cannot run with inputs "
                                         r"x \[3\]: indices"):
        run_passes(model, FoldConstants())


@pytest.mark.parametrize("op, dividend, divisor, dtype, cause", [
    ("Div", "-2147483648", "-1", "int32", "integer Div of -2147483648 by -1 overflows int32"),
    ("Div", "-9223372036854775808", "-1", "int64",
     "integer Div of -9223372036854775808 by -1 overflows int64"),
    ("Div", "5", "0", "int32", "integer Div by zero"),
    ("Mod", "5", "0", "int64", "integer Mod by zero")])
def test_an_integer_division_that_traps_is_refused_not_run(op, dividend, divisor, dtype, cause):
    # onnxruntime's kernel runs into the CPU's division trap: the compile died of SIGFPE,
    # exit 136 with nothing said. A divisor computed in the same region is checked too, as
    # its value is known (node by node).
    for made in (False, True):
        source = "q = Identity(b)" if made else "q = Identity(a)"
        text = f"""
            g ({dtype}[1] x) => ({dtype}[1] y)
            <{dtype}[1] a = {{{dividend}}}, {dtype}[1] b = {{{divisor}}}>
            {{ {source}
              z = {op}(a, {"q" if made else "b"})
              y = Add(z, x) }}"""
        with pytest.raises(InputError, match=f"node writing 'z' \\({op}\\) fails on its "
                                             f"constant inputs, .*: {cause}"):
            graphopt.optimize(parse(text))


def test_failing_constant_node_that_no_output_reads_is_not_an_error():
    text = OUT_OF_RANGE.replace("y = Add(x, picked)", "y = Identity(x)")
    model = load_onnx(parse(text))
    infer_shapes(model)
    run_passes(model, FoldConstants())
    assert ops(model) == ["Identity"]  # dead, so dropped with the folded region


def test_failing_constant_node_stops_optimize_without_a_pass_name_in_front():
    with pytest.raises(InputError) as caught:
        graphopt.optimize(parse(OUT_OF_RANGE))
    assert str(caught.value).startswith("node writing 'picked' (Gather) fails on its constant ")


# -------------------------------------------------------------------------------------------
# nested graphs
# -------------------------------------------------------------------------------------------
IF_MODEL = """
    g (bool cond, float[2] x) => (float[2] y)
    <float[2] c1 = {1.0, 2.0}>
    {
      c2 = Mul(c1, c1)
      y = If (cond) <
        then_branch = g1 () => (float[2] z) {
          k = Constant<value = float[2] {5.0, 6.0}>()
          t = Add(c2, k)
          z = Add(x, t)
        },
        else_branch = g2 () => (float[2] z2) {
          z2 = Sub(x, c2)
        }>
    }"""


def test_folds_inside_if_branches_and_reads_outer_folds():
    proto = parse(IF_MODEL)
    model, stats = fold(proto)
    assert stats == {"FoldConstants": 3}  # outer Mul, inner Constant and Add
    assert ops(model) == ["If"]
    then_branch = model.graph.nodes()[0].attr("then_branch")
    assert [n.op_type for n in then_branch] == ["Add"]
    np.testing.assert_array_equal(then_branch.initializers["t"].constant(), [6.0, 10.0])
    for cond in (True, False):
        assert_same_outputs(proto, model, {"cond": np.array(cond), "x": np.ones(2, np.float32)})


def test_folds_inside_loop_body():
    proto = parse("""
        g (int64 n, float[2] x) => (float[2] y)
        <float[2] c = {1.0, 2.0}>
        {
          c2 = Mul(c, c)
          t = Constant<value = bool {1}>()
          y = Loop(n, t, x) <body = b (int64 i, bool cond, float[2] acc)
                                      => (bool co, float[2] out) {
              k = Neg(c2)
              co = Identity(cond)
              out = Add(acc, k)
          }>
        }""")
    model, stats = fold(proto)
    assert stats == {"FoldConstants": 3}  # Mul, Constant, and Neg inside the body
    body = model.graph.nodes()[0].attr("body")
    assert [n.op_type for n in body] == ["Identity", "Add"]
    assert_same_outputs(proto, model, {"n": np.array(3), "x": np.ones(2, np.float32)})


def test_value_returned_by_a_branch_is_not_folded():
    proto = parse("""
        g (bool cond, float[2] x) => (float[2] y)
        <float[2] c1 = {1.0, 2.0}>
        {
          c2 = Mul(c1, c1)
          y = If (cond) <then_branch = g1 () => (float[2] z) { z = Identity(c2) },
                         else_branch = g2 () => (float[2] z2) { z2 = Identity(x) }>
        }""")
    model, stats = fold(proto)
    # The branch's Identity produces the branch output %z, so it stays; %c2 folds under it.
    assert stats == {"FoldConstants": 1} and ops(model) == ["If"]
    assert_same_outputs(proto, model, {"cond": np.array(True), "x": np.ones(2, np.float32)})

    proto = parse("""
        g (bool cond, float[2] x) => (float[2] y)
        <float[2] c1 = {1.0, 2.0}>
        {
          c2 = Mul(c1, c1)
          y = If (cond) <then_branch = g1 () => (float[2] c2) { },
                         else_branch = g2 () => (float[2] z2) { z2 = Identity(x) }>
        }""")
    model, stats = fold(proto)
    assert stats == {} and ops(model) == ["Mul", "If"]  # the branch returns %c2 itself


# -------------------------------------------------------------------------------------------
# numerics on a mixed model
# -------------------------------------------------------------------------------------------
def test_mixed_model_numerics():
    proto = parse("""
        g (float[B,4,6] x) => (float[B,24] y, float[B,4,6] w)
        <float[6,6] wt = {0,1,2,3,4,5, 6,7,8,9,10,11, 12,13,14,15,16,17, 18,19,20,21,22,23,
                          24,25,26,27,28,29, 30,31,32,33,34,35},
         float scale = {0.125}, int64[1] ax = {0}, int64[1] m1 = {-1}>
        {
          wT = Transpose<perm = [1, 0]>(wt)
          ws = Mul(wT, scale)
          half = Constant<value = float {0.5}>()
          sq = Sqrt(half)
          w2 = Div(ws, sq)
          w = MatMul(x, w2)
          s = Shape(w)
          b = Gather(s, ax)
          n4 = Shape<start = 1>(w)
          prod = ReduceProd<keepdims = 1>(n4)
          c = Concat<axis = 0>(b, prod)
          y = Reshape(w, c)
        }""")
    model, stats = fold(proto)
    # wT ws half sq w2, and prod (from the folded Shape<start=1>); the batch dim stays symbolic.
    assert stats == {"FoldConstants": 6, "Shape": 1}
    assert sorted(ops(model)) == ["Concat", "Gather", "MatMul", "Reshape", "Shape"]
    assert_same_outputs(proto, model, {"x": np.random.default_rng(0).standard_normal(
        (3, 4, 6)).astype(np.float32)})


# -------------------------------------------------------------------------------------------
# property: chains of elementwise ops over constants fold to what onnxruntime computes
# -------------------------------------------------------------------------------------------
SHAPES = [(), (3,), (1, 3), (2, 3)]
BINARY = {"int64": ["Add", "Sub", "Mul", "Max", "Min", "Div", "Mod"],
          "int32": ["Add", "Sub", "Max", "Min", "Div", "Mod"],  # no Mul: keep int32 in range
          "float32": ["Add", "Sub", "Mul", "Max", "Min", "Div", "Pow"]}
UNARY = {"int64": ["Neg", "Abs", "Identity"], "int32": ["Neg", "Abs", "Sign"],
         "float32": ["Neg", "Abs", "Exp", "Sqrt", "Tanh", "Floor", "Reciprocal", "Erf"]}


@st.composite
def chains(draw):
    dtype = draw(st.sampled_from(["int64", "int32", "float32"]))
    np_dtype = np.dtype(dtype)
    binary = BINARY[dtype]

    def constant(nonzero: bool = False):
        shape = draw(st.sampled_from(SHAPES))
        size = int(np.prod(shape, dtype=np.int64))
        if dtype == "float32":
            values = draw(st.lists(st.floats(-8, 8, width=32), min_size=size, max_size=size))
            if nonzero:
                values = [v if abs(v) > 0.25 else 1.0 for v in values]
        else:
            # |values| <= 100 and at most 6 steps: int64 products stay below 1e14; divisors
            # are 1..9, so no division by zero and no INT_MIN / -1 trap.
            low, high = (1, 9) if nonzero else (-100, 100)
            values = draw(st.lists(st.integers(low, high), min_size=size, max_size=size))
        return np.array(values, dtype=np_dtype).reshape(shape)

    steps = []
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            op = draw(st.sampled_from(binary))
            # Integer division needs a fresh non-zero divisor, never a computed value.
            steps.append((op, constant(nonzero=op in ("Div", "Mod", "Pow")),
                          draw(st.booleans()) and op not in ("Div", "Mod", "Pow")))
        else:
            steps.append((draw(st.sampled_from(UNARY[dtype])), None, False))
    return dtype, constant(), steps


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chains())
def test_property_elementwise_chains_fold_to_onnxruntime_values(chain):
    dtype, start, steps = chain
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [numpy_helper.from_array(start, "c0")]
    nodes, current = [], "c0"
    for i, (op, const, swap) in enumerate(steps):
        out = f"v{i}"
        if const is None:
            nodes.append(helper.make_node(op, [current], [out]))
        else:
            inits.append(numpy_helper.from_array(const, f"k{i}"))
            operands = [f"k{i}", current] if swap else [current, f"k{i}"]
            attrs = {"fmod": 0} if op == "Mod" else {}
            nodes.append(helper.make_node(op, operands, [out], **attrs))
        current = out
    nodes.append(helper.make_node("Add", ["x", current], ["y"]))
    proto = helper.make_model(helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", elem, [2, 3])],
        [helper.make_tensor_value_info("y", elem, None)], inits),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    model, stats = fold(proto)
    assert stats == {"FoldConstants": len(steps)}
    assert ops(model) == ["Add"]
    folded = to_onnx(model)
    onnx.checker.check_model(folded, full_check=True)
    feeds = {"x": np.zeros((2, 3), dtype=dtype)}
    expected, actual = numerics.run(proto, feeds)["y"], numerics.run(folded, feeds)["y"]
    np.testing.assert_array_equal(actual, expected)  # bit for bit: same kernels, same inputs


def test_slice_indices_clamp_as_onnxruntime_does():
    # Python's slice clamps a negative-step start below -size to "nothing"; ONNX to 0.
    import itertools

    from graphopt.passes.fold_shapes import slice_indices

    node = helper.make_node("Slice", ["d", "s", "e", "a", "st"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.INT64, [None])
                                            for n in ("d", "s", "e", "a", "st")],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    session = numerics.session(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17)], ir_version=IR_VERSION).SerializeToString())
    for size in range(4):
        data = np.arange(size, dtype=np.int64)
        for start, end, step in itertools.product(range(-6, 6), range(-6, 6), (-2, -1, 1, 2)):
            feeds = {"d": data, "s": np.array([start]), "e": np.array([end]),
                     "a": np.array([0]), "st": np.array([step])}
            (expected,) = session.run(None, feeds)
            assert list(slice_indices(size, start, end, step)) == expected.tolist(), \
                (size, start, end, step)


def test_slice_of_a_shape_with_a_negative_step_folds_to_what_onnxruntime_computes():
    proto = parse("""
        g (float[4,N,8] x) => (int64[2] y)
        <int64[1] s = {-4}, int64[1] e = {-10}, int64[1] a = {0}, int64[1] st = {-1},
         int64[1] seven = {7}>
        {
          shape = Shape(x)
          picked = Slice(shape, s, e, a, st)
          y = Concat <axis = 0> (picked, seven)
        }""")
    model, stats = fold(proto)
    assert "Slice" not in ops(model), stats
    assert_same_outputs(proto, model, {"x": np.zeros((4, 2, 8), np.float32)})


def _same_everywhere(proto: onnx.ModelProto, feeds: dict, tmp_path) -> None:
    """The original's outputs at every level as ONNX, and from a cpu and an ascend310 .om."""
    expected = numerics.run(proto, feeds)
    for level in (0, 1, 2, 3):
        optimized = graphopt.optimize(proto, level=level).to_onnx()
        assert numerics.compare(expected, numerics.run(optimized, feeds), 0, 0) == []
    for target in ("cpu", "ascend310"):
        graphopt.save(graphopt.optimize(proto, target=target), tmp_path / f"{target}.om")
        with warnings.catch_warnings():  # the NPU's functional stand-in says so
            warnings.simplefilter("ignore", RuntimeWarning)
            session = graphopt.load(tmp_path / f"{target}.om")
        assert numerics.compare(expected, session.run(feeds), 0, 0) == []


@pytest.mark.parametrize("dims, indices", [([6], [1, 4]), ([2, 3], [[0, 1], [1, 1]])])
def test_a_sparse_constant_stays_a_node(dims, indices, tmp_path):
    # onnxruntime runs a 1-D sparse Constant in a model but refused it in the fold's own
    # session, which graphopt reported as a model that cannot run.
    values = helper.make_tensor("v", TensorProto.FLOAT, [2], [5.0, 7.0])
    where = helper.make_tensor("i", TensorProto.INT64, np.shape(indices),
                               np.ravel(indices).tolist())
    sparse = helper.make_sparse_tensor(values, where, dims)
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], sparse_value=sparse),
         helper.make_node("Add", ["x", "c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                              ir_version=IR_VERSION)
    _same_everywhere(proto, {"x": np.arange(6, dtype=np.float32).reshape(dims)}, tmp_path)


def test_a_sparse_initializer_feeding_a_matmul_compiles(tmp_path):
    # Strict inference left the sparse weight untyped, and refused the MatMul as rank 0.
    values = helper.make_tensor("w", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    where = helper.make_tensor("i", TensorProto.INT64, [3], [0, 4, 8])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        sparse_initializer=[helper.make_sparse_tensor(values, where, [3, 3])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION)
    _same_everywhere(proto, {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}, tmp_path)


def test_a_chain_of_computed_pads_folds_whole_past_the_iteration_cap():
    # Swin pads each stage's width up to its window with pads computed from the width (w % 8 …):
    # a stage's Pad is typed only in the sweep after its pads fold, so a chain of twelve needs
    # twelve sweeps, past the cap of 8 (swinv2_tiny needs nine). Sweeps that remove nodes go on.
    nodes, inputs = [], {"one": [1], "window": [8], "zeros": [0, 0, 0]}
    previous = "x"
    for k in range(12):
        nodes += [
            helper.make_node("Shape", [previous], [f"shape{k}"]),
            helper.make_node("Gather", [f"shape{k}", "one"], [f"width{k}"], axis=0),
            helper.make_node("Mod", [f"width{k}", "window"], [f"rem{k}"]),
            helper.make_node("Sub", ["window", f"rem{k}"], [f"short{k}"]),
            helper.make_node("Mod", [f"short{k}", "window"], [f"pad{k}"]),
            helper.make_node("Add", [f"pad{k}", "one"], [f"grow{k}"]),
            helper.make_node("Concat", ["zeros", f"grow{k}"], [f"pads{k}"], axis=0),
            helper.make_node("Pad", [previous, f"pads{k}"], [f"padded{k}"]),
            helper.make_node("Relu", [f"padded{k}"], [f"y{k}"])]
        previous = f"y{k}"
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in inputs.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION)
    result = graphopt.optimize(proto)
    assert not any("fixed point" in note for note in result.notes), result.notes
    assert Counter(n.op_type for n in result.model.graph) == {"Pad": 12, "Relu": 12}
    feeds = {"x": np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32)}
    expected, actual = numerics.run(proto, feeds), numerics.run(result.to_onnx(), feeds)
    np.testing.assert_array_equal(actual[previous], expected[previous])


def test_large_constants_reach_the_folding_session_as_fed_arrays(monkeypatch):
    # As initializers they were copied into the proto, its bytes and onnxruntime's tensor: a
    # peak of five times the data (4 GB to fold 768 MB of transposed weights, 8.7 s; 1.7 GB
    # and 0.9 s fed). Small ones (shapes, scalars) and bfloat16 stay initializers.
    from graphopt.passes import fold_eval

    rng = np.random.default_rng(5)
    big = rng.standard_normal((512, 1024)).astype(np.float32)  # 2 MiB
    small = rng.standard_normal((4, 8)).astype(np.float32)
    half = rng.standard_normal((512, 1024)).astype(ml_dtypes.bfloat16)
    proto = helper.make_model(helper.make_graph(
        [helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]),
         helper.make_node("MatMul", ["x", "Wt"], ["a"]),
         helper.make_node("Transpose", ["S"], ["St"], perm=[1, 0]),
         helper.make_node("MatMul", ["y", "St"], ["b"]),
         helper.make_node("Transpose", ["H"], ["Ht"], perm=[1, 0]),
         helper.make_node("Cast", ["Ht"], ["Hf"], to=TensorProto.FLOAT),
         helper.make_node("MatMul", ["x", "Hf"], ["c"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 1024]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "abc"],
        initializer=[numpy_helper.from_array(big, "W"), numpy_helper.from_array(small, "S"),
                     helper.make_tensor("H", TensorProto.BFLOAT16, half.shape,
                                        half.view(np.uint16).ravel().tolist())]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    sessions = []
    made = numerics.session

    def recorded(model, *args, **kwargs):
        sessions.append(model)
        return made(model, *args, **kwargs)

    monkeypatch.setattr(fold_eval.numerics, "session", recorded)
    result = graphopt.optimize(proto, level=2)
    graphs = [m for m in (onnx.load_from_string(m) if isinstance(m, bytes) else m
                          for m in sessions) if m.graph.name == "fold"]
    fed = {i.name for g in graphs for i in g.graph.input}
    inline = {t.name for g in graphs for t in g.graph.initializer}
    assert "W" in fed and "W" not in inline and {"S", "H"} <= inline, (fed, inline)
    feeds = {"x": rng.standard_normal((2, 1024)).astype(np.float32),
             "y": rng.standard_normal((2, 8)).astype(np.float32)}
    expected = numerics.run(proto, feeds)
    actual = numerics.run(result.to_onnx(), feeds)
    for name in "abc":
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-5, atol=1e-4)


def test_float16_ops_onnxruntime_runs_in_float32_are_not_folded_into_float16():
    # onnxruntime has no float16 CPU kernel for Sqrt, Reciprocal, Exp or Mul: it runs them in
    # float32 and drops the Casts between them, so k = 66300 is never rounded. Folded, k was a
    # float16 infinity and an output inf where the model gives 6956.
    k_parts = {"a": np.array([3.0, 5.0, 1.2e-7, 0.3, 1000.0], np.float16),
               "e": np.array([10.0, 0.05, -2.0, 11.0, 0.9], np.float16)}
    proto = helper.make_model(helper.make_graph(
        [helper.make_node("Sqrt", ["a"], ["s"]), helper.make_node("Reciprocal", ["s"], ["r"]),
         helper.make_node("Exp", ["e"], ["ee"]), helper.make_node("Mul", ["r", "ee"], ["k"]),
         helper.make_node("Mul", ["x", "k"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [5])],
        [numpy_helper.from_array(v, n) for n, v in k_parts.items()]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    result = graphopt.optimize(proto)
    x = {"x": np.array([0.1257, -0.1321, 0.6406, 0.1049, -0.5356], np.float16)}
    expected, actual = numerics.run(proto, x)["y"], numerics.run(result.to_onnx(), x)["y"]
    assert np.isfinite(expected).all()
    np.testing.assert_array_equal(actual, expected)
