"""Pass manager: pipelines, fixed points, disabled passes, instruments, failures named by pass."""

from __future__ import annotations

import json

import onnx.parser
import pytest

from graphopt.errors import OptionError, PassError
from graphopt.ir import load_onnx
from graphopt.passes import PASSES, PIPELINES, FixedPoint, Options, Pass, PassContext, PassManager
from graphopt.passes import PassResult, Pipeline
from graphopt.passes.instruments import DumpIR, VerifyAfterEachPass

MODEL = onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 4] x) => (float[2, 4] y) {
    a = Identity(x)
    b = Identity(a)
    c = Identity(b)
    y = Relu(c)
}
""")


class RemoveOneIdentity(Pass):
    """Test pass: removes one Identity per run, so only a fixed point removes them all."""

    name = "RemoveOneIdentity"
    description = "test only"

    def run(self, model, ctx):
        for node in model.graph:
            if node.op_type == "Identity":
                node.output.replace_all_uses_with(node.inputs[0])
                model.graph.remove(node)
                return PassResult(changed=True, stats={"Identity": 1})
        return PassResult()


class RenameRelu(Pass):
    """Test pass: renames the Relu on every run, a change that never settles nor shrinks."""

    name = "RenameRelu"
    description = "test only"

    def run(self, model, ctx):
        for node in model.graph:
            if node.op_type == "Relu":
                node.name += "'"
        return PassResult(changed=True)


class BreakUseLists(Pass):
    name = "BreakUseLists"
    description = "test only"

    def run(self, model, ctx):
        model.graph.nodes()[0].inputs[0]._uses.clear()
        return PassResult(changed=True)


class Explode(Pass):
    name = "Explode"
    description = "test only"

    def run(self, model, ctx):
        raise ZeroDivisionError("boom")


@pytest.fixture
def test_passes(monkeypatch):
    for cls in (RemoveOneIdentity, RenameRelu, BreakUseLists, Explode):
        monkeypatch.setitem(PASSES, cls.name, cls)


def _run(steps, options=None, instruments=None):
    model = load_onnx(MODEL)
    manager = PassManager(Pipeline("test", "test", tuple(steps)), PassContext(options or Options()),
                          instruments)
    return model, manager.run(model)


def test_fixed_point_repeats_until_nothing_changes(test_passes):
    model, log = _run([FixedPoint(("RemoveOneIdentity",))])
    assert [n.op_type for n in model.graph] == ["Relu"]
    assert [r.iteration for r in log.records] == [1, 2, 3, 4]
    assert [r.changed for r in log.records] == [True, True, True, False]
    assert log.totals()["RemoveOneIdentity"]["rewrites"]["Identity"] == 3
    assert log.records[0].nodes_before == 4 and log.records[0].nodes_after == 3


def test_iteration_cap_is_noted(test_passes):
    ctx = PassContext(Options(max_iterations=2))
    model = load_onnx(MODEL)
    pipeline = Pipeline("t", "t", (FixedPoint(("RenameRelu",)),))
    log = PassManager(pipeline, ctx).run(model)
    assert [r.iteration for r in log.records] == [1, 2]
    assert ctx.notes == ["fixed point of RenameRelu not reached in 2 iterations"]


def test_sweeps_that_remove_nodes_go_on_past_the_cap(test_passes):
    # Progress, not a cycle (a chain of computed pads types one stage per sweep): the group
    # runs until it settles, without a note.
    ctx = PassContext(Options(max_iterations=2))
    model = load_onnx(MODEL)
    pipeline = Pipeline("t", "t", (FixedPoint(("RemoveOneIdentity",)),))
    log = PassManager(pipeline, ctx).run(model)
    assert [n.op_type for n in model.graph] == ["Relu"]
    assert [r.iteration for r in log.records] == [1, 2, 3, 4]
    assert ctx.notes == []


def test_sweeps_that_remove_nodes_stop_at_a_ceiling(test_passes):
    # Six Identities take six sweeps; with a cap of 1 the ceiling is 4 × 1.
    chain = "\n".join(f"    i{k + 1} = Identity(i{k})" for k in range(6))
    model = load_onnx(onnx.parser.parse_model(f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2] i0) => (float[2] y) {{
        {chain}
            y = Relu(i6)
        }}"""))
    ctx = PassContext(Options(max_iterations=1))
    PassManager(Pipeline("t", "t", (FixedPoint(("RemoveOneIdentity",)),)), ctx).run(model)
    assert len(model.graph) == 3
    assert ctx.notes == ["fixed point of RemoveOneIdentity not reached in 4 iterations"]


def test_disabled_pass_does_not_run(test_passes):
    model, log = _run(["RemoveOneIdentity"], Options(disabled_passes={"RemoveOneIdentity"}))
    assert log.records == [] and len(model.graph) == 4


def test_unknown_disabled_pass_is_an_option_error():
    with pytest.raises(OptionError, match="unknown pass or rule NoSuchPass"):
        _run([], Options(disabled_passes={"NoSuchPass"}))


def test_verify_instrument_names_the_pass_that_broke_the_graph(test_passes):
    with pytest.raises(PassError, match=r"pass BreakUseLists left the graph invalid.*after: "
                                        r"RemoveOneIdentity"):
        _run(["RemoveOneIdentity", "BreakUseLists"], instruments=[VerifyAfterEachPass()])


def test_a_crashing_pass_is_named_with_its_predecessors(test_passes):
    with pytest.raises(PassError, match=r"pass Explode failed: ZeroDivisionError: boom "
                                        r"\(after: RemoveOneIdentity\)"):
        _run(["RemoveOneIdentity", "Explode"])


def test_dump_ir_writes_numbered_files_and_log(test_passes, tmp_path):
    _run([FixedPoint(("RemoveOneIdentity",))], instruments=[DumpIR(str(tmp_path))])
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[0] == "000_import.txt" and names[1] == "001_RemoveOneIdentity.txt"
    assert "passes.json" in names and len(names) == 6
    log = json.loads((tmp_path / "passes.json").read_text())
    assert log["passes"][0]["rewrites"] == {"Identity": 1}
    assert "Identity" in (tmp_path / "000_import.txt").read_text()
    assert "Identity" not in (tmp_path / "004_RemoveOneIdentity.txt").read_text()


def test_levels_are_defined_and_use_registered_passes():
    assert sorted(PIPELINES) == [0, 1, 2, 3]
    for pipeline in PIPELINES.values():
        assert set(pipeline.pass_names()) <= set(PASSES)
    assert PIPELINES[0].steps == ()
