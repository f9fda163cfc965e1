"""The pattern matcher and the rule machinery: bindings, commuted operands, constants, attributes,
optional inputs, diamonds, deletability, check/unsupported refusals, near-miss traces, matching
cost, and --trace-rule/--disable-pass for rules on the command line."""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
import onnx.parser
import pytest
from helpers import ops

import graphopt
from graphopt.cli import main
from graphopt.ir import DType, format_model, load_onnx, to_onnx, verify
from graphopt.ir.pattern import Attr, Const, Match, Matcher, Miss, OneOf, Optional
from graphopt.passes import Options, PassContext
from graphopt.passes.fusion.gelu import GeluErf
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.passes.rules import RULES, Rule, RulePass, Tracer

HEADER = '<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>\n'


# -- test-only rules (they register in RULES by class name; the fixture below drops them) ------

class TestOnlySquare(Rule):
    """x · x → Pow(x, 2)"""
    __test__ = False

    def pattern(self, op, x):
        return op.Mul(x, x)

    def rewrite(self, op, x):
        return op.Pow(x, op.const(np.array(2.0, np.float32)))


class TestOnlyAddOne(Rule):
    __test__ = False

    def pattern(self, op, x):
        return op.Add(x, 1.0)

    def rewrite(self, op, x):
        return op.Neg(x)


class TestOnlySubOne(Rule):
    __test__ = False

    def pattern(self, op, x):
        return op.Sub(x, 1.0)

    def rewrite(self, op, x):
        return op.Neg(x)


class TestOnlyScale(Rule):
    __test__ = False

    def pattern(self, op, x):
        return op.Mul(x, Const(pred=lambda a: a.size == 1, name="scale"))

    def rewrite(self, op, x, scale):
        return op.Neg(x)


class TestOnlySoftmaxAxis(Rule):
    __test__ = False

    def pattern(self, op, x):
        return op.Softmax(x, axis=Attr("axis", default=-1))

    def rewrite(self, op, x, axis):
        return op.LogSoftmax(x, axis=axis)


class TestOnlySoftmaxLast(Rule):
    __test__ = False

    def pattern(self, op, x):
        return op.Softmax(x, axis=-1)

    def rewrite(self, op, x):
        return op.LogSoftmax(x, axis=-1)


class TestOnlyClip(Rule):
    __test__ = False

    def pattern(self, op, x, lo, hi):
        return op.Clip(x, Optional(lo), Optional(hi))

    def rewrite(self, op, x, lo=None, hi=None):
        return op.Clip(x, lo, hi)


class TestOnlyScaledRelu(Rule):
    """Relu(x · c), Relu(x / c) or Relu(x): one pattern for three spellings."""
    __test__ = False

    def pattern(self, op, x):
        scale = Const(pred=lambda a: a.size == 1, name="c")
        return op.Relu(OneOf(op.Mul(x, scale), op.Div(x, scale), x))

    def rewrite(self, op, x, c=None):
        return op.Relu(x)


class TestOnlyNorm(Rule):
    """(x - mean(x)) / sqrt(mean((x - mean(x))²)): the Sub is a diamond."""
    __test__ = False

    def pattern(self, op, x):
        d = op.Sub(x, op.ReduceMean(x, axes=[-1]))
        return op.Div(d, op.Sqrt(op.ReduceMean(op.Mul(d, d), axes=[-1])))

    def rewrite(self, op, x):
        return op.LpNormalization(x)


class TestOnlyDoubleNeg(Rule):
    __test__ = False

    def pattern(self, op, x):
        return op.Neg(op.Neg(x))

    def rewrite(self, op, x):
        return op.Identity(x)


class TestOnlyPositiveShift(Rule):
    __test__ = False

    def pattern(self, op, x):
        return op.Relu(op.Add(x, Const(pred=lambda a: a.size == 1, name="shift")))

    def check(self, shift):
        value = float(shift.reshape(-1)[0])
        return None if value > 0 else f"shift {value} is not positive"

    def rewrite(self, op, x, shift):
        return op.Relu(op.Add(x, op.const(shift)))


class TestOnlyNoKernel(Rule):
    __test__ = False
    emits = (("com.microsoft", "TestOnlyNoSuchFusedOp"),)

    def pattern(self, op, x):
        return op.Relu(op.Relu(x))

    def rewrite(self, op, x):
        return op.TestOnlyNoSuchFusedOp(x, _domain="com.microsoft")


