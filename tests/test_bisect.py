"""`graphopt bisect`: a deliberately wrong rewrite found at its rule and anchor in about log2
evaluations; clean models; passes that ask no gate; and the gate calls in folding and cleanups."""

from __future__ import annotations

import itertools
import json
import math
import re

import numpy as np
import onnx
import pytest
from helpers import PerturbWeights, parse_model, run_cli

import graphopt.compiler
from graphopt import numerics, zoo
from graphopt.compiler import optimize
from graphopt.errors import OptionError
from graphopt.ir import Tensor, format_model, to_onnx
from graphopt.numerics import compare, random_feeds, run
from graphopt.passes import PASSES, FixedPoint, Pass, PassResult, Pipeline, pipelines
from graphopt.passes.base import anchor_key
from graphopt.passes.fusion.conv_bn import FuseConvBatchNorm
from graphopt.passes.rules import Rule, RulePass
from graphopt.tools.bisect import bisect
from graphopt.tools.bisect_compile import NondeterministicCompile, Setup, compile_prefix

TOL = {"rtol": 1e-4, "atol": 1e-5}


class WrongClip(Rule):
    """Test-only: Clip(x, 0, 6) -> Sigmoid(x), numerically wrong, at the one Clip whose input
    feeds the node named `target` (the fixture sets it)."""

    name = "TestBisectWrongClip"
    target = ""

    def pattern(self, op, x, lo, hi):
        return op.Clip(x, lo, hi)

    def check(self, x, **_):
        clips = [n for n in x.consumers() if n.op_type == "Clip"]
        return None if any(anchor_key(n) == self.target for n in clips) else "not the target"

    def rewrite(self, op, x, **_):
        return op.Sigmoid(x)


class ReluToMax(Rule):
    """Test-only and correct: Relu(x) -> Max(x, 0)."""

    name = "TestBisectReluToMax"

    def pattern(self, op, x):
        return op.Relu(x)

    def rewrite(self, op, x):
        return op.Max(x, op.const(np.zeros((), np.float32)))


class ReluToMaxPass(RulePass):
    name = "TestBisectReluToMax"
    description = "Relu into Max(x, 0) (test only)"
    rules = (ReluToMax,)


class BreakMax(Pass):
    """Test-only miscompile that asks no gate: every Max becomes a Min."""

    name = "TestBisectBreakMax"
    description = "Max into Min (a deliberate miscompile)"

    def run(self, model, ctx) -> PassResult:
        result = PassResult()
        for node in model.graph:
            if node.op_type == "Max":
                node.op_type = "Min"
                result.count("Max")
        return result


class SilentBreakRelu(Pass):
    """Test-only miscompile that asks no gate and reports no change: every Relu becomes Abs."""

    name = "TestBisectSilentBreakRelu"
    description = "Relu into Abs, unreported (a deliberate miscompile)"

    def run(self, model, ctx) -> PassResult:
        for node in model.graph:
            if node.op_type == "Relu":
                node.op_type = "Abs"
        return PassResult()


_flaky_runs = itertools.count()


class FlakyGate(Pass):
    """Test-only: asks the gate about a different node in every compile, then miscompiles."""

    name = "TestBisectFlakyGate"
    description = "a nondeterministic gated miscompile"

    def run(self, model, ctx) -> PassResult:
        nodes = model.graph.nodes()
        if ctx.allows("Flaky", nodes[next(_flaky_runs) % len(nodes)]):
            return PerturbWeights().run(model, ctx)
        return PassResult()


class NudgeOneWeight(Pass):
    """Test-only, off by rounding alone: one element of the Add's constant, 4.5 among values
    up to 900, moves by 0.01 (1.1e-5 of the largest; past rtol 1e-4 of the element)."""

    name = "TestBisectNudgeOneWeight"
    description = "move one weight by a rounding's worth at the output's scale"

    def run(self, model, ctx) -> PassResult:
        result = PassResult()
        for node in model.graph:
            value = node.inputs[1]
            if node.op_type == "Add" and ctx.allows("Nudge", node):
                array = value.constant().copy()
                array[0, 100] += 0.01
                value.const = Tensor(array)
                result.count("Nudge")
        return result


class ShiftTheAdd(Pass):
    """Test-only miscompile, gated: the Add's constant moves by 1."""

    name = "TestBisectShiftTheAdd"
    description = "add 1 to the Add's constant (a deliberate miscompile)"

    def run(self, model, ctx) -> PassResult:
        result = PassResult()
        for node in model.graph:
            if node.op_type == "Add" and ctx.allows("Shift", node):
                node.inputs[1].const = Tensor(node.inputs[1].constant() + 1)
                result.count("Shift")
        return result


