"""--input-fp16-nodes and --output-type (ATC's --input_fp16_nodes and --output_type): inputs that
take float16, outputs given in float16 or float32, Casts at the edges that a precision mode's own
cancel."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import parse_model, run_cli

import graphopt
from graphopt import numerics
from graphopt.errors import OptionError
from graphopt.tools.compare import compare_models


def _classifier(batch="N") -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    return parse_model(f"""
        g (float[{batch},3,16,16] x, float[{batch},4] extra) => (float[{batch},10] y,
                                                              float[{batch},4] twice,
                                                              int64[{batch}] label) {{
            c = Conv <pads = [1,1,1,1]> (x, w, b)
            r = Relu (c)
            p = GlobalAveragePool (r)
            f = Flatten (p)
            y = Gemm <transB = 1> (f, wf, bf)
            twice = Add (extra, extra)
            label = ArgMax <axis = 1, keepdims = 0> (y)
        }}""", w=(rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32),
        b=rng.standard_normal(8).astype(np.float32),
        wf=(rng.standard_normal((10, 8)) * 0.3).astype(np.float32),
        bf=rng.standard_normal(10).astype(np.float32))


def _feeds(batch=2, seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, 3, 16, 16)).astype(np.float16),
            "extra": rng.standard_normal((batch, 4)).astype(np.float32)}


def _dtypes(values) -> dict[str, int]:
    return {v.name: v.type.tensor_type.elem_type for v in values}


@pytest.mark.parametrize("precision", ["keep", "fp16", "mixed-fp16"])
def test_inputs_take_and_outputs_give_float16(precision):
    model = _classifier()
    result = graphopt.optimize(model, input_fp16_nodes="x", output_type="y:FP16",
                               precision=precision)
    compiled = result.to_onnx()
    onnx.checker.check_model(compiled, full_check=True)
    f16, f32, i64 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    assert _dtypes(compiled.graph.input) == {"x": f16, "extra": f32}
    assert _dtypes(compiled.graph.output) == {"y": f16, "twice": f32, "label": i64}
    assert "input 'x' takes float16; output 'y' is float16" in " ".join(result.notes)
    feeds = _feeds()
    expected = numerics.run(model, {**feeds, "x": feeds["x"].astype(np.float32)})
    actual = numerics.run(compiled, feeds)
    tolerance = 1e-3 if precision == "keep" else 2e-2
    np.testing.assert_allclose(actual["y"].astype(np.float32), expected["y"], rtol=tolerance,
                               atol=tolerance)
    if precision == "fp16":  # the mode's boundary Casts met the edges' and cancelled
        casts = [(n.input[0], n.output[0]) for n in compiled.graph.node if n.op_type == "Cast"]
        assert casts == [("extra", "extra_f16"), ("twice_f16", "twice")]


def test_every_float_output_and_float16_outputs_back_to_float32():
    result = graphopt.optimize(_classifier(), output_type="FP16")
    assert _dtypes(result.to_onnx().graph.output) == {
        "y": onnx.TensorProto.FLOAT16, "twice": onnx.TensorProto.FLOAT16,
        "label": onnx.TensorProto.INT64}
    half = parse_model("g (float16[2,4] a) => (float16[2,4] s) { s = Add (a, a) }")
    widened = graphopt.optimize(half, output_type={"s": "FP32"}).to_onnx()
    assert _dtypes(widened.graph.output) == {"s": onnx.TensorProto.FLOAT}
    a = np.arange(8, dtype=np.float16).reshape(2, 4)
    assert numerics.run(widened, {"a": a})["s"].tolist() == (2 * a).astype(np.float32).tolist()


def test_an_output_named_overrides_every_output():
    # {"": "FP16", "y": "FP32"} gave y float16: the cast for every output came first, and y's
    # own type then read as already given.
    result = graphopt.optimize(_classifier(), output_type={"": "FP16", "y": "FP32"})
    assert _dtypes(result.to_onnx().graph.output) == {
        "y": onnx.TensorProto.FLOAT, "twice": onnx.TensorProto.FLOAT16,
        "label": onnx.TensorProto.INT64}
    assert "output 'twice' is float16" in " ".join(result.notes)


def test_node_index_names_an_output_as_in_atc():
    model = _classifier()
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    gemm.name = "head"
    compiled = graphopt.optimize(model, output_type="head:0:FP16").to_onnx()
    assert _dtypes(compiled.graph.output)["y"] == onnx.TensorProto.FLOAT16


def test_the_artifact_verifies_inspects_and_compares_against_the_source(tmp_path, capsys):
    source, om = tmp_path / "net.onnx", tmp_path / "net.om"
    onnx.save(_classifier(), source)
    rc, out, err = run_cli(capsys, "optimize", source, "-o", om, "--input-fp16-nodes", "x",
                           "--output-type", "FP16", "--verify")
    assert rc == 0, err
    session = graphopt.load(om)
    assert [(e["name"], e["dtype"]) for e in session.inputs] == [("x", "float16"),
                                                                  ("extra", "float32")]
    rc, out, _ = run_cli(capsys, "inspect", om)
    assert "io types   --input-fp16-nodes/--output-type: input 'x' float16, output 'twice' " \
           "float16, output 'y' float16" in out
    report = compare_models(source, om)  # the source runs with the same Casts at its edges
    assert report.passed
    assert any("ran with the same Casts at its edges" in note for note in report.notes)
    assert compare_models(source, om, _feeds()).passed
    # float32 data for x: the refusal named the source, whose file takes float32 there.
    single = {**_feeds(), "x": _feeds()["x"].astype(np.float32)}
    with pytest.raises(graphopt.errors.InputError,
                       match=f"^feeds: input 'x' has dtype float32, but {om} takes float16 "
                             r"there \(its compile's input_fp16_nodes\)"):
        compare_models(source, om, single)


def test_verify_inputs_in_float32_for_a_float16_input_say_why(tmp_path, capsys):
    source, feeds = tmp_path / "net.onnx", tmp_path / "feeds.npz"
    onnx.save(_classifier(), source)
    np.savez(feeds, **{**_feeds(), "x": _feeds()["x"].astype(np.float32)})
    rc, _, err = run_cli(capsys, "optimize", source, "-o", tmp_path / "net.om",
                         "--input-fp16-nodes", "x", "--verify", "--inputs", feeds)
    assert rc != 0
    assert "input 'x' has dtype float32, expected float16[N,3,16,16] (--input-fp16-nodes makes " \
           "it take float16, and --inputs holds what the compiled model takes)" in err
    assert not (tmp_path / "net.om").exists()


def test_compare_casts_an_inner_tensor_out_nodes_made_an_output():
    # The source computes r inside, in float32: the compile's float16 r failed on 480 elements
    # at rtol 1e-4, though the model is exact up to the Cast.
    source = _classifier()
    compiled = graphopt.optimize(source, out_nodes="r;y", output_type="FP16").to_onnx()
    assert _dtypes(compiled.graph.output) == {"r": onnx.TensorProto.FLOAT16,
                                              "y": onnx.TensorProto.FLOAT16}
    report = compare_models(source, compiled)
    assert report.passed, [(row.name, row.note, row.mismatches) for row in report.rows]


def test_shape_profiles_keep_the_dtypes(tmp_path, capsys):
    source, om = tmp_path / "net.onnx", tmp_path / "net.om"
    onnx.save(_classifier(), source)
    rc, _, err = run_cli(capsys, "optimize", source, "-o", om, "--input-fp16-nodes", "x",
                         "--dynamic-dims", "N:1,2", "--verify")
    assert rc == 0, err
    session = graphopt.load(om)
    for batch in (1, 2):
        outputs = session.run(_feeds(batch))
        assert outputs["y"].dtype == np.float32 and outputs["y"].shape == (batch, 10)
    assert compare_models(source, om).passed


@pytest.mark.parametrize("keywords, message", [
    ({"input_fp16_nodes": "z"}, "input_fp16_nodes 'z': the model has no such input (its "
                                "inputs: 'x', 'extra')"),
    ({"input_fp16_nodes": "x;x"}, "'x' named twice"),
    ({"input_fp16_nodes": ""}, "an empty name"),
    ({"output_type": "UINT8"}, "'UINT8'; expected FP16 or FP32 (a uint8 output needs a "
                               "quantization scale the model does not state)"),
    ({"output_type": "y:INT8"}, "output_type y: 'INT8'; expected FP16 or FP32"),
    ({"output_type": "y"}, "output_type every output: 'y'; expected FP16 or FP32"),
    ({"output_type": "y:"}, "output_type y: no type; expected FP16 or FP32"),
    ({"output_type": "label:FP16"}, "output_type 'label': the output is int64; only float32 "
                                    "and float16 outputs change type"),
    ({"output_type": "c:FP16"}, "output_type 'c': not an output of the model"),
    ({"output_type": "nothing:FP16"}, "output_type 'nothing': no tensor or node of the main "
                                      "graph has that name"),
    ({"output_type": 3}, "output_type: expected \"a;b\" or a list of names, not int"),
    ({"output_type": {}}, "output_type: an empty dict names no output"),
    # One output by two spellings was cast twice, or took the first type given, silently.
    ({"output_type": "y:FP16;y:0:FP32"}, "output_type names output 'y' twice ('y' and 'y:0')"),
    ({"output_type": "y:FP16;y:0:FP16"}, "output_type names output 'y' twice ('y' and 'y:0')"),
    ({"output_type": "y:FP16;:FP32"}, "an empty name before ':FP32'"),
])
def test_names_and_types_that_do_not_fit_are_refused(keywords, message):
    with pytest.raises(OptionError) as refused:
        graphopt.optimize(_classifier(), **keywords)
    assert message in str(refused.value)


def test_an_integer_input_is_refused_by_name_on_the_command_line(tmp_path, capsys):
    source = tmp_path / "ids.onnx"
    onnx.save(parse_model("g (int64[2] i) => (int64[2] o) { o = Identity (i) }"), source)
    rc, _, err = run_cli(capsys, "optimize", source, "-o", tmp_path / "o.om",
                         "--input-fp16-nodes", "i")
    assert rc == 1 and "--input-fp16-nodes 'i': the input is int64; only float32 inputs can " \
        "take float16" in err
    assert not (tmp_path / "o.om").exists()


def test_outputs_both_in_float16_are_judged_at_float16s_step():
    # A sum taken in another order may round to the neighbouring float16: 1 step, 2⁻¹⁰ of the
    # value, which --verify's rtol 1e-4 read as a failure.
    from graphopt.tools.compare import compare_arrays

    reference = np.array([0.1, 1.0, 3.0], np.float16)
    neighbour = np.nextafter(reference, np.float16(10))
    assert compare_arrays("y", reference, neighbour).passed
    assert not compare_arrays("y", reference, neighbour + np.float16(0.01)).passed
    assert not compare_arrays("y", reference.astype(np.float32),
                              neighbour.astype(np.float32)).passed


def test_an_output_graph_output_lists_twice_gets_one_cast_and_one_record():
    model = parse_model("g (float[2,4] x) => (float[2,4] a) { a = Relu (x) }")
    model.graph.output.append(model.graph.output[0])
    result = graphopt.optimize(model, output_type="FP16", level=0)
    compiled = result.to_onnx()
    assert [n.op_type for n in compiled.graph.node].count("Cast") == 1
    assert "output 'a' is float16" in result.notes and not any("a_f32" in n for n in result.notes)
    from graphopt.source_marks import io_types
    assert io_types(compiled.metadata_props)["outputs"] == {"a": "float16"}


@pytest.mark.parametrize("spec, named", [("y:FP16;head:0:FP32", "('y' and 'head:0')"),
                                         ("y:FP16;head:FP16", "('y' and 'head')")])
def test_one_output_named_twice_is_refused(spec, named):
    # The first type named won and the second went unsaid (or, asked alike, a second Cast
    # recorded the output as 'y_f32').
    model = _classifier()
    next(n for n in model.graph.node if n.op_type == "Gemm").name = "head"
    with pytest.raises(OptionError) as refused:
        graphopt.optimize(model, output_type=spec)
    assert f"output_type names output 'y' twice {named}" in str(refused.value)


def test_every_output_names_the_output_it_cannot_retype():
    model = parse_model("g (float[2,4] x) => (float[2,4] x, float[2,4] a) { a = Relu (x) }")
    with pytest.raises(OptionError) as refused:
        graphopt.optimize(model, output_type="FP16")
    assert "output_type FP16 (every output): 'x': the output is also an input" in \
        str(refused.value)


def test_an_aipp_input_named_as_float16_is_refused_naming_insert_op_conf(tmp_path):
    config = tmp_path / "aipp.cfg"
    config.write_text("aipp_op {\n aipp_mode: static\n input_format: RGB888_U8\n"
                      " src_image_size_w: 16\n src_image_size_h: 16\n}\n")
    with pytest.raises(OptionError) as refused:
        graphopt.optimize(_classifier(batch=1), insert_op_conf=config, input_fp16_nodes="x")
    assert "input_fp16_nodes 'x': the input takes insert_op_conf's uint8 images" in \
        str(refused.value)


def test_compare_casts_the_sources_value_of_a_cut_to_output_given_in_float16(tmp_path, capsys):
    # The source ends elsewhere: its value of 'r' (float32) failed against the .om's float16 r.
    source, om = tmp_path / "net.onnx", tmp_path / "cut.om"
    onnx.save(_classifier(batch=1), source)
    rc, _, err = run_cli(capsys, "optimize", source, "-o", om, "--out-nodes", "r;y",
                         "--output-type", "r:FP16")
    assert rc == 0, err
    report = compare_models(source, om)
    assert report.passed, [(r.name, r.note) for r in report.rows]
    assert [(r.name, r.dtype) for r in report.outputs] == [("r", "f16"), ("y", "f32")]
    assert any("was cut to r (" in n and "gives it in another dtype" in n for n in report.notes)


def test_an_output_type_of_an_output_out_nodes_cut_says_so():
    # "no tensor or node of the main graph has that name", of an output of the source.
    with pytest.raises(OptionError, match="output_type 'twice': out_nodes cut that output of "
                                          "the source model"):
        graphopt.optimize(_classifier(batch=1), out_nodes="r;y", output_type={"twice": "FP16"})


def test_compare_says_which_outputs_it_judged_at_float16s_step(tmp_path):
    # The rule line read "allclose(rtol=0, atol=0)" over a float16 output one step off, which
    # passed at rtol 2⁻¹⁰ with nothing saying so.
    exact = tmp_path / "exact.onnx"
    onnx.save(parse_model("g (float16[4] a) => (float16[4] s) { s = Add (a, a) }"), exact)
    stepped = tmp_path / "stepped.onnx"
    onnx.save(parse_model("g (float16[4] a) => (float16[4] s) { t = Add (a, a)\n"
                          " s = Add (t, c) }", c=np.array(2 ** -9, np.float16)), stepped)
    feeds = {"a": np.ones(4, np.float16)}
    report = compare_models(exact, stepped, feeds, rtol=0, atol=0)
    assert report.passed
    assert "s: float16 in both models, judged at rtol=0.0009765625 (float16's step, which a " \
           "sum in another order can round by) rather than 0" in report.notes
    wide = compare_models(exact, stepped, feeds, rtol=1e-2, atol=0)
    assert not any("float16's step" in note for note in wide.notes)


def test_bf16_leaves_a_float16_edge_alone_where_its_neighbour_stays_float32():
    # bf16 converted the edges' Casts themselves: x went float16 -> bfloat16 -> float32 into a
    # Conv kept float32, and y float32 -> bfloat16 -> float16, 3 bits lost each way for nothing.
    model = parse_model("""
        g (float[1,3,8,8] x) => (float[1,4,8,8] y) { y = Conv <pads = [1,1,1,1]> (x, w) }""",
        w=np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32))
    compiled = graphopt.optimize(model, input_fp16_nodes="x", output_type="FP16",
                                 precision="bf16").to_onnx()
    to = [a.i for n in compiled.graph.node if n.op_type == "Cast" for a in n.attribute]
    assert onnx.TensorProto.BFLOAT16 not in to
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float16)}
    kept = graphopt.optimize(model, input_fp16_nodes="x", output_type="FP16").to_onnx()
    assert numerics.run(compiled, feeds)["y"].tolist() == numerics.run(kept, feeds)["y"].tolist()


@pytest.mark.parametrize("spec", ["FP16;y:FP32", "y:FP32;fp16"])
def test_a_bare_type_among_named_outputs_is_every_other_outputs(spec):
    # The command line refused "FP16;y:FP32" as "FP16: no type; expected FP16 or FP32", while
    # the library took the same ask as {"": "FP16", "y": "FP32"}.
    result = graphopt.optimize(_classifier(), output_type=spec)
    assert _dtypes(result.to_onnx().graph.output) == {
        "y": onnx.TensorProto.FLOAT, "twice": onnx.TensorProto.FLOAT16,
        "label": onnx.TensorProto.INT64}


def test_a_type_for_every_output_given_twice_is_refused():
    with pytest.raises(OptionError) as refused:
        graphopt.optimize(_classifier(), output_type="FP16;FP32")
    assert "output_type: a type for every output given twice" in str(refused.value)


def _zipmap_classifier() -> onnx.ModelProto:
    from onnx import helper as h

    ml = "ai.onnx.ml"
    linear = h.make_node("LinearClassifier", ["x"], ["label", "scores"], domain=ml,
                         classlabels_ints=[0, 1], coefficients=[1.0, -1.0, -1.0, 1.0],
                         intercepts=[0.0, 0.0])
    zipmap = h.make_node("ZipMap", ["scores"], ["probabilities"], domain=ml,
                         classlabels_int64s=[0, 1])
    map_type = h.make_map_type_proto(onnx.TensorProto.INT64,
                                     h.make_tensor_type_proto(onnx.TensorProto.FLOAT, None))
    graph = h.make_graph([linear, zipmap], "g",
                         [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [None, 2])],
                         [h.make_tensor_value_info("label", onnx.TensorProto.INT64, [None]),
                          h.make_value_info("probabilities", h.make_sequence_type_proto(map_type))])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(ml, 1)],
                        ir_version=8)


def test_a_zipmap_output_is_named_for_what_it_is():
    # "every output named already has that type", and "the output is untyped", of a
    # scikit-learn classifier's seq(map(int64, float)) probabilities.
    result = graphopt.optimize(_zipmap_classifier(), output_type="FP16")
    assert ("output_type: the model has no float32 or float16 output to change; nothing changed "
            "(its outputs: 'label' (int64), 'probabilities' (a seq(map(i64,f32)), not a tensor))"
            ) in result.notes
    with pytest.raises(OptionError, match=r"'probabilities': the output is a seq\(map\(i64,f32\)\)"
                                          r", not a tensor; only float32 and float16 outputs "
                                          r"change type \(out_nodes can make the tensor it is "
                                          r"built from an output\)"):
        graphopt.optimize(_zipmap_classifier(), output_type="probabilities:FP16")
