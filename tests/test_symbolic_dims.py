"""symbolic_dims: dims as a constant times names, and shape tensors evaluated into them."""

from __future__ import annotations

import onnx.parser
import pytest
from helpers import OPSET17

from graphopt.ir import load_onnx
from graphopt.passes import PASSES, Options, PassContext
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.passes.symbolic_dims import (Equalities, over, proven_dims, shape_tensor, solved,
                                           value_dims)


def evaluated(body: str, x_type: str = "float[S, B, 64]"):
    """shape_tensor of the graph's output `t`, with x's dims as Shape(x) reads them."""
    proto = onnx.parser.parse_model(OPSET17 + f"""
    g ({x_type} x) => (int64[?] t) {{
        {body}
    }}""")
    model = load_onnx(proto)
    PASSES["ConstantToInitializer"]().run(model, PassContext(Options()))
    (t,) = model.graph.outputs
    return shape_tensor(t, value_dims)


def test_the_head_split_target_of_the_dynamo_export():
    got = evaluated("""
        one = Constant <value = int64 {1}> ()
        four = Constant <value = int64 {4}> ()
        minus_one = Constant <value_ints = [-1]> ()
        zero1 = Constant <value_ints = [0]> ()
        one1 = Constant <value_ints = [1]> ()
        sixteen = Constant <value_ints = [16]> ()
        s = Shape <start = 0, end = 2> (x)
        b = Gather <axis = 0> (s, one)
        n = Mul(b, four)
        r = Reshape(n, minus_one)
        seq = Slice(s, zero1, one1)
        t = Concat <axis = 0> (seq, r, sixteen)""")
    assert got == ([(1, ("S",)), (4, ("B",)), (16, ())], False)


def test_exact_division_is_followed_and_an_inexact_one_is_not():
    body = """
        two = Constant <value = int64 {2}> ()
        d = Constant <value = int64 {DIVISOR}> ()
        zero1 = Constant <value_ints = [0]> ()
        s = Shape(x)
        e = Gather <axis = 0> (s, two)
        h = Div(e, d)
        t = Unsqueeze(h, zero1)"""
    assert evaluated(body.replace("DIVISOR", "4")) == ([(16, ())], False)
    assert evaluated(body.replace("DIVISOR", "5")) is None  # 64 / 5 truncates


def test_an_unnamed_dim_equals_only_itself():
    (a, b) = value_dims(load_onnx(onnx.parser.parse_model(OPSET17 + """
    g (float[?, ?] x) => (float[?, ?] y) { y = Relu(x) }""")).graph.inputs[0])
    assert a != b and over(a, a) == (1, ())


def test_a_name_that_is_a_product_is_read_as_one():
    # The dynamo exporter names the dims it derives by their expressions: 4*B is 4·B.
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                      ["4*B", "B*4", "s0*s1", "s0 + 1", "2*s0*3", "batch",
                                       "²*B", "2*3"])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    dims = value_dims(load_onnx(helper.make_model(graph)).graph.inputs[0])
    assert dims == [(4, ("B",)), (4, ("B",)), (1, ("s0", "s1")), (1, ("s0 + 1",)),
                    (6, ("s0",)), (1, ("batch",)), (1, ("²*B",)),  # a digit int() refuses
                    (1, ("2*3",))]  # numbers alone: a free size, named so, not the number 6


@pytest.mark.parametrize(("left", "right", "found"), [
    ((64, ("B", "S")), (640, ("B",)), ("S", 10)),   # a traced 10 against the sequence
    ((64, ("S",)), (64, ("T",)), None),             # two names: nothing is learnt
    ((6, ("S",)), (4, ()), None),                   # S would be 2/3
])
def test_equal_element_counts_give_a_name_its_size(left, right, found):
    assert solved(left, right) == found


def proven(inputs: str, body: str):
    """proven_dims of the graph's output `y` after shape inference, and the equalities found."""
    proto = onnx.parser.parse_model(OPSET17 + f"""
    g ({inputs}) => (float[?, ?, ?, ?] y) {{
        {body}
    }}""")
    model = load_onnx(proto)
    PASSES["ConstantToInitializer"]().run(model, PassContext(Options()))
    infer_shapes(model)
    (y,) = model.graph.outputs
    equal = Equalities()
    return proven_dims(y, equal), equal, value_dims(y)


HEAD_SPLIT = """
        zero = Constant <value = int64 {0}> ()
        axes = Constant <value_ints = [0]> ()
        rest = Constant <value_ints = [-1, 4, 16]> ()
        s = Shape(SOURCE)
        g = Gather <axis = 0> (s, zero)
        b = Unsqueeze(g, axes)
        t = Concat <axis = 0> (b, rest)
        y = Reshape(x, t)"""


def test_a_reshapes_minus_one_is_the_input_over_the_other_entries():
    # x.view(x.size(0), -1, 4, 16): inference names the -1 afresh; it is S.
    dims, equal, inferred = proven("float[B, S, 64] x", HEAD_SPLIT.replace("SOURCE", "x"))
    assert dims == [(1, ("B",)), (1, ("S",)), (4, ()), (16, ())]
    assert inferred[1] != (1, ("S",)) and equal.same(inferred[1], (1, ("S",)))
    assert equal.entry(inferred[1]) == "S"


def test_a_minus_one_over_another_inputs_dim_is_not_proven():
    # B · S · 64 over C · 64 does not divide: the -1 keeps the name inference gave it.
    dims, equal, inferred = proven("float[B, S, 64] x, float[C, 64] z",
                                   HEAD_SPLIT.replace("SOURCE", "z"))
    assert dims[0] == (1, ("C",)) and dims[1] == inferred[1]
    assert not equal.same(dims[1], (1, ("S",)))


def test_the_head_count_a_minus_one_stands_for_is_a_number():
    body = """
        heads = Constant <value_ints = [-1, 16]> ()
        s = Shape <end = 2> (x)
        t = Concat <axis = 0> (s, heads)
        y = Reshape <allowzero = 1> (x, t)"""
    dims, _, inferred = proven("float[B, S, 64] x", body)
    assert dims[2] == (4, ()) and inferred[2] != (4, ())


def test_a_concat_joins_its_inputs_dims_off_its_axis():
    # Concat runs only where its inputs agree off the axis: P is B and Q is S (rotary
    # embeddings concatenate a rotated half, whose dims inference lost, with a kept half).
    dims, equal, _ = proven("float[P, Q, 4, 8] r, float[B, S, 4, 8] a",
                            "y = Concat <axis = -1> (r, a)")
    assert equal.same((1, ("P",)), (1, ("B",))) and equal.same((1, ("Q",)), (1, ("S",)))
    assert not equal.same((1, ("B",)), (1, ("S",)))
    assert dims[3] == (16, ())


def test_two_numbers_are_never_joined():
    equal = Equalities()
    equal.join((1, ("N",)), (4, ()))
    equal.join((1, ("N",)), (8, ()))
    assert equal.number((1, ("N",))) == 4 and not equal.same((4, ()), (8, ()))