class TestOnlyFloatOnly(Rule):
    __test__ = False
    dtypes = (DType.FLOAT,)

    def pattern(self, op, x):
        return op.Relu(op.Relu(x))

    def rewrite(self, op, x):
        return op.Relu(x)


class TestOnlyDeepMiss(Rule):
    """Five nodes deep, then a constant the chain never has: a near-miss at every Relu."""
    __test__ = False

    def pattern(self, op, x):
        return op.Relu(op.Add(op.Relu(op.Add(op.Relu(op.Add(x, 2.0)), 1.0)), 1.0))

    def rewrite(self, op, x):
        return op.Relu(x)


class TestOnlyReluAdd(Rule):
    """Fires at every Relu(Add(x, c)) of a chain; makes several nodes of one op type."""
    __test__ = False

    def pattern(self, op, x, c):
        return op.Relu(op.Add(x, c))

    def rewrite(self, op, x, c):
        y = op.Add(x, c)
        for _ in range(6):
            y = op.Relu(y)
        return y


class TestOnlyPass(RulePass):
    """Not registered: applies whichever rules it is given."""
    __test__ = False
    name = "TestOnlyPass"

    def __init__(self, *rules):
        self.rules = rules


@pytest.fixture(scope="module", autouse=True)
def _drop_test_rules():
    yield
    for name in [n for n in RULES if n.startswith("TestOnly")]:
        del RULES[name]


# -- helpers ---------------------------------------------------------------------------------

def load(text: str):
    proto = onnx.parser.parse_model(HEADER + text)
    onnx.checker.check_model(proto)
    model = load_onnx(proto)
    infer_shapes(model)
    return model


def producer(model, name: str):
    (node,) = [n for n in model.graph if any(v is not None and v.name == name
                                              for v in n.outputs)]
    return node


def match(rule: type[Rule], model, output: str) -> Match | Miss:
    return Matcher(rule().build_pattern()).match(producer(model, output))


def run(model, *rules: type[Rule], trace: tuple[str, ...] = (), **options):
    """Apply `rules` once; returns (stats, trace lines)."""
    ctx = PassContext(Options(**options), tracer=Tracer(set(trace)) if trace else None)
    result = TestOnlyPass(*rules).run(model, ctx)
    verify(model)
    return dict(result.stats), (ctx.tracer.report() if trace else [])


# -- variables -------------------------------------------------------------------------------

def test_variable_bound_twice_binds_the_same_value():
    model = load("""
    g (float[4] x, float[4] y) => (float[4] sq, float[4] xy) {
        sq = Mul(x, x)
        xy = Mul(x, y)
    }""")
    found = match(TestOnlySquare, model, "sq")
    assert isinstance(found, Match) and found.bindings["x"].name == "x"
    missed = match(TestOnlySquare, model, "xy")
    assert isinstance(missed, Miss)
    assert "variable 'x' is %x elsewhere, here %y" in missed.reason
    stats, _ = run(model, TestOnlySquare)
    assert stats == {"TestOnlySquare": 1} and ops(model) == ["Pow", "Mul"]


# -- commuted operands -----------------------------------------------------------------------

def test_commutative_op_matches_both_operand_orders():
    model = load("""
    g (float[4] x) => (float[4] a, float[4] b) <float one = {1.0}> {
        a = Add(one, x)
        b = Add(x, one)
    }""")
    for out in ("a", "b"):
        found = match(TestOnlyAddOne, model, out)
        assert isinstance(found, Match) and found.bindings["x"].name == "x"
    assert run(model, TestOnlyAddOne)[0] == {"TestOnlyAddOne": 2}


def test_non_commutative_op_is_not_swapped():
    model = load("""
    g (float[4] x) => (float[4] a, float[4] b) <float one = {1.0}> {
        a = Sub(x, one)
        b = Sub(one, x)
    }""")
    assert isinstance(match(TestOnlySubOne, model, "a"), Match)
    missed = match(TestOnlySubOne, model, "b")
    assert isinstance(missed, Miss) and "expected constant ≈ 1.0, %x is not constant" in \
        missed.reason
    assert run(model, TestOnlySubOne)[0] == {"TestOnlySubOne": 1}
    assert ops(model) == ["Neg", "Sub"]


# -- constants -------------------------------------------------------------------------------

