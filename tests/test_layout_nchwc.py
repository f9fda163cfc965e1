"""LayoutNchwc: conv nets rewritten into onnxruntime's blocked NCHWc ops ahead of time — what
converts, the exact filter bytes (against onnxruntime's own transformer), what stays NCHW, the
numerics at every onnxruntime level, and that ORT_ENABLE_ALL finds nothing left to convert.

Numerics: seed-0 normal inputs, both models at ORT_DISABLE_ALL (and the rewrite at
ORT_ENABLE_ALL too), |actual − expected| ≤ 1e-5 + 1e-4·|expected| elementwise.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest
from helpers import parse_model
from onnx import numpy_helper

from graphopt import nchwc_block, numerics, zoo
from graphopt.compiler import optimize
from graphopt.errors import GraphoptError, OptionError
from graphopt.ir import load_onnx, to_onnx, verify
from graphopt.nchwc_block import block_mismatch, detect_block_size, onnxruntime_block_size
from graphopt.passes import Options, PassContext, PassManager, Pipeline, layout_nchwc
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.partition.target import load_target
from graphopt.passes.layout_nchwc import NCHWC, LayoutNchwc
from graphopt.tools.compare import compare_models
from graphopt.passes.layout_nchwc_weights import (
    batchnorm_as_depthwise,
    filter_oihwbibo,
    filter_oihwbo,
    padded,
    unblock_oihwbibo,
    unblock_oihwbo,
)

RTOL, ATOL = 1e-4, 1e-5
BLOCK = detect_block_size()
needs_nchwc = pytest.mark.skipif(
    not BLOCK, reason="neither AVX2 nor AVX-512F in /proc/cpuinfo: LayoutNchwc targets only "
                      "those CPUs (MLAS blocks of 8 and 16), so no blocked model runs here")
HEADER = '<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>\n'
LEVELS = ("disable", "basic", "extended", "all")


def build(text: str, **weights: np.ndarray) -> onnx.ModelProto:
    return parse_model(text, HEADER, **weights)


@dataclass(frozen=True)
class Case:
    """A small model, the ops the rewrite leaves in it, and the pass's stats or note."""

    text: str
    ops: list[str]
    stats: dict[str, int] = field(default_factory=dict)
    note: str = ""
    weights: dict[str, np.ndarray] = field(default_factory=dict)

    def model(self) -> onnx.ModelProto:
        return build(self.text, **self.weights)


def case(text: str, ops: list[str], stats: dict | None = None, note: str = "",
         **weights: np.ndarray) -> Case:
    return Case(text, ops, stats or {}, note, weights)