class UnloadableSoftmax(Pass):
    """Test-only miscompile, gated: one Softmax gets an axis past its input's rank, which
    onnxruntime refuses at load, so optimize's final check refuses the compile."""

    name = "TestBisectUnloadableSoftmax"
    description = "a Softmax's axis to 7 (a deliberate miscompile)"
    target = "s2"

    def run(self, model, ctx) -> PassResult:
        result = PassResult()
        for node in model.graph:
            if node.op_type == "Softmax" and ctx.allows("Axis", node):
                if node.outputs[0].name == self.target:
                    node.set_attr("axis", 7)
                result.count("Axis")
        return result


def _with_pipeline(monkeypatch, steps, *passes) -> None:
    for cls in passes:
        monkeypatch.setitem(PASSES, cls.name, cls)
    monkeypatch.setitem(pipelines.PIPELINES, 2, Pipeline("O2-test", "a test pipeline", steps))


@pytest.fixture(scope="module")
def mobilenet():
    return zoo.build("mobilenetv2", width=0.35, image_size=64)


@pytest.fixture
def wrong_clip(monkeypatch):
    monkeypatch.setattr(FuseConvBatchNorm, "rules", FuseConvBatchNorm.rules + (WrongClip,))

    def aim(anchor: str) -> None:
        monkeypatch.setattr(WrongClip, "target", anchor)
    return aim


# ---------------------------------------------------------------------------------------------
# A wrong rule at one node among many
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("anchor", ["/features/features.5/conv/conv.1/conv.1.2/Clip",
                                    "/features/features.16/conv/conv.0/conv.0.2/Clip"])
def test_finds_the_wrong_rule_at_its_anchor_in_log2_evaluations(mobilenet, wrong_clip, anchor):
    wrong_clip(anchor)
    clips = [n for n in mobilenet.graph.node if n.op_type == "Clip"]
    assert len(clips) > 30 and anchor in [n.name for n in clips]
    lines = []
    result = bisect(mobilenet, level=2, progress=lines.append, **TOL)
    assert result.found and result.granularity == "rewrite"
    assert (result.pass_name, result.rule, result.anchor) == \
        ("FuseConvBatchNorm", "TestBisectWrongClip", anchor)
    assert result.total_rewrites > 150
    assert result.evaluations <= math.ceil(math.log2(result.total_rewrites)) + 3
    assert len(lines) == result.evaluations and all("evaluation" in line for line in lines)
    assert "outputs differ" in lines[0] and "'logits'" in result.problem
    removed = [line for line in result.before_lines if line.startswith("- ")]
    created = [line for line in result.after_lines if line.startswith("+ ")]
    assert any("= Clip(" in line and line.endswith(f"# {anchor}") for line in removed)
    assert any("= Sigmoid(" in line for line in created)
    assert not any("Sigmoid" in line for line in result.before_lines)
    # Context: the Conv producing the Clip's input is shown on both sides, unmarked.
    assert any(line.startswith("  ") and "= Conv(" in line for line in result.before_lines)
    # The pass run is the one of the manager's log, and the rule fired there.
    log = optimize(mobilenet, level=2).log.records
    assert log[result.pass_run - 1].name == "FuseConvBatchNorm"
    assert log[result.pass_run - 1].stats.get("TestBisectWrongClip") == 1
    assert 1 <= result.rewrite_in_run <= result.rewrites_in_run


def test_cli_reports_the_culprit_and_exits_1(mobilenet, wrong_clip, tmp_path, capsys):
    anchor = "/features/features.5/conv/conv.1/conv.1.2/Clip"
    wrong_clip(anchor)
    path = tmp_path / "m.onnx"
    onnx.save(mobilenet, path)
    rc, out, err = run_cli(capsys, "bisect", path)
    assert rc == 1, err
    assert "culprit pass:    FuseConvBatchNorm (pass run" in out
    assert f"culprit rewrite: TestBisectWrongClip at {anchor}" in out
    assert "- " in out and "+ " in out and "Sigmoid" in out
    assert "bisect: evaluation 1: full compile" in err
    n = int(re.search(r"binary search over (\d+) rewrite", out)[1])  # n + 1 answers to tell
    assert f"(at most ceil(log2 {n + 1}) = {math.ceil(math.log2(n + 1))} steps)" in out
    rc, out, err = run_cli(capsys, "bisect", path, "--json")
    assert rc == 1
    data = json.loads(out)
    assert data["rule"] == "TestBisectWrongClip" and data["anchor"] == anchor