def test_float_literal_matches_close_scalars_only():
    """A literal stands for a scalar (0-d or one element): an all-equal tensor could broadcast
    the other operand to a shape the rewrite would not produce. Close means within 4 float32
    ulps (1.0000001 is one); 1.00001 is another number, which a fusion would change."""
    model = load("""
    g (float[4] x) => (float[4] a, float[4] b, float[4] c, float[4] d, float[4] e)
            <float one = {1.0000001}, float off = {1.00001},
            float[1] one1 = {1.0}, float[4] ones = {1.0, 1.0, 1.0, 1.0},
            float[1, 1] one11 = {1.0}> {
        a = Add(x, one)
        b = Add(x, one1)
        c = Add(x, ones)
        d = Add(x, one11)
        e = Add(x, off)
    }""")
    assert isinstance(match(TestOnlyAddOne, model, "a"), Match)
    assert "expected constant ≈ 1.0, got [1.0000100135803223]" in \
        match(TestOnlyAddOne, model, "e").reason
    assert isinstance(match(TestOnlyAddOne, model, "b"), Match)
    missed = match(TestOnlyAddOne, model, "c")
    assert isinstance(missed, Miss) and "expected constant ≈ 1.0, got [1.0, 1.0, 1.0, 1.0]" in \
        missed.reason
    assert isinstance(match(TestOnlyAddOne, model, "d"), Miss)


def test_float_literal_refuses_other_value_and_non_constants():
    model = load("""
    g (float[4] x, float[4] y, float z) => (float[4] a, float[4] b, float[4] c)
            <float two = {2.0}, float z = {1.0}> {
        a = Add(x, two)
        b = Add(x, y)
        c = Add(x, z)
    }""")
    assert "expected constant ≈ 1.0, got [2.0]" in match(TestOnlyAddOne, model, "a").reason
    assert "%y is not constant" in match(TestOnlyAddOne, model, "b").reason
    # An initializer that is also a graph input can be overridden by the caller: not constant.
    assert "%z is not constant" in match(TestOnlyAddOne, model, "c").reason
    assert run(model, TestOnlyAddOne)[0] == {}


def test_const_predicate_binds_the_array():
    model = load("""
    g (float[2] x) => (float[2] a, float[2] b) <float s = {3.0}, float[2] v = {1.0, 2.0}> {
        a = Mul(x, s)
        b = Mul(x, v)
    }""")
    found = match(TestOnlyScale, model, "a")
    assert isinstance(found, Match)
    scale = found.bindings["scale"]
    assert isinstance(scale, np.ndarray) and scale.shape == () and scale == 3.0
    missed = match(TestOnlyScale, model, "b")
    assert isinstance(missed, Miss) and "expected constant (predicate), got [1.0, 2.0]" in \
        missed.reason
    assert run(model, TestOnlyScale)[0] == {"TestOnlyScale": 1}


# -- attributes ------------------------------------------------------------------------------

def test_attr_binds_the_attribute_or_its_default():
    model = load("""
    g (float[2, 4] x) => (float[2, 4] a, float[2, 4] b) {
        a = Softmax <axis = 0> (x)
        b = Softmax(x)
    }""")
    assert match(TestOnlySoftmaxAxis, model, "a").bindings["axis"] == 0
    assert match(TestOnlySoftmaxAxis, model, "b").bindings["axis"] == -1
    run(model, TestOnlySoftmaxAxis)
    assert [n.attr("axis") for n in model.graph] == [0, -1]
    assert ops(model) == ["LogSoftmax", "LogSoftmax"]


def test_attribute_equality_refuses_other_values():
    model = load("""
    g (float[2, 4] x) => (float[2, 4] a, float[2, 4] b) {
        a = Softmax <axis = -1> (x)
        b = Softmax <axis = 0> (x)
    }""")
    assert isinstance(match(TestOnlySoftmaxLast, model, "a"), Match)
    missed = match(TestOnlySoftmaxLast, model, "b")
    assert isinstance(missed, Miss) and "attribute axis=0, expected -1" in missed.reason
    assert run(model, TestOnlySoftmaxLast)[0] == {"TestOnlySoftmaxLast": 1}


# -- optional inputs -------------------------------------------------------------------------

