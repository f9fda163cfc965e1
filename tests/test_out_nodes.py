"""--out-nodes (ATC's --out_nodes): a compile that ends the model at tensors the user names."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from helpers import conv_topk_model, parse_model, run_cli

import graphopt
from graphopt import numerics
from graphopt.errors import OptionError
from graphopt.out_nodes import parse_out_nodes
from graphopt.source_marks import CUT_KEY, cut_outputs
from graphopt.tools.compare import compare_models

RTOL, ATOL = 1e-4, 1e-5


def _with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """The original with `names` as its outputs (types left for onnxruntime): the values a
    cut compile must reproduce."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    del exposed.graph.output[:]
    exposed.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names)
    return exposed


def _feeds(model: onnx.ModelProto) -> dict:
    return numerics.random_feeds(model, seed=0)


@pytest.mark.parametrize("level", [0, 2, 3])
def test_the_compiled_model_returns_the_originals_values_of_the_named_tensors(level):
    model = conv_topk_model()
    result = graphopt.optimize(model, level=level, out_nodes="r2;scores")
    compiled = result.to_onnx()
    onnx.checker.check_model(compiled, full_check=True)
    assert [o.name for o in compiled.graph.output] == ["r2", "scores"]
    assert "TopK" not in {n.op_type for n in compiled.graph.node}  # -O0 runs no pass
    feeds = _feeds(model)
    expected = numerics.run(_with_outputs(model, ["r2", "scores"]), feeds)
    actual = numerics.run(compiled, feeds)
    assert not numerics.compare(expected, actual, RTOL, ATOL)
    assert json.loads(dict((p.key, p.value) for p in compiled.metadata_props)[CUT_KEY]) == \
        ["values", "indices"]


def test_the_summary_counts_the_source_models_nodes_before_the_cut():
    # It counted the model the cut left: "nodes 0 -> 0" for a cut at the input.
    model = conv_topk_model()
    result = graphopt.optimize(model, level=0, out_nodes="r2;scores")
    assert sum(result.ops_before.values()) == len(model.graph.node)
    assert result.ops_before["TopK"] == 1


def test_node_index_and_a_single_output_nodes_name_resolve_in_the_order_given():
    model = parse_model("""
        g (float[2, 6] x) => (float[2, 3] top, int64[2, 3] at) {
            h = Relu (x)
            top, at = TopK <axis = 1> (h, k)
        }""", k=np.array([3], np.int64))
    model.graph.node[0].name = "relu"
    model.graph.node[1].name = "topk"
    result = graphopt.optimize(model, out_nodes=["topk:1", "relu"])
    assert [v.name for v in result.model.graph.outputs] == ["at", "h"]
    assert "ends at 'at', 'h'" in " ".join(result.notes)


def test_a_tensor_named_like_node_colon_index_is_taken_by_its_name():
    # Converted TensorFlow models name tensors "op:0".
    model = parse_model("""
        g (float[4] x) => (float[4] y) {
            "a:1" = Relu (x)
            y = Neg ("a:1")
        }""")
    model.graph.node[0].name = "a"
    result = graphopt.optimize(model, out_nodes="a:1")
    assert [v.name for v in result.model.graph.outputs] == ["a:1"]


def test_tensorflows_tensor_colon_0_names_the_tensor():
    model = parse_model("""
        g (float[4] x) => (float[4] y) {
            r = Relu (x)
            y = Neg (r)
        }""")
    result = graphopt.optimize(model, out_nodes="r:0")
    assert [v.name for v in result.model.graph.outputs] == ["r"]


def _if_model() -> onnx.ModelProto:
    return parse_model("""
        g (bool c, float[4] x) => (float[4] y) {
            y = If (c) <
                then_branch = t () => (float[4] r) { r = Relu (x) },
                else_branch = e () => (float[4] s) { s = Neg (x) }>
        }""")


