"""RenameOrtGeneratedInitializers: names onnxruntime's generator wrote (`base_token_N`, and the
bare `base` beside them) are renamed, so a model onnxruntime optimized once loads again in
onnxruntime after graphopt compiled it."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import parse_model

import graphopt
from graphopt import numerics
from graphopt.ir import load_onnx, to_onnx, verify
from graphopt.passes import PASSES, PIPELINES, Options, PassContext


def rename(proto: onnx.ModelProto):
    model = load_onnx(proto)
    result = PASSES["RenameOrtGeneratedInitializers"]().run(model, PassContext(Options()))
    verify(model)
    out = to_onnx(model)
    onnx.checker.check_model(out)
    feeds = numerics.random_feeds(proto, seed=1)
    assert not numerics.compare(numerics.run(proto, feeds), numerics.run(out, feeds), 0, 0)
    return model, dict(result.stats)


def test_generated_names_and_their_base_are_renamed_but_not_the_signature():
    model, stats = rename(parse_model("""
    g (float[2, 4] x, int64[2] reorder_token_9 = {2, 4}) => (float[2, 4] y, int64[2] c_token_1) {
        a = Reshape(x, reorder)
        b = Reshape(a, reorder_token_0)
        r_token_2 = Reshape(b, n_token_3_new_shape)
        d = Reshape(r_token_2, reorder_token_9)
        e = Reshape(d, n_new_shape)
        y = Reshape(e, s)
        c_token_1 = Identity(s)
    }""", reorder=np.array([2, 4]), reorder_token_0=np.array([4, 2]),
        n_token_3_new_shape=np.array([2, 4]), n_new_shape=np.array([2, 4]), s=np.array([2, 4])))
    # The input (overridable) and the outputs keep their names, and so does a computed value:
    # onnxruntime names the values it computes with a generator that checks values (a
    # gemm_input_reshape_arg_token_1 is safe), and the ones the generator that does not check
    # them names are initializers. `s` is no name onnxruntime generates.
    assert stats == {"initializer": 4}
    assert set(model.graph.initializers) == {
        "reorder_1", "reorder_0", "n_3_new_shape_1", "n_new_shape_1", "s", "reorder_token_9"}
    assert [v.name for v in model.graph.outputs] == ["y", "c_token_1"]


def test_the_bases_of_a_single_fusion_are_renamed_alone():
    # One MatMulAddFusion and one ReshapeFusion (of an unnamed node) leave no _token_ beside
    # their names; onnxruntime's next ones generate the same names.
    model, stats = rename(parse_model("""
    g (float[8] x) => (float[2, 4] y) {
        a = Reshape(x, gemm_input_shape)
        b = Reshape(a, _new_shape)
        y = Reshape(b, input_shape)
    }""", gemm_input_shape=np.array([4, 2]), _new_shape=np.array([8]),
        input_shape=np.array([2, 4])))
    assert stats == {"initializer": 2}
    assert set(model.graph.initializers) == {"gemm_input_shape_1", "_new_shape_1", "input_shape"}


def test_renamed_names_are_not_renamed_again():
    model, _ = rename(parse_model("""
    g (float[2, 4] x) => (float[2, 4] y) {
        a = Reshape(x, s)
        y = Reshape(a, s_token_0)
    }""", s=np.array([4, 2]), s_token_0=np.array([2, 4])))
    _, stats = rename(to_onnx(model))
    assert stats == {}


def test_names_are_renamed_before_a_merge_could_leave_the_bare_base_alone():
    # Three projections of one width: merging their equal shapes leaves only gemm_input_shape,
    # which nothing beside it would any longer mark as onnxruntime's.
    proto = parse_model("""
    g (float[8] x) => (float[2, 4] y) {
        a = Reshape(x, gemm_input_shape)
        b = Reshape(x, gemm_input_shape_token_6)
        c = Reshape(x, gemm_input_shape_token_12)
        ab = Add(a, b)
        y = Add(ab, c)
    }""", gemm_input_shape=np.array([2, 4]), gemm_input_shape_token_6=np.array([2, 4]),
        gemm_input_shape_token_12=np.array([2, 4]))
    result = graphopt.optimize(proto)
    assert set(result.model.graph.initializers) == {"gemm_input_shape_1"}


def test_every_level_but_the_round_trip_renames():
    assert [level for level, pipeline in PIPELINES.items()
            if "RenameOrtGeneratedInitializers" in pipeline.pass_names()] == [1, 2, 3]


S, H, F, HEADS = 4, 8, 16, 2


def bertish() -> onnx.ModelProto:
    """Two BERT encoder layers over a [1, S, H] input; every projection a 3-D MatMul + Add."""
    rng = np.random.default_rng(0)
    weights = {"heads": np.array([1, S, HEADS, H // HEADS]), "merged": np.array([1, S, H])}
    lines, x = [], "x"
    for i in range(2):
        def linear(name, source, k, m):
            weights[f"w{i}{name}"] = (rng.standard_normal((k, m)) * 0.3).astype(np.float32)
            weights[f"b{i}{name}"] = (rng.standard_normal(m) * 0.3).astype(np.float32)
            lines.extend([f"mm{i}{name} = MatMul({source}, w{i}{name})",
                          f"{name}{i} = Add(mm{i}{name}, b{i}{name})"])
            return f"{name}{i}"

        for name, perm in (("q", "[0, 2, 1, 3]"), ("k", "[0, 2, 3, 1]"), ("v", "[0, 2, 1, 3]")):
            lines.extend([f"{name}r{i} = Reshape({linear(name, x, H, H)}, heads)",
                          f"{name}t{i} = Transpose <perm = {perm}> ({name}r{i})"])
        for name in ("g1", "be1", "g2", "be2"):
            weights[f"{name}{i}"] = rng.standard_normal(H).astype(np.float32)
        lines.extend([f"s{i} = MatMul(qt{i}, kt{i})", f"p{i} = Softmax <axis = -1> (s{i})",
                      f"c{i} = MatMul(p{i}, vt{i})",
                      f"ct{i} = Transpose <perm = [0, 2, 1, 3]> (c{i})",
                      f"cr{i} = Reshape(ct{i}, merged)",
                      f"r1{i} = Add({linear('o', f'cr{i}', H, H)}, {x})",
                      f"ln1{i} = LayerNormalization <axis = -1> (r1{i}, g1{i}, be1{i})",
                      f"relu{i} = Relu({linear('f1', f'ln1{i}', H, F)})",
                      f"r2{i} = Add({linear('f2', f'relu{i}', F, H)}, ln1{i})",
                      f"ln2{i} = LayerNormalization <axis = -1> (r2{i}, g2{i}, be2{i})"])
        x = f"ln2{i}"
    lines.append(f"y = Identity({x})")
    body = "\n".join(lines)
    return parse_model(f"g (float[1, {S}, {H}] x) => (float[1, {S}, {H}] y) {{\n{body}\n}}",
                       **weights)


def test_a_model_onnxruntime_optimized_loads_again_after_compiling(tmp_path):
    """onnxruntime's basic level makes 3-D MatMul + Add a Gemm between Reshapes whose shapes it
    names gemm_input_shape, gemm_input_shape_token_0, …; equal shapes were merged keeping the
    bare names, and when onnxruntime loaded the compiled model it fused the projection graphopt's
    attention fusion left behind, generated `gemm_input_shape` again and refused the model
    ("Attempt to replace the existing tensor")."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(tmp_path / "basic.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(bertish().SerializeToString(), options,
                         providers=["CPUExecutionProvider"])
    saved = onnx.load(str(tmp_path / "basic.onnx"))
    generated = [t.name for t in saved.graph.initializer if "_token_" in t.name]
    if "gemm_input_shape" not in {t.name for t in saved.graph.initializer} or not generated:
        pytest.skip("this onnxruntime names no MatMulAddFusion shapes gemm_input_shape[_token_N]")
    feeds = numerics.random_feeds(saved, seed=1)
    expected = numerics.run(saved, feeds)
    for target in (None, "ascend310"):
        result = graphopt.optimize(saved, target=target)
        assert result.log.totals()["RenameOrtGeneratedInitializers"]["rewrites"]
        weights = {name for g in result.model.graph.all_graphs() for name in g.initializers}
        assert "gemm_input_shape" not in weights and not [n for n in weights if "_token_" in n]
        om = tmp_path / f"{target}.om"
        graphopt.save(result, str(om))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the NPU's CPU stand-in notice
            session = graphopt.load(str(om), optimization_level="all")
        assert not numerics.compare(expected, session.run(feeds), 1e-4, 1e-5)
    onnx_path = tmp_path / "compiled.onnx"
    graphopt.save(graphopt.optimize(saved), str(onnx_path))
    actual = numerics.run(onnx.load(str(onnx_path)), feeds, level="all")
    assert not numerics.compare(expected, actual, 1e-4, 1e-5)
