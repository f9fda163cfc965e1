"""The import check of what onnxruntime's CPU provider can load: its kernel registry's version
rule, the dtypes a kernel binds, its own schemas for its contrib ops, and the cases onnxruntime
runs without a matching kernel (float16 through inserted Casts, ops whose ONNX function body
only ONNX's inference refuses)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import parse_model

import graphopt
from graphopt import numerics
from graphopt.errors import GraphoptError
from graphopt.partition.target_ort import OPEN_ENDED, kernel_takes_version, ort_cpu_kernels

RTOL, ATOL = 1e-6, 1e-6


def _ort_loads(model: onnx.ModelProto) -> bool:
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - any refusal is what the test asks about
        return False
    return True


def _compiled_run(model: onnx.ModelProto, feeds: dict, folder) -> list[np.ndarray]:
    """`model` compiled into an .om, loaded and run on `feeds`; the ONNX result checked."""
    result = graphopt.optimize(model)
    onnx.checker.check_model(result.to_onnx())
    path = folder / "model.om"
    graphopt.save(result, path)
    return list(graphopt.load(path).run(feeds).values())


def _reference(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_an_open_ended_kernel_runs_only_the_schema_version_it_was_written_for():
    # As onnxruntime's kernel registry decides: "version 25 on" means version 25 itself, since
    # a later schema of the op may differ; a closed range covers every version in it.
    assert kernel_takes_version(25, OPEN_ENDED, 25)
    assert not kernel_takes_version(25, OPEN_ENDED, 28)
    assert kernel_takes_version(13, 18, 17) and kernel_takes_version(13, 18, 18)
    assert not kernel_takes_version(13, 18, 19) and not kernel_takes_version(13, 18, 12)


@pytest.mark.skipif(onnx.defs.onnx_opset_version() < 28, reason="this onnx has no opset 28")
def test_a_schema_newer_than_every_kernel_is_refused_at_import():
    model = parse_model(
        "g (int8[4] x) => (float[4] y) { y = DequantizeLinear (x, s) }",
        header='<ir_version: 11, opset_import: ["" : 28]>\n', s=np.float32(0.5))
    if _ort_loads(model):
        pytest.skip("this onnxruntime has a kernel for DequantizeLinear-28")
    # The newest kernel is registered "from 25 on", which runs version 25 alone: not "25+"
    with pytest.raises(GraphoptError, match=r"no CPU kernel for DequantizeLinear version 28 "
                                            r"\(its kernels cover versions [-, \d]*\d\)"):
        graphopt.optimize(model)


@pytest.mark.parametrize("node, shape", [("Unsqueeze <axes = [-1]> (x)", "[2, 3, 1]"),
                                         ("Squeeze <axes = [-1]> (x)", "[2, 3]")])
def test_negative_squeeze_axes_before_opset_11_are_refused_not_misread(node, shape):
    # onnxruntime runs them counting from the end; ONNX's inference at opset 10 did not, and
    # the compile removed the Unsqueeze of [2, 3] as adding nothing: Shape gave [2, 3].
    x_shape = "[2, 3, 1]" if node.startswith("Squeeze") else "[2, 3]"
    model = parse_model(f"g (float{x_shape} x) => (int64[{shape.count(',') + 1}] s) "
                        f"{{ y = {node}\n s = Shape (y) }}",
                        header='<ir_version: 5, opset_import: ["" : 10]>\n')
    assert numerics.run(model, {"x": np.ones(json.loads(x_shape), np.float32)})["s"].tolist() == \
        json.loads(shape)
    with pytest.raises(GraphoptError, match=r"axes \[-1\]: negative axes count from the end "
                                            r"only from opset 11, and the model imports opset 10"):
        graphopt.optimize(model)


def test_a_float16_node_without_a_float16_kernel_compiles_as_onnxruntime_runs_it(tmp_path):
    # onnxruntime computes it in float32 between Casts it inserts at load.
    if "float16" in ort_cpu_kernels()["Div"]:
        pytest.skip("this onnxruntime has a float16 Div kernel on the CPU")
    model = parse_model("g (float16[2,3] a, float16[2,3] b) => (float16[2,3] y) "
                        "{ y = Div (a, b) }")
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal((2, 3)).astype(np.float16),
             "b": rng.uniform(1, 2, (2, 3)).astype(np.float16)}
    np.testing.assert_allclose(_compiled_run(model, feeds, tmp_path)[0],
                               _reference(model, feeds)[0], rtol=RTOL, atol=ATOL)


def test_a_bfloat16_node_without_a_bfloat16_kernel_is_refused_by_node_and_dtypes():
    if "bfloat16" in ort_cpu_kernels()["Div"]:
        pytest.skip("this onnxruntime has a bfloat16 Div kernel on the CPU")
    model = parse_model("g (bfloat16[2] a, bfloat16[2] b) => (bfloat16[2] y) "
                        "{ y = Div (a, b) }")
    assert not _ort_loads(model)
    with pytest.raises(GraphoptError, match=r"node writing 'y' \(Div\): onnxruntime's CPU provider has "
                                            r"no Div-14 kernel for these dtypes \(a bfloat16, "
                                            r"b bfloat16, y bfloat16\)"):
        graphopt.optimize(model)


def test_an_error_inside_onnxs_own_function_body_is_not_the_models_fault(tmp_path):
    # ONNX's strict inference refuses MeanVarianceNormalization-13 through the Constant of its
    # schema's function body; onnxruntime runs the op with its own kernel.
    model = parse_model("g (float[2,3,4,4] x) => (float[2,3,4,4] y) "
                        "{ y = MeanVarianceNormalization (x) }",
                        header='<ir_version: 7, opset_import: ["" : 13]>\n')
    assert _ort_loads(model)
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 3, 4, 4)).astype(np.float32)}
    np.testing.assert_allclose(_compiled_run(model, feeds, tmp_path)[0],
                               _reference(model, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", [None, "ascend310"])
@pytest.mark.parametrize("body, groups, epsilon, shape", [
    ("y = GroupNormalization <num_groups = 3, epsilon = 0.001> (x, s, b)", 3, 1e-3,
     "N,6,5,5"),
    # x computed by another node (its type unknown at import); one element per group, a tiny
    # epsilon: an InstanceNormalization rewrite was 5e-5 off there
    ("r = Relu (x)\n y = GroupNormalization <num_groups = 6, epsilon = 0.000001> (r, s, b)", 6,
     1e-6, "N,6"),
])
def test_deprecated_group_normalization_18_compiles_to_what_onnxruntime_computes(
        tmp_path, target, body, groups, epsilon, shape):
    # onnx.checker refuses GroupNormalization-18 (scale and bias per group); onnxruntime runs
    # it as the function ONNX gives its schema, which import writes out op for op.
    rng = np.random.default_rng(2)
    model = parse_model(f"g (float[{shape}] x) => (float[{shape}] y) {{ {body} }}",
                        header='<ir_version: 8, opset_import: ["" : 18]>\n',
                        s=rng.standard_normal(groups).astype(np.float32),
                        b=rng.standard_normal(groups).astype(np.float32))
    assert _ort_loads(model)
    sizes = [2 if d == "N" else int(d) for d in shape.split(",")]
    feeds = {"x": rng.standard_normal(sizes).astype(np.float32) * 3 + 1}
    result = graphopt.optimize(model, target=target)
    assert any("GroupNormalization node(s) of opset 18" in note for note in result.notes)
    onnx.checker.check_model(result.to_onnx(), full_check=True)
    graphopt.save(result, tmp_path / "model.om")
    actual = list(graphopt.load(tmp_path / "model.om").run(feeds).values())
    # The function body's variance, mean(x²) − mean(x)², fuses into one LayerNormalization
    # over each group (LayerNormMoments), which sums in another order: a unit in the last place.
    np.testing.assert_allclose(actual[0], _reference(model, feeds)[0], rtol=1e-6, atol=1e-6)


def test_group_normalization_18_whose_groups_do_not_divide_the_channels_stays_refused():
    # No input runs it; rewritten, later passes could drop the Reshape that fails.
    model = parse_model("g (float[N,6,2] x) => (float[N,6,2] y) "
                        "{ y = GroupNormalization <num_groups = 4> (x, s, b) }",
                        header='<ir_version: 8, opset_import: ["" : 18]>\n',
                        s=np.ones(4, np.float32), b=np.zeros(4, np.float32))
    with pytest.raises(GraphoptError, match="GroupNormalization is deprecated"):
        graphopt.optimize(model)


@pytest.mark.parametrize("opset", [13, 14, 16])
@pytest.mark.parametrize("target", [None, "ascend310"])
def test_layer_normalization_before_opset_17_gets_opset_17(tmp_path, opset, target):
    # onnxruntime's transformer optimizer writes LayerNormalization into models of older
    # opsets, and onnxruntime runs it there: its own kernel, registered for opsets 1 to 16.
    rng = np.random.default_rng(3)
    model = parse_model("g (float[2,5,8] x) => (float[2,5,8] y) "
                        "{ r = Relu (x)\n y = LayerNormalization <epsilon = 0.00001> (r, s, b) }",
                        header=f'<ir_version: 8, opset_import: ["" : {opset}]>\n',
                        s=rng.standard_normal(8).astype(np.float32),
                        b=rng.standard_normal(8).astype(np.float32))
    assert _ort_loads(model)
    feeds = {"x": rng.standard_normal((2, 5, 8)).astype(np.float32)}
    result = graphopt.optimize(model, target=target)
    assert any(f"LayerNormalization at opset {opset}" in note for note in result.notes)
    proto = result.to_onnx()
    assert {o.domain: o.version for o in proto.opset_import}[""] == 17
    onnx.checker.check_model(proto, full_check=True)
    graphopt.save(result, tmp_path / "model.om")
    actual = list(graphopt.load(tmp_path / "model.om").run(feeds).values())
    np.testing.assert_allclose(actual[0], _reference(model, feeds)[0], rtol=1e-5, atol=1e-6)


MIXED_NORMS = """
    g (float[2,5,8] x) => (OUT[2,5,8] y) {
        a = Add (x, x)
        n1 = LayerNormalization <epsilon = 0.00001> (FIRST, s1, b1)
        h = Add (n1, c)
        y = LayerNormalization <epsilon = 0.00001> (h, s2, b2)
    }"""


@pytest.mark.parametrize("first, wide, narrow", [
    ("x", np.float32, np.float16),   # X known at import: a graph input
    ("a", np.float32, np.float16),   # X computed: typed by one inference at import
    ("a", np.float32, np.float64),   # a wider scale: the norm computes in double
])
def test_early_layer_normalization_with_a_scale_of_another_type(tmp_path, first, wide, narrow):
    """onnxruntime's LayerNormalization before opset 17 takes a scale and bias of another type
    V than X and writes Y in V (a float16 model that kept float32 inputs). ONNX-17's takes one
    type: the raised model computes in the wider type between Casts, as onnxruntime did."""
    rng = np.random.default_rng(5)
    names = {np.float16: "float16", np.float64: "double"}
    model = parse_model(MIXED_NORMS.replace("FIRST", first).replace("OUT", names[narrow]),
                        header='<ir_version: 8, opset_import: ["" : 16]>\n',
                        s1=(rng.random(8) + 0.5).astype(narrow), b1=rng.random(8).astype(narrow),
                        c=rng.random(8).astype(narrow), s2=(rng.random(8) + 0.5).astype(narrow),
                        b2=rng.random(8).astype(narrow))
    assert _ort_loads(model)
    feeds = {"x": rng.standard_normal((2, 5, 8)).astype(np.float32)}
    result = graphopt.optimize(model)
    (note,) = [n for n in result.notes if "LayerNormalization at opset 16" in n]
    assert "1 of them (a scale of another type than X) now compute in the wider type" in note
    onnx.checker.check_model(result.to_onnx(), full_check=True)
    graphopt.save(result, tmp_path / "model.om")
    (actual,) = graphopt.load(tmp_path / "model.om").run(feeds).values()
    (expected,) = _reference(model, feeds)
    assert actual.dtype == expected.dtype == narrow
    tolerance = 1e-3 if narrow == np.float16 else 1e-6
    np.testing.assert_allclose(actual, expected, rtol=tolerance, atol=tolerance)


def test_early_mixed_layer_normalization_with_constant_node_operands():
    # Exporters may write the scale and bias as Constant nodes, untyped at import.
    model = parse_model("""g (float16[2,8] x) => (float[2,8] y) {
        s = Constant <value = float[8] {0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2}> ()
        b = Constant <value = float[8] {-1, -0.5, 0, 0.5, 1, 1.5, 2, 2.5}> ()
        r = Relu (x)
        y = LayerNormalization (r, s, b)
    }""", header='<ir_version: 8, opset_import: ["" : 16]>\n')
    assert _ort_loads(model)
    feeds = {"x": np.random.default_rng(2).standard_normal((2, 8)).astype(np.float16)}
    result = graphopt.optimize(model)
    onnx.checker.check_model(result.to_onnx(), full_check=True)
    (actual,) = numerics.run(result.to_onnx(), feeds).values()
    (expected,) = _reference(model, feeds)
    assert actual.dtype == expected.dtype == np.float32
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)


def test_early_layer_normalization_of_mixed_types_declared_wrongly_is_refused():
    # onnxruntime refuses Y declared in X's type; graphopt says why.
    model = parse_model("g (float[2,8] x) => (float[2,8] y) "
                        "{ y = LayerNormalization (x, s, b) }",
                        header='<ir_version: 8, opset_import: ["" : 16]>\n',
                        s=np.ones(8, np.float16), b=np.zeros(8, np.float16))
    model.graph.node[0].name = "n1"
    assert not _ort_loads(model)
    with pytest.raises(GraphoptError, match=r"node 'n1' \(LayerNormalization\): X is float32 and "
                       r"its scale float16, so .* writes Y in the scale's type, but the model "
                       r"declares Y float32 \(onnxruntime refuses"):
        graphopt.optimize(model)


def test_early_mixed_layer_normalization_inside_a_branch_is_refused_with_the_way_out():
    # A branch's X is computed there, where the import's typing does not reach: onnxruntime
    # runs it, ONNX-17's inference refuses it, and the message says what the raise changed.
    model = parse_model("""g (float[2,8] x, bool c) => (float16[2,8] y) {
        y = If (c) <then_branch = t () => (float16[2,8] ty) { a = Add (x, x)
                                                             ty = LayerNormalization (a, s, b) },
                    else_branch = e () => (float16[2,8] ey) { ey = Cast <to = 10> (x) }>
    }""", header='<ir_version: 8, opset_import: ["" : 16]>\n', s=np.ones(8, np.float16),
        b=np.zeros(8, np.float16))
    assert _ort_loads(model)
    with pytest.raises(GraphoptError, match=r"the model's opset was raised to 17 for its "
                       r"LayerNormalization nodes .*: Cast the narrower of X and the scale and "
                       r"bias to the wider type, and Y to the scale's type"):
        graphopt.optimize(model)


def test_layer_normalization_at_an_opset_that_cannot_be_raised_is_refused_naming_it():
    model = parse_model("g (float[2,8] x) => (float[2,8] y) "
                        "{ y = LayerNormalization (x, s, b) }",
                        header='<ir_version: 7, opset_import: ["" : 12]>\n',
                        s=np.ones(8, np.float32), b=np.zeros(8, np.float32))
    with pytest.raises(GraphoptError, match=r"\(LayerNormalization\): .*domain_version of 12"):
        graphopt.optimize(model)


CONTRIB = '<ir_version: 10, opset_import: ["" : 17, "com.microsoft" : 1]>\n'


@pytest.mark.parametrize("body, message", [
    ("y = com.microsoft.BiasGelu (x)",
     r"\(com.microsoft::BiasGelu\): 1 input\(s\) where com.microsoft::BiasGelu-1 takes 2$"),
    ("y = com.microsoft.BiasGelu <bogus = 3> (x, b)",
     r"com.microsoft::BiasGelu-1 has no attribute 'bogus'$"),
    ("y = com.microsoft.FusedConv <group = \"1\"> (x, b)",
     r"attribute 'group' is STRING where com.microsoft::FusedConv-1 takes INT$"),
])
def test_an_onnxruntime_op_is_checked_against_onnxruntimes_schema(body, message):
    model = parse_model(f"g (float[1,1,4,4] x, float[1,1,1,1] b) => (float[1,1,4,4] y) {{ {body} }}",
                        header=CONTRIB)
    assert not _ort_loads(model)
    with pytest.raises(GraphoptError, match=message):
        graphopt.optimize(model)


def test_an_onnxruntime_op_that_fits_its_schema_compiles(tmp_path):
    model = parse_model("g (float[2,4] x, float[4] b) => (float[2,4] y) "
                        "{ y = com.microsoft.BiasGelu (x, b) }", header=CONTRIB)
    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal((2, 4)).astype(np.float32),
             "b": rng.standard_normal(4).astype(np.float32)}
    np.testing.assert_allclose(_compiled_run(model, feeds, tmp_path)[0],
                               _reference(model, feeds)[0], rtol=RTOL, atol=ATOL)


def test_an_internal_attribute_of_an_onnxruntime_op_passes_as_onnxruntime_lets_it():
    # Schema checks skip attribute names starting with "__" (internal symbols).
    model = parse_model("g (float[2,4] x, float[4] b) => (float[2,4] y) "
                        "{ y = com.microsoft.BiasGelu <__internal = 1> (x, b) }", header=CONTRIB)
    assert _ort_loads(model)
    graphopt.optimize(model)


@pytest.mark.parametrize("attribute", ["bogus = 3", "body = g2 () => () {}"])
def test_an_unknown_attribute_the_checker_lets_through_is_refused(attribute):
    # onnx.checker accepts any attribute on LayerNormalization: with a `body` graph the compile
    # exited 0 and wrote an .om whose partition onnxruntime could not load.
    model = parse_model(f"""
        g (float[3,4] x, float[4] w, float[4] b) => (float[3,4] y) {{
            y = LayerNormalization <axis = -1, {attribute}> (x, w, b)
        }}""")
    name = attribute.split()[0]
    with pytest.raises(GraphoptError, match=f"node writing 'y' \\(LayerNormalization\\): "
                                            f"Unrecognized attribute: {name} for operator "
                                            "LayerNormalization"):
        graphopt.optimize(model)


def test_an_attribute_of_a_later_opset_says_which():
    # torch's dynamo exporter at opset 17 writes chunk() as Split with num_outputs, which
    # came with Split-18: onnx's message alone did not say why the attribute was unknown.
    model = parse_model("g (float[4] x) => (float[2] a, float[2] b) "
                        "{ a, b = Split <axis = 0, num_outputs = 2> (x) }")
    with pytest.raises(GraphoptError, match=r"Unrecognized attribute: num_outputs for operator "
                                            r"Split \(it came with Split-18, and the model "
                                            r"imports opset 17: export it at opset 18 or later\)"):
        graphopt.optimize(model)


def test_an_output_declared_with_another_type_than_its_op_writes_is_refused():
    # skl2onnx declares a float64 tree's output double (at ai.onnx.ml 1, which ONNX's
    # inference does not type); TreeEnsembleRegressor always writes float, and onnxruntime
    # refuses the model (the .om compiled, then failed to load).
    model = parse_model(
        "g (double[N,2] x) => (double[N,1] y) "
        "{ y = ai.onnx.ml.TreeEnsembleRegressor <n_targets = 1, nodes_featureids = [0], "
        "nodes_modes = [\"LEAF\"], nodes_nodeids = [0], nodes_treeids = [0], "
        "nodes_truenodeids = [0], nodes_falsenodeids = [0], nodes_values = [0.0], "
        "target_ids = [0], target_nodeids = [0], target_treeids = [0], "
        "target_weights = [1.5]> (x) }",
        header='<ir_version: 8, opset_import: ["" : 17, "ai.onnx.ml" : 1]>\n')
    assert not _ort_loads(model)
    with pytest.raises(GraphoptError, match=r"output 'y' is declared float64, but the "
                                            r"op always writes float32"):
        graphopt.optimize(model)


@pytest.mark.parametrize("returned", [False, True])
def test_shape_inference_names_an_unnamed_node_by_its_output_even_beside_a_returned_input(
        returned):
    # An empty `dilations` no Conv kernel takes. Returning the input x as an output too used
    # to hide it (the check cleared every output's shape, x's with them), and an unnamed node
    # was named '?'.
    dilations = onnx.helper.make_attribute("dilations", [], attr_type=onnx.AttributeProto.INTS)
    conv = onnx.helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3])
    conv.attribute.append(dilations)
    info = onnx.helper.make_tensor_value_info
    outputs = [info("y", onnx.TensorProto.FLOAT, [1, 4, 3, 3])]
    if returned:
        outputs.append(info("x", onnx.TensorProto.FLOAT, [1, 2, 5, 5]))
    graph = onnx.helper.make_graph(
        [conv], "g", [info("x", onnx.TensorProto.FLOAT, [1, 2, 5, 5])], outputs,
        [onnx.numpy_helper.from_array(np.ones((4, 2, 3, 3), np.float32), "w")])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    with pytest.raises(GraphoptError, match=r"^<model>: node writing 'y' \(Conv\): shape "
                                            r"inference refuses it: .*dilations"):
        graphopt.optimize(model)


def test_a_casts_inert_saturate_is_dropped_so_the_cast_can_leave_a_loop_body():
    # onnxruntime loads this Loop body's Casts with `saturate` to integer types, and refuses
    # the attribute ("only used for cast to float 8 types") once a compile had moved them out
    # of the body: the compiled model did not load.
    proto = onnx.parser.parse_model("""<ir_version: 9, opset_import: ["" : 19]>
    g (int32[1,1,1,1] x) => (int32[1,a,1,1] x, int32[b,c,d,e,f] scanned)
       <int64 n = {2}, bool go = {1}> {
       scanned = Loop (n, go) <body: graph = body (int64 i, bool cond) =>
                                (bool cond_out, int32[g,1,h,k] back) {
          cond_out = Identity (cond)
          wide = Cast <saturate: int = 1, to: int = 13> (x)
          narrow = Cast <saturate: int = 0, to: int = 6> (wide)
          back = Cast <to: int = 6> (narrow)
       }>
    }""")
    assert _ort_loads(proto)
    x = {"x": np.array([[[[-3]]]], np.int32)}
    for level in (1, 2, 3):
        out = graphopt.optimize(proto, level=level).to_onnx()
        assert not any(a.name == "saturate" for n in out.graph.node for a in n.attribute)
        np.testing.assert_array_equal(numerics.run(out, x)["scanned"],
                                      numerics.run(proto, x)["scanned"])


def test_an_image_scaler_becomes_the_mul_and_add_the_conv_after_it_takes_in():
    # ImageScaler (opsets 1-9) heads old converted models such as the model zoo's Tiny
    # YOLOv2: written as Mul and Add, it runs on an NPU, which had sent it to the host, and
    # folds into the Conv after it.
    rng = np.random.default_rng(0)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("ImageScaler", ["x"], ["s"], scale=0.0039, bias=[0.1, -0.2, 0.3]),
         onnx.helper.make_node("Conv", ["s", "w"], ["c"], pads=[1, 1, 1, 1]),
         onnx.helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.1)], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 8, 8])],
        [onnx.numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")])
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 8)],
                                   ir_version=4)
    x = {"x": rng.uniform(0, 255, (1, 3, 8, 8)).astype(np.float32)}
    for target in (None, "ascend310"):
        result = graphopt.optimize(proto, target=target)
        assert "1 ImageScaler node(s) (an experimental op of opsets 1-9) rewritten as the Mul " \
               "and Add they compute" in result.notes
        assert "ImageScaler" not in [n.op_type for n in result.model.graph]
        np.testing.assert_allclose(numerics.run(result.to_onnx(), x)["y"],
                                   numerics.run(proto, x)["y"], rtol=1e-4, atol=1e-4)
    placed = graphopt.optimize(proto, target="ascend310").partitioning.partitions
    assert [p.device for p in placed] == ["npu"]