def test_passes_switched_off_for_the_compile_are_off_in_every_compile_bisect_makes(
        mobilenet, wrong_clip, tmp_path, capsys, monkeypatch):
    # A compile made with FuseConvBatchNorm off is clean; bisect without the switch had
    # bisected another compile, and named a culprit the user's compile never ran.
    wrong_clip("/features/features.5/conv/conv.1/conv.1.2/Clip")
    path = tmp_path / "m.onnx"
    onnx.save(mobilenet, path)
    (tmp_path / "switches.cfg").write_text("FuseConvBatchNorm: off\n")
    for switch in (["--disable-pass", "FuseConvBatchNorm"],
                   ["--switch-file", tmp_path / "switches.cfg"],
                   ["--fusion-switch-file", tmp_path / "switches.cfg"]):
        rc, out, err = run_cli(capsys, "bisect", path, *switch)
        assert rc == 0, (switch, err)
        assert "m.onnx at O2 with FuseConvBatchNorm off, on seeded random inputs: " \
            "the full compile is within" in out
    # A rule switched off alone: the pass's other rules still fold the BatchNorms.
    result = bisect(path, disable_passes=["TestBisectWrongClip"], **TOL)
    assert not result.found and result.switched_off == ["TestBisectWrongClip"]
    assert result.total_rewrites > 150
    # Every compile of a search gets the fold limit, not only the first.
    import graphopt.compiler

    limits = []
    compile_once = graphopt.compiler.optimize

    def recorded(*args, **kwargs):
        limits.append(kwargs.get("fold_size_limit"))
        return compile_once(*args, **kwargs)
    monkeypatch.setattr(graphopt.compiler, "optimize", recorded)
    rc, out, err = run_cli(capsys, "bisect", path, "--fold-size-limit", "2K")
    assert rc == 1 and "culprit rewrite: TestBisectWrongClip" in out
    assert len(limits) > 5 and set(limits) == {2048}
    rc, out, err = run_cli(capsys, "bisect", path, "--disable-pass", "FuseConvBN")
    assert rc == 2 and not out
    assert "--disable-pass: unknown pass or rule FuseConvBN" in err


# ---------------------------------------------------------------------------------------------
# Nothing to find; errors
# ---------------------------------------------------------------------------------------------
def test_clean_model_has_no_culprit(tmp_path, capsys):
    path = tmp_path / "tiny.onnx"
    onnx.save(zoo.build("tiny"), path)
    result = bisect(path, level=3, **TOL)
    assert not result.found and result.evaluations == 1 and result.total_rewrites > 10
    rc, out, err = run_cli(capsys, "bisect", path, "-O", "3")
    assert rc == 0, err
    assert "within allclose(rtol=0.0001, atol=1e-05), nothing to bisect" in out
    assert "1 evaluation: the full compile" in out
    # compare of the .om may still differ: its sessions run onnxruntime's optimizer too.
    assert "note: bisect runs the compiled graph at ORT_DISABLE_ALL; an .om's sessions also " \
        "run onnxruntime's own optimizer" in out
    # The head says what was compiled and what it ran on.
    rc, out, err = run_cli(capsys, "bisect", path, "--target", "ascend310")
    assert rc == 0, err
    assert "tiny.onnx at O2 for target ascend310, on seeded random inputs: " in out


def test_outputs_off_by_rounding_alone_pass_the_default_rule_as_under_verify(monkeypatch,
                                                                             tmp_path, capsys):
    # PaddleOCR's detector compiled for cpu passed --verify and compare by the rounding
    # allowance while bisect named LayoutNchwc as the culprit and exited 1.
    _with_pipeline(monkeypatch, ("InferShapes", NudgeOneWeight.name), NudgeOneWeight)
    values = np.linspace(-900, 900, 200, dtype=np.float32).reshape(1, 200)
    path = tmp_path / "add.onnx"
    onnx.save(parse_model("g (float[1, 200] x) => (float[1, 200] y) { y = Add(x, v) }",
                          v=values), path)
    result = bisect(path)
    assert not result.found and result.total_rewrites == 1
    assert "within rtol of the output's largest magnitude" in result.rounding_note
    rc, out, err = run_cli(capsys, "bisect", path)
    assert rc == 0, out
    assert "the full compile is within allclose(rtol=0.0001, atol=1e-05) but for rounding " \
           "(see note), nothing to bisect" in out
    assert "note: outputs differ from the original" in out
    assert "evaluation 1: full compile, 1 rewrites in 2 pass runs: ok (rounding alone" in err
    # Tolerances given apply as given, even at the defaults' values, as compare applies them.
    strict = bisect(path, rtol=1e-4, atol=1e-5)
    assert strict.found and strict.rule == "Nudge" and not strict.rounding_note
    rc, out, _ = run_cli(capsys, "bisect", path, "--rtol", "1e-4", "--atol", "1e-5")
    assert rc == 1 and "culprit pass:    TestBisectNudgeOneWeight" in out


