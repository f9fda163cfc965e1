"""graphopt.tools.diff and `graphopt diff`: node matching, Conv+BatchNorm fusion, --pass mode,
--json schema, and errors (missing file, printed-IR dump, unknown pass)."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from helpers import parse_model, run_cli
from onnx import TensorProto, helper

import graphopt
from graphopt import zoo
from graphopt.ir import load_onnx
from graphopt.numerics import random_feeds
from graphopt.passes import Options, PassContext
from graphopt.passes.fusion.conv_bn import FuseConvBatchNorm
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.tools.diff import diff_models
from graphopt.tools.diff_format import format_diff

CONV_BN = """
    agraph (float[1,3,8,8] x) => (float[1,4,8,8] y) {
      c = Conv <pads=[1,1,1,1]> (x, w)
      b = BatchNormalization (c, scale, shift, mean, var)
      y = Relu (b)
    }"""


def _conv_bn() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    proto = parse_model(CONV_BN, w=rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
                        scale=rng.uniform(0.5, 1.5, 4).astype(np.float32),
                        shift=rng.standard_normal(4).astype(np.float32),
                        mean=rng.standard_normal(4).astype(np.float32),
                        var=rng.uniform(0.5, 1.5, 4).astype(np.float32))
    for node in proto.graph.node:
        node.name = f"/{node.output[0]}/{node.op_type}"
    return proto


@pytest.fixture
def conv_bn_path(tmp_path) -> str:
    path = os.fspath(tmp_path / "convbn.onnx")
    onnx.save(_conv_bn(), path)
    return path


def _fused():
    """(before, after) IR models around FuseConvBatchNorm."""
    before = load_onnx(_conv_bn())
    infer_shapes(before)
    after = load_onnx(_conv_bn())
    infer_shapes(after)
    assert FuseConvBatchNorm().run(after, PassContext(Options())).changed
    return before, after


# ---------------------------------------------------------------------------------------------
# library
# ---------------------------------------------------------------------------------------------
def test_conv_batchnorm_fusion_removes_the_bn_and_changes_the_conv():
    before, after = _fused()
    diff = diff_models(before, after)
    assert [(e.op, e.name) for e in diff.removed] == \
        [("BatchNormalization", "/b/BatchNormalization")]
    assert diff.added == []
    changes = {c.op_after: c for c in diff.changed}
    assert set(changes) == {"Conv", "Relu"}
    conv = changes["Conv"]
    assert conv.name_before == "/c/Conv" and conv.op_before == "Conv"
    assert "= Conv(%x, %w) {pads=[1,1,1,1]}  # /c/Conv" in conv.before
    assert "Conv(%x, %w_fused, %w_b)" in conv.after
    assert "Relu(%b)" in changes["Relu"].before
    assert {v.name for v in diff.initializers_added} == {"w_fused", "w_b"}
    assert diff.initializers_removed == [] and diff.initializers_changed == []
    assert diff.op_deltas() == [("BatchNormalization", 1, 0, -1)]
    assert (diff.nodes_a, diff.nodes_b) == (3, 2)


@pytest.mark.parametrize("names, a_first", [(("WA", "WB"), False), (("w", "w_b"), True)])
def test_two_convs_on_one_input_pair_with_the_conv_their_weights_came_from(names, a_first):
    # The fused convs share op, input, shapes and attributes: convB (listed first) was paired
    # with the conv holding WA's folded weights, and the diff said convB became it. Named w
    # and w_b, B's folded w_b_fused reads as made from w as well: the longest name decides.
    rng = np.random.default_rng(0)
    weights = {}
    for p in "AB":
        weights |= {f"W{p}": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
                    f"s{p}": rng.uniform(0.5, 2, 4).astype(np.float32),
                    f"b{p}": rng.standard_normal(4).astype(np.float32),
                    f"m{p}": rng.standard_normal(4).astype(np.float32),
                    f"v{p}": rng.uniform(0.5, 2, 4).astype(np.float32)}
    proto = parse_model("""
        g (float[1,3,8,8] x) => (float[1,4,8,8] y) {
            [convB] cB = Conv <pads = [1,1,1,1]> (x, WB)
            [convA] cA = Conv <pads = [1,1,1,1]> (x, WA)
            [bnA] yA = BatchNormalization (cA, sA, bA, mA, vA)
            [bnB] yB = BatchNormalization (cB, sB, bB, mB, vB)
            y = Add (yA, yB)
        }""", **weights)
    if a_first:  # convA, convB, bnB, bnA: the other order of both pairs
        order = [1, 0, 3, 2, 4]
        nodes = [proto.graph.node[i] for i in order]
        del proto.graph.node[:]
        proto.graph.node.extend(nodes)
    for node in proto.graph.node:
        node.input[:] = [{"WA": names[0], "WB": names[1]}.get(i, i) for i in node.input]
    for tensor in proto.graph.initializer:
        tensor.name = {"WA": names[0], "WB": names[1]}.get(tensor.name, tensor.name)
    before, after = load_onnx(proto), load_onnx(proto)
    infer_shapes(before)
    infer_shapes(after)
    assert FuseConvBatchNorm().run(after, PassContext(Options())).changed
    changes = {c.name_before: c.after for c in diff_models(before, after).changed}
    assert f"%{names[0]}_fused," in changes["convA"] and f"%{names[1]}_fused," in \
        changes["convB"], changes


def test_protos_are_accepted_and_identical_models_have_no_differences():
    diff = diff_models(_conv_bn(), _conv_bn())
    assert diff.empty and diff.op_deltas() == []
    assert format_diff(diff).endswith("no differences")


def test_unnamed_nodes_match_by_structure_and_a_new_name_is_listed_apart():
    a = parse_model("agraph (float[4] x) => (float[4] y) { t = Neg (x)\n y = Abs (t) }")
    b = parse_model("agraph (float[4] x) => (float[4] y) { t = Neg (x)\n y = Abs (t) }")
    b.graph.node[0].name = "renamed"  # same op, inputs and outputs: the same node
    diff = diff_models(a, b)
    assert not (diff.removed or diff.added or diff.changed)
    # A name given (or cleared) selects otherwise (--quant-skip, --keep-dtype, bisect anchors).
    assert diff.renamed == [("", "", "renamed")]
    b.graph.node[1].op_type = "Relu"
    diff = diff_models(a, b)
    assert [(e.op, e.line) for e in diff.removed] == [("Abs", "%y<f32[4]> = Abs(%t)")]
    assert [(e.op, e.line) for e in diff.added] == [("Relu", "%y<f32[4]> = Relu(%t)")]


def test_same_name_with_new_attributes_is_a_change():
    a = parse_model("agraph (float[2,3] x) => (float[3,2] y) { y = Transpose <perm=[1,0]> (x) }")
    b = parse_model("agraph (float[2,3] x) => (float[3,2] y) { y = Transpose <perm=[0,1]> (x) }")
    a.graph.node[0].name = b.graph.node[0].name = "t"
    (change,) = diff_models(a, b).changed
    assert "perm=[1,0]" in change.before and "perm=[0,1]" in change.after


def test_initializer_with_new_data_and_changed_graph_output():
    text = "agraph (float[3] x) => (float[3] y) { y = Add (x, c) }"
    a = parse_model(text, c=np.ones(3, np.float32))
    b = parse_model(text, c=np.array([1, 1, 2], np.float32))
    diff = diff_models(a, b)
    assert [(v.name, v.type_before, v.type_after) for v in diff.initializers_changed] == \
        [("c", "f32[3]", "f32[3]")]
    assert diff.changed == []  # the node reads the same names
    c = parse_model(text.replace("=> (float[3] y)", "=> (float[?] y)"), c=np.ones(3, np.float32))
    assert [(v.name, v.type_before, v.type_after) for v in diff_models(a, c).io_changed] == \
        [("output y", "f32[3]", "f32[?]")]


def test_graph_outputs_in_another_order_are_a_change():
    # A caller that takes outputs by position would read them swapped.
    a = parse_model("g (float[3] x) => (float[3] p, float[3] q) { p = Relu (x)  q = Neg (x) }")
    b = parse_model("g (float[3] x) => (float[3] q, float[3] p) { p = Relu (x)  q = Neg (x) }")
    diff = diff_models(a, b)
    assert [(v.name, v.type_before, v.type_after) for v in diff.io_changed] == \
        [("output order", "p, q", "q, p")]
    assert diff_models(a, a).io_changed == []


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------
def _saved_pair(tmp_path):
    before, after = _fused()
    paths = []
    for name, model in (("before.onnx", before), ("after.onnx", after)):
        paths.append(os.fspath(tmp_path / name))
        graphopt.save(model, paths[-1])
    return paths


def test_cli_two_models(tmp_path, capsys):
    a, b = _saved_pair(tmp_path)
    rc, out, err = run_cli(capsys, "diff", a, b)
    assert rc == 0, err
    assert "1 node(s) removed, 0 added, 2 changed" in out
    assert "  - %b<f32[1,4,8,8]> = BatchNormalization(" in out
    assert "  /c/Conv -> " in out and "    + %" in out and "Conv(%x, %w_fused, %w_b)" in out
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("Batch"))
    assert row == ["BatchNormalization", "1", "0", "-1"]


def test_cli_takes_options_between_the_two_models(tmp_path, capsys):
    a, b = _saved_pair(tmp_path)
    rc, out, err = run_cli(capsys, "diff", a, b, "--json")
    assert rc == 0, err
    for argv in ((a, "--json", b), ("--json", a, b), (a, "--limit", "5", "--json", b)):
        rc, again, err = run_cli(capsys, "diff", *argv)
        assert rc == 0 and json.loads(again) == json.loads(out), err
    rc, _, err = run_cli(capsys, "diff", a, "--json", b, "--bogus")
    # One line, from the command's own parser: not graphopt's top-level usage first.
    assert rc == 2 and err == ("graphopt: error: diff: unrecognized arguments: --bogus "
                               "(see graphopt diff --help)\n")


def test_cli_json_schema(tmp_path, capsys):
    a, b = _saved_pair(tmp_path)
    rc, out, err = run_cli(capsys, "diff", a, b, "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert set(data) == {"a", "b", "nodes", "removed", "added", "changed", "initializers",
                         "io_changed", "opsets_changed", "functions_changed", "op_counts",
                         "unrelated", "renamed", "properties_changed"}
    assert data["nodes"] == {"a": 3, "b": 2}
    assert data["removed"] == [{"name": "/b/BatchNormalization", "op": "BatchNormalization",
                                "scope": "", "line": data["removed"][0]["line"]}]
    assert {c["op_after"] for c in data["changed"]} == {"Conv", "Relu"}
    assert set(data["changed"][0]) == {"name", "name_before", "op_before", "op_after", "scope",
                                       "before", "after"}
    assert sorted(v["name"] for v in data["initializers"]["added"]) == ["w_b", "w_fused"]
    counts = {e["op"]: (e["a"], e["b"], e["delta"]) for e in data["op_counts"]}
    assert counts == {"Conv": (1, 1, 0), "BatchNormalization": (1, 0, -1), "Relu": (1, 1, 0)}


def test_cli_pass_mode(conv_bn_path, capsys):
    rc, out, err = run_cli(capsys, "diff", conv_bn_path, "--pass", "FuseConvBatchNorm", "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert data["pass"]["name"] == "FuseConvBatchNorm"
    assert data["pass"]["rewrites"] == {"ConvBatchNorm": 1}
    assert data["pass"]["first_run"] == data["pass"]["last_run"] == 1
    assert data["pass"]["runs"] == 2 and data["pass"]["changed_runs"] == 1
    assert [r["op"] for r in data["removed"]] == ["BatchNormalization"]
    assert "Conv" in {c["op_after"] for c in data["changed"]}
    rc, out, err = run_cli(capsys, "diff", conv_bn_path, "--pass", "FuseConvBatchNorm")
    assert rc == 0, err
    assert out.startswith("FuseConvBatchNorm run 1 of 2 (1 changed the graph); "
                          "rewrites: ConvBatchNorm=1\n")
    assert "before FuseConvBatchNorm (after SimplifySlicing)" in out


def test_pass_mode_compiles_with_the_switches_of_the_compile_it_explains(conv_bn_path, capsys,
                                                                        monkeypatch):
    # The rule off, its pass still runs and changes nothing: what that compile saw.
    rc, out, err = run_cli(capsys, "diff", conv_bn_path, "--pass", "FuseConvBatchNorm",
                           "--disable-pass", "ConvBatchNorm", "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert data["pass"]["changed_runs"] == 0 and data["pass"]["rewrites"] == {}
    assert not data["removed"] and not data["added"]
    import graphopt.compiler

    compile_once, limits = graphopt.compiler.optimize, []

    def recorded(*args, **kwargs):
        limits.append(kwargs.get("fold_size_limit"))
        return compile_once(*args, **kwargs)
    monkeypatch.setattr(graphopt.compiler, "optimize", recorded)
    rc, out, err = run_cli(capsys, "diff", conv_bn_path, "--pass", "FuseConvBatchNorm",
                           "--fold-size-limit", "1K", "--json")
    assert rc == 0, err
    assert json.loads(out)["pass"]["rewrites"] == {"ConvBatchNorm": 1} and limits == [1024]


def test_cli_pass_mode_all_runs_and_a_pass_that_changed_nothing(conv_bn_path, capsys):
    rc, out, err = run_cli(capsys, "diff", conv_bn_path, "--pass", "EliminateDeadNodes",
                           "--all-runs", "--json")
    assert rc == 0, err
    data = json.loads(out)["pass"]
    assert data["first_run"] == 1 and data["last_run"] == data["runs"] > 1
    rc, out, err = run_cli(capsys, "diff", conv_bn_path, "--pass", "FuseGelu")
    assert rc == 0, err
    assert "FuseGelu ran 2 time(s) and never changed the graph; showing its run 1\n" in out
    assert out.rstrip().endswith("no differences")
    # Its first run to its last: what other passes changed between them is named, not blamed.
    rc, out, err = run_cli(capsys, "diff", conv_bn_path, "--pass", "FuseGelu", "--all-runs")
    assert rc == 0, err
    head = out.splitlines()[0]
    assert head.startswith("FuseGelu ran 2 time(s) and never changed the graph; showing its "
                           "runs 1-2; the diff also holds what ") and "changed between them" in head


def test_cli_diff_of_onnx_dumps_equals_pass_mode(conv_bn_path, tmp_path, capsys):
    dump = tmp_path / "dump"
    graphopt.optimize(conv_bn_path, dump_dir=os.fspath(dump), dump_format="onnx")
    log = json.loads((dump / "passes.json").read_text())
    index = next(i for i, e in enumerate(log["passes"]) if e["pass"] == "FuseConvBatchNorm")
    before = (log["passes"][index - 1] if index else log["import"])["dumps"][0]
    after = log["passes"][index]["dumps"][0]
    rc, out, err = run_cli(capsys, "diff", dump / before, dump / after, "--json")
    assert rc == 0, err
    by_files = json.loads(out)
    rc, out, err = run_cli(capsys, "diff", conv_bn_path, "--pass", "FuseConvBatchNorm", "--json")
    by_pass = json.loads(out)
    for key in ("removed", "added", "changed", "initializers", "op_counts"):
        assert by_files[key] == by_pass[key], key


def test_zoo_model_pass_mode_pairs_every_rebuilt_conv(tmp_path, capsys):
    path = tmp_path / "tiny.onnx"
    onnx.save(zoo.build("tiny"), os.fspath(path))
    rc, out, err = run_cli(capsys, "diff", path, "--pass", "FuseConvBatchNorm", "--json")
    assert rc == 0, err
    data = json.loads(out)
    fused = data["pass"]["rewrites"]["ConvBatchNorm"]
    assert [r["op"] for r in data["removed"]] == ["BatchNormalization"] * fused
    assert data["added"] == []
    convs = [c for c in data["changed"] if c["op_after"] == "Conv"]
    assert len(convs) == fused and all("_fused" in c["after"] for c in convs)


def test_pass_mode_compiles_with_the_precision_flags_and_pins(tmp_path, capsys):
    path = tmp_path / "tiny.onnx"
    model = zoo.build("tiny")
    onnx.save(model, os.fspath(path))
    calibration = tmp_path / "calibration.npz"
    np.savez(calibration, **random_feeds(model, seed=1))
    rc, out, err = run_cli(capsys, "diff", path, "--pass", "QuantizeInt8", "--quantize", "int8",
                           "--calibration", calibration, "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert data["pass"]["changed_runs"] == 1 and data["pass"]["rewrites"]["QuantizeLinear"] >= 1
    added = {e["op"] for e in data["added"]}
    assert {"QuantizeLinear", "DequantizeLinear"} <= added
    rc, out, err = run_cli(capsys, "diff", path, "--pass", "ConvertPrecision", "--precision",
                           "fp16", "--json")
    assert rc == 0, err
    assert "f16" in json.dumps(json.loads(out)["changed"])
    # Pins reach the compile: the dumps of a model with a symbolic batch hold the pinned one.
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(model, os.fspath(path))
    rc, out, err = run_cli(capsys, "diff", path, "--pass", "FuseConvBatchNorm", "--input-shape",
                           "input:2,3,32,32")
    assert rc == 0, err
    assert "Conv(" in out and "<f32[2,16,32,32]>" in out and "batch" not in out


@pytest.mark.parametrize("argv, needle", [
    (["MISSING", "MODEL"], "MISSING: no such file"),
    (["DUMP.txt", "MODEL"], "printed-IR dump cannot be read back; dump with `--dump-format onnx`"),
    (["MODEL", "--pass", "NoSuchPass"],
     "--pass NoSuchPass: no such pass (`graphopt passes` lists them; passes that ran: "
     "InferShapes, "),
    (["MODEL", "--pass", "foldconstants"],
     "--pass foldconstants: no such pass (did you mean FoldConstants? `graphopt passes` "),
    (["MODEL", "--pass", "FuseConvBatchNorm", "-O", "1"],
     "--pass FuseConvBatchNorm: did not run at -O1; it runs at -O2, -O3 (passes that ran: "
     "InferShapes, "),
    (["MODEL", "--pass", "FuseConvBatchNorm", "-O", "0"],
     "did not run at -O0; it runs at -O2, -O3 (no pass ran)"),
    # A pass an option or a target adds: trying other levels would not make it run.
    (["MODEL", "--pass", "QuantizeInt8", "-O", "3"],
     "--pass QuantizeInt8: did not run at -O3; it runs only with --quantize int8 ("),
    (["MODEL", "--pass", "ConvertPrecision"], "it runs only with --precision MODE ("),
    (["MODEL", "--pass", "WinogradConv", "-O", "3"],
     "did not run at -O3; it runs only with -O3 and --target cpu ("),
    (["MODEL", "--pass", "LayoutNchwc", "--target", "ascend310"],
     "did not run at -O2 --target ascend310; it runs only with --target cpu, on a CPU with "
     "AVX2 or AVX-512F, at -O2 or -O3 ("),
    # The compile's own switches: the pass is off, not missing from the level.
    (["MODEL", "--pass", "FuseConvBatchNorm", "--disable-pass", "FuseConvBatchNorm"],
     "--pass FuseConvBatchNorm: switched off by --disable-pass FuseConvBatchNorm"),
    (["MODEL", "--pass", "FuseConvBatchNorm", "--fusion-switch-file", "SWITCHES"],
     "--pass FuseConvBatchNorm: switched off by the switch file SWITCHES"),
    (["MODEL", "MODEL", "--disable-pass", "FuseGelu"],
     "--disable-pass applies only with --pass NAME"),
    (["MODEL"], "diff takes two models A and B, got 1"),
    (["MODEL", "MODEL", "MODEL"], "diff takes two models A and B, got 3"),
    (["MODEL", "MODEL", "--pass", "FuseGelu"], "--pass FuseGelu takes one model, got 2"),
    (["MODEL", "MODEL", "--all-runs", "-O", "3"], "--all-runs, -O apply only with --pass NAME"),
    (["MODEL", "MODEL", "--precision", "fp16"],
     "--precision applies only with --pass NAME"),
    (["MODEL", "MODEL", "--input-shape", "x:1,3"], "--input-shape applies only with --pass NAME"),
])
def test_cli_errors(conv_bn_path, tmp_path, capsys, argv, needle):
    txt = tmp_path / "000_import.txt"
    txt.write_text("graph main_graph (\n")
    switches = tmp_path / "switches.cfg"
    switches.write_text("FuseConvBatchNorm: off\n")
    names = {"MODEL": conv_bn_path, "MISSING": os.fspath(tmp_path / "missing.onnx"),
             "DUMP.txt": os.fspath(txt), "SWITCHES": os.fspath(switches)}
    needle = needle.replace("MISSING", names["MISSING"]).replace("SWITCHES", names["SWITCHES"])
    rc, out, err = run_cli(capsys, "diff", *[names.get(a, a) for a in argv])
    # diff's errors exit 2, as GNU diff's: with --exit-code, 1 says the models differ.
    assert rc == 2 and out == ""
    assert err.startswith("graphopt: error: ") and needle in err, err


def test_types_an_import_infers_are_not_changes():
    # A model against its own import: the values the model left untyped are typed now.
    text = "g (float[3] x) => (float[3] y) { t = Relu (x)  y = Neg (t) }"
    untyped = parse_model(text)
    typed = load_onnx(untyped)
    infer_shapes(typed)
    assert diff_models(untyped, typed).changed == []
    # A type both sides know and that differs still is one.
    half = parse_model(text.replace("float", "float16"))
    assert [c.op_before for c in diff_models(untyped, half).changed] == ["Neg"]  # y: f32, f16


def test_two_models_without_an_input_or_output_in_common_are_said_to_be_unrelated(tmp_path,
                                                                                  capsys):
    a = parse_model("g (float[4] x) => (float[4] y) { y = Relu (x) }")
    b = parse_model("g (float[4] p) => (float[4] q) { q = Relu (p) }")
    onnx.save(a, tmp_path / "a.onnx")
    onnx.save(b, tmp_path / "b.onnx")
    rc, out, err = run_cli(capsys, "diff", tmp_path / "a.onnx", tmp_path / "b.onnx")
    assert rc == 0, err
    assert "note: A and B share no input or output name: they may be two different models" \
        in out
    rc, out, _ = run_cli(capsys, "diff", tmp_path / "a.onnx", tmp_path / "a.onnx")
    assert "share no input" not in out


def _function_model(op: str, opset: int = 17) -> onnx.ModelProto:
    body = helper.make_function("local", "MyAct", ["a"], ["b"],
                                [helper.make_node(op, ["a"], ["b"])],
                                [helper.make_opsetid("", opset)])
    graph = helper.make_graph(
        [helper.make_node("MyAct", ["x"], ["y"], domain="local", name="act")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid("local", 1)],
                              functions=[body])
    model.ir_version = 8
    return model


def test_function_bodies_and_opset_imports_are_compared(tmp_path, capsys):
    # The graphs alike, the models compute different things: a local function's body (a
    # dynamo export's, FuseElementwise's) or the opset the nodes follow.
    paths = {}
    for name, op, opset in (("relu", "Relu", 17), ("sigmoid", "Sigmoid", 17),
                            ("relu13", "Relu", 13)):
        paths[name] = os.fspath(tmp_path / f"{name}.onnx")
        onnx.save(_function_model(op, opset), paths[name])
    diff = diff_models(onnx.load(paths["relu"]), onnx.load(paths["sigmoid"]))
    assert not diff.empty and not (diff.changed or diff.opsets_changed)
    [change] = diff.functions_changed
    assert (change.name, change.change) == ("local::MyAct", "changed")
    assert change.lines == ["- b = Relu (a)", "+ b = Sigmoid (a)"]
    diff = diff_models(onnx.load(paths["relu13"]), onnx.load(paths["relu"]))
    assert [(v.name, v.type_before, v.type_after) for v in diff.opsets_changed] == \
        [("ai.onnx", "13", "17")]
    rc, out, err = run_cli(capsys, "diff", paths["relu"], paths["sigmoid"])
    assert rc == 0 and "model-local functions (1):\n  changed local::MyAct\n" in out, err
    rc, out, _ = run_cli(capsys, "diff", paths["relu13"], paths["relu"], "--json")
    data = json.loads(out)
    assert data["opsets_changed"] == [{"domain": "ai.onnx", "a": "13", "b": "17"}]
    assert data["functions_changed"][0]["change"] == "changed"  # the body's opset moved too


def test_exit_code_says_whether_the_models_differ(tmp_path, capsys):
    a, b = _saved_pair(tmp_path)
    assert run_cli(capsys, "diff", a, b)[0] == 0
    assert run_cli(capsys, "diff", a, b, "--exit-code")[0] == 1
    assert run_cli(capsys, "diff", a, a, "--exit-code")[0] == 0
    rc, _, err = run_cli(capsys, "diff", a, os.fspath(tmp_path / "missing.onnx"), "--exit-code")
    assert rc == 2 and "no such file" in err


def test_renamed_nodes_and_model_properties_are_differences(tmp_path, capsys):
    # Both read "no differences": a node's new name (what --quant-skip, --keep-dtype and
    # bisect's anchors select by) and graphopt.lossy_passes, which changes compare's rule.
    a, _ = _saved_pair(tmp_path)
    renamed, marked = onnx.load(a), onnx.load(a)
    renamed.graph.node[0].name = "/renamed"
    onnx.helper.set_model_props(marked, {"graphopt.lossy_passes": "QuantizeInt8"})
    for name, model in (("renamed", renamed), ("marked", marked)):
        onnx.save(model, tmp_path / f"{name}.onnx")
    rc, out, _ = run_cli(capsys, "diff", a, tmp_path / "renamed.onnx", "--exit-code")
    first = onnx.load(a).graph.node[0].name
    assert rc == 1 and f"renamed nodes (1), alike but for their names:\n  {first} -> /renamed" \
        in out, out
    rc, out, _ = run_cli(capsys, "diff", a, tmp_path / "marked.onnx", "--json")
    assert {"property": "graphopt.lossy_passes", "a": None, "b": "QuantizeInt8"} in \
        json.loads(out)["properties_changed"]
