"""Ops CANN's ONNX parser documents (atlasoxol_09_*) that the NPU profiles had left to the host:
each compiles onto the NPU (or its AI CPU), runs as onnxruntime runs the original, gets a cost,
and falls back naming the attribute where the page limits one. The Ascend 310 follows the list
for its own products (CANN 5.0.4), which lacks Tan, Einsum and GridSample."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from helpers import conv_classifier, parse_model

import graphopt
from graphopt import numerics
from graphopt.codegen import OmSession
from graphopt.ir import load_onnx
from graphopt.partition import load_target
from graphopt.partition.placement import place
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.tuner.model import model_estimate

RNG = np.random.default_rng(11)
NPU_TARGETS = ["ascend310", "ascend310b", "ascend910b"]
NOT_ON_310 = ("Einsum", "GridSample", "Tan")  # the current list's, past the 310's


def _floats(*shape: int, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return RNG.uniform(low, high, shape).astype(np.float32)


# A tail after conv_classifier's `scores` [1, 64] or its feature map `r2` [1, 32, 32, 32]:
# (its text, the graph output it declares, its weights).
def _unary(op: str, domain: str = "h") -> tuple:
    # Tanh bounds the input to (-1, 1), each op's domain (Acosh's is shifted to [1, 2)).
    inner = {"h": "h = Mul (t, c)", "a": "u = Abs (t)\n a = Add (u, one)"}[domain]
    return (f"t = Tanh (scores)\n {inner}\n y = {op} ({domain})", "float[1,64] y",
            {"c": np.array(0.9, np.float32), "one": np.array(1.0, np.float32)})


TAILS = {
    **{op: _unary(op) for op in ("Tan", "Asin", "Acos", "Atan", "Asinh", "Atanh", "Sinh",
                                 "Cosh")},
    "Acosh": _unary("Acosh", "a"),
    # (A product by a matrix, "abc,cd->abd", is a MatMul by the time placement sees it.)
    "Einsum": ("s = Reshape (scores, shape)\n y = Einsum <equation = \"abc,cde->abde\"> (s, we)",
               "float[1,8,4,4] y",
               {"shape": np.array([1, 8, 8], np.int64), "we": _floats(8, 4, 4)}),
    "GridSample": ("y = GridSample <mode = \"nearest\", align_corners = 1> (r2, grid)",
                   "float[1,32,8,8] y", {"grid": _floats(1, 8, 8, 2, low=-0.9, high=0.9)}),
    "RoiAlign": ("y = RoiAlign <output_height = 4, output_width = 4, sampling_ratio = 2, "
                 "spatial_scale = 0.5> (r2, rois, idx)", "float[3,32,4,4] y",
                 {"rois": np.array([[0, 0, 30, 30], [8, 4, 40, 20], [10, 10, 50, 60]],
                                   np.float32), "idx": np.zeros(3, np.int64)}),
    "OneHot": ("m = ArgMax <axis = 1, keepdims = 0> (scores)\n i = Cast <to = 6> (m)\n"
               " y = OneHot <axis = -1> (i, depth, values)", "float[1,64] y",
               {"depth": np.array(64, np.int32), "values": np.array([0.0, 2.0], np.float32)}),
}


def _model(op: str):
    tail, output, weights = TAILS[op]
    return conv_classifier(tail, output, **weights)


def _compile(proto, tmp_path, **options):
    result = graphopt.optimize(proto, **options)
    path = tmp_path / "model.om"
    graphopt.save(result, path)
    return result, path


def _home(result, op: str) -> tuple[str, str | None]:
    """(device, engine) of the op's node: its partition's device, its placement's engine."""
    placements = place(result.model, result.partitioning.target)
    (node,) = [n for n in result.model.graph if n.op_type == op]
    (part,) = [p for p in result.partitioning.partitions if node in p.nodes]
    return part.device, placements[node].engine


