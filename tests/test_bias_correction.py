"""Bias correction in QuantizeInt8: the mean output shift that rounding weights causes, from
calibration means, folded into the bias (Conv, grouped Conv, Gemm both ways, a Conv without
bias), checked against the exact shift and end to end against float."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphopt
import graphopt.quant.float_heads as float_heads
import graphopt.quant.int8 as int8
import graphopt.quant.qdq_rewrite as qdq_rewrite
from graphopt import numerics
from graphopt.ir import Node
from graphopt.quant.qparams import dequantize_weight, quantize_weight
from tests.helpers import parse_model


def _conv(x, w, groups=1):
    """A direct, unpadded, stride-1 convolution in float64."""
    n, c, h, wd = x.shape
    o, per, kh, kw = w.shape
    out = np.zeros((n, o, h - kh + 1, wd - kw + 1))
    for j in range(o):
        g = j // (o // groups)
        xs = x[:, g * per:(g + 1) * per]
        for a in range(kh):
            for b in range(kw):
                out[:, j] += np.einsum("nchw,c->nhw", xs[:, :, a:a + out.shape[2],
                                                         b:b + out.shape[3]], w[j, :, a, b])
    return out


@pytest.mark.parametrize("groups", [1, 2, 8])
def test_conv_shift_is_the_output_change_on_a_constant_input(groups):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 8 // groups, 3, 3)).astype(np.float32)
    wq, scale = quantize_weight(w, 0)
    w_deq = dequantize_weight(wq, scale, 0)
    mean = rng.uniform(0.5, 2.0, 8)
    x = np.broadcast_to(mean[None, :, None, None], (1, 8, 5, 5))
    expected = (_conv(x, w_deq, groups) - _conv(x, w, groups))[0, :, 0, 0]
    node = Node("Conv", [], {"group": groups} if groups > 1 else {})
    np.testing.assert_allclose(qdq_rewrite.mean_shift(node, w, w_deq, mean), expected, rtol=1e-5,
                               atol=1e-7)
    assert np.max(np.abs(expected)) > 1e-4  # rounding moved the mean: the test can tell


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_shift_is_the_output_change_at_the_mean(trans_b):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 6) if not trans_b else (6, 16)).astype(np.float32)
    axis = 0 if trans_b else 1
    wq, scale = quantize_weight(w, axis)
    w_deq = dequantize_weight(wq, scale, axis)
    mean = rng.uniform(-1.0, 2.0, 16)
    expected = mean @ (w_deq.T - w.T if trans_b else w_deq - w)
    node = Node("Gemm", [], {"transB": trans_b})
    np.testing.assert_allclose(qdq_rewrite.mean_shift(node, w, w_deq, mean), expected, rtol=1e-5)


NET = """
    agraph (float[1, 16, 12, 12] x) => (float[1, 8, 8, 8] y) {
        c1 = Conv (x, w1)
        r1 = Relu(c1)
        y = Conv (r1, w2, b2)
    }"""


def _net():
    rng = np.random.default_rng(2)
    # One large weight per output channel makes the scale coarse, so rounding moves the mean
    # of the other weights noticeably.
    w1 = rng.standard_normal((8, 16, 3, 3)).astype(np.float32) * 0.1
    w1[:, 0, 0, 0] = 2.0
    w2 = rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.1
    w2[:, 0, 0, 0] = 1.5
    return parse_model(NET, w1=w1, w2=w2, b2=np.full(8, 0.1, np.float32))


def _channel_mean_error(proto, out, feeds_list):
    diffs = [numerics.run(out, f)["y"] - numerics.run(proto, f)["y"] for f in feeds_list]
    return float(np.abs(np.mean(diffs, axis=(0, 1, 3, 4))).max())


def test_bias_correction_removes_the_mean_error_end_to_end(tmp_path, monkeypatch):
    proto = _net()
    rng = np.random.default_rng(3)
    # Inputs with a non-zero mean per channel, as after a Relu: the shift is W error · mean.
    data = rng.uniform(0.0, 2.0, (8, 1, 16, 12, 12)).astype(np.float32)
    np.savez(tmp_path / "c.npz", x=data)
    held = [{"x": rng.uniform(0.0, 2.0, (1, 16, 12, 12)).astype(np.float32)} for _ in range(8)]
    options = {"quantize": "int8", "calibration": str(tmp_path / "c.npz"),
               "quant_keep_ends": False}

    def compiled():
        out = graphopt.to_onnx(graphopt.optimize(proto, pass_options=options).model)
        onnx.checker.check_model(out)
        return out

    corrected = compiled()
    # The first conv had no bias: the correction gives it one, an int32 DequantizeLinear.
    conv1 = next(n for n in corrected.graph.node if n.op_type == "Conv" and "w1" in n.input[1])
    assert len(conv1.input) == 3
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in corrected.graph.initializer}
    producers = {o: n for n in corrected.graph.node for o in n.output}
    assert inits[producers[conv1.input[2]].input[0]].dtype == np.int32
    with_correction = _channel_mean_error(proto, corrected, held)
    for module in (qdq_rewrite, float_heads):  # the quantized layers' and the float ones'
        monkeypatch.setattr(module, "mean_shift", lambda node, w, w_deq, mean:
                            np.zeros(w.shape[0], np.float32))
    without = _channel_mean_error(proto, compiled(), held)
    assert with_correction < 0.5 * without, (with_correction, without)


def test_channel_means_stream_over_samples_of_any_rank():
    from graphopt.quant.stats import TensorStats
    rng = np.random.default_rng(4)
    for shape in ((2, 3, 4, 5), (6, 3), (1, 3, 7)):
        arrays = [rng.standard_normal(shape) + np.arange(3).reshape(1, 3, *[1] * (len(shape) - 2))
                  for _ in range(4)]
        s = TensorStats(channels=True)
        for a in arrays:
            s.observe_range(a)
        expected = np.mean(np.concatenate(arrays), axis=(0, *range(2, len(shape))))
        np.testing.assert_allclose(s.channel_mean, expected, rtol=1e-12)
    assert TensorStats().channel_mean is None  # not tracked unless asked


HEADED = """
    agraph (float[1, 16, 12, 12] x) => (float[1, 10] y) {
        c1 = Conv (x, w1)
        r1 = Relu(c1)
        c2 = Conv (r1, w2, b2)
        r2 = Relu(c2)
        p = GlobalAveragePool(r2)
        f = Flatten(p)
        y = Gemm <transB = 1> (f, w3, b3)
    }"""


def test_a_float_head_absorbs_the_mean_shift_of_the_quantized_layers(tmp_path, monkeypatch):
    """quant_keep_ends keeps the stem and the Gemm head float; the head's bias takes back the
    mean shift of its input that the quantized middle conv leaves, measured by running the
    quantized model over the calibration samples."""
    rng = np.random.default_rng(5)
    w1 = rng.standard_normal((8, 16, 3, 3)).astype(np.float32) * 0.1
    w2 = rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.1
    w2[:, 0, 0, 0] = 1.5  # a coarse weight scale: rounding shifts the outputs' means
    proto = parse_model(HEADED, w1=w1, w2=w2, b2=np.full(8, 0.1, np.float32),
                        w3=rng.standard_normal((10, 8)).astype(np.float32),
                        b3=np.zeros(10, np.float32))
    data = rng.uniform(0.0, 2.0, (8, 1, 16, 12, 12)).astype(np.float32)
    np.savez(tmp_path / "c.npz", x=data)
    options = {"quantize": "int8", "calibration": str(tmp_path / "c.npz")}

    def compiled():
        result = graphopt.optimize(proto, pass_options=options)
        out = graphopt.to_onnx(result.model)
        onnx.checker.check_model(out)
        return result, out

    def mean_error(out):
        return np.mean([numerics.run(out, {"x": x})["y"] - numerics.run(proto, {"x": x})["y"]
                        for x in data], axis=0)

    result, corrected = compiled()
    counts = next(r for r in result.log.records if r.name == "QuantizeInt8").stats
    assert counts["bias correction of a float layer"] == 1
    gemm = next(n for n in corrected.graph.node if n.op_type == "Gemm")
    assert gemm.input[2].endswith("_corrected")
    # Over the calibration samples, the head is linear in its input: the corrected bias makes
    # the mean output the float model's.
    with_correction = np.abs(mean_error(corrected)).max()
    monkeypatch.setattr(int8, "correct_float_layers", lambda *args: None)
    without = np.abs(mean_error(compiled()[1])).max()
    assert with_correction < 1e-3 * np.abs(numerics.run(proto, {"x": data[0]})["y"]).max()
    assert with_correction < 0.05 * without, (with_correction, without)


def test_a_float_head_keeps_its_bias_under_too_few_calibration_samples(tmp_path):
    # One row per sample reaches the head: from one sample the correction cancels that
    # sample's error exactly and fits noise elsewhere, while the accuracy report, which runs
    # the first calibration sample, would read a perfect cosine.
    rng = np.random.default_rng(5)
    proto = parse_model(HEADED, w1=rng.standard_normal((8, 16, 3, 3)).astype(np.float32) * 0.1,
                        w2=rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.1,
                        b2=np.full(8, 0.1, np.float32),
                        w3=rng.standard_normal((10, 8)).astype(np.float32),
                        b3=np.zeros(10, np.float32))
    for samples, corrected in ((float_heads.MIN_HEAD_VALUES - 1, 0), (float_heads.MIN_HEAD_VALUES, 1)):
        np.savez(tmp_path / "c.npz", x=rng.uniform(0.0, 2.0, (samples, 1, 16, 12, 12))
                 .astype(np.float32))
        _assert_corrected(proto, tmp_path / "c.npz", corrected)


def _assert_corrected(proto, calibration, corrected: int) -> None:
    """An INT8 compile on `calibration` corrects `corrected` float layers' bias, and says
    when it keeps them."""
    result = graphopt.optimize(proto, pass_options={
        "quantize": "int8", "calibration": str(calibration)})
    stats = next(r for r in result.log.records if r.name == "QuantizeInt8").stats
    assert stats.get("bias correction of a float layer", 0) == corrected
    assert any("keep their bias" in note for note in result.notes) == (not corrected)


CHAINED = """
    agraph (float[1, 8, 12, 12] x) => (float[1, 8, 8, 8] y) {
        c1 = Conv (x, w1, b1)
        r1 = Relu(c1)
        c2 = Conv (r1, w2, b2)
        r2 = Relu(c2)
        c3 = Conv (r2, w3, b3)
        r3 = Relu(c3)
        y = Conv (r3, w4, b4)
    }"""


def test_chained_float_layers_are_corrected_in_waves(tmp_path):
    """Two float layers with a quantized one between them: the second is corrected after the
    first, from its input's mean in the model the first one's correction changed, so the
    output's mean over the calibration samples is the float model's. Measured once for both,
    the second took back the first one's error as well, which its own correction removes."""
    rng = np.random.default_rng(6)
    weights = {}
    for i, (o, k) in enumerate([(8, 3), (8, 1), (8, 3), (8, 1)], start=1):
        w = rng.standard_normal((o, 8, k, k)).astype(np.float32) * 0.2
        w[:, 0, 0, 0] = 1.5  # coarse weight scales: rounding shifts the means
        weights[f"w{i}"], weights[f"b{i}"] = w, np.full(o, 0.1, np.float32)
    proto = parse_model(CHAINED, **weights)
    proto.graph.node[2].name, proto.graph.node[6].name = "second", "last"
    data = rng.uniform(0.0, 2.0, (8, 1, 8, 12, 12)).astype(np.float32)
    np.savez(tmp_path / "c.npz", x=data)
    result = graphopt.optimize(proto, pass_options={
        "quantize": "int8", "calibration": str(tmp_path / "c.npz"), "quant_keep_ends": False,
        "quant_skip": {"second", "last"}})
    assert "QuantizeInt8 kept in float: 2 × named by quant_skip" in result.notes
    out = graphopt.to_onnx(result.model)
    stats = next(r for r in result.log.records if r.name == "QuantizeInt8").stats
    assert stats["bias correction of a float layer"] == 2
    error = np.mean([numerics.run(out, {"x": x})["y"] - numerics.run(proto, {"x": x})["y"]
                     for x in data], axis=(0, 1, 3, 4))
    # 1e-8 of the output's magnitude in waves; 9e-5 measured once for both.
    assert np.abs(error).max() < 1e-6 * np.abs(numerics.run(proto, {"x": data[0]})["y"]).max()