@pytest.mark.parametrize("spec, message", [
    ("nowhere", "'nowhere': no tensor or node of the main graph has that name"),
    ("r", "'r': it is inside the body of If node"),
    ("y;y", "'y' named twice"),
    ("y;", "an empty name"),
])
def test_names_that_resolve_to_no_main_graph_tensor_are_refused_by_name(spec, message):
    with pytest.raises(OptionError, match="out_nodes") as caught:
        graphopt.optimize(_if_model(), out_nodes=spec)
    assert message in str(caught.value)


def test_an_index_past_a_nodes_outputs_and_a_bare_multi_output_node_are_refused():
    model = conv_topk_model()
    topk = next(n for n in model.graph.node if n.op_type == "TopK")
    topk.name = "top"
    with pytest.raises(OptionError, match=r"node 'top' \(TopK\) has 2 output\(s\), none at "
                                          "index 2"):
        graphopt.optimize(model, out_nodes="top:2")
    with pytest.raises(OptionError, match=r"has 2 outputs; name one as 'top:0'"):
        graphopt.optimize(model, out_nodes="top")
    with pytest.raises(OptionError, match="out_nodes: expected"):
        graphopt.optimize(model, out_nodes=3)
    # A digit int() does not read (superscript two) was a ValueError out of int().
    with pytest.raises(OptionError, match="no tensor or node of the main graph"):
        graphopt.optimize(model, out_nodes="top:\u00b2")


def test_parse_out_nodes_takes_atcs_form_and_lists():
    assert parse_out_nodes(" a ; Conv_1:0") == ["a", "Conv_1:0"]
    assert parse_out_nodes(["a", "b"]) == ["a", "b"]
    with pytest.raises(OptionError, match=r"out_nodes \[\]: no name \(give tensor names"):
        parse_out_nodes([])  # had read as "an empty name"
    assert cut_outputs({CUT_KEY: "not json"}) == []


def test_cutting_before_the_cpu_postprocessing_leaves_one_npu_partition(tmp_path, capsys):
    # ATC users end a detector before its NMS/TopK, which then runs on the host.
    path = tmp_path / "topk.onnx"
    onnx.save(conv_topk_model(), path)
    om = tmp_path / "head.om"
    rc, out, err = run_cli(capsys, "optimize", path, "-o", om, "--target", "ascend310",
                           "--out-nodes", "scores", "--verify")
    assert rc == 0, err
    assert "note: --out-nodes: the model ends at 'scores'" in out
    with pytest.warns(RuntimeWarning, match="functional stand-in"):
        session = graphopt.load(om)
    assert [e["name"] for e in session.outputs] == ["scores"]
    assert {p["device"] for p in session.artifact.manifest["partitions"]} == {"npu"}
    rc, out, _ = run_cli(capsys, "inspect", om)
    assert "--out-nodes: the source's output(s) values, indices are no longer outputs" in out


def test_compare_matches_the_cut_outputs_with_the_originals_tensors(tmp_path, capsys):
    path = tmp_path / "topk.onnx"
    onnx.save(conv_topk_model(), path)
    for suffix in ("om", "onnx"):
        written = tmp_path / f"cut.{suffix}"
        rc, _, err = run_cli(capsys, "optimize", path, "-o", written, "--out-nodes", "r2;scores")
        assert rc == 0, err
        report = compare_models(path, written)
        assert report.passed
        assert [row.name for row in report.outputs] == ["r2", "scores"]
        assert any("compiled without (out_nodes): values, indices (not compared)" in note
                   for note in report.notes)
    # A model that lost an output it was not compiled without still fails.
    lost = _with_outputs(conv_topk_model(), ["values"])
    assert not compare_models(path, lost).passed


def test_compare_still_fails_a_cut_output_that_differs(tmp_path):
    model = conv_topk_model()
    result = graphopt.optimize(model, out_nodes="scores")
    compiled = result.to_onnx()
    bias = next(i for i in compiled.graph.initializer if i.name == "bf")
    bias.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(bias) + 1, "bf"))
    report = compare_models(model, compiled)
    assert not report.passed and report.outputs[0].name == "scores"