def _assert_runs_as_original(proto, path, feeds):
    expected = numerics.run(proto, feeds)  # onnxruntime at ORT_DISABLE_ALL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the CPU stand-in notice
        actual = OmSession(path).run(feeds)
    for name, array in expected.items():
        np.testing.assert_allclose(actual[name], array, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("op", sorted(TAILS))
def test_a_documented_op_compiles_onto_the_npu_and_runs_as_the_original(op, tmp_path):
    proto = _model(op)
    target = "ascend910b" if op in NOT_ON_310 else "ascend310"
    result, path = _compile(proto, tmp_path, target=target)
    assert _home(result, op) == ("npu", "vector"), result.partitioning.fallbacks()
    _assert_runs_as_original(proto, path, {"x": _floats(1, 8, 32, 32)})


@pytest.mark.parametrize("target", ["ascend310", "ascend310b", "ascend910b"])
@pytest.mark.parametrize("op", ["Einsum", "GridSample", "RoiAlign", "Tan"])
def test_the_other_npus_take_them_too_and_the_310_what_its_list_has(op, target, tmp_path):
    result, _ = _compile(_model(op), tmp_path, target=target)
    if target == "ascend310" and op in NOT_ON_310:
        assert _home(result, op)[0] == "cpu"
        (reason,) = {r for n, r in result.partitioning.fallbacks() if n.op_type == op}
        assert reason == f"no npu kernel for {op}", reason
    else:
        assert _home(result, op) == ("npu", "vector"), result.partitioning.fallbacks()


@pytest.mark.parametrize("op", ["Einsum", "GridSample", "RoiAlign", "OneHot"])
def test_the_cost_model_prices_them(op, tmp_path):
    target = "ascend910b" if op in NOT_ON_310 else "ascend310"
    result, _ = _compile(_model(op), tmp_path, target=target)
    (row,) = [r for r in model_estimate(result.model, result.partitioning).rows
              if r.op == op]
    assert row.device == "npu" and 0 < row.seconds < 1 and math.isfinite(row.seconds)


def test_einsum_is_priced_as_its_contraction():
    # [64,128,256]·[256,512]: 4.3 G multiply-adds, where its 4.2 M outputs priced as an
    # elementwise op came to microseconds.
    proto = parse_model("""
        g (float[64,128,256] a, float[256,512] b) => (float[64,128,512] y) {
            y = Einsum <equation = "abc,cd->abd"> (a, b)
        }""")
    result = graphopt.optimize(proto, target="ascend910b")
    (row,) = [r for r in model_estimate(result.model, result.partitioning).rows
              if r.op == "Einsum"]
    peak = load_target("ascend910b").device("npu").peak_ops_per_s["float16"]
    assert row.seconds >= 2 * 64 * 128 * 256 * 512 / peak


@pytest.mark.parametrize("target", NPU_TARGETS)
def test_range_and_constant_of_shape_have_kernels_where_shapes_are_static(target):
    # Folded away in a compile; unfolded here, their shapes are static and they are placed.
    model = load_onnx(parse_model("""
        g (float[8] x) => (float[8] y, int64[8] p, int32[8] q) {
            z = ConstantOfShape <value = float[1] {0.5}> (shape)
            y = Add (x, z)
            p = Range (zero, eight, one)
            q = Range (zero32, eight32, one32)
        }""", shape=np.array([8], np.int64), zero=np.array(0, np.int64),
        eight=np.array(8, np.int64), one=np.array(1, np.int64), zero32=np.array(0, np.int32),
        eight32=np.array(8, np.int32), one32=np.array(1, np.int32)))
    infer_shapes(model)
    placed = {n.outputs[0].name: p for n, p in place(model, load_target(target)).items()}
    assert (placed["z"].device, placed["z"].engine) == ("npu", "vector")
    assert (placed["p"].device, placed["p"].engine) == ("npu", "aicpu")  # int64 arithmetic
    assert (placed["q"].device, placed["q"].engine) == ("npu", "vector")


@pytest.mark.parametrize("op, tail, output, weights, reason", [
    ("Einsum", 'y = Einsum <equation = "bchw,c->bchw"> (r2, g)', "float[1,32,32,32] y",
     {"g": _floats(32)}, "attribute equation='bchw,c->bchw' of Einsum: takes abc,cde->abde, "),
    ("Einsum", 's = Reshape (scores, shape)\n y = Einsum <equation = "abc, cde -> abde"> (s, we)',
     "float[1,8,4,4] y", {"shape": np.array([1, 8, 8], np.int64), "we": _floats(8, 4, 4)},
     "attribute equation='abc, cde -> abde' of Einsum"),  # the page's spelling only
    ("GridSample", 'y = GridSample <mode = "bicubic"> (r2, grid)', "float[1,32,8,8] y",
     {"grid": _floats(1, 8, 8, 2)}, "attribute mode='bicubic' of GridSample: takes bilinear, "
     "nearest"),
])
def test_a_form_the_page_does_not_list_stays_on_the_host_naming_the_attribute(
        op, tail, output, weights, reason, tmp_path):
    proto = conv_classifier(tail, output, **weights)
    result, path = _compile(proto, tmp_path, target="ascend910b")
    assert _home(result, op)[0] == "cpu"
    (found,) = {r for n, r in result.partitioning.fallbacks() if n.op_type == op}
    assert found.startswith(reason), found
    _assert_runs_as_original(proto, path, {"x": _floats(1, 8, 32, 32)})


@pytest.mark.parametrize("target", NPU_TARGETS)
def test_a_resize_with_opset_18s_attributes_set_stays_on_the_host(target):
    # CANN's Resize page (opsets 10-18) has no antialias or keep_aspect_ratio_policy: an
    # antialiased downscale had been placed on the NPU, which would run it without the filter.
    model = load_onnx(parse_model("""
        g (float[1,3,16,16] x) => (float[1,3,8,8] a, float[1,3,8,8] b, float[1,3,8,8] c) {
            a = Resize <mode = "linear"> (x, , scales)
            b = Resize <mode = "linear", antialias = 1> (x, , scales)
            c = Resize <mode = "linear", keep_aspect_ratio_policy = "not_larger"> (x, , , sizes)
        }""", header='<ir_version: 9, opset_import: ["" : 19]>\n',
        scales=np.array([1, 1, 0.5, 0.5], np.float32), sizes=np.array([1, 3, 8, 8], np.int64)))
    infer_shapes(model)
    placed = {n.outputs[0].name: p for n, p in place(model, load_target(target)).items()}
    assert placed["a"].device == "npu"
    assert placed["b"].device == "cpu" and "antialias=1 of Resize: takes 0" in placed["b"].reason
    assert placed["c"].device == "cpu"
    assert "keep_aspect_ratio_policy='not_larger'" in placed["c"].reason


@pytest.mark.parametrize("target", NPU_TARGETS)
def test_scatters_whose_reduction_cann_does_not_take_stay_on_the_host(target):
    # CANN's ScatterElements runs a max or min reduction as an overwrite, and its ScatterND
    # refuses mul: a GNN's max aggregation had been placed on the NPU.
    model = load_onnx(parse_model("""
        g (float[8,4] d, int64[20,4] i, float[20,4] u, int64[20,1] j)
            => (float[8,4] add, float[8,4] mx, float[8,4] mul, float[8,4] nd_add,
                float[8,4] nd_mul, float[8,4] nd_min) {
            add = ScatterElements <reduction = "add"> (d, i, u)
            mx = ScatterElements <reduction = "max"> (d, i, u)
            mul = ScatterElements <reduction = "mul"> (d, i, u)
            nd_add = ScatterND <reduction = "add"> (d, j, u)
            nd_mul = ScatterND <reduction = "mul"> (d, j, u)
            nd_min = ScatterND <reduction = "min"> (d, j, u)
        }""", header='<ir_version: 9, opset_import: ["" : 18]>\n'))
    infer_shapes(model)
    placed = {n.outputs[0].name: p for n, p in place(model, load_target(target)).items()}
    assert {name for name, p in placed.items() if p.device == "npu"} == {"add", "mul", "nd_add"}
    assert "reduction='max' of ScatterElements: takes none, add, mul" in placed["mx"].reason
    assert "reduction='mul' of ScatterND: takes none, add" in placed["nd_mul"].reason