def test_one_of_matches_each_spelling_in_order():
    model = load("""
    g (float[4] x) => (float[4] a, float[4] b, float[4] c, float[4] d) <float k = {2.0}> {
        m = Mul(k, x)
        a = Relu(m)
        v = Div(x, k)
        b = Relu(v)
        c = Relu(x)
        s = Sub(x, k)
        d = Relu(s)
    }""")
    bound = {out: match(TestOnlyScaledRelu, model, out).bindings for out in "abcd"}
    assert bound["a"]["x"].name == "x" and float(bound["a"]["c"]) == 2.0  # commuted Mul
    assert bound["b"]["x"].name == "x" and "c" in bound["b"]
    assert bound["c"]["x"].name == "x" and "c" not in bound["c"]
    # The bare alternative binds Sub's output itself: OneOf falls through to the variable.
    assert bound["d"]["x"].name == "s" and "c" not in bound["d"]
    with pytest.raises(TypeError):
        OneOf(Const(1.0))


def test_optional_input_matches_present_and_omitted():
    model = load("""
    g (float[4] x) => (float[4] a, float[4] b, float[4] c) <float lo = {0.0}, float hi = {6.0}> {
        a = Clip(x)
        b = Clip(x, lo, hi)
        c = Clip(x, , hi)
    }""")
    bound = {out: match(TestOnlyClip, model, out).bindings for out in "abc"}
    assert set(bound["a"]) == {"x"}
    assert bound["b"]["lo"].name == "lo" and bound["b"]["hi"].name == "hi"
    assert "lo" not in bound["c"] and bound["c"]["hi"].name == "hi"
    assert run(model, TestOnlyClip)[0] == {"TestOnlyClip": 3}
    assert [[v.name if v else None for v in n.inputs] for n in model.graph] == [
        ["x", None, None], ["x", "lo", "hi"], ["x", None, "hi"]]


# -- diamonds --------------------------------------------------------------------------------

NORM = """
    g (float[2, 4] x) => (float[2, 4] y) {
        m = ReduceMean <axes = [-1]> (x)
        d = Sub(x, m)
        sq = Mul(d, d)
        v = ReduceMean <axes = [-1]> (sq)
        s = Sqrt(v)
        y = Div(DIVIDEND, s)
    }"""


def test_diamond_matches_when_both_uses_are_the_same_node():
    model = load(NORM.replace("DIVIDEND", "d"))
    found = match(TestOnlyNorm, model, "y")
    assert isinstance(found, Match)
    assert sorted(n.op_type for n in found.nodes) == sorted(
        ["Div", "Sub", "ReduceMean", "Sqrt", "ReduceMean", "Mul"])


def test_diamond_refuses_two_equal_but_distinct_nodes():
    # d2 computes what d does, but it is another node: the pattern's one Sub cannot be both.
    model = load(NORM.replace("DIVIDEND", "d2").replace("d = Sub(x, m)",
                                                         "d = Sub(x, m)\n d2 = Sub(x, m)"))
    missed = match(TestOnlyNorm, model, "y")
    assert isinstance(missed, Miss)
    assert "Sub should be" in missed.reason and "again" in missed.reason
    assert run(model, TestOnlyNorm)[0] == {}


def test_diamond_rewrite_leaves_no_dead_nodes():
    # BUG: graphopt/passes/rules.py apply() removes match.nodes once, in match order (root
    # first, then depth-first). With a diamond, the shared Sub is listed before the Mul that
    # reads it a second time, so when the Sub is visited it still has a use and is skipped; it
    # (and the ReduceMean feeding it) stay behind as dead nodes although the docstring promises
    # "drop dead nodes". Fix: repeat the removal sweep until it removes nothing, or visit
    # match.nodes in reverse topological order (consumers before producers).
    model = load(NORM.replace("DIVIDEND", "d"))
    assert run(model, TestOnlyNorm)[0] == {"TestOnlyNorm": 1}
    assert ops(model) == ["LpNormalization"], format_model(model)


# -- what a rule may delete ------------------------------------------------------------------

DOUBLE_NEG = """
    g (float[4] x) => (float[4] y{extra_out}) {{
        n = Neg(x)
        y = Neg(n)
        {extra}
    }}"""


def test_rule_does_not_fire_when_an_intermediate_has_another_reader():
    model = load(DOUBLE_NEG.format(extra_out=", float[4] z", extra="z = Relu(n)"))
    stats, traces = run(model, TestOnlyDoubleNeg, trace=("TestOnlyDoubleNeg",))
    assert stats == {} and ops(model) == ["Neg", "Neg", "Relu"]
    assert "pattern matched, refused: %n (from '') is also read by Relu ''" in traces[0]


