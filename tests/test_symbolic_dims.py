"""symbolic_dims: dims as a constant times names, and shape tensors evaluated into them."""

from __future__ import annotations

import onnx.parser
import pytest
from helpers import OPSET17

from graphopt.ir import load_onnx
from graphopt.passes import PASSES, Options, PassContext
from graphopt.passes.symbolic_dims import over, shape_tensor, solved, value_dims


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


@pytest.mark.parametrize(("left", "right", "found"), [
    ((64, ("B", "S")), (640, ("B",)), ("S", 10)),   # a traced 10 against the sequence
    ((64, ("S",)), (64, ("T",)), None),             # two names: nothing is learnt
    ((6, ("S",)), (4, ()), None),                   # S would be 2/3
])
def test_equal_element_counts_give_a_name_its_size(left, right, found):
    assert solved(left, right) == found
