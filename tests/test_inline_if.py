"""InlineConstantIf: a constant-condition If becomes its branch, in place and with equal
outputs; a removed If releases the outer values its bodies read."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import pytest

import graphopt
from graphopt import numerics
from graphopt.ir import format_model, load_onnx, to_onnx, verify
from graphopt.passes import PASSES, PassContext
from graphopt.passes.options import Options

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'


def parse(text: str) -> onnx.ModelProto:
    return onnx.parser.parse_model(HEADER + text)


def inline(proto: onnx.ModelProto, *, gate=None):
    model = load_onnx(proto)
    ctx = PassContext(Options(), gate=gate)
    stats = PASSES["InlineConstantIf"]().run(model, ctx).stats
    verify(model)
    return model, stats


def ops(model, graph=None) -> list[str]:
    return [n.op_type for n in (graph or model.graph)]


def assert_same_outputs(original: onnx.ModelProto, model, feeds) -> None:
    rewritten = to_onnx(model) if not isinstance(model, onnx.ModelProto) else model
    onnx.checker.check_model(rewritten, full_check=True)
    expected = numerics.run(original, feeds)
    actual = numerics.run(rewritten, feeds)
    assert list(actual) == list(expected)
    assert numerics.compare(expected, actual, rtol=1e-6, atol=0) == []


# The branches read an outer node output (%t), an outer weight, hold a weight of their own, and
# the then branch nests a second If on the graph input %c.
BRANCHY = """
    g (float[2] x, bool c) => (float[2] y, float[2] w)
    <bool flag = {1}, float[2] k = {2.0, 3.0}>
    {
      t = Exp(x)
      y = If (flag) <
        then_branch = g1 () => (float[2] z) {
          a = Mul(t, k)
          z = If (c) <then_branch = g3 () => (float[2] p) { p = Neg(a) },
                      else_branch = g4 () => (float[2] q) { q = Abs(a) }>
        },
        else_branch = g2 () => (float[2] z2) <float[2] b = {7.0, 8.0}> {
          z2 = Sub(t, b)
        }>
      w = Relu(y)
    }"""


@pytest.mark.parametrize("flag", [True, False])
def test_the_taken_branch_replaces_the_if(flag):
    proto = parse(BRANCHY.replace("flag = {1}", f"flag = {{{int(flag)}}}"))
    model, stats = inline(proto)
    assert stats == {"If": 1}
    # The nested If reads %c, known only at run time: it stays, now in the main graph.
    assert ops(model) == (["Exp", "Mul", "If", "Relu"] if flag else ["Exp", "Sub", "Relu"])
    for c in (True, False):
        feeds = {"x": np.array([0.5, -1.0], np.float32), "c": np.array(c)}
        assert_same_outputs(proto, model, feeds)


def test_a_runtime_condition_is_left_alone():
    proto = parse(BRANCHY.replace("<bool flag = {1}, ", "<").replace("(float[2] x, bool c)",
                                                                      "(float[2] x, bool c, bool flag)"))
    model, stats = inline(proto)
    assert stats == {} and ops(model) == ["Exp", "If", "Relu"]


def test_a_branch_returning_a_value_defined_outside_its_nodes_keeps_the_output_name():
    # %y is a graph output; the then branch returns the graph input itself (onnxruntime refuses
    # such a model, graphopt must not emit one), the else branch a weight of its own: an
    # Identity keeps the name %y in both cases.
    x = np.array([0.5, -1.0], np.float32)
    for flag, expected in ((1, x), (0, np.array([7.0, 8.0], np.float32))):
        proto = parse(f"""
            g (float[2] x) => (float[2] y)
            <bool flag = {{{flag}}}>
            {{
              y = If (flag) <then_branch = g1 () => (float[2] x) {{ }},
                             else_branch = g2 () => (float[2] b) <float[2] b = {{7.0, 8.0}}> {{ }}>
            }}""")
        model, stats = inline(proto)
        assert stats == {"If": 1} and ops(model) == ["Identity"]
        assert [v.name for v in model.graph.outputs] == ["y"]
        rewritten = to_onnx(model)
        onnx.checker.check_model(rewritten, full_check=True)
        np.testing.assert_array_equal(numerics.run(rewritten, {"x": x})["y"], expected)


def test_a_condition_of_shape_one_counts():
    proto = parse("""
        g (float[2] x) => (float[2] y)
        <bool[1] flag = {0}>
        {
          y = If (flag) <then_branch = g1 () => (float[2] a) { a = Neg(x) },
                         else_branch = g2 () => (float[2] b) { b = Abs(x) }>
        }""")
    model, stats = inline(proto)
    assert stats == {"If": 1} and ops(model) == ["Abs"]
    assert [v.name for v in model.graph.outputs] == ["y"]
    assert_same_outputs(proto, model, {"x": np.array([0.5, -1.0], np.float32)})


def test_a_sequence_output_of_the_graph_is_not_inlined():
    proto = parse("""
        g (float[2] x) => (seq(float[2]) y)
        <bool flag = {1}>
        {
          y = If (flag) <then_branch = g1 () => (seq(float[2]) a) { a = SequenceConstruct(x) },
                         else_branch = g2 () => (seq(float[2]) b) { b = SequenceConstruct(x, x) }>
        }""")
    model, stats = inline(proto)
    assert stats == {} and ops(model) == ["If"]


def test_the_rewrite_gate_is_asked():
    proto = parse(BRANCHY)
    asked = []
    model, stats = inline(proto, gate=lambda pass_name, rule, anchor: asked.append(rule) and False)
    assert asked == ["If"] and stats == {} and ops(model) == ["Exp", "If", "Relu"]


def test_a_shape_test_folds_and_the_if_goes_at_O2():
    # The batch-of-one test an exporter leaves behind: known once the shape is.
    proto = parse("""
        g (float[1,4] x) => (float[1,4] y)
        <int64 zero = {0}, int64 one = {1}>
        {
          s = Shape(x)
          n = Gather(s, zero)
          single = Equal(n, one)
          y = If (single) <then_branch = g1 () => (float[1,4] a) { a = Relu(x) },
                           else_branch = g2 () => (float[1,4] b) { b = Sigmoid(x) }>
        }""")
    result = graphopt.optimize(proto, level=2)
    optimized = result.to_onnx()
    assert [n.op_type for n in optimized.graph.node] == ["Relu"]
    assert_same_outputs(proto, optimized, {"x": np.array([[0.5, -1.0, 2.0, -3.0]], np.float32)})
    assert result.log.totals()["InlineConstantIf"]["rewrites"] == {"If": 1}


def test_removing_an_if_frees_what_its_branches_read():
    # A dead If is the last reader of %t: once the If goes, Exp has no reader either.
    proto = parse("""
        g (float[2] x, bool c) => (float[2] y)
        {
          t = Exp(x)
          dead = If (c) <then_branch = g1 () => (float[2] a) { a = Neg(t) },
                         else_branch = g2 () => (float[2] b) { b = Abs(t) }>
          y = Relu(x)
        }""")
    model = load_onnx(proto)
    stats = PASSES["EliminateDeadNodes"]().run(model, PassContext(Options())).stats
    verify(model)
    assert ops(model) == ["Relu"] and stats["node"] == 2
    assert "Exp" not in format_model(model)


def test_names_the_branch_shares_with_other_scopes_are_renamed():
    # Legal in ONNX, not in one graph: two Ifs whose taken branches both define %t and %m and
    # name a node N.
    proto = parse("""
        g (float[2] x) => (float[2] z)
        <bool flag = {1}>
        {
          y1 = If (flag) <then_branch = g1 () => (float[2] t) <float[2] m = {1.0, 2.0}> {
                            t = Mul(x, m) },
                          else_branch = g2 () => (float[2] e) { e = Abs(x) }>
          y2 = If (flag) <then_branch = g3 () => (float[2] t) <float[2] m = {5.0, 6.0}> {
                            t = Add(x, m) },
                          else_branch = g4 () => (float[2] f) { f = Abs(x) }>
          s = Add(y1, y2)
          z = Add(s, x)
        }""")
    for node in proto.graph.node:
        if node.op_type == "If":
            node.attribute[0].g.node[0].name = "N"  # then_branch
    model, stats = inline(proto)
    assert stats == {"If": 2}
    names = [v.name for v in model.graph.all_values()]
    assert len(names) == len(set(names))
    node_names = [n.name for n in model.graph if n.name]
    assert len(node_names) == len(set(node_names)) == 2
    assert_same_outputs(proto, model, {"x": np.array([0.5, -1.0], np.float32)})


def test_shapes_declared_for_both_branches_are_inferred_again_after_inlining():
    # An exporter traces both branches and declares one rank for both: here rank 1, true of the
    # Reshape branch only (torch_geometric's scatter aggregation writes this). Inferred from the
    # If, the Relu after it was rank 1 too; kept after inlining the Identity branch, the Gemm
    # reading it made onnxruntime and onnx.checker refuse the model.
    from onnx import TensorProto, helper, numpy_helper

    def branch(name, node):
        return helper.make_graph([node], name, [], [helper.make_tensor_value_info(
            f"{name}_y", TensorProto.FLOAT, ["n"])])

    graph = helper.make_graph([
        helper.make_node("Equal", ["k", "k2"], ["c"]),
        helper.make_node("If", ["c"], ["y"],
                         then_branch=branch("then", helper.make_node(
                             "Reshape", ["x", "flat"], ["then_y"])),
                         else_branch=branch("else", helper.make_node(
                             "Identity", ["x"], ["else_y"]))),
        helper.make_node("Relu", ["y"], ["r"]),
        helper.make_node("Gemm", ["r", "w"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(np.array(1, np.int64), "k"),
         numpy_helper.from_array(np.array(2, np.int64), "k2"),
         numpy_helper.from_array(np.array([-1], np.int64), "flat"),
         numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "w")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    result = graphopt.optimize(proto)
    assert "If" not in ops(result.model)
    feeds = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    assert_same_outputs(proto, result.to_onnx(), feeds)