def test_rule_does_not_fire_when_an_intermediate_is_a_graph_output():
    model = load(DOUBLE_NEG.format(extra_out=", float[4] n", extra=""))
    stats, traces = run(model, TestOnlyDoubleNeg, trace=("TestOnlyDoubleNeg",))
    assert stats == {} and ops(model) == ["Neg", "Neg"]
    assert "pattern matched, refused: %n (from '') is a graph output" in traces[0]


def test_root_output_that_is_a_graph_output_keeps_its_name():
    model = load(DOUBLE_NEG.format(extra_out="", extra=""))
    assert run(model, TestOnlyDoubleNeg)[0] == {"TestOnlyDoubleNeg": 1}
    assert ops(model) == ["Identity"]
    assert [v.name for v in model.graph.outputs] == ["y"]
    assert model.graph.outputs[0].producer.op_type == "Identity"
    onnx.checker.check_model(to_onnx(model))


# -- refusals and traces ---------------------------------------------------------------------

SHIFT = """
    g (float[4] x) => (float[4] y) <float c = {VALUE}> {
        a = Add(x, c)
        y = Relu(a)
    }"""


def test_check_refusal_stops_the_rewrite_and_is_traced():
    model = load(SHIFT.replace("VALUE", "-1.0"))
    stats, traces = run(model, TestOnlyPositiveShift, trace=("TestOnlyPositiveShift",))
    assert stats == {} and ops(model) == ["Add", "Relu"]
    assert traces == [("trace TestOnlyPositiveShift: at Relu '' (matched 2 pattern node(s)): "
                       "pattern matched, refused: shift -1.0 is not positive")]
    accepted = load(SHIFT.replace("VALUE", "1.0"))
    assert run(accepted, TestOnlyPositiveShift)[0] == {"TestOnlyPositiveShift": 1}


BROKEN_GELU = """
    g (float[2, 8] x) => (float[2, 8] y) <float s = {1.4142135}, float one = {1.0},
                                          float half = {0.5}> {
        d = Div(x, s)
        e = Tanh(d)
        a = Add(e, one)
        m = Mul(x, a)
        y = Mul(m, half)
    }"""


def test_trace_names_the_failed_pattern_node_closest_miss_first():
    model = load(BROKEN_GELU)
    stats, traces = run(model, GeluErf, trace=("GeluErf",))
    assert stats == {}
    assert len(traces) == 2  # the two Muls are both candidate roots
    assert traces[0].startswith("trace GeluErf: at Mul '' (matched 3 pattern node(s)): ")
    assert "expected Erf, %e comes from Tanh" in traces[0]
    assert "(matched 1 pattern node(s))" in traces[1]


def test_trace_reports_a_rule_without_candidates():
    model = load(SHIFT.replace("VALUE", "1.0"))
    _, traces = run(model, GeluErf, trace=("GeluErf",))
    assert traces == ["trace GeluErf: no candidate root in the graph"]


def test_rule_emitting_an_op_onnxruntime_lacks_does_not_fire():
    model = load("""
    g (float[4] x) => (float[4] y) {
        r = Relu(x)
        y = Relu(r)
    }""")
    stats, traces = run(model, TestOnlyNoKernel, trace=("TestOnlyNoKernel",))
    assert stats == {} and ops(model) == ["Relu", "Relu"]
    assert any("refused: onnxruntime has no com.microsoft::TestOnlyNoSuchFusedOp kernel" in line
               for line in traces), traces


def test_rule_with_dtypes_does_not_fire_on_float16():
    text = """
    g (DT[4] x) => (DT[4] y) {
        r = Relu(x)
        y = Relu(r)
    }"""
    model = load(text.replace("DT", "float16"))
    stats, traces = run(model, TestOnlyFloatOnly, trace=("TestOnlyFloatOnly",))
    assert stats == {} and ops(model) == ["Relu", "Relu"]
    assert any("refused: the fused kernel does not take f16 (only f32)" in line
               for line in traces), traces
    model = load(text.replace("DT", "float"))
    assert run(model, TestOnlyFloatOnly)[0] == {"TestOnlyFloatOnly": 1}


def test_disabled_rule_does_not_run():
    model = load(DOUBLE_NEG.format(extra_out="", extra=""))
    stats, _ = run(model, TestOnlyDoubleNeg, disabled_passes={"TestOnlyDoubleNeg"})
    assert stats == {} and ops(model) == ["Neg", "Neg"]