def _nudged_then_shifted(monkeypatch, tmp_path):
    """An Add of values up to 900 under a pipeline that nudges a weight (within rounding)
    and then shifts the Add (beyond it): the path of the model."""
    _with_pipeline(monkeypatch, ("InferShapes", NudgeOneWeight.name, ShiftTheAdd.name),
                   NudgeOneWeight, ShiftTheAdd)
    values = np.linspace(-900, 900, 200, dtype=np.float32).reshape(1, 200)
    path = tmp_path / "add.onnx"
    onnx.save(parse_model("g (float[1, 200] x) => (float[1, 200] y) { y = Add(x, v) }",
                          v=values), path)
    return path


def test_a_culprits_report_keeps_the_note_an_evaluation_passed_by(monkeypatch, tmp_path,
                                                                   capsys):
    # The search's progress said "ok (rounding alone, see note)" of the nudge's prefix, and
    # the report of the culprit after it had no note to see.
    path = _nudged_then_shifted(monkeypatch, tmp_path)
    rc, out, err = run_cli(capsys, "bisect", path)
    assert rc == 1 and "culprit rewrite: Shift at %y" in out
    assert "ok (rounding alone, see note)" in err
    assert "note: an evaluation passed by rounding alone: outputs differ" in out


def test_the_original_runs_once_at_enable_all_however_many_evaluations_fail(monkeypatch,
                                                                            tmp_path):
    # Each evaluation outside rtol/atol ran the original again at ORT_ENABLE_ALL for the
    # rounding allowance's baseline: a large model's bisect paid that per failing compile.
    path = _nudged_then_shifted(monkeypatch, tmp_path)
    levels = []
    run = numerics.run

    def counted(model, feeds, level="disable", *args, **kwargs):
        levels.append(level)
        return run(model, feeds, level, *args, **kwargs)

    monkeypatch.setattr(numerics, "run", counted)
    result = bisect(path)
    assert result.found and result.rule == "Shift"
    # Both evaluations (the full compile, then the prefix that only nudges) fall outside
    # rtol/atol; the original ran at ENABLE_ALL for the first alone.
    assert result.evaluations == 2 and levels.count("all") == 1


def test_open_dims_set_to_1_are_said_as_compare_says_them(tmp_path, capsys):
    # PaddleOCR's recognizer ran on a 1×1 image and reported "nothing to bisect", unsaid.
    path = tmp_path / "dyn.onnx"
    onnx.save(parse_model("g (float[N, S, 8] x) => (float[N, S, 8] y) { y = Relu (x) }"), path)
    assert bisect(path).inputs == "seeded random inputs (open dims set to 1: x [1,1,8])"
    rc, out, err = run_cli(capsys, "bisect", path)
    assert rc == 0, err
    assert "dyn.onnx at O2, on seeded random inputs (open dims set to 1: x [1,1,8]): " in out
    # Pinned, or a batch of one only, there is nothing to say.
    assert bisect(path, input_shapes={"x": [1, 4, 8]}).inputs == "seeded random inputs"
    assert bisect(path, input_shapes={"x": [-1, 4, 8]}).inputs == "seeded random inputs"


def test_outputs_with_no_element_are_said_to_be_uncompared(tmp_path, capsys):
    path = tmp_path / "relu.onnx"
    onnx.save(parse_model("""
agraph (float[N,4] x) => (float[N,4] y) {
    h = Relu (x)
    y = Relu (h)
}
"""), path)
    result = bisect(path, input_shapes={"x": [0, 4]})
    assert not result.found and result.empty_outputs == ["y"]
    rc, out, err = run_cli(capsys, "bisect", path, "--input-shape", "x:0,4")
    assert rc == 0, err
    assert "note: output(s) y hold no element at these input shapes: nothing of them was " \
           "compared" in out
    assert bisect(path, input_shapes={"x": [2, 4]}).empty_outputs == []


