"""Channel equalization before INT8 (graphopt/quant/equalize.py): the float model's outputs
stay the same, the regions it may scale are found and the others left alone, and the int8
error goes down."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import parse_model, run_cli
from onnx import TensorProto, helper, numpy_helper

import graphopt
from graphopt import numerics
from graphopt.ir import load_onnx, to_onnx
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.quant.equalize import MAX_SCALE, equalize_channels

# A stem, a bottleneck-like block with a projection shortcut and a residual Add, a depthwise
# and a grouped conv, pooling, and a Gemm head: the regions are {s, rs} (read by a, sc),
# {a, ra} (read by b), {b, sc, sum, rsum, mp} (read by dw), {dw, rdw} (read by gc) and
# {gc, rgc, gap, flat} (read by the Gemm).
RESIDUAL = """
    agraph (float[1, 3, 12, 12] x) => (float[1, 10] y) {
        s = Conv <pads = [1, 1, 1, 1]> (x, ws, bs)
        rs = Relu(s)
        a = Conv <pads = [1, 1, 1, 1]> (rs, wa, ba)
        ra = LeakyRelu <alpha = 0.1> (a)
        b = Conv (ra, wb, bb)
        sc = Conv (rs, wsc)
        sum = Add(b, sc)
        rsum = Relu(sum)
        mp = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (rsum)
        dw = Conv <pads = [1, 1, 1, 1], group = 8> (mp, wdw, bdw)
        rdw = Relu(dw)
        gc = Conv <group = 2> (rdw, wgc, bgc)
        rgc = Relu(gc)
        gap = GlobalAveragePool(rgc)
        flat = Flatten(gap)
        y = Gemm <transB = 1> (flat, wf, bf)
    }"""


def _skewed(rng, shape, spread=30.0):
    """Weights whose output channels span ranges `spread` apart (as BatchNorms folded in do)."""
    w = rng.standard_normal(shape).astype(np.float32) * 0.3
    gains = np.geomspace(1.0, spread, shape[0]).astype(np.float32)
    rng.shuffle(gains)
    return w * gains.reshape(-1, *[1] * (len(shape) - 1)), gains


def _residual():
    rng = np.random.default_rng(0)
    weights = {}
    for name, shape in {"ws": (8, 3, 3, 3), "wa": (8, 8, 3, 3), "wb": (8, 8, 1, 1),
                        "wsc": (8, 8, 1, 1), "wdw": (8, 1, 3, 3), "wgc": (6, 4, 1, 1)}.items():
        weights[name], _ = _skewed(rng, shape)
    weights["wsc"] /= 4
    for name, size in {"bs": 8, "ba": 8, "bb": 8, "bdw": 8, "bgc": 6}.items():
        weights[name] = rng.standard_normal(size).astype(np.float32) * 0.1
    weights["wf"] = rng.standard_normal((10, 6)).astype(np.float32) * 0.3
    weights["bf"] = rng.standard_normal(10).astype(np.float32) * 0.1
    return parse_model(RESIDUAL, **weights)


def _samples(n=8, shape=(1, 3, 12, 12), seed=1):
    return [{"x": np.random.default_rng(seed + i).standard_normal(shape).astype(np.float32)}
            for i in range(n)]


def _extents(proto, samples):
    """extents(names) for equalize_channels, from onnxruntime runs of the float `proto`."""
    def extents(names):
        probe = onnx.ModelProto()
        probe.CopyFrom(proto)
        probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
        found = {}
        for feeds in samples:
            outs = numerics.run(probe, feeds)
            for name in names:
                a = np.abs(outs[name])
                found[name] = np.maximum(found.get(name, 0), a.max(axis=(0, *range(2, a.ndim))))
        return found
    return extents


def _equalized(proto, samples=None):
    model = load_onnx(proto)
    infer_shapes(model)
    count = equalize_channels(model, _extents(proto, samples or _samples()))
    return count, to_onnx(model)


def test_the_float_outputs_stay_the_same_and_each_region_is_scaled():
    proto = _residual()
    count, out = _equalized(proto)
    onnx.checker.check_model(out, full_check=True)
    assert count == 5
    before = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    after = {n.input[1]: onnx.numpy_helper.to_array(
        next(t for t in out.graph.initializer if t.name == n.input[1]))
        for n in out.graph.node if n.op_type in ("Conv", "Gemm")}
    changed = [name for name in after if name not in before
               or not np.array_equal(after[name], before[name])]
    assert len(changed) == 7  # every layer that writes or reads a region
    for feeds in _samples(4, seed=50):  # inputs the scales were not measured on
        want, got = numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_channels_are_evened_out_within_the_bound():
    proto = _residual()
    samples = _samples()
    _, out = _equalized(proto, samples)
    names = ["rs", "ra", "rsum", "rdw"]
    before, after = _extents(proto, samples)(names), _extents(out, samples)(names)
    for name in names:
        spread = before[name].max() / before[name][before[name] > 0]
        evened = after[name].max() / after[name][after[name] > 0]
        # Toward √ of the spread (of the widest tensor of the region, which rsum is not).
        assert evened.max() < 0.75 * spread.max(), name
        assert np.all(after[name] <= before[name] * MAX_SCALE * (1 + 1e-5)), name
        assert np.all(after[name] >= before[name] * (1 - 1e-5)), name  # scales ≥ 1


@pytest.mark.parametrize("between, why", [
    ("r = Clip(c1, zero, six)", "Clip's bounds do not scale"),
    ("r = Sigmoid(c1)", "not homogeneous"),
    ("r = Add(c1, bias)", "a constant added"),
    ("r = Relu(c1)\n        o = Identity(r)", "a graph output inside"),
])
def test_a_region_that_cannot_carry_a_scale_is_left_alone(between, why):
    outputs = "float[1, 4, 8, 8] y" + (", float[1, 4, 8, 8] r" if "o =" in between else "")
    text = f"""
    agraph (float[1, 3, 8, 8] x) => ({outputs}) {{
        c1 = Conv <pads = [1, 1, 1, 1]> (x, w1)
        {between}
        y = Conv <pads = [1, 1, 1, 1]> (r, w2)
    }}"""
    rng = np.random.default_rng(3)
    w1, _ = _skewed(rng, (4, 3, 3, 3))
    weights = {"w1": w1, "w2": rng.standard_normal((4, 4, 3, 3)).astype(np.float32)}
    if "Clip" in between:
        weights.update(zero=np.array(0, np.float32), six=np.array(6, np.float32))
    if "bias" in between:
        weights["bias"] = np.ones((1, 4, 1, 1), np.float32)
    count, _ = _equalized(parse_model(text, **weights))
    assert count == 0, why


def test_a_concat_or_a_graph_input_ends_the_region():
    rng = np.random.default_rng(4)
    proto = parse_model("""
    agraph (float[1, 4, 8, 8] x) => (float[1, 4, 8, 8] y, float[1, 4, 8, 8] z) {
        r = Relu(x)
        y = Conv <pads = [1, 1, 1, 1]> (r, w1)
        c = Conv (x, w2)
        rc = Relu(c)
        cat = Concat <axis = 1> (rc, rc)
        z = Conv (cat, w3)
    }""", w1=rng.standard_normal((4, 4, 3, 3)).astype(np.float32),
        w2=_skewed(rng, (4, 4, 1, 1))[0], w3=rng.standard_normal((4, 8, 1, 1)).astype(np.float32))
    assert _equalized(proto)[0] == 0


def test_gemm_layers_write_and_read_their_features_either_way_round():
    rng = np.random.default_rng(5)
    proto = parse_model("""
    agraph (float[4, 6] x) => (float[4, 3] y) {
        h = Gemm <transB = 1> (x, w1, b1)
        r = Relu(h)
        h2 = Gemm (r, w2, b2)
        r2 = Relu(h2)
        y = Gemm <transB = 1> (r2, w3)
    }""", w1=_skewed(rng, (8, 6))[0], b1=np.full(8, 0.1, np.float32),
        w2=_skewed(rng, (5, 8))[0].T.copy(), b2=np.full(5, 0.1, np.float32),
        w3=rng.standard_normal((3, 5)).astype(np.float32))
    samples = _samples(shape=(4, 6))
    count, out = _equalized(proto, samples)
    assert count == 2
    for feeds in _samples(3, shape=(4, 6), seed=90):
        want, got = numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("opset", [17, 18])  # ReduceMean's axes: an attribute, then an input
def test_a_spatial_reduce_mean_and_fused_gemms_carry_the_region(opset):
    # Dynamo's global pool, then FusedGemm(Relu) layers as -O3 writes a Gemm + Relu.
    rng = np.random.default_rng(6)
    # Dynamo keeps the dims and views the [N, C, 1, 1] mean as [N, C].
    pool = [helper.make_node("ReduceMean", ["r", "axes"], ["m"], keepdims=1),
            helper.make_node("Reshape", ["m", "rows"], ["p"])] if opset >= 18 else [
        helper.make_node("ReduceMean", ["r"], ["p"], keepdims=0, axes=[2, 3])]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), *pool,
             helper.make_node("FusedGemm", ["p", "w1", "b1"], ["h"], domain="com.microsoft",
                              transB=1, activation="Relu"),
             helper.make_node("FusedGemm", ["h", "w2"], ["y"], domain="com.microsoft",
                              transB=1, activation="Relu")]
    weights = {"w": _skewed(rng, (8, 3, 3, 3))[0], "b": np.full(8, 0.1, np.float32),
               "w1": _skewed(rng, (6, 8))[0], "b1": np.full(6, 0.1, np.float32),
               "w2": rng.standard_normal((4, 6)).astype(np.float32)}
    if opset >= 18:
        weights.update(axes=np.array([2, 3], np.int64), rows=np.array([2, 8], np.int64))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(a, n) for n, a in weights.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid("com.microsoft", 1)])
    samples = _samples(shape=(2, 3, 8, 8))
    count, out = _equalized(proto, samples)
    assert count == 2  # {c, r, (m,) p} and {h}
    for feeds in _samples(3, shape=(2, 3, 8, 8), seed=70):
        want, got = numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _int8_error(proto, tmp_path, equalize: bool) -> float:
    calibration = tmp_path / "calib.npz"
    np.savez(calibration, x=np.stack([s["x"] for s in _samples(16)]))
    result = graphopt.optimize(proto, pass_options={
        "quantize": "int8", "calibration": str(calibration), "quant_keep_ends": False,
        "quant_keep_sensitive": False, "quant_equalize": equalize})
    out = graphopt.to_onnx(result.model)
    onnx.checker.check_model(out)
    errors = []
    for feeds in _samples(8, seed=200):
        want = numerics.run(proto, feeds)["y"]
        got = numerics.run(out, feeds, level="all")["y"]
        errors.append(np.abs(got - want).mean() / want.std())
    return float(np.mean(errors))


def test_int8_rounds_the_evened_channels_with_less_error(tmp_path):
    proto = _residual()
    plain, equalized = _int8_error(proto, tmp_path, False), _int8_error(proto, tmp_path, True)
    assert equalized < 0.8 * plain, (equalized, plain)


def test_the_command_line_turns_it_off(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(_residual(), path)
    calibration = tmp_path / "calib.npz"
    np.savez(calibration, x=np.stack([s["x"] for s in _samples(8)]))
    for flags, regions in (((), "equalized channel region=5"), (("--no-equalize-channels",), None)):
        code, out, err = run_cli(capsys, "optimize", path, "-o", tmp_path / "q.onnx",
                                 "--quantize", "int8", "--calibration", calibration,
                                 "--no-accuracy-report", *flags)
        assert code == 0, err
        assert (regions in out) if regions else "equalized" not in out, out
    code, _, err = run_cli(capsys, "optimize", path, "-o", tmp_path / "f.onnx",
                           "--no-equalize-channels")
    assert code != 0 and "--no-equalize-channels applies to --quantize int8" in err


def test_shape_profiles_scale_their_channels_as_the_profile_the_data_fits(tmp_path):
    # Profiles had skipped equalization, even the one the data fits: an OCR detector's int8
    # cosine fell from 0.993 (pinned) to 0.971 under --dynamic-dims at the same shape. The
    # profile that takes the other's ranges scales by the extents measured there.
    calibration = tmp_path / "calib.npz"
    np.savez(calibration, x=np.stack([s["x"] for s in _samples(8)]))  # batch 1: fits N=1
    options = {"quantize": "int8", "calibration": str(calibration)}
    dynamic = parse_model(RESIDUAL.replace("float[1, 3, 12, 12] x", "float[N, 3, 12, 12] x")
                          .replace("float[1, 10] y", "float[N, 10] y"),
                          **{t.name: onnx.numpy_helper.to_array(t)
                             for t in _residual().graph.initializer})
    result = graphopt.optimize(dynamic, dynamic_dims={"N": [2, 1]}, pass_options=options)
    for compiled in result.profiles:
        assert compiled.result.log.totals()["QuantizeInt8"]["rewrites"][
            "equalized channel region"] == 5, compiled.profile.name
    pinned = graphopt.optimize(_residual(), pass_options=options)
    assert pinned.log.totals()["QuantizeInt8"]["rewrites"]["equalized channel region"] == 5
    graphopt.save(result, tmp_path / "d.om")
    graphopt.save(pinned, tmp_path / "p.om")
    profiled, alone = graphopt.load(tmp_path / "d.om"), graphopt.load(tmp_path / "p.om")
    pair = [s["x"] for s in _samples(2, seed=300)]
    both = profiled.run({"x": np.concatenate(pair)})["y"]  # the N=2 profile, which borrowed
    for row, x in zip(both, pair):
        np.testing.assert_allclose(row, alone.run({"x": x})["y"][0], rtol=1e-5, atol=1e-6)