def w(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


def scalar(value: float) -> np.ndarray:
    return np.array(value, np.float32)


def rewrite(proto: onnx.ModelProto, block: int | None = None):
    """The IR model after InferShapes and LayoutNchwc, the pass's stats, the notes."""
    model = load_onnx(proto)
    infer_shapes(model)
    options = Options()
    if block is not None:
        options.nchwc_block_size = block
    ctx = PassContext(options)
    result = LayoutNchwc().run(model, ctx)
    verify(model)
    assert result.changed == bool(result.stats)
    return model, dict(result.stats), ctx.notes


def ops(model) -> list[str]:
    return [("nchwc." if n.domain == NCHWC else "") + n.op_type for n in model.graph]


def nodes(model, op: str) -> list:
    kind = op.removeprefix("nchwc.")
    return [n for n in model.graph if n.op_type == kind and (n.domain == NCHWC) == (kind != op)]


def ort_optimized(proto: onnx.ModelProto, path) -> onnx.ModelProto:
    """What onnxruntime's ORT_ENABLE_ALL makes of `proto` (its NCHWc transformer included)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(path)
    options.log_severity_level = 3
    ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return onnx.load(str(path))


def op_counts(proto: onnx.ModelProto, domain: str | None = None) -> Counter:
    return Counter(f"{n.domain}::{n.op_type}" for n in proto.graph.node
                   if domain is None or n.domain == domain)


def check(original: onnx.ModelProto, model, tmp_path, like_ort: bool = True) -> onnx.ModelProto:
    """onnx.checker; the same outputs at ORT_DISABLE_ALL and ORT_ENABLE_ALL; onnxruntime finds
    nothing more to do; with `like_ort`, its transformer makes the same nchwc ops of the
    original."""
    rewritten = to_onnx(model)
    onnx.checker.check_model(rewritten)
    feeds = numerics.random_feeds(original, seed=0)
    expected = numerics.run(original, feeds)
    for level in ("disable", "all"):
        problems = numerics.compare(expected, numerics.run(rewritten, feeds, level), RTOL, ATOL)
        assert not problems, f"{level}: {problems[0]}"
    again = ort_optimized(rewritten, tmp_path / "ours_by_ort.onnx")
    assert op_counts(again) == op_counts(rewritten), "onnxruntime changed the rewritten layout"
    if like_ort:
        theirs = ort_optimized(original, tmp_path / "original_by_ort.onnx")
        assert op_counts(rewritten, NCHWC) == op_counts(theirs, NCHWC)
    return rewritten


# -- block size and filter layouts --------------------------------------------------------------

@pytest.mark.parametrize("flags,block", [("fpu sse2 avx avx2 fma", 8),
                                         ("fpu avx2 avx512f avx512bw", 16), ("fpu sse2 avx", 0)])
def test_block_size_from_cpuinfo(tmp_path, flags, block):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t: avx512f\n")
    assert detect_block_size(str(cpuinfo)) == block
    assert detect_block_size(str(tmp_path / "missing")) == 0


@needs_nchwc
def test_block_size_is_onnxruntimes():
    assert onnxruntime_block_size() == BLOCK


@needs_nchwc
def test_block_size_probe_is_remembered_per_onnxruntime_build(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    probes = tmp_path / "graphopt" / nchwc_block.PROBES_FILE
    onnxruntime_block_size.cache_clear()
    assert onnxruntime_block_size() == BLOCK and probes.exists()  # probed, then written

    def no_probe():
        raise AssertionError("probed again")

    monkeypatch.setattr(nchwc_block, "_probe", no_probe)
    onnxruntime_block_size.cache_clear()
    assert onnxruntime_block_size() == BLOCK  # another process: read back
    # Another onnxruntime build (a reinstall changes its library) probes again; both are kept.
    monkeypatch.setattr(nchwc_block, "_probe_key", lambda: "another build")
    monkeypatch.setattr(nchwc_block, "_probe", lambda: 0)
    onnxruntime_block_size.cache_clear()
    assert onnxruntime_block_size() == 0
    assert len(json.loads(probes.read_text())) == 2
    # A damaged file, or an answer no CPU gives, is probed again and mended.
    for damaged in ("{not json", json.dumps({"another build": 12})):
        probes.write_text(damaged)
        onnxruntime_block_size.cache_clear()
        assert onnxruntime_block_size() == 0
        assert json.loads(probes.read_text()) == {"another build": 0}
    onnxruntime_block_size.cache_clear()


@needs_nchwc
def test_block_size_probe_works_without_a_writable_cache(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # no folder can be made under a file
    onnxruntime_block_size.cache_clear()
    assert onnxruntime_block_size() == BLOCK
    onnxruntime_block_size.cache_clear()


@needs_nchwc
def test_a_model_blocked_for_another_cpu_is_flagged():
    proto = CASES["regular conv"].model()
    model, _, _ = rewrite(proto)
    assert block_mismatch(model.metadata_props) is None
    assert block_mismatch({}) is None
    other = 24 - BLOCK  # 16 here when this CPU blocks by 8, and the other way round
    model, _, _ = rewrite(proto, block=other)
    assert f"blocks of {other} channels but onnxruntime blocks by {BLOCK}" in \
        block_mismatch(model.metadata_props)
    # Why the check matters: onnxruntime runs such a model without complaint, wrongly.
    feeds = numerics.random_feeds(proto, seed=0)
    assert numerics.compare(numerics.run(proto, feeds), numerics.run(to_onnx(model), feeds))
    # graphopt compare says why rather than reporting a mismatch.
    with pytest.raises(GraphoptError, match=f"blocks of {other} channels"):
        compare_models(proto, to_onnx(model))


@pytest.mark.parametrize("block", [8, 16])
def test_filter_layouts_round_trip(block):
    for o, i in ((12, 20), (16, 16), (5, 3)):
        weight = w(o, i, 3, 2)
        bibo = filter_oihwbibo(weight, block)
        assert bibo.shape == (padded(o, block), padded(i, block), 3, 2)
        assert np.array_equal(unblock_oihwbibo(bibo, o, i, block), weight)
        assert np.count_nonzero(bibo) == np.count_nonzero(weight)  # the padding is zeros
        bo = filter_oihwbo(weight, block)
        assert bo.shape == (padded(o, block), i, 3, 2)
        assert np.array_equal(unblock_oihwbo(bo, o, block), weight)
    # The first block of OIHWBiBo: kernel position (0, 0), input channel 0, outputs 0..B-1.
    weight = w(block, block, 1, 1)
    assert np.array_equal(filter_oihwbibo(weight, block).reshape(-1)[:block], weight[:, 0, 0, 0])


def test_batchnorm_as_depthwise_is_the_affine_map():
    c = 5
    scale, shift, mean, var = w(c), w(c, seed=1), w(c, seed=2), np.abs(w(c, seed=3)) + 0.5
    weight, bias = batchnorm_as_depthwise(scale, shift, mean, var, 1e-5, 8)
    assert weight.shape == (8, 1, 1, 1) and bias.shape == (8,)
    x = w(c, seed=4)
    expected = (x - mean) / np.sqrt(var + 1e-5) * scale + shift
    np.testing.assert_allclose(weight.reshape(-1)[:c] * x + bias[:c], expected, rtol=1e-5)
    assert not weight[c:].any() and not bias[c:].any()



def test_a_batchnorm_dividing_by_zero_keeps_its_infinities_without_a_warning():
    # Variance 0 and epsilon 0: numpy's divide-by-zero warning reached the user (an error
    # under -W error), and the mean's 0·∞ made the whole channel NaN where the original is +∞
    # wherever its input is positive.
    scale, shift, mean = np.ones(2), np.zeros(2), np.zeros(2)
    var = np.array([0.0, 1.0])
    x = np.array([[-2.0, 0.0, 3.0], [-2.0, 0.0, 3.0]])
    with np.errstate(all="ignore"):
        expected = (x - mean[:, None]) / np.sqrt(var[:, None]) * scale[:, None] + shift[:, None]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        weight, bias = batchnorm_as_depthwise(scale, shift, mean, var, 0.0, 8)
        with np.errstate(invalid="ignore"):  # 0·∞ at x = 0, as in the original
            actual = weight.reshape(-1)[:2, None] * x + bias[:2, None]
    np.testing.assert_array_equal(actual, expected)


LAYOUTS = {  # one conv each; onnxruntime's transformer writes the filter, we compare bytes
    "blocked input, padded outputs": ("float[1,16,6,6] x", "float[12,16,3,3] k", "",
                                      (12, 16, 3, 3)),
    "padded inputs (12 → 16)": ("float[1,12,6,6] x", "float[16,12,1,1] k", "", (16, 12, 1, 1)),
    "NCHW input": ("float[1,3,6,6] x", "float[12,3,3,3] k", "", (12, 3, 3, 3)),
    "depthwise": ("float[1,12,6,6] x", "float[12,1,3,3] k", "<group=12>", (12, 1, 3, 3)),
    "grouped": ("float[1,32,6,6] x", "float[32,16,3,3] k", "<group=2>", (32, 16, 3, 3)),
}


@needs_nchwc
@pytest.mark.parametrize("case", LAYOUTS)
def test_filters_and_biases_are_onnxruntimes_bytes(tmp_path, case):
    x, k, attrs, shape = LAYOUTS[case]
    proto = build(f"g ({x}, {k}, float[{shape[0]}] b) => (float y) {{ y = Conv{attrs}(x, k, b) }}",
                  k=w(*shape), b=w(shape[0]))
    model, _, _ = rewrite(proto)
    (ours,) = nodes(model, "nchwc.Conv")
    theirs_proto = ort_optimized(proto, tmp_path / "ort.onnx")
    (theirs,) = [n for n in theirs_proto.graph.node if n.op_type == "Conv"]
    data = {t.name: numpy_helper.to_array(t) for t in theirs_proto.graph.initializer}
    for index in (1, 2):
        assert np.array_equal(ours.inputs[index].constant(), data[theirs.input[index]]), index
    group = {a.name: a.i for a in theirs.attribute}.get("group", 1)
    assert ours.attr("group", 1) == group
    check(proto, model, tmp_path)


# -- what converts ------------------------------------------------------------------------------

X16 = "float[1,16,8,8] x"
IN, OUT = "nchwc.ReorderInput", "nchwc.ReorderOutput"
CASES = {
    "regular conv": case(
        f"g ({X16}, float[32,16,3,3] k, float[32] b) => (float y) {{"
        " y = Conv<pads=[1,1,1,1]>(x, k, b) }",
        [IN, "nchwc.Conv", OUT], {"ReorderInput": 1, "Conv": 1, "ReorderOutput": 1},
        k=w(32, 16, 3, 3), b=w(32)),
    "first conv reads NCHW": case(
        "g (float[1,3,16,16] x, float[16,3,3,3] k) => (float y) {"
        " y = Conv<pads=[1,1,1,1], strides=[2,2]>(x, k) }",
        ["nchwc.Conv", OUT], {"Conv:nchw": 1, "ReorderOutput": 1}, k=w(16, 3, 3, 3)),
    "depthwise, channels padded": case(
        "g (float[1,12,8,8] x, float[12,1,3,3] k) => (float y) {"
        " y = Conv<group=12, pads=[1,1,1,1]>(x, k) }",
        [IN, "nchwc.Conv", OUT], {"ReorderInput": 1, "Conv:depthwise": 1, "ReorderOutput": 1},
        k=w(12, 1, 3, 3)),
    "grouped": case(
        "g (float[1,32,8,8] x, float[32,16,1,1] k) => (float y) { y = Conv<group=2>(x, k) }",
        [IN, "nchwc.Conv", OUT], {"ReorderInput": 1, "Conv:grouped": 1, "ReorderOutput": 1},
        k=w(32, 16, 1, 1)),
    "conv + relu": case(
        "g (float[1,3,16,16] x, float[16,3,3,3] k, float[16] b) => (float y) {"
        " c = Conv<pads=[1,1,1,1]>(x, k, b)\n y = Relu(c) }",
        ["nchwc.Conv", OUT], {"Conv:nchw": 1, "activation into Conv": 1, "ReorderOutput": 1},
        k=w(16, 3, 3, 3), b=w(16)),
    "conv + add residual + relu": case(
        f"g ({X16}, float[16,16,3,3] k1, float[16,16,3,3] k2, float[16] b2) => (float y) {{"
        " c1 = Conv<pads=[1,1,1,1]>(x, k1)\n r1 = Relu(c1)\n"
        " c2 = Conv<pads=[1,1,1,1]>(r1, k2, b2)\n a = Add(c2, r1)\n y = Relu(a) }",
        [IN, "nchwc.Conv", "nchwc.Conv", OUT],
        {"ReorderInput": 1, "Conv": 2, "activation into Conv": 2, "Add into Conv's Sum": 1,
         "ReorderOutput": 1},
        # He-scaled, so the sums stay near unit scale and ATOL measures float32 rounding:
        # with N(0, 1) weights they reach ±50, and a kernel that adds in another order (MLAS's
        # AVX-512 one) differs by 1e-4 on an element near zero
        k1=w(16, 16, 3, 3) / 12, k2=w(16, 16, 3, 3, seed=1) / 12, b2=w(16)),
    "pooling shares one ReorderInput": case(
        "g (float[1,16,9,9] x) => (float y, float z) {"
        " y = MaxPool<kernel_shape=[3,3], strides=[2,2], pads=[1,1,1,1], ceil_mode=1>(x)\n"
        " z = AveragePool<kernel_shape=[3,3], strides=[2,2], pads=[1,1,1,1],"
        " count_include_pad=1>(x) }",
        [IN, "nchwc.MaxPool", OUT, "nchwc.AveragePool", OUT],
        {"ReorderInput": 1, "MaxPool": 1, "AveragePool": 1, "ReorderOutput": 2}),
    "global pools after a conv": case(
        f"g ({X16}, float[32,16,1,1] k) => (float y, float z) {{"
        " c = Conv(x, k)\n y = GlobalAveragePool(c)\n z = GlobalMaxPool(c) }",
        [IN, "nchwc.Conv", "nchwc.GlobalAveragePool", OUT, "nchwc.GlobalMaxPool", OUT],
        {"ReorderInput": 1, "Conv": 1, "GlobalAveragePool": 1, "GlobalMaxPool": 1,
         "ReorderOutput": 2},
        k=w(32, 16, 1, 1)),
    "blocked graph output with another reader": case(
        f"g ({X16}, float[16,16,1,1] k) => (float c, float y) {{ c = Conv(x, k)\n y = Relu(c) }}",
        [IN, "nchwc.Conv", OUT, "Relu", OUT],
        {"ReorderInput": 1, "Conv": 1, "Relu kept blocked": 1, "ReorderOutput": 2},
        k=w(16, 16, 1, 1)),
    "concat along channels": case(
        f"g ({X16}, float[16,16,1,1] k1, float[16,16,3,3] k2) => (float y) {{"
        " a = Conv(x, k1)\n b = Conv<pads=[1,1,1,1]>(x, k2)\n y = Concat<axis=1>(a, b) }",
        [IN, "nchwc.Conv", "nchwc.Conv", "Concat", OUT],
        {"ReorderInput": 1, "Conv": 2, "Concat kept blocked": 1, "ReorderOutput": 1},
        k1=w(16, 16, 1, 1), k2=w(16, 16, 3, 3)),
    "batchnorm becomes a depthwise conv": case(
        f"g ({X16}, float[16,16,1,1] k, float[16] s, float[16] t, float[16] m, float[16] v)"
        " => (float c, float y) {"
        " c = Conv(x, k)\n n = BatchNormalization<epsilon=0.001>(c, s, t, m, v)\n y = Relu(n) }",
        [IN, "nchwc.Conv", OUT, "nchwc.Conv", OUT],
        {"ReorderInput": 1, "Conv": 1, "BatchNormalization:depthwise": 1,
         "activation into Conv": 1, "ReorderOutput": 2},
        k=w(16, 16, 1, 1), s=w(16), t=w(16, seed=1), m=w(16, seed=2),
        v=np.abs(w(16, seed=3)) + 0.5),
    "transpose to NHWC": case(
        f"g ({X16}, float[16,16,1,1] k) => (float[1,8,8,16] y) {{"
        " c = Conv(x, k)\n y = Transpose<perm=[0,2,3,1]>(c) }",
        [IN, "nchwc.Conv", OUT],
        {"ReorderInput": 1, "Conv": 1, "Transpose to NHWC:ReorderOutput": 1}, k=w(16, 16, 1, 1)),
    "nearest resize": case(
        f"g ({X16}, float[16,16,1,1] k, float[4] sc) => (float y) {{"
        ' c = Conv(x, k)\n y = Resize<mode="nearest", coordinate_transformation_mode='
        '"asymmetric", nearest_mode="floor">(c, "", sc) }',
        [IN, "nchwc.Conv", "nchwc.Upsample", OUT],
        {"ReorderInput": 1, "Conv": 1, "Resize:Upsample": 1, "ReorderOutput": 1},
        k=w(16, 16, 1, 1), sc=np.array([1, 1, 2, 3], np.float32)),
    **{f"bilinear resize, {where}": case(  # a segmentation head's, or a bilinear UNet's
        f"g ({X16}, float[16,16,1,1] k, float[4] sc) => (float y) {{"
        f' c = Conv(x, k)\n r = Resize<mode="linear", coordinate_transformation_mode="{where}">'
        '(c, "", sc)\n y = Relu(r) }',
        [IN, "nchwc.Conv", "nchwc.Upsample", "Relu", OUT],
        {"ReorderInput": 1, "Conv": 1, "Resize:Upsample": 1, "Relu kept blocked": 1,
         "ReorderOutput": 1},
        k=w(16, 16, 1, 1), sc=np.array([1, 1, 2, 3], np.float32))
       for where in ("half_pixel", "align_corners", "asymmetric")},
    "bilinear resize to a size": case(  # torchvision's segmentation heads resize to a size
        f"g ({X16}, float[16,16,1,1] k, int64[4] sz) => (float y) {{"
        ' c = Conv(x, k)\n y = Resize<mode="linear">(c, "", "", sz) }',
        [IN, "nchwc.Conv", "nchwc.Upsample", OUT],
        {"ReorderInput": 1, "Conv": 1, "Resize:Upsample": 1, "ReorderOutput": 1},
        k=w(16, 16, 1, 1), sz=np.array([1, 16, 16, 24], np.int64)),
    "elementwise stays blocked": case(
        f"g ({X16}, float[16,16,1,1] k1, float[16,16,1,1] k2) => (float y) {{"
        " a = Conv(x, k1)\n b = Conv(x, k2)\n m = Mul(a, b)\n s = Sigmoid(m)\n t = Tanh(a)\n"
        " h = HardSigmoid(a)\n u = Add(s, t)\n y = Sum(u, h, m) }",
        [IN, "nchwc.Conv", "nchwc.Conv", "Mul", "Sigmoid", "Tanh", "HardSigmoid", "Add", "Sum",
         OUT],
        {"ReorderInput": 1, "Conv": 2, "Mul kept blocked": 1, "Sigmoid kept blocked": 1,
         "Tanh kept blocked": 1, "HardSigmoid kept blocked": 1, "Add kept blocked": 1,
         "Sum kept blocked": 1, "ReorderOutput": 1},
        k1=w(16, 16, 1, 1), k2=w(16, 16, 1, 1, seed=1)),
    "GELUs stay blocked": case(  # ConvNeXt's, FastViT's and TinyViT's, between convs
        "g (float[1,16,8,8] x, float[20,16,1,1] k1, float[20,20,1,1] k2, float[20,20,1,1] k3)"
        " => (float y) { a = Conv(x, k1)\n g = com.microsoft.Gelu(a)\n b = Conv(g, k2)\n"
        " q = com.microsoft.QuickGelu<alpha=1.702>(b)\n y = Conv(q, k3) }",
        [IN, "nchwc.Conv", "Gelu", "nchwc.Conv", "QuickGelu", "nchwc.Conv", OUT],
        {"ReorderInput": 1, "Conv": 3, "Gelu kept blocked": 1, "QuickGelu kept blocked": 1,
         "ReorderOutput": 1},
        k1=w(20, 16, 1, 1), k2=w(20, 20, 1, 1), k3=w(20, 20, 1, 1, seed=1)),
    "an NHWC input transposed to NCHW": case(  # ConvNeXt's LayerNorm2d, before each conv
        "g (float[1,8,8,16] x, float[16,16,3,3] k) => (float y) {"
        " t = Transpose<perm=[0,3,1,2]>(x)\n y = Conv<pads=[1,1,1,1]>(t, k) }",
        ["Transpose", IN, "nchwc.Conv", OUT],
        {"ReorderInput": 1, "Conv": 1, "ReorderOutput": 1}, k=w(16, 16, 3, 3)),
    "Sum goes to the activation-free conv": case(
        f"g ({X16}, float[16,16,1,1] k1, float[16,16,1,1] k2) => (float y) {{"
        " a = Conv(x, k1)\n r = Relu(a)\n b = Conv(x, k2)\n y = Add(r, b) }",
        [IN, "nchwc.Conv", "nchwc.Conv", OUT],
        {"ReorderInput": 1, "Conv": 2, "activation into Conv": 1, "Add into Conv's Sum": 1,
         "ReorderOutput": 1},
        k1=w(16, 16, 1, 1), k2=w(16, 16, 1, 1, seed=1)),
    "FusedConv": case(
        f"g ({X16}, float[16,16,3,3] k, float[16] b) => (float y) {{ y = com.microsoft.FusedConv"
        '<activation="LeakyRelu", activation_params=[0.1], pads=[1,1,1,1]>(x, k, b) }',
        [IN, "nchwc.Conv", OUT], {"ReorderInput": 1, "FusedConv": 1, "ReorderOutput": 1},
        k=w(16, 16, 3, 3), b=w(16)),
}


@needs_nchwc
@pytest.mark.parametrize("name", CASES)
def test_converts(tmp_path, name):
    proto = CASES[name].model()
    model, stats, notes = rewrite(proto)
    assert ops(model) == CASES[name].ops
    assert stats == CASES[name].stats
    assert [CASES[name].note in n for n in notes] == ([True] if CASES[name].note else [])
    assert model.metadata_props["graphopt.nchwc_block_size"] == str(BLOCK)
    assert model.opset_imports[NCHWC] == 1
    check(proto, model, tmp_path)


@needs_nchwc
def test_structure_of_the_residual_block():
    model, _, _ = rewrite(CASES["conv + add residual + relu"].model())
    first, second = nodes(model, "nchwc.Conv")
    assert first.attr("activation") == second.attr("activation") == "Relu"
    x, k, b, total = second.inputs
    assert x is total is first.output  # in-place accumulation onto the residual
    assert k.shape == (16, 16, 3, 3) and b.name == "b2"
    (out,) = nodes(model, OUT)
    assert out.output.name == "y" and out.attr("channels") == 16
    assert out.attr("channels_last") is None


@needs_nchwc
def test_attributes_of_padded_and_fused_convs(tmp_path):
    model, _, _ = rewrite(CASES["depthwise, channels padded"].model())
    (conv,) = nodes(model, "nchwc.Conv")
    assert conv.attr("group") == padded(12, BLOCK) and conv.inputs[1].shape == (16, 1, 3, 3)
    assert nodes(model, OUT)[0].attr("channels") == 12
    clip = build("g (float[1,3,16,16] x, float[16,3,3,3] k, float lo, float hi) => (float y) {"
                 " c = Conv(x, k)\n y = Clip(c, lo, hi) }",
                 k=w(16, 3, 3, 3), lo=scalar(0.0), hi=scalar(6.0))
    model, _, _ = rewrite(clip)
    (conv,) = nodes(model, "nchwc.Conv")
    assert conv.attr("activation") == "Clip" and conv.attr("activation_params") == [0.0, 6.0]
    check(clip, model, tmp_path)
    model, _, _ = rewrite(CASES["transpose to NHWC"].model())
    (out,) = nodes(model, OUT)
    assert (out.attr("channels"), out.attr("channels_last")) == (16, 1)
    assert out.output.shape == (1, 8, 8, 16)


@needs_nchwc
@pytest.mark.parametrize("activation", ["HardSwish", "LeakyRelu<alpha=0.2>", "Sigmoid", "Tanh",
                                        "HardSigmoid<alpha=0.3, beta=0.4>"])
def test_every_activation_the_conv_takes(tmp_path, activation):
    proto = build(f"g ({X16}, float[16,16,3,3] k) => (float y) {{"
                  f" c = Conv<pads=[1,1,1,1]>(x, k)\n y = {activation}(c) }}", k=w(16, 16, 3, 3))
    model, stats, _ = rewrite(proto)
    assert stats["activation into Conv"] == 1
    # onnxruntime decomposes HardSwish before its own transformer sees it: same numbers, other ops
    check(proto, model, tmp_path, like_ort=not activation.startswith("HardSwish"))


@needs_nchwc
def test_activation_after_a_fused_sum(tmp_path):
    # act(conv + bias + sum), MLAS's order; onnxruntime itself only fuses Relu/Sigmoid/Tanh here.
    proto = build(f"g ({X16}, float[16,16,1,1] k1, float[16,16,1,1] k2, float[16] b, float lo,"
                  " float hi) => (float y) { r = Relu(x)\n c1 = Conv(r, k1)\n c2 = Conv(c1, k2, b)"
                  "\n a = Add(c2, c1)\n y = Clip(a, lo, hi) }", k1=w(16, 16, 1, 1),
                  k2=w(16, 16, 1, 1, seed=1), b=w(16), lo=scalar(-0.5), hi=scalar(0.5))
    model, stats, _ = rewrite(proto)
    first, second = nodes(model, "nchwc.Conv")
    assert stats["Add into Conv's Sum"] == 1 and second.attr("activation") == "Clip"
    assert second.inputs[3] is first.output and first.attr("activation") is None
    check(proto, model, tmp_path, like_ort=False)


@needs_nchwc
@pytest.mark.parametrize("level", LEVELS)
def test_runs_at_every_onnxruntime_level(level):
    proto = CASES["conv + add residual + relu"].model()
    model, _, _ = rewrite(proto)
    feeds = numerics.random_feeds(proto, seed=0)
    expected = numerics.run(proto, feeds)
    assert not numerics.compare(expected, numerics.run(to_onnx(model), feeds, level), RTOL, ATOL)


# -- what stays NCHW ----------------------------------------------------------------------------

NEGATIVES = {
    "fed weight": case(
        f"g ({X16}, float[16,16,1,1] k) => (float y) {{ y = Conv(x, k) }}", ["Conv"],
        note="1 conv(s) read weights computed at run time (e.g. the one making %y); the layout "
             "is left to onnxruntime's layout level"),
    "fed bias": case(
        f"g ({X16}, float[16,16,1,1] k, float[16] b) => (float y) {{ y = Conv(x, k, b) }}",
        ["Conv"], note="the bias is not a constant", k=w(16, 16, 1, 1)),
    "18 input channels": case(  # at least one block of 8 or 16, so not read as NCHW
        "g (float[1,18,8,8] x, float[16,18,1,1] k) => (float y) { y = Conv(x, k) }",
        ["Conv"], note="18 input channels, not a multiple of 4", k=w(16, 18, 1, 1)),
    "depthwise with multiplier 2": case(
        f"g ({X16}, float[32,1,3,3] k) => (float y) {{ y = Conv<group=16>(x, k) }}",
        ["Conv"], note="grouped with 1 in / 2 out channels per group", k=w(32, 1, 3, 3)),
    "depthwise over 6 channels": case(
        "g (float[1,6,8,8] x, float[6,1,3,3] k) => (float y) { y = Conv<group=6>(x, k) }",
        ["Conv"], note="depthwise over 6 channels, not a multiple of 4", k=w(6, 1, 3, 3)),
    "1-D conv": case(
        "g (float[1,16,8] x, float[16,16,3] k) => (float y) { y = Conv(x, k) }",
        ["Conv"], note="a 1-D conv (NCHWc blocks 2-D convs)", k=w(16, 16, 3)),
    "MaxPool with indices": case(
        f"g ({X16}) => (float y, int64 i) {{ y, i = MaxPool<kernel_shape=[2,2]>(x) }}",
        ["MaxPool"], note="MaxPool returns indices"),
    "AveragePool overhanging with the padding counted": case(  # 9 = 4 windows of 2 and a half
        "g (float[1,16,9,9] x) => (float y) {"
        " y = AveragePool<kernel_shape=[2,2], strides=[2,2], ceil_mode=1, count_include_pad=1>(x)"
        " }", ["AveragePool"], note="ceil_mode with count_include_pad"),
    "pool over 12 channels": case(
        "g (float[1,12,8,8] x) => (float y) { y = GlobalAveragePool(x) }",
        ["GlobalAveragePool"], note="12 channels, not a multiple of the block"),
}


@needs_nchwc
@pytest.mark.parametrize("name", NEGATIVES)
def test_stays_nchw(tmp_path, name):
    proto = NEGATIVES[name].model()
    model, stats, notes = rewrite(proto)
    assert ops(model) == NEGATIVES[name].ops and not stats
    assert len(notes) == 1 and NEGATIVES[name].note in notes[0], notes
    assert "graphopt.nchwc_block_size" not in model.metadata_props
    check(proto, model, tmp_path)


PARTIAL = {  # converted, but what follows the conv reads NCHW
    "add broadcasts over the channels": case(
        f"g ({X16}, float[16,16,1,1] k, float[1,1,8,8] c) => (float y) {{"
        " a = Conv(x, k)\n y = Add(a, c) }",
        [IN, "nchwc.Conv", OUT, "Add"], k=w(16, 16, 1, 1), c=w(1, 1, 8, 8)),
    "a number over the blocked tensor": case(  # its padded channels' 0s would divide it
        f"g ({X16}, float[16,16,1,1] k, float two) => (float y) {{"
        " a = Conv(x, k)\n y = Div(two, a) }",
        [IN, "nchwc.Conv", OUT, "Div"], k=w(16, 16, 1, 1), two=scalar(2)),
    "a division by 0": case(
        f"g ({X16}, float[16,16,1,1] k, float zero) => (float y) {{"
        " a = Conv(x, k)\n y = Div(a, zero) }",
        [IN, "nchwc.Conv", OUT, "Div"], k=w(16, 16, 1, 1), zero=scalar(0)),
    **{f"a resize nchwc.Upsample does not compute: {what}": case(
        f"g ({X16}, float[16,16,1,1] k, float[4] sc) => (float y) {{"
        f' c = Conv(x, k)\n y = Resize<{attrs}>(c, "", sc) }}',
        [IN, "nchwc.Conv", OUT, "Resize"], k=w(16, 16, 1, 1), sc=np.array(scales, np.float32))
       for what, attrs, scales in (
           ("pytorch_half_pixel", 'mode="linear", coordinate_transformation_mode='
                                  '"pytorch_half_pixel"', [1, 1, 2, 2]),
           ("cubic", 'mode="cubic"', [1, 1, 2, 2]),
           ("a scale of 1.5", 'mode="linear"', [1, 1, 1.5, 2]),
           ("nearest at half_pixel", 'mode="nearest", nearest_mode="floor"', [1, 1, 2, 2]))},
    "a resize to a size of no whole multiple": case(
        f"g ({X16}, float[16,16,1,1] k, int64[4] sz) => (float y) {{"
        ' c = Conv(x, k)\n y = Resize<mode="linear">(c, "", "", sz) }',
        [IN, "nchwc.Conv", OUT, "Resize"], k=w(16, 16, 1, 1),
        sz=np.array([1, 16, 12, 16], np.int64)),
    "a chain that reaches no blocked reader, beside a graph output": case(
        # The conv leaves the layout for its graph output anyway: keeping Max and Mul blocked
        # would only add a second ReorderOutput (1.14x the time on this shape).
        "g (float[1,16,8,8] x, float[32,16,1,1] k, float lo, float half, int64[2] flat)"
        " => (float c, float y) {"
        " c = Conv(x, k)\n m = Max(c, lo)\n h = Mul(m, half)\n y = Reshape(h, flat) }",
        [IN, "nchwc.Conv", OUT, "Max", "Mul", "Reshape"], k=w(32, 16, 1, 1), lo=scalar(0.2),
        half=scalar(0.5), flat=np.array([1, -1], np.int64)),
    "a division of two blocked tensors": case(  # 0/0 in the padded channels would be NaN
        "g (float[1,16,8,8] x, float[12,16,1,1] k1, float[12,16,1,1] k2) => (float y) {"
        " a = Conv(x, k1)\n b = Conv(x, k2)\n y = Div(a, b) }",
        [IN, "nchwc.Conv", OUT, "nchwc.Conv", OUT, "Div"], k1=w(12, 16, 1, 1),
        k2=w(12, 16, 1, 1, seed=1)),
    "add of a blocked and an NCHW tensor": case(
        f"g ({X16}, float[16,16,1,1] k) => (float y) {{ a = Conv(x, k)\n y = Add(a, x) }}",
        [IN, "nchwc.Conv", OUT, "Add"], k=w(16, 16, 1, 1)),
    "clip with a fed bound": case(
        f"g ({X16}, float[16,16,1,1] k, float hi) => (float y) {{"
        ' a = Conv(x, k)\n y = Clip(a, "", hi) }',
        [IN, "nchwc.Conv", OUT, "Clip"], k=w(16, 16, 1, 1)),
    "conv read twice: Relu kept apart, Elu reads NCHW": case(
        f"g ({X16}, float[16,16,1,1] k) => (float y, float z) {{"
        " a = Conv(x, k)\n y = Relu(a)\n z = Elu(a) }",
        [IN, "nchwc.Conv", OUT, "Relu", OUT, "Elu"], k=w(16, 16, 1, 1)),
    "both addends activated": case(
        f"g ({X16}, float[16,16,1,1] k1, float[16,16,1,1] k2) => (float y) {{"
        " a = Conv(x, k1)\n r = Relu(a)\n b = Conv(x, k2)\n s = Sigmoid(b)\n y = Add(r, s) }",
        [IN, "nchwc.Conv", "nchwc.Conv", "Add", OUT],
        k1=w(16, 16, 1, 1), k2=w(16, 16, 1, 1, seed=1)),
    "concat with unaligned channels": case(
        f"g ({X16}, float[16,16,1,1] k1, float[12,16,1,1] k2) => (float y) {{"
        " a = Conv(x, k1)\n b = Conv(x, k2)\n y = Concat<axis=1>(a, b) }",
        [IN, "nchwc.Conv", OUT, "nchwc.Conv", OUT, "Concat"],
        k1=w(16, 16, 1, 1), k2=w(12, 16, 1, 1)),
}


# Beyond onnxruntime's transformer: elementwise ops with a constant, kept in the layout.
SQUEEZED_BY_MEAN = (
    "g (float[1,16,8,8] x, float[16,16,1,1] k, float[16,16,1,1] k1, float[16,16,1,1] k2{header})"
    " => (float y) {{ c = Conv(x, k)\n p = ReduceMean<{axes}keepdims=1>(c{axes_input})\n"
    " e = Conv(p, k1)\n s = Sigmoid(e)\n m = Mul(c, s)\n y = Conv(m, k2) }}")
SQUEEZED_STATS = {"ReorderInput": 1, "Conv": 3, "ReduceMean:GlobalAveragePool": 1,
                  "activation into Conv": 1, "Mul by a channel gate:depthwise": 1,
                  "ReorderOutput": 1}

BEYOND = {
    "PRelu as LowerPRelu writes it": case(  # 20 channels: padded with a block of 8 or 16
        "g (float[1,16,8,8] x, float[20,16,1,1] k, float zero, float[20,1,1] slope,"
        " float[20,20,3,3] k2) => (float y) {"
        " c = Conv(x, k)\n r = Relu(c)\n m = Min(c, zero)\n s = Mul(m, slope)\n"
        " p = Add(r, s)\n y = Conv<pads=[1,1,1,1]>(p, k2) }",
        [IN, "nchwc.Conv", "Relu", "Min", "nchwc.Conv", "nchwc.Conv", OUT],
        {"ReorderInput": 1, "Conv": 2, "Relu kept blocked": 1, "Min of a number kept blocked": 1,
         "Mul by channel:depthwise": 1, "Add into Conv's Sum": 1, "ReorderOutput": 1},
        k=w(20, 16, 1, 1), zero=scalar(0), slope=w(20, 1, 1) * 0.1, k2=w(20, 20, 3, 3)),
    "a learned scale and shift": case(  # PP-LCNet's, after each hard-swish
        f"g ({X16}, float[16,16,1,1] k, float[1] a, float b, float[1,16,1,1] c,"
        " float[16,1,1] d) => (float y) {"
        " h = Conv(x, k)\n s = HardSwish(h)\n m = Mul(a, s)\n t = Sub(m, b)\n"
        " u = Div(t, a)\n v = Max(u, b)\n e = Mul(v, c)\n y = Add(e, d) }",
        [IN, "nchwc.Conv", "Mul", "Sub", "Div", "Max", "nchwc.Conv", "nchwc.Conv", OUT],
        {"ReorderInput": 1, "Conv": 1, "activation into Conv": 1,
         "Mul of a number kept blocked": 1, "Sub of a number kept blocked": 1,
         "Div of a number kept blocked": 1, "Max of a number kept blocked": 1,
         "Mul by channel:depthwise": 1, "Add by channel:depthwise": 1, "ReorderOutput": 1},
        k=w(16, 16, 1, 1), a=np.array([1.5], np.float32), b=scalar(-0.25),
        c=w(1, 16, 1, 1), d=w(16, 1, 1)),
    "a residual whose skip path left the layout": case(  # BlazeNet pads channels in NCHW
        "g (float[1,16,8,8] x, float[16,16,1,1] k1, int64[8] pads, float[32,16,1,1] k2,"
        " float[32,32,1,1] k3) => (float y) {"
        " c = Conv(x, k1)\n p = Pad(c, pads)\n d = Conv(c, k2)\n a = Add(d, p)\n"
        " y = Conv(a, k3) }",
        [IN, "nchwc.Conv", OUT, "Pad", IN, "nchwc.Conv", "nchwc.Conv", OUT],
        {"ReorderInput": 2, "Conv": 3, "Add into Conv's Sum": 1, "ReorderOutput": 2},
        k1=w(16, 16, 1, 1), pads=np.array([0, 0, 0, 0, 0, 16, 0, 0], np.int64),
        k2=w(32, 16, 1, 1), k3=w(32, 32, 1, 1)),
    "a blocked tensor of unaligned channels pools in the layout": case(  # onnxruntime reorders
        f"g ({X16}, float[12,16,1,1] k) => (float y) {{"
        " c = Conv(x, k)\n y = MaxPool<kernel_shape=[2,2], strides=[2,2]>(c) }",
        [IN, "nchwc.Conv", "nchwc.MaxPool", OUT],
        {"ReorderInput": 1, "Conv": 1, "MaxPool": 1, "ReorderOutput": 1}, k=w(12, 16, 1, 1)),
    "a channel Pad within the last block": case(  # 20 → 24 channels: one block of 8 or 16
        "g (float[1,16,8,8] x, float[20,16,1,1] k1, int64[8] pads, float[24,24,3,3] k2)"
        " => (float y) { c = Conv(x, k1)\n r = Relu(c)\n p = Pad(r, pads)\n"
        " y = Conv<pads=[1,1,1,1]>(p, k2) }",
        [IN, "nchwc.Conv", "nchwc.Conv", OUT],
        {"ReorderInput": 1, "Conv": 2, "activation into Conv": 1,
         "channel Pad within the block": 1, "ReorderOutput": 1},
        k1=w(20, 16, 1, 1), pads=np.array([0, 0, 0, 0, 0, 4, 0, 0], np.int64),
        k2=w(24, 24, 3, 3)),
    "a 2x2 up-sampling ConvTranspose into a Concat": case(  # a UNet's up block
        f"g ({X16}, float[32,16,1,1] k, float[32,16,2,2] t, float[16] tb,"
        " float[32,48,3,3] k2, float[4] scales) => (float y) {"
        " c = Conv(x, k)\n u = ConvTranspose<kernel_shape=[2,2], strides=[2,2]>(c, t, tb)\n"
        " s = Resize<mode=\"nearest\", coordinate_transformation_mode=\"asymmetric\","
        " nearest_mode=\"floor\">(c, \"\", scales)\n j = Concat<axis=1>(s, u)\n"
        " y = Conv<pads=[1,1,1,1]>(j, k2) }",
        [IN, "nchwc.Conv", "nchwc.Conv", "Reshape", "Transpose", "Reshape", "nchwc.Upsample",
         "Concat", "nchwc.Conv", OUT],
        {"ReorderInput": 1, "Conv": 2, "ConvTranspose:1x1 Conv + depth-to-space": 1,
         "Resize:Upsample": 1, "Concat kept blocked": 1, "ReorderOutput": 1},
        k=w(32, 16, 1, 1) / 4, t=w(32, 16, 2, 2) / 6, tb=w(16), k2=w(32, 48, 3, 3) / 20,
        scales=np.array([1, 1, 2, 2], np.float32)),
    "a squeeze-and-excitation gate": case(  # EfficientNet's, MobileNetV3's: 20 channels padded
        "g (float[1,16,8,8] x, float[20,16,1,1] k, float[20,20,1,1] k1, float[20] b1,"
        " float[20,20,1,1] k2) => (float y) {"
        " c = Conv(x, k)\n p = GlobalAveragePool(c)\n e = Conv(p, k1, b1)\n s = Sigmoid(e)\n"
        " m = Mul(s, c)\n y = Conv(m, k2) }",
        [IN, "nchwc.Conv", "nchwc.GlobalAveragePool", "nchwc.Conv", "Reshape", "nchwc.Conv",
         "nchwc.Conv", OUT],
        {"ReorderInput": 1, "Conv": 3, "GlobalAveragePool": 1, "activation into Conv": 1,
         "Mul by a channel gate:depthwise": 1, "ReorderOutput": 1},
        k=w(20, 16, 1, 1) / 4, k1=w(20, 20, 1, 1) / 4, b1=w(20), k2=w(20, 20, 1, 1) / 4),
    "a squeeze-and-excitation gate squeezed by ReduceMean": case(
        # dynamo's and timm's squeeze: ReduceMean over H and W, not GlobalAveragePool
        SQUEEZED_BY_MEAN.format(header="", axes="axes=[2,3], ", axes_input=""),
        [IN, "nchwc.Conv", "nchwc.GlobalAveragePool", "nchwc.Conv", "Reshape", "nchwc.Conv",
         "nchwc.Conv", OUT], SQUEEZED_STATS,
        k=w(16, 16, 1, 1) / 4, k1=w(16, 16, 1, 1) / 4, k2=w(16, 16, 1, 1) / 4),
    "a channel gate read in NCHW": case(  # reordered in: [1, C, 1, 1] costs nothing to move
        f"g ({X16}, float[1,16,1,1] g, float[16,16,1,1] k, float[16,16,1,1] k2) => (float y) {{"
        " c = Conv(x, k)\n s = Sigmoid(g)\n m = Mul(c, s)\n y = Conv(m, k2) }",
        [IN, "nchwc.Conv", "Sigmoid", IN, "Reshape", "nchwc.Conv", "nchwc.Conv", OUT],
        {"ReorderInput": 2, "Conv": 2, "Mul by a channel gate:depthwise": 1, "ReorderOutput": 1},
        k=w(16, 16, 1, 1) / 4, k2=w(16, 16, 1, 1) / 4),
    "a 3x2 ConvTranspose over unaligned channels": case(  # 20 out: padded in every tap
        f"g ({X16}, float[16,16,1,1] k, float[16,20,3,2] t, float[16,20,1,1] k2)"
        " => (float y) { c = Conv(x, k)\n"
        " u = ConvTranspose<kernel_shape=[3,2], strides=[3,2]>(c, t)\n r = Relu(u)\n"
        " y = Conv(r, k2) }",
        [IN, "nchwc.Conv", "nchwc.Conv", "Reshape", "Transpose", "Reshape", "Relu",
         "nchwc.Conv", OUT],
        {"ReorderInput": 1, "Conv": 2, "ConvTranspose:1x1 Conv + depth-to-space": 1,
         "Relu kept blocked": 1, "ReorderOutput": 1},
        k=w(16, 16, 1, 1) / 4, t=w(16, 20, 3, 2) / 4, k2=w(16, 20, 1, 1) / 5),
}

@needs_nchwc
def test_a_resize_to_a_size_that_keeps_the_aspect_ratio_stays_nchw(tmp_path):
    # not_larger resizes every axis by one scale, min(16/16, 8/8, 32/8, 32/8) = 1: [1,16,8,8].
    # The per-axis ratios (4, 4) would make it [1,16,32,32], as onnxruntime's own transformer
    # does at ORT_ENABLE_ALL, so the check runs against ORT_DISABLE_ALL alone.
    proto = parse_model(f"g ({X16}, float[16,16,1,1] k, int64[4] sz) => (float y) {{"
                        ' c = Conv(x, k)\n y = Resize<mode="linear", keep_aspect_ratio_policy='
                        '"not_larger">(c, "", "", sz) }',
                        '<ir_version: 8, opset_import: ["" : 18]>\n', k=w(16, 16, 1, 1),
                        sz=np.array([1, 16, 32, 32], np.int64))
    model, stats, _ = rewrite(proto)
    assert ops(model) == [IN, "nchwc.Conv", OUT, "Resize"] and "Resize:Upsample" not in stats
    rewritten = to_onnx(model)
    feeds = numerics.random_feeds(proto, seed=0)
    expected = numerics.run(proto, feeds)
    assert expected["y"].shape == (1, 16, 8, 8)
    assert not numerics.compare(expected, numerics.run(rewritten, feeds, "disable"), RTOL, ATOL)


@needs_nchwc
def test_a_squeeze_by_reduce_mean_with_its_axes_as_an_input_is_blocked(tmp_path):
    # ReduceMean takes its axes as an input from opset 18 on; -2 and -1 are H and W.
    proto = parse_model(SQUEEZED_BY_MEAN.format(header=", int64[2] axes", axes="",
                                                axes_input=", axes"),
                        '<ir_version: 8, opset_import: ["" : 18]>\n',
                        k=w(16, 16, 1, 1) / 4, k1=w(16, 16, 1, 1) / 4, k2=w(16, 16, 1, 1) / 4,
                        axes=np.array([-2, -1], np.int64))
    model, stats, _ = rewrite(proto)
    assert stats == SQUEEZED_STATS and "ReduceMean" not in ops(model)
    check(proto, model, tmp_path, like_ort=False)


def _gated_over(batch) -> onnx.ModelProto:
    """A squeeze-and-excitation gate over a batch of `batch` images (a number or a dim name)."""
    return build(f"g (float[{batch},16,8,8] x, float[16,16,1,1] k, float[16,16,1,1] k2)"
                 " => (float y) { c = Conv(x, k)\n p = GlobalAveragePool(c)\n s = Sigmoid(p)\n"
                 " m = Mul(c, s)\n y = Conv(m, k2) }", k=w(16, 16, 1, 1), k2=w(16, 16, 1, 1))


@needs_nchwc
@pytest.mark.parametrize("batch", ["N", 2])
def test_a_channel_gate_over_a_batch_stays_a_mul(tmp_path, batch):
    # Each image has its own gate, which no single filter can be; an open batch dim says which
    # pin would block it.
    proto = _gated_over(batch)
    model, stats, notes = rewrite(proto)
    assert "Mul by a channel gate:depthwise" not in stats and "Mul" in ops(model)
    said = [n for n in notes if "channel gate over the open batch dim" in n]
    if batch == 2:
        assert not said, said
    else:
        assert len(said) == 1 and "1 × Mul: a channel gate over the open batch dim 'N' (each " \
            "image has its own; input_shapes pinning one image blocks it)" in said[0], notes
    check(proto, model, tmp_path)


UPCONVS_KEPT_NCHW = {  # why each ConvTranspose stays an NCHW op, behind a ReorderOutput
    "overlapping taps": ("kernel_shape=[3,3], strides=[2,2]", "the stride is not the kernel"),
    "padded": ("kernel_shape=[2,2], strides=[2,2], pads=[1,1,1,1]", "padded"),
    "an output padding": ("kernel_shape=[2,2], strides=[2,2], output_padding=[1,1]", "padded"),
    "grouped": ("kernel_shape=[2,2], strides=[2,2], group=2", "grouped"),
    "dilated": ("kernel_shape=[2,2], strides=[2,2], dilations=[2,2]", "dilated"),
}


@needs_nchwc
@pytest.mark.parametrize("name", UPCONVS_KEPT_NCHW)
def test_a_conv_transpose_with_overlapping_or_padded_taps_stays_nchw(tmp_path, name):
    attrs, why = UPCONVS_KEPT_NCHW[name]
    group = 2 if "group" in attrs else 1
    weight = w(16, 16 // group, 3 if "[3,3]" in attrs else 2, 3 if "[3,3]" in attrs else 2) / 4
    proto = build(f"g ({X16}, float[16,16,1,1] k, float[16,{16 // group},{weight.shape[2]},"
                  f"{weight.shape[3]}] t, float[16,16,1,1] k2) => (float y) {{ c = Conv(x, k)\n"
                  f" u = ConvTranspose<{attrs}>(c, t)\n y = Conv(u, k2) }}",
                  k=w(16, 16, 1, 1) / 4, t=weight, k2=w(16, 16, 1, 1) / 4)
    model, stats, notes = rewrite(proto)
    assert ops(model) == [IN, "nchwc.Conv", OUT, "ConvTranspose", IN, "nchwc.Conv", OUT]
    assert "ConvTranspose:1x1 Conv + depth-to-space" not in stats
    assert any(f"ConvTranspose: {why}" in n for n in notes), notes
    check(proto, model, tmp_path, like_ort=False)


@needs_nchwc
def test_a_conv_transpose_whose_output_leaves_the_layout_stays_nchw(tmp_path):
    # Blocking it would move the reorder from its input to its larger output.
    proto = build(f"g ({X16}, float[16,16,1,1] k, float[16,8,2,2] t) => (float y) {{"
                  " c = Conv(x, k)\n y = ConvTranspose<kernel_shape=[2,2], strides=[2,2]>(c, t) }",
                  k=w(16, 16, 1, 1), t=w(16, 8, 2, 2))
    model, stats, _ = rewrite(proto)
    assert ops(model) == [IN, "nchwc.Conv", OUT, "ConvTranspose"]
    check(proto, model, tmp_path)


@needs_nchwc
def test_a_conv_transpose_blocked_for_a_dynamic_batch(tmp_path):
    proto = build("g (float[N,16,4,6] x, float[16,16,1,1] k, float[16,16,2,2] t, float[16] tb,"
                  " float[16,32,1,1] k2) => (float y) { c = Conv(x, k)\n"
                  " u = ConvTranspose<kernel_shape=[2,2], strides=[2,2]>(c, t, tb)\n"
                  " p = MaxPool<kernel_shape=[2,2], strides=[2,2]>(u)\n j = Concat<axis=1>(c, p)\n"
                  " y = Conv(j, k2) }",
                  k=w(16, 16, 1, 1) / 4, t=w(16, 16, 2, 2) / 4, tb=w(16), k2=w(16, 32, 1, 1) / 6)
    model, stats, _ = rewrite(proto)
    assert stats["ConvTranspose:1x1 Conv + depth-to-space"] == 1
    rewritten = check(proto, model, tmp_path, like_ort=False)
    for batch in (1, 3):  # the Reshapes copy the batch dim (0), whatever it is at run time
        feeds = {"x": np.random.default_rng(batch).standard_normal((batch, 16, 4, 6))
                 .astype(np.float32)}
        assert not numerics.compare(numerics.run(proto, feeds),
                                    numerics.run(rewritten, feeds), RTOL, ATOL)

PADS_KEPT_NCHW = {  # the padded channels would not read 0 (or the Pad leaves the block)
    "after a Sigmoid": ("s = Sigmoid(c)", [0, 0, 0, 0, 0, 4, 0, 0], None),
    "with a fill of 1": ("s = Relu(c)", [0, 0, 0, 0, 0, 4, 0, 0], 1.0),
    "past the block": ("s = Relu(c)", [0, 0, 0, 0, 0, 20, 0, 0], None),
    "before the channels": ("s = Relu(c)", [0, 4, 0, 0, 0, 0, 0, 0], None),
}


@needs_nchwc
@pytest.mark.parametrize("activation", ["Sigmoid", "HardSigmoid"])
def test_a_channel_pad_behind_a_fused_conv_of_sigmoid_stays(tmp_path, activation):
    # -O3 fuses the activation into a FusedConv before the layout: its padded channels hold
    # act(0) = 0.5, which the Pad would have made real channels.
    proto = build(
        "g (float[1,16,8,8] x, float[20,16,1,1] k1, int64[8] pads) => (float y) {"
        f" c = Conv(x, k1)\n s = {activation}(c)\n y = Pad(s, pads) }}",
        k1=w(20, 16, 1, 1), pads=np.array([0, 0, 0, 0, 0, 4, 0, 0], np.int64))
    result = optimize(proto, level=3, target="cpu")
    feeds = numerics.random_feeds(proto, seed=0)
    assert not numerics.compare(numerics.run(proto, feeds),
                                numerics.run(result.to_onnx(), feeds), RTOL, ATOL)


@needs_nchwc
@pytest.mark.parametrize("name", PADS_KEPT_NCHW)
def test_a_channel_pad_that_would_not_read_zeros_stays_nchw(tmp_path, name):
    activation, pads, fill = PADS_KEPT_NCHW[name]
    extra = sum(pads)
    weights = {"k1": w(20, 16, 1, 1), "pads": np.array(pads, np.int64),
               "k2": w(20 + extra, 20 + extra, 1, 1)}
    fill_text = ""
    if fill is not None:
        weights["fill"], fill_text = scalar(fill), ", fill"
    proto = build(
        f"g (float[1,16,8,8] x, float[20,16,1,1] k1, int64[8] pads,"
        f" float[{20 + extra},{20 + extra},1,1] k2{', float fill' if fill is not None else ''})"
        f" => (float y) {{ c = Conv(x, k1)\n {activation}\n p = Pad(s, pads{fill_text})\n"
        " y = Conv(p, k2) }", **weights)
    model, stats, _ = rewrite(proto)
    assert "channel Pad within the block" not in stats and "Pad" in ops(model)
    check(proto, model, tmp_path, like_ort=False)


@needs_nchwc
@pytest.mark.parametrize("name", BEYOND)
def test_keeps_elementwise_ops_with_constants_in_the_layout(tmp_path, name):
    proto = BEYOND[name].model()
    model, stats, _ = rewrite(proto)
    assert ops(model) == BEYOND[name].ops
    assert stats == BEYOND[name].stats
    check(proto, model, tmp_path, like_ort=False)


@needs_nchwc
@pytest.mark.parametrize("gelu, opset", [("Gelu", 20), ("com.microsoft.FastGelu", 17)])
def test_gelu_of_onnx_and_fast_gelu_stay_blocked(tmp_path, gelu, opset):
    # The dynamo exporter writes ONNX's Gelu (opset 20); FuseGelu makes FastGelu of the tanh
    # form. Both are elementwise and 0 at 0, as the contrib Gelu onnxruntime keeps blocked.
    proto = parse_model(
        "g (float[1,16,8,8] x, float[20,16,1,1] k1, float[20,20,1,1] k2) => (float y) {"
        f" a = Conv(x, k1)\n g = {gelu}(a)\n y = Conv(g, k2) }}",
        f'<ir_version: 9, opset_import: ["" : {opset}, "com.microsoft" : 1]>\n',
        k1=w(20, 16, 1, 1), k2=w(20, 20, 1, 1))
    model, stats, _ = rewrite(proto)
    assert ops(model) == [IN, "nchwc.Conv", gelu.split(".")[-1], "nchwc.Conv", OUT]
    assert stats[f"{gelu.split('.')[-1]} kept blocked"] == 1
    check(proto, model, tmp_path, like_ort=False)


@needs_nchwc
@pytest.mark.parametrize("name", PARTIAL)
def test_reorders_back_where_nchw_is_read(tmp_path, name):
    proto = PARTIAL[name].model()
    model, _, _ = rewrite(proto)
    assert ops(model) == PARTIAL[name].ops
    check(proto, model, tmp_path)


# -- the pass as a whole ------------------------------------------------------------------------

def test_no_avx_leaves_the_model_with_a_note(monkeypatch):
    monkeypatch.setattr(layout_nchwc, "detect_block_size", lambda: 0)
    model, stats, notes = rewrite(CASES["regular conv"].model())
    assert ops(model) == ["Conv"] and not stats
    assert "neither AVX-512F nor AVX2" in notes[0]


def test_block_size_option():
    proto = CASES["grouped"].model()
    with pytest.raises(OptionError, match="nchwc_block_size 4"):
        rewrite(proto, block=4)
    # Forced to 16 (runnable only with AVX-512F): the structure and the recorded block.
    model, stats, _ = rewrite(CASES["depthwise, channels padded"].model(), block=16)
    (conv,) = nodes(model, "nchwc.Conv")
    assert conv.attr("group") == 16 and model.metadata_props["graphopt.nchwc_block_size"] == "16"
    model, stats, _ = rewrite(build("g (float[1,8,8,8] x, float[24,8,1,1] k) => (float y) {"
                                    " y = Conv(x, k) }", k=w(24, 8, 1, 1)), block=16)
    assert stats == {"Conv:nchw": 1, "ReorderOutput": 1}  # 8 < 16 input channels: reads NCHW
    assert nodes(model, "nchwc.Conv")[0].inputs[1].shape == (32, 8, 1, 1)


def test_second_run_changes_nothing():
    model, _, _ = rewrite(CASES["conv + add residual + relu"].model(), block=8)
    before = ops(model)
    ctx = PassContext(Options())
    ctx.options.nchwc_block_size = 8
    assert not LayoutNchwc().run(model, ctx).changed and ops(model) == before
    ctx.options.nchwc_block_size = 16
    assert not LayoutNchwc().run(model, ctx).changed
    assert "already blocked by 8, not 16" in ctx.notes[0]


def test_replaced_weights_leave_the_file():
    model, _, _ = rewrite(CASES["conv + add residual + relu"].model(), block=8)
    assert sorted(model.graph.initializers) == ["b2", "k1_OIHWBiBo8", "k2_OIHWBiBo8"]


def _compiled(name: str, level: int, **size):
    """The zoo model, graphopt at -O`level`, then LayoutNchwc through the pass manager."""
    proto = zoo.build(name, **size)
    result = optimize(proto, level=level)
    baseline = result.to_onnx()
    ctx = PassContext(Options())
    log = PassManager(Pipeline("nchwc", "LayoutNchwc alone", ("LayoutNchwc",)), ctx).run(
        result.model)
    verify(result.model)
    return proto, baseline, result.model, log.records[0].stats, ctx.notes


@needs_nchwc
@pytest.mark.parametrize("name,level,size", [
    ("resnet50", 2, {"width": 0.25, "image_size": 64}),
    ("mobilenetv2", 2, {"width": 0.5, "image_size": 64}),
    ("mobilenetv2", 3, {"image_size": 64}),  # -O3: FusedConv(Clip) in, nchwc Conv out
    ("unet", 2, {"base_channels": 16, "image_size": 32}),  # ConvTranspose up-sampling
])
def test_zoo(tmp_path, name, level, size):
    proto, baseline, model, stats, notes = _compiled(name, level, **size)
    assert not notes
    assert not {"Conv", "FusedConv", "ConvTranspose"} & set(ops(model))
    rewritten = check(baseline, model, tmp_path, like_ort=name != "unet")
    feeds = zoo.sample_inputs(proto, seed=0)
    assert not numerics.compare(numerics.run(proto, feeds), numerics.run(rewritten, feeds),
                                RTOL, ATOL)
    counts = op_counts(rewritten)
    convs = sum(n.op_type in ("Conv", "FusedConv") for n in baseline.graph.node)
    upconvs = stats.get("ConvTranspose:1x1 Conv + depth-to-space", 0)
    assert counts[f"{NCHWC}::Conv"] == convs + upconvs
    # Once before Flatten → Gemm, and once before each inner conv with fewer input channels
    # than a block (MobileNetV2 at width 0.5 has 8, under AVX-512's blocks of 16), which reads
    # NCHW as the stem does.
    narrow = stats.get("Conv:nchw", 0) + stats.get("FusedConv:nchw", 0) - 1
    assert counts[f"{NCHWC}::ReorderOutput"] == 1 + narrow
    assert narrow == (name == "mobilenetv2" and level == 2 and BLOCK == 16)
    if name == "resnet50":
        assert stats["Add into Conv's Sum"] == 16 and stats["Conv:nchw"] == 1
        assert counts[f"{NCHWC}::MaxPool"] == 1
    elif name == "unet":  # one layout from the stem to the head: up-sampling and skips too
        assert upconvs == 4 and stats["Concat kept blocked"] == 4
        assert counts[f"{NCHWC}::ReorderInput"] == 0
    else:
        assert stats[f"{'FusedConv' if level == 3 else 'Conv'}:depthwise"] == 17
        assert stats["Add into Conv's Sum"] == 10


@needs_nchwc
def test_graphopt_reads_its_blocked_output_back():
    # The nchwc ops have onnxruntime schemas, so a blocked model is valid input; no pass may
    # touch them (verify=True compares against the blocked model at ORT_DISABLE_ALL).
    _, _, model, _, _ = _compiled("mobilenetv2", 2, width=0.5, image_size=64)
    blocked = to_onnx(model)
    again = optimize(blocked, level=3, verify=True)
    assert op_counts(again.to_onnx(), NCHWC) == op_counts(blocked, NCHWC)


def test_verify_and_bisect_refuse_a_compile_blocked_for_another_cpu(tmp_path, capsys):
    # A profile may force the other block size (a cross-compile); run here, its convs come
    # out wrong, and --verify and bisect blamed LayoutNchwc for a miscompile.
    from helpers import run_cli

    here = onnxruntime_block_size()
    if here not in (8, 16):
        pytest.skip("this CPU runs no NCHWc block")
    profile = json.loads(open(load_target("cpu").path, encoding="utf-8").read())
    profile["name"] = "other_cpu"
    profile["devices"][0]["nchwc_block_size"] = 24 - here  # 8 <-> 16
    target = tmp_path / "other_cpu.json"
    target.write_text(json.dumps(profile))
    model = tmp_path / "tiny.onnx"
    onnx.save(zoo.build("tiny"), model)
    message = (f"the compile blocks its convs by {24 - here} channels (the target's "
               f"nchwc_block_size) and onnxruntime here by {here}: the result runs wrong on "
               "this machine")
    rc, _, err = run_cli(capsys, "optimize", model, "-o", tmp_path / "t.om", "--target", target,
                         "--verify")
    assert rc == 1 and f"--verify: {message}" in err and not (tmp_path / "t.om").exists(), err
    rc, out, err = run_cli(capsys, "bisect", model, "--target", target)
    assert rc == 2 and f"bisect: {message}" in err and "culprit" not in out, err


def test_a_compile_blocked_for_another_cpu_says_so_and_is_not_load_checked_here():
    # onnxruntime here sizes the blocked ops by its own block: two padded 36-channel tensors
    # meeting in an -O3 Min were refused (blocked by 8 on an AVX-512 CPU), and the load check
    # called that a graphopt bug.
    # Where it loads, it runs wrong without an error; an .onnx has no runtime to refuse it.
    here = onnxruntime_block_size()
    if here not in (8, 16):
        pytest.skip("this CPU runs no NCHWc block")
    proto = parse_model("""
        g (float[1,16,7,7] x) => (float[1,36,4,7] y) {
            a = Conv <kernel_shape = [3, 1], pads = [2, 0, 1, 0], strides = [2, 1]> (x, k3, b3)
            b = Conv (a, k33)
            c = Concat <axis = 1> (b, a)
            d = Conv (c, k36, b36)
            t = Tanh (d)
            m = Min (c, t)
            r = Relu (m)
            s = Add (r, c)
            e = Conv (s, k36, b36)
            f = Add (s, e)
            y = Relu (f)
        }""", k3=w(3, 16, 3, 1), b3=w(3), k33=w(33, 3, 1, 1), k36=w(36, 36, 1, 1), b36=w(36))
    for level in (2, 3):
        result = optimize(proto, level=level, target="cpu",
                          pass_options={"nchwc_block_size": 24 - here})
        assert result.model.metadata_props["graphopt.nchwc_block_size"] == str(24 - here)
        assert [n for n in result.notes if n.startswith("the compile's convs are in NCHWc")] == \
            [f"the compile's convs are in NCHWc blocks of {24 - here} channels (the target's "
             f"nchwc_block_size) and onnxruntime here blocks by {here}: it runs only on a CPU "
             f"that blocks by {24 - here}, and was not loaded here (an .om refuses to load on "
             "another CPU; an .onnx runs wrong on one, without an error)"], result.notes
    assert not [n for n in optimize(proto, level=3, target="cpu").notes if "NCHWc" in n]


@needs_nchwc
def test_a_block_quantized_quantize_linear_keeps_its_layout(tmp_path):
    # A one-element scale of rank 4 with block_size (opset 21) passed the per-tensor test, and
    # the QuantizeLinear moved to the NHWC tensor, where blocked quantization's shape check
    # failed at every run.
    proto = parse_model(
        "g (float[1,3,1,1] x, float[16,3,1,1] k, int8[16,16,1,1] wq, float ws,"
        " float[1,1,1,1] sb, uint8[1,1,1,1] zb) => (float[1,16,1,1] y) {"
        " c = Conv(x, k)\n r = Relu(c)\n qr = QuantizeLinear<axis=1, block_size=16>(r, sb, zb)"
        "\n d = DequantizeLinear<axis=1, block_size=16>(qr, sb, zb)\n"
        " wd = DequantizeLinear(wq, ws)\n y = Conv(d, wd) }",
        '<ir_version: 10, opset_import: ["" : 21]>\n', k=w(16, 3, 1, 1),
        wq=np.random.default_rng(0).integers(-100, 100, (16, 16, 1, 1)).astype(np.int8),
        ws=np.array(0.01, np.float32), sb=np.full((1, 1, 1, 1), 0.05, np.float32),
        zb=np.full((1, 1, 1, 1), 128, np.uint8))
    model, stats, _ = rewrite(proto)
    assert "ReorderOutput to NHWC before QuantizeLinear" not in stats
    feeds = numerics.random_feeds(proto, seed=0)
    assert not numerics.compare(numerics.run(proto, feeds), numerics.run(to_onnx(model), feeds),
                                RTOL, ATOL)