def test_errors_name_the_option(tmp_path, capsys):
    rc, out, err = run_cli(capsys, "bisect", tmp_path / "missing.onnx")
    assert rc == 2 and "missing.onnx" in err and not out
    path = tmp_path / "tiny.onnx"
    onnx.save(zoo.build("tiny"), path)
    (tmp_path / "bad.npz").write_text("not npz")
    rc, out, err = run_cli(capsys, "bisect", path, "--inputs", tmp_path / "bad.npz")
    assert rc == 2 and "--inputs" in err and not out
    # An AttributeError ('list' object has no attribute 'items') had come through.
    with pytest.raises(OptionError, match=r"^input_shapes: expected a dict, got \[1, 3\]$"):
        bisect(path, input_shapes=[1, 3])


@pytest.mark.parametrize("keywords, message", [
    # No output passes rtol=-1, atol=nan or a cosine of 5: each had named a culprit.
    ({"rtol": -1}, r"^rtol: expected a finite number ≥ 0, got -1$"),
    ({"atol": float("nan")}, r"^atol: expected a finite number ≥ 0, got nan$"),
    ({"min_cosine": 5}, r"^min_cosine must be between -1 and 1, got 5$"),
    # numpy's UFuncTypeError, codegen's TypeError and "optimization level 2 does not exist"
    ({"rtol": "1e-3"}, r"^rtol: expected a number, got '1e-3'$"),
    ({"feeds": [np.ones((1, 4), np.float32)]},
     r"^feeds: expected a dict of input arrays or an \.npz path, got \[array\("),
    ({"level": "2"}, r"^level: expected an integer, got '2'$"),
    # and TypeErrors, or "no" taken for True
    ({"calibration": 5, "quantize": "int8"}, r"^calibration: expected a path"),
    ({"pass_options": 5}, r"^pass_options: expected a dict, got 5$"),
    ({"allow_custom_ops": "no"}, r"^allow_custom_ops: expected True or False, got 'no'$"),
    ({"progress": 5}, r"^progress: expected a function taking a line of text, got 5$"),
])
def test_options_of_the_wrong_kind_are_named_as_compare_and_optimize_name_them(keywords,
                                                                                message):
    model = parse_model("g (float[1, 4] x) => (float[1, 4] y) { y = Relu (x) }")
    with pytest.raises(OptionError, match=message):
        bisect(model, **keywords)


def test_feeds_may_be_any_mapping():
    from types import MappingProxyType

    model = parse_model("g (float[1, 4] x) => (float[1, 4] y) { y = Relu (x) }")
    feeds = MappingProxyType({"x": np.ones((1, 4), np.float32)})
    assert bisect(model, feeds=feeds).inputs == "the given inputs"


# ---------------------------------------------------------------------------------------------
# Precision compiles
# ---------------------------------------------------------------------------------------------
def test_a_lossy_compile_is_judged_by_cosine_unless_a_rule_is_given(tmp_path, capsys):
    path = tmp_path / "tiny.onnx"
    onnx.save(zoo.build("tiny"), path)
    # fp16 rounds every output past allclose(1e-4, 1e-5) by design; cosine 0.999 holds.
    result = bisect(path, precision="fp16")
    assert not result.found and result.judged_by == "cosine >= 0.999, norm within ±4.5%"
    assert "ConvertPrecision, lossy by design" in result.rule_note
    # A bound of 0 is a cosine rule too, not "no rule".
    loose = bisect(path, precision="fp16", min_cosine=0.0)
    assert not loose.found and loose.judged_by == "cosine >= 0" and not loose.rule_note
    rc, out, err = run_cli(capsys, "bisect", path, "--precision", "fp16")
    assert rc == 0, err
    assert "at O2+ConvertPrecision, on seeded random inputs: the full compile is within " \
           "cosine >= 0.999, norm within ±4.5%, nothing to bisect" in out
    assert "note: compiled with ConvertPrecision" in out and "--min-cosine C or --rtol" in out
    # A rule given is the rule: ConvertPrecision asks no gate, so it is named by its pass run.
    rc, out, err = run_cli(capsys, "bisect", path, "--precision", "fp16", "--rtol", "1e-5",
                           "--json")
    assert rc == 1, err
    data = json.loads(out)
    assert data["judged_by"] == "allclose(rtol=1e-05, atol=1e-05)" and not data["rule_note"]
    assert (data["granularity"], data["pass_name"]) == ("pass", "ConvertPrecision")
    rc, out, err = run_cli(capsys, "bisect", path, "--precision", "fp16", "--min-cosine", "0.9",
                           "--atol", "1")
    assert rc == 2 and "--min-cosine replaces the --rtol/--atol rule" in err