def test_an_input_only_the_cut_part_read_stays_in_the_signature(tmp_path):
    model = parse_model("""
        g (float[4] x, float[4] z) => (float[4] y, float[4] w) {
            y = Relu (x)
            w = Neg (z)
        }""")
    om = tmp_path / "y.om"
    graphopt.save(graphopt.optimize(model, out_nodes="y"), om)
    session = graphopt.load(om)
    assert [e["name"] for e in session.inputs] == ["x", "z"]
    x = np.array([-1, 2, -3, 4], np.float32)
    np.testing.assert_array_equal(session.run({"x": x, "z": x})["y"], np.maximum(x, 0))


def test_each_shape_profile_is_cut_alike(tmp_path):
    model = conv_topk_model(batch="N")
    om = tmp_path / "profiles.om"
    graphopt.save(graphopt.optimize(model, out_nodes="scores", dynamic_dims="N:1,2"), om)
    session = graphopt.load(om)
    assert [e["name"] for e in session.outputs] == ["scores"]
    assert session.outputs[0]["shape"] == ["N", 64]  # the dim the profiles vary keeps its name
    for batch in (1, 2):
        x = np.random.default_rng(batch).standard_normal((batch, 8, 32, 32)).astype(np.float32)
        expected = numerics.run(_with_outputs(model, ["scores"]), {"x": x})
        assert not numerics.compare(expected, session.run({"x": x}), RTOL, ATOL)
    assert compare_models(model, om).passed  # the profiles' .om records the cut outputs too


def test_a_precision_compiles_accuracy_report_compares_the_cut_outputs(tmp_path, capsys):
    path = tmp_path / "topk.onnx"
    onnx.save(conv_topk_model(), path)
    rc, out, err = run_cli(capsys, "optimize", path, "-o", tmp_path / "h.onnx", "--out-nodes",
                           "scores", "--precision", "fp16")
    assert rc == 0, err
    assert f"accuracy vs {path} ended at --out-nodes" in out
    row = next(line for line in out.splitlines() if line.startswith("scores "))
    assert float(row.split()[3]) > 0.999
    assert f"the time of {path} ended at --out-nodes" in out


@pytest.mark.parametrize("spec", ["x", "wb"])
def test_compare_matches_an_output_cut_at_an_input_or_a_weight(tmp_path, capsys, spec):
    # The reference computes neither: compare crashed on a table of no row.
    path = tmp_path / "m.onnx"
    onnx.save(parse_model("""
        g (float[4] x) => (float[4] y) {
            y = Add (x, wb)
        }""", wb=np.arange(4, dtype=np.float32)), path)
    cut = tmp_path / "cut.om"
    rc, _, err = run_cli(capsys, "optimize", path, "-o", cut, "--out-nodes", spec)
    assert rc == 0, err
    rc, out, err = run_cli(capsys, "compare", path, cut)
    assert rc == 0, err
    assert f"\n{spec} " in out and "outputs: 1/1 pass" in out


def test_names_only_the_cut_removed_are_said_to_be_cut_not_misspelt():
    # --precision-allow of an op, --quant-skip of a node that --out-nodes removed: the notes
    # had blamed a fusion or a typo.
    model = conv_topk_model()
    fp16 = graphopt.optimize(model, out_nodes="r2", precision="fp16",
                             pass_options={"precision_allow": ["Gemm"]})
    assert "ConvertPrecision: precision_allow 'Gemm' names only what out_nodes removed " \
           "(the model ends before it)" in fp16.notes, fp16.notes
    typo = graphopt.optimize(model, out_nodes="r2", precision="fp16",
                             pass_options={"precision_allow": ["Gemn"]})
    assert not any("out_nodes removed" in note for note in typo.notes), typo.notes