CONV_HEAD = """
    agraph (float[1, 8, S, S] x) => (float[1, 4, S, S] y) {
        c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
        r1 = Relu(c1)
        c2 = Conv <pads = [1, 1, 1, 1]> (r1, w2, b2)
        r2 = Relu(c2)
        y = Conv (r2, w3, b3)
    }"""


@pytest.mark.parametrize("size, corrected", [(12, 1), (2, 0)])
def test_a_float_conv_counts_its_map_positions_as_values(tmp_path, size, corrected):
    # The last Conv stays float (quant_keep_ends) behind the quantized middle one. Its input
    # mean runs over every position of its map: one 12x12 sample gives 144 values per
    # channel, enough (PaddleOCR's detector on 3 images: held-out cosine 0.74 uncorrected,
    # 0.96 corrected); a 2x2 map gives 4, too few.
    rng = np.random.default_rng(2)
    proto = parse_model(CONV_HEAD.replace("S", str(size)),
                        w1=rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2,
                        b1=np.full(8, 0.1, np.float32),
                        w2=rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2,
                        b2=np.full(8, 0.1, np.float32),
                        w3=rng.standard_normal((4, 8, 1, 1)).astype(np.float32),
                        b3=np.zeros(4, np.float32))
    np.savez(tmp_path / "c.npz", x=rng.uniform(0.0, 2.0, (1, 1, 8, size, size))
             .astype(np.float32))
    _assert_corrected(proto, tmp_path / "c.npz", corrected)