def test_int8_rewrites_are_bisected_to_the_layer(tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(zoo.build("tiny"), path)
    calibration = tmp_path / "calibration.npz"
    feeds = random_feeds(zoo.build("tiny"), seed=1)
    np.savez(calibration, **feeds)
    result = bisect(path, quantize="int8", calibration=calibration, feeds=feeds)
    assert not result.found and result.judged_by == "cosine >= 0.999, norm within ±4.5%"
    # Under a rule no int8 layer keeps, the first layer QuantizeInt8 asks the gate for is it.
    strict = bisect(path, quantize="int8", calibration=calibration, feeds=feeds,
                    min_cosine=0.9999999)
    assert strict.found and strict.granularity == "rewrite"
    assert strict.pass_name == "QuantizeInt8" and strict.rule == "QuantizeInt8"
    assert strict.rewrite_in_run == 1
    assert any("QuantizeLinear" in line for line in strict.after_lines)


# ---------------------------------------------------------------------------------------------
# Passes that ask no gate
# ---------------------------------------------------------------------------------------------
def test_pass_without_gate_is_reported_at_pass_granularity(monkeypatch):
    _with_pipeline(monkeypatch, ("InferShapes", "ConstantToInitializer",
                                 FixedPoint(("EliminateIdentity", "EliminateNoOps",
                                             "EliminateDeadNodes")),
                                 PerturbWeights.name, "EliminateDeadNodes"), PerturbWeights)
    model = zoo.build("tiny")
    result = bisect(model, level=2, **TOL)
    assert result.found and result.granularity == "pass"
    assert result.pass_name == PerturbWeights.name and result.rule is None
    # Every compile breaks (the pass asks no gate), so the run is one of the compile allowing none.
    assert result.allowed == 0
    runs = [r.name for r in compile_prefix(Setup(model, "<model>", 2), 0).runs]
    assert runs[result.pass_run - 1] == PerturbWeights.name
    assert result.evaluations <= math.ceil(math.log2(result.total_rewrites + 1)) + \
        math.ceil(math.log2(len(runs) + 1)) + 1
    # Its change: initializers with new data, shown with the nodes reading them.
    assert any(line.startswith("- %") and "initializer" in line for line in result.before_lines)
    assert any(line.startswith("+ %") and "initializer" in line for line in result.after_lines)
    assert any(line.startswith("  ") and "= Conv(" in line for line in result.after_lines)


def test_pass_without_gate_that_breaks_only_after_a_rewrite_names_both(monkeypatch):
    _with_pipeline(monkeypatch, ("InferShapes", ReluToMaxPass.name, BreakMax.name,
                                 "EliminateDeadNodes"), ReluToMaxPass, BreakMax)
    model = parse_model("""
agraph (float[2,8] x) => (float[2,8] y) {
    a = Neg (x)
    b = Relu (a)
    y = Abs (b)
}
""")
    result = bisect(model, level=2, **TOL)
    assert result.found and result.granularity == "pass" and result.pass_name == BreakMax.name
    assert result.pass_run == 3 and "TestBisectReluToMax" in result.enabled_by
    # Full, no rewrite, the rewrite's run alone, and one step of the search over every run
    # after it (a run that reports no change may still have made one).
    assert result.evaluations == 4
    assert any("= Min(" in line for line in result.after_lines)


def test_a_pass_that_changes_the_model_without_saying_so_is_named(monkeypatch):
    # Only runs that reported a change were searched: the import was blamed.
    _with_pipeline(monkeypatch, ("InferShapes", SilentBreakRelu.name, "EliminateDeadNodes"),
                   SilentBreakRelu)
    model = parse_model("""
agraph (float[2,8] x) => (float[2,8] y) {
    a = Neg (x)
    y = Relu (a)
}
""")
    result = bisect(model, level=2, **TOL)
    assert result.found and result.granularity == "pass", result.granularity
    assert result.pass_name == SilentBreakRelu.name and result.pass_run == 2


def test_a_rewrite_whose_model_onnxruntime_refuses_to_load_is_found(monkeypatch):
    # optimize's final load check refused the compile, and bisect ended with that error,
    # the one that tells the user to find the pass, instead of finding it.
    _with_pipeline(monkeypatch, ("InferShapes", UnloadableSoftmax.name), UnloadableSoftmax)
    model = parse_model("""
agraph (float[2,8] x) => (float[2,8] y) {
    s1 = Softmax <axis = 1> (x)
    s2 = Softmax <axis = 1> (s1)
    s3 = Softmax <axis = 1> (s2)
    y = Neg (s3)
}
""")
    lines = []
    result = bisect(model, level=2, progress=lines.append, **TOL)
    assert result.found and result.granularity == "rewrite", result.granularity
    assert (result.pass_name, result.rule) == (UnloadableSoftmax.name, "Axis")
    assert "does not run" in lines[0], lines


def test_a_model_onnxruntime_refuses_once_shapes_fold_is_not_blamed_on_a_rewrite(monkeypatch):
    # The model is at fault (onnxruntime loads the original only with its optimizer off): the
    # search would blame whichever pass ran first.
    from graphopt import compile_checks
    from graphopt.errors import ModelAtFault

    def at_fault(model, label, given, device=""):
        raise ModelAtFault(f"{label}: onnxruntime loads the original only with its graph "
                           "optimizations off")

    monkeypatch.setattr(compile_checks, "check_loads", at_fault)
    monkeypatch.setattr(graphopt.compiler, "check_loads", at_fault)
    with pytest.raises(ModelAtFault, match="only with its graph optimizations off"):
        bisect(zoo.build("tiny"), level=2, **TOL)


def test_nondeterministic_compile_is_named(monkeypatch):
    _with_pipeline(monkeypatch, ("InferShapes", FlakyGate.name), FlakyGate)
    model = zoo.build("tiny")
    with pytest.raises(NondeterministicCompile, match="not deterministic"):
        bisect(model, level=2, **TOL)


# ---------------------------------------------------------------------------------------------
# The gate calls of folding and cleanups, and the driver
# ---------------------------------------------------------------------------------------------
# The weights are larger than the constants CSE compares by value: only
# MergeDuplicateInitializers makes them one.
DUPLICATES = """
agraph (float[8,10] x) => (float[80] y, float[8,10] z) {
    c = Constant <value = float[1] {2.0}> ()
    i = Identity (x)
    s = Shape (i)
    n = Cast <to = 1> (i)
    m = Mul (n, c)
    r1 = Relu (m)
    r2 = Relu (m)
    e = Add (r1, w1)
    f = Add (r2, w2)
    k = Concat <axis = 0> (s3, s4)
    g = Mul (e, f)
    h = Reshape (g, k)
    y = Reshape (h, s12)
    z = Reshape (g, s)
}
"""


def _duplicates():
    w = np.arange(80, dtype=np.float32).reshape(8, 10)
    return parse_model(DUPLICATES, w1=w, w2=w.copy(), s3=np.array([10], np.int64),
                       s4=np.array([8], np.int64), s12=np.array([80], np.int64))


GATED = {"ConstantToInitializer", "EliminateIdentity", "FoldShapes", "FoldConstants",
         "EliminateNoOps", "EliminateCommonSubexpressions", "MergeDuplicateInitializers"}


@pytest.mark.parametrize("level", [2, 3])
def test_folding_and_cleanups_ask_the_gate_and_a_denied_rewrite_changes_nothing(level):
    seen = []

    def record(pass_name, rule, node):
        seen.append(pass_name)
        return True

    optimize(_duplicates(), level=level, rewrite_gate=record)
    assert GATED <= set(seen)
    feeds = random_feeds(_duplicates(), seed=1)
    expected = run(_duplicates(), feeds)
    calls = itertools.count()
    for name, gate in [("none", lambda p, r, n: False),
                       ("every other", lambda p, r, n: next(calls) % 2 == 0)]:
        result = optimize(_duplicates(), level=level, rewrite_gate=gate)
        assert not any("fixed point" in note for note in result.notes), name
        proto = to_onnx(result.model)
        onnx.checker.check_model(proto)
        assert not compare(expected, run(proto, feeds), **TOL), name
        if name == "none":
            # A denied rewrite is not a change: no gated pass reports one, no group sweeps twice.
            changed = {r.name for r in result.log.records if r.changed}
            assert not changed & GATED, changed
            assert max(r.iteration for r in result.log.records) == 1


@pytest.mark.parametrize("name, level, target", [("tiny", 3, None), ("tiny", 2, "cpu"),
                                                  ("mobilenetv2", 2, None)])
def test_bisect_driver_compiles_what_optimize_does(name, level, target):
    model = zoo.build(name, width=0.35, image_size=64) if name == "mobilenetv2" else zoo.build(name)
    expected = optimize(model, level=level, target=target)
    from graphopt.partition import load_target

    setup = Setup(model, "<model>", level, load_target(target) if target else None)
    compiled = compile_prefix(setup, None)
    assert format_model(compiled.model) == format_model(expected.model)
    assert [r.name for r in compiled.runs] == [r.name for r in expected.log.records]


def test_inputs_that_do_not_fit_name_the_file_and_the_input(tmp_path, capsys):
    source = tmp_path / "tiny.onnx"
    onnx.save(zoo.build("tiny"), source)
    inputs = tmp_path / "wrong.npz"
    np.savez(inputs, input=np.zeros((1, 3, 8, 8), np.float32))
    for command in (["bisect", source], ["optimize", source, "-o", tmp_path / "x.onnx", "--verify"]):
        rc, _, err = run_cli(capsys, *command, "--inputs", inputs)
        status = 2 if command[0] == "bisect" else 1  # bisect's 1 says it found a culprit
        assert rc == status and f"--inputs {inputs}: input 'input' has shape [1, 3, 8, 8]" in err


def test_pins_are_checked_against_the_model_and_the_inputs(tmp_path, capsys):
    # A pin the model or the --inputs contradict is the option's fault: bisect had named the
    # import as the culprit, or relayed onnxruntime's advice line without its reason.
    source = tmp_path / "tiny.onnx"
    onnx.save(zoo.build("tiny"), source)
    rc, _, err = run_cli(capsys, "bisect", source, "--input-shape", "input:2,3,32,32")
    assert rc == 2 and ("input 'input' dim 0 is fixed to 1 by " in err
                        and "cannot pin it to 2" in err), err
    dynamic = tmp_path / "dyn.onnx"
    onnx.save(parse_model("g (float[N, S, 8] x) => (float[N, S, 8] y) { y = Relu (x) }"),
              dynamic)
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=np.ones((2, 3, 8), np.float32))
    rc, _, err = run_cli(capsys, "bisect", dynamic, "--inputs", inputs,
                         "--input-shape", "x:1,1,8")
    assert rc == 2 and (f"--input-shape pins input 'x' to [1, 1, 8], but --inputs {inputs} "
                        "gives it shape [2, 3, 8]") in err, err
    rc, _, err = run_cli(capsys, "compare", dynamic, dynamic, "--input-shape", "x:7")
    assert rc == 2 and "input 'x' has rank 3 [N,S,8], got 1 dims [7]" in err, err