# -- cost ------------------------------------------------------------------------------------

def chain(n: int) -> onnx.ModelProto:
    """x → Add(·, c) → Relu → Add(·, c) → Relu … (n nodes) → Identity → y."""
    lines, prev = [], "x"
    for i in range(n // 2):
        lines += [f"a{i} = Add({prev}, c)", f"r{i} = Relu(a{i})"]
        prev = f"r{i}"
    lines.append(f"y = Identity({prev})")
    return onnx.parser.parse_model(HEADER + "g (float[4] x) => (float[4] y) <float c = {1.0}> {\n"
                                   + "\n".join(lines) + "\n}")


GRAPHOPT_DIR = os.path.dirname(graphopt.__file__)


def lines_run(proto, rules, trace=()) -> int:
    """How many lines of graphopt's code one run of the rules over `proto` executes: a measure
    of the work that, unlike a timing, does not depend on the machine or its load."""
    model = load_onnx(proto)
    ctx = PassContext(Options(), tracer=Tracer(set(trace)) if trace else None)
    count = 0

    def count_lines(frame, event, arg):
        nonlocal count
        count += event == "line"
        return count_lines

    def enter(frame, event, arg):  # trace graphopt's frames only: the rest is not its work
        return count_lines if frame.f_code.co_filename.startswith(GRAPHOPT_DIR) else None

    sys.settrace(enter)
    try:
        TestOnlyPass(*rules).run(model, ctx)
    finally:
        sys.settrace(None)
    return count


def test_matching_work_is_linear():
    # Every Relu is a candidate that matches five pattern nodes before missing; the tracer
    # records each near-miss. Four times the chain: four times the lines run (quadratic
    # matching would be sixteen).
    rules, trace = (TestOnlyDeepMiss,), ("TestOnlyDeepMiss",)
    small, large = lines_run(chain(200), rules, trace), lines_run(chain(800), rules, trace)
    assert large < 4.4 * small, (small, large)


def test_rewrite_work_is_linear():
    # Each rewrite names six new Relu values: naming the k-th one after one op type must not
    # cost O(k) (a probe of relu_1, relu_2, … from 1 on every call made this quadratic).
    small = lines_run(chain(100), (TestOnlyReluAdd,))
    large = lines_run(chain(400), (TestOnlyReluAdd,))
    assert large < 4.4 * small, (small, large)


# -- command line ----------------------------------------------------------------------------

def cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main([os.fspath(a) for a in argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


GELU_PAIR = """
    g (float[2, 8] x) => (float[2, 8] y, float[2, 8] z) <float s = {1.4142135}, float one = {1.0},
            float half = {0.5}, float three = {3.0}, float k = {0.044715},
            float c = {0.7978845608}> {
        d = Div(x, s)
        e = Erf(d)
        a = Add(e, one)
        m = Mul(x, a)
        y = Mul(m, half)
        p = Pow(x, three)
        pk = Mul(p, k)
        inner = Add(x, pk)
        t = Mul(inner, c)
        th = Tanh(t)
        ta = Add(th, one)
        h = Mul(x, half)
        z = Mul(h, ta)
    }"""


def save(tmp_path, text: str) -> str:
    path = tmp_path / "m.onnx"
    onnx.save(onnx.parser.parse_model(HEADER + text), path)
    return os.fspath(path)


def test_cli_trace_rule_names_the_failed_pattern_node(tmp_path, capsys):
    rc, out, err = cli(capsys, "optimize", save(tmp_path, BROKEN_GELU), "-o",
                       tmp_path / "out.onnx", "--trace-rule", "GeluErf")
    assert rc == 0, err
    lines = [line for line in out.splitlines() if line.startswith("trace GeluErf:")]
    assert lines and "expected Erf" in lines[0] and "comes from Tanh" in lines[0], out


def test_cli_unknown_trace_rule_is_a_one_line_error(tmp_path, capsys):
    rc, out, err = cli(capsys, "optimize", save(tmp_path, BROKEN_GELU), "-o",
                       tmp_path / "out.onnx", "--trace-rule", "NoSuchRule")
    assert rc == 1 and out == ""
    assert err.startswith("graphopt: error:") and err.count("\n") == 1 and "NoSuchRule" in err
    assert not (tmp_path / "out.onnx").exists()


def test_cli_disable_pass_accepts_a_rule_name(tmp_path, capsys):
    out_path = tmp_path / "out.onnx"
    rc, out, err = cli(capsys, "optimize", save(tmp_path, GELU_PAIR), "-o", out_path,
                       "--disable-pass", "GeluErf")
    assert rc == 0, err
    result = onnx.load(out_path)
    kinds = [(n.domain, n.op_type) for n in result.graph.node]
    assert ("", "Erf") in kinds and ("com.microsoft", "Gelu") not in kinds
    assert ("com.microsoft", "FastGelu") in kinds  # FuseGelu still ran its other rules
    assert "GeluTanh=1" in out


def test_cli_trace_rule_that_fired_says_so_and_lists_no_node_it_fused(tmp_path, capsys):
    # The Muls inside the GELU were tried as roots before the Mul that ends it matched: near-
    # misses at nodes the rule itself then removed, which read as "the rule failed".
    rc, out, err = cli(capsys, "optimize", save(tmp_path, GELU_PAIR), "-o",
                       tmp_path / "out.onnx", "--trace-rule", "GeluTanh", "--trace-rule",
                       "GeluErf")
    assert rc == 0, err
    lines = [line for line in out.splitlines() if line.startswith("trace GeluTanh:")]
    assert lines == ["trace GeluTanh: fired 1 time(s), and no other candidate came close"], out
    # Nodes another rule fused stay near-misses of this one: they say why it did not take them.
    lines = [line for line in out.splitlines() if line.startswith("trace GeluErf:")]
    assert lines[0] == "trace GeluErf: fired 1 time(s); the closest misses elsewhere:"
    assert "expected Mul, %p comes from Pow" in out


def test_cli_passes_lists_rules_with_their_pass(capsys):
    rc, out, _ = cli(capsys, "passes")
    assert rc == 0
    for rule in ("GeluErf", "GeluErfHalfFirst", "GeluErfMulForm", "GeluTanh", "GeluTanhHalfLast",
                 "QuickGelu", "BiasGelu"):
        assert any(line.split()[:2] == [rule, "FuseGelu"] for line in out.splitlines()), rule


CONV_BN_RELU = """
    g (float[1,2,4,4] x) => (float[1,2,4,4] y) {
        c = Conv(x, w)
        b = BatchNormalization(c, s, bias, mean, var)
        y = Relu(b)
    }"""


@pytest.mark.parametrize("rule, extra, reason", [
    ("ConvRelu", [], "its pass FuseActivation does not run at -O2"),
    ("ConvBatchNorm", [], "fired 1 time(s), and no other candidate came close"),
    ("ConvBatchNorm", ["--disable-pass", "FuseConvBatchNorm"],
     "switched off (FuseConvBatchNorm is disabled)"),
])
def test_cli_trace_rule_says_why_a_rule_left_no_near_miss(tmp_path, capsys, rule, extra, reason):
    weights = "".join(f", float[2] {n} = {{1.0, 0.5}}" for n in ("s", "bias", "mean", "var"))
    text = CONV_BN_RELU.replace("{", "<float[2,2,1,1] w = {1.0, 0.0, 0.0, 1.0}" + weights + ">\n{",
                                1)
    rc, out, err = cli(capsys, "optimize", save(tmp_path, text), "-o", tmp_path / "out.onnx",
                       "--trace-rule", rule, *extra)
    assert rc == 0, err
    assert f"trace {rule}: {reason}" in out


def test_a_miss_names_every_alternative_that_failed_on_the_same_value():
    # Relu(Mul | Div | x) at a Relu of a Sigmoid: "x" binds, so use a OneOf of ops alone.
    class MulOrDiv(Rule):
        __test__ = False

        def pattern(self, op, x):
            scale = Const(pred=lambda a: a.size == 1, name="c")
            return op.Relu(OneOf(op.Mul(x, scale), op.Div(x, scale)))

        def rewrite(self, op, x, c=None):
            return op.Relu(x)

    model = load("""
    g (float[2, 8] x) => (float[2, 8] y) {
        s = Sigmoid(x)
        y = Relu(s)
    }""")
    miss = Matcher(MulOrDiv().build_pattern()).match(producer(model, "y"))
    assert isinstance(miss, Miss)
    assert "expected Mul or Div, %s comes from Sigmoid" in miss.reason, miss.reason