def test_onnxruntime_errors_keep_the_line_that_says_what_is_wrong():
    from graphopt.numerics import ort_reason

    error = RuntimeError("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions "
                         "for input: x for the following indices\n index: 0 Got: 2 Expected: 1\n"
                         " Please fix either the inputs/outputs or the model.")
    assert ort_reason(error) == ("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid "
                                 "dimensions for input: x for the following indices index: 0 "
                                 "Got: 2 Expected: 1")
    assert ort_reason(RuntimeError("")) == "RuntimeError"


def test_errors_of_a_model_read_from_a_file_name_the_file(tmp_path, capsys):
    # bisect compiles the proto it read: its errors said "<model>: …".
    from helpers import run_cli

    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("LayerNormalization", ["x", "s"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])],
        [onnx.numpy_helper.from_array(np.ones(4, np.float32), "s")])
    path = tmp_path / "ln9.onnx"
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 9)]), path)
    rc, _, err = run_cli(capsys, "bisect", path)
    assert rc == 2 and err.startswith(f"graphopt: error: {path}: "), err
    assert "<model>" not in err


def test_a_model_onnxruntime_cannot_load_is_named_without_blaming_the_inputs(tmp_path, capsys):
    # "onnxruntime cannot run the original model on seeded random inputs", for a node reading
    # a value nothing makes.
    proto = parse_model("g (float[2] x) => (float[2] y) { y = Relu (x) }")
    proto.graph.node[0].input[0] = "ghost"
    onnx.save(proto, tmp_path / "bad.onnx")
    rc, _, err = run_cli(capsys, "bisect", tmp_path / "bad.onnx")
    assert rc != 0 and f"onnxruntime cannot run {tmp_path / 'bad.onnx'}: " in err \
        and "seeded random inputs" not in err, err
