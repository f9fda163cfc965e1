"""QuantizeInt8: QDQ structure on tiny Conv and MatMul models, numerics against float, the int8
kernels onnxruntime picks at load, quant_skip / quant_keep_ends, and calibration errors."""

from __future__ import annotations

import zipfile
from collections import Counter

import numpy as np
import onnx
import onnx.version_converter
import onnxruntime as ort
import pytest
from helpers import IR_VERSION

import graphopt
from graphopt import numerics, zoo
from graphopt.errors import OptionError, PassError
from graphopt.passes.instruments import Instrument
from graphopt.quant.probe import int8_gemm_saturates
from tests.helpers import parse_model, run_cli

CONV = """
    agraph (float[1, 3, 16, 16] x) => (float[1, 8, 16, 16] y) {
        c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
        r1 = Relu(c1)
        c2 = Conv <pads = [1, 1, 1, 1]> (r1, w2, b2)
        r2 = Relu(c2)
        c3 = Conv <pads = [1, 1, 1, 1]> (r2, w3, b3)
        s = Add(c3, r1)
        y = Relu(s)
    }"""
# Cosine to the float outputs the int8 models must keep on these seeded nets.
MIN_COSINE = 0.999


def _conv_model():
    rng = np.random.default_rng(0)

    def w(o, i):
        return (rng.standard_normal((o, i, 3, 3)) * np.sqrt(2 / (9 * i))).astype(np.float32)

    proto = parse_model(CONV, w1=w(8, 3), b1=rng.standard_normal(8).astype(np.float32) * 0.1,
                        w2=w(8, 8), b2=rng.standard_normal(8).astype(np.float32) * 0.1,
                        w3=w(8, 8), b3=rng.standard_normal(8).astype(np.float32) * 0.1)
    for i, node in enumerate(proto.graph.node):
        node.name = f"{node.op_type.lower()}{i}"
    return proto


def _calibration(tmp_path, shape=(1, 3, 16, 16), n=8, name="x"):
    path = tmp_path / "calib.npz"
    np.savez(path, **{name: np.random.default_rng(1).standard_normal((n, *shape))
                      .astype(np.float32)})
    return str(path)


def _int8(proto, **options):
    result = graphopt.optimize(proto, pass_options={"quantize": "int8", **options})
    out = graphopt.to_onnx(result.model)
    onnx.checker.check_model(out)
    return result, out


def _cosine(a, b) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _loaded_ops(proto, tmp_path, level="extended") -> Counter:
    """The ops onnxruntime runs after its load-time fusions, from its optimized model."""
    options = ort.SessionOptions()
    options.graph_optimization_level = numerics.LEVELS[level]
    options.optimized_model_filepath = str(tmp_path / "loaded.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return Counter(n.op_type for n in onnx.load(str(tmp_path / "loaded.onnx")).graph.node)


def test_conv_net_becomes_qdq_that_onnxruntime_runs_as_qlinearconv(tmp_path):
    proto = _conv_model()
    result, out = _int8(proto, calibration=_calibration(tmp_path), quant_keep_ends=False)
    ops = Counter(n.op_type for n in out.graph.node)
    # Activations: x, r1 (folded into c1), r2 (folded into c2), c3, and the Add's output
    # feeds only the graph output, so the Add stays float; every Relu after a quantized op folds.
    assert ops["Conv"] == 3 and ops["Relu"] == 1  # the last Relu writes the graph output
    assert ops["QuantizeLinear"] == 4
    assert result.log.totals()["QuantizeInt8"]["rewrites"]["fold Relu"] == 2
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in out.graph.initializer}
    convs = [n for n in out.graph.node if n.op_type == "Conv"]
    producers = {o: n for n in out.graph.node for o in n.output}
    for conv in convs:
        w_dq, b_dq = producers[conv.input[1]], producers[conv.input[2]]
        assert w_dq.op_type == b_dq.op_type == "DequantizeLinear"
        assert inits[w_dq.input[0]].dtype == np.int8
        assert inits[w_dq.input[1]].shape == (8,)  # per output channel
        assert inits[b_dq.input[0]].dtype == np.int32
        x_scale = inits[producers[producers[conv.input[0]].input[0]].input[1]]
        np.testing.assert_allclose(inits[b_dq.input[1]], x_scale * inits[w_dq.input[1]],
                                   rtol=1e-6)
    feeds = numerics.random_feeds(proto, seed=5)
    expected = numerics.run(proto, feeds)["y"]
    actual = numerics.run(out, feeds)["y"]
    assert _cosine(expected, actual) > MIN_COSINE
    assert np.max(np.abs(expected - actual)) < 0.05 * np.max(np.abs(expected))
    loaded = _loaded_ops(out, tmp_path)
    assert loaded["QLinearConv"] == 3 and loaded["Conv"] == 0


def test_per_tensor_weights_and_symmetric_activations(tmp_path):
    proto = _conv_model()
    _, out = _int8(proto, calibration=_calibration(tmp_path), quant_keep_ends=False,
                   per_channel=False, activation_symmetric=True)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in out.graph.initializer}
    # Symmetric codes as uint8 around 128, the form onnxruntime's CPU kernels run: written as
    # int8, its optimizer converted only some Q/DQ pairs, and a conv with one side of each
    # stayed float (timm regnetx_002: 18 of 44 convs, no faster than FP32).
    qs = [n for n in out.graph.node if n.op_type == "QuantizeLinear"]
    assert qs and all(inits[q.input[2]].dtype == np.uint8 and inits[q.input[2]] == 128
                      for q in qs)
    dqs = [n for n in out.graph.node if n.op_type == "DequantizeLinear"
           and inits.get(n.input[0]) is not None and inits[n.input[0]].dtype == np.int8
           and inits[n.input[0]].ndim == 4]
    assert len(dqs) == 3 and all(inits[d.input[1]].shape == () for d in dqs)
    ops = Counter(n.op_type for n in out.graph.node)
    assert ops["Relu"] == 3  # no folding into a symmetric range
    feeds = numerics.random_feeds(proto, seed=5)
    assert _cosine(numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]) > MIN_COSINE


# Entropy clips the rare large activations on purpose (8 small samples leave a sparse
# histogram), which costs more on a net this small than on a real one.
@pytest.mark.parametrize("method, cosine", [("percentile", 0.995), ("entropy", 0.98),
                                            ("mse", 0.995)])
def test_histogram_methods_run_end_to_end(tmp_path, method, cosine):
    proto = _conv_model()
    _, out = _int8(proto, calibration=_calibration(tmp_path), quant_keep_ends=False,
                   calibration_method=method)
    feeds = numerics.random_feeds(proto, seed=5)
    assert _cosine(numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]) > cosine


SHORTCUT = """
    agraph (float[1, 4, 8, 8] x) => (float[1, 4, 8, 8] y%s) {
        h = Relu(x)
        a = Conv(h, wa, ba)
        d = Conv(x, wd, bd)
        s = Add(a, d)
        r = Relu(s)
        c = Conv(r, wc, bc)
        y = Relu(c)%s
    }"""


def _shortcut_model(shared: bool):
    """A residual block's tail: branch `a` and a projection `d` with 8x its range, added and
    Relu'd; with `shared`, a second Conv reads `d` too. The branch reads x through a Relu, as
    a block's last conv reads its middle: two convs of x itself would merge into one."""
    rng = np.random.default_rng(3)

    def w(scale=1.0):
        return (rng.standard_normal((4, 4, 1, 1)) * 0.5 * scale).astype(np.float32)

    def b():
        return (rng.standard_normal(4) * 0.1).astype(np.float32)

    text = SHORTCUT % ((", float[1, 4, 8, 8] z", "\n        z = Conv(d, we, be)") if shared
                       else ("", ""))
    extra = {"we": w(), "be": b()} if shared else {}
    return parse_model(text, wa=w(), ba=b(), wd=w(8.0), bd=b(), wc=w(), bc=b(), **extra)


def _q_range(out, tensor):
    """The float range the QuantizeLinear of `tensor` covers: [-zp·s, (255 - zp)·s]."""
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in out.graph.initializer}
    q = next(n for n in out.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
    scale, zero = float(inits[q.input[1]]), int(inits[q.input[2]])
    return -zero * scale, (255 - zero) * scale, scale


@pytest.mark.parametrize("shared", [False, True])
def test_add_relu_inputs_are_cut_to_the_range_the_sum_can_show(tmp_path, shared):
    proto = _shortcut_model(shared)
    calib = _calibration(tmp_path, shape=(1, 4, 8, 8))
    # The ranges are checked against the float tensors as they are, not channel-equalized.
    _, out = _int8(proto, calibration=calib, quant_keep_ends=False, quant_equalize=False)
    samples = np.load(calib)["x"]
    probe = onnx.helper.make_model(proto.graph, opset_imports=proto.opset_import,
                                   ir_version=IR_VERSION)
    for name in ("a", "d"):
        probe.graph.output.append(onnx.helper.make_tensor_value_info(
            name, onnx.TensorProto.FLOAT, None))
    runs = [numerics.run(probe, {"x": x}) for x in samples]
    a_hi = max(float(r["a"].max()) for r in runs)
    d_lo, d_hi = (min(float(r["d"].min()) for r in runs), max(float(r["d"].max()) for r in runs))
    lo, hi, scale = _q_range(out, "d")
    assert d_lo < -2 * a_hi  # the projection reaches far below what the branch can lift to 0
    if shared:  # a second reader needs d whole
        assert lo == pytest.approx(d_lo, abs=scale) and hi == pytest.approx(d_hi, abs=scale)
        return
    # Below -max(a) the sum is negative whatever a is, and the Relu zeroes it.
    assert lo == pytest.approx(-a_hi, abs=scale) and hi == pytest.approx(d_hi, abs=scale)
    assert scale < 0.7 * (d_hi - d_lo) / 255
    feeds = numerics.random_feeds(proto, seed=5)
    expected, actual = numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]
    assert _cosine(expected, actual) > MIN_COSINE


def _float_convs(out):
    producers = {o: n for n in out.graph.node for o in n.output}
    return sorted(n.name for n in out.graph.node if n.op_type == "Conv"
                  and producers.get(n.input[1]) is None)


def test_quant_skip_and_keep_ends(tmp_path):
    calibration = _calibration(tmp_path)
    # keep_ends is the default: conv0 reads the graph input; conv4 feeds a residual Add, so it
    # is no last layer (the model has no head).
    _, out = _int8(_conv_model(), calibration=calibration)
    assert _float_convs(out) == ["conv0"]
    _, out = _int8(_conv_model(), calibration=calibration, quant_keep_ends=False,
                   quant_skip={"conv2"})
    assert _float_convs(out) == ["conv2"]
    # Skipping the first layer does not move the ends inwards.
    _, out = _int8(_conv_model(), calibration=calibration, quant_skip={"conv0"})
    assert _float_convs(out) == ["conv0"]
    result, out = _int8(_conv_model(), calibration=calibration, quant_skip={"Conv"})
    assert _float_convs(out) == ["conv0", "conv2", "conv4"]
    assert not any(n.op_type == "QuantizeLinear" for n in out.graph.node)
    assert any("quant_skip" in note for note in result.notes)
    # A name no node has (a typo) is noted with the nearest names.
    result, out = _int8(_conv_model(), calibration=calibration, quant_skip={"conv_2"})
    assert _float_convs(out) == ["conv0"]
    (note,) = [n for n in result.notes if "names nothing in the model" in n]
    assert "'conv_2' (nearest: 'conv2'" in note
    result, _ = _int8(_conv_model(), calibration=calibration, quant_skip={"conv_2", "cnv4"})
    (note,) = [n for n in result.notes if "name nothing in the model" in n]
    assert "'cnv4' (nearest: 'conv4'" in note and "'conv_2' (nearest: 'conv2'" in note
    assert "fused nodes" not in note  # no node of the model had either name
    # An op that is no layer (the residual Add, by name or type) runs on the int8 codes of the
    # layers around it whatever the skip says: that is said, where it had been taken silently.
    for skip in ({"add5"}, {"Add", "conv2"}):
        result, out = _int8(_conv_model(), calibration=calibration, quant_keep_ends=False,
                            quant_skip=skip)
        idle = sorted(skip - {"conv2"})
        (note,) = [n for n in result.notes if "names no layer" in n]
        assert note.startswith(f"QuantizeInt8: quant_skip {idle[0]!r} names no layer it "
                               "quantizes"), note
    result, _ = _int8(_conv_model(), calibration=calibration, quant_skip={"conv2"})
    assert not any("names no layer" in n for n in result.notes), result.notes


def test_a_skipped_layer_stays_float_in_the_om(tmp_path):
    # onnxruntime's WeightBiasQuantization would quantize conv2's float weight itself (per
    # tensor) because it reads a DequantizeLinear output: the .om's session must not run it.
    calibration = _calibration(tmp_path)
    result, out = _int8(_conv_model(), calibration=calibration, quant_keep_ends=False,
                        quant_skip={"conv2"})
    assert _float_convs(out) == ["conv2"]
    path = tmp_path / "model.om"
    graphopt.save(result, path)
    (part,) = graphopt.codegen.load_om(path).manifest["partitions"]
    assert part["disabled_optimizers"] == ["WeightBiasQuantization"]
    x = np.random.default_rng(4).standard_normal((1, 3, 16, 16)).astype(np.float32)

    def run(disabled):
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(out.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"],
                                       disabled_optimizers=disabled)
        return session.run(None, {"x": x})[0]

    float_conv, requantized = run(["WeightBiasQuantization"]), run(None)
    assert np.abs(float_conv - requantized).max() > 1e-4  # the optimizer does change it
    np.testing.assert_allclose(graphopt.load(path).run({"x": x})["y"], float_conv,
                               rtol=1e-5, atol=1e-5)
    # Without a float layer behind dequantized data, nothing is disabled.
    result, _ = _int8(_conv_model(), calibration=calibration)
    graphopt.save(result, path)
    (part,) = graphopt.codegen.load_om(path).manifest["partitions"]
    assert "disabled_optimizers" not in part


CLASSIFIER = """
    agraph (float[1, 3, 16, 16] x) => (float[1, 10] y) {
        n = Sub(x, mean)
        c1 = Conv <pads = [1, 1, 1, 1]> (n, w1)
        r1 = Relu(c1)
        c2 = Conv <pads = [1, 1, 1, 1]> (r1, w2)
        r2 = Relu(c2)
        p = GlobalAveragePool(r2)
        f = Flatten(p)
        g = Gemm <transB = 1> (f, wf, bf)
        y = Softmax(g)
    }"""


def test_keep_ends_keeps_a_classifiers_stem_and_head_float(tmp_path):
    """The stem reads the input through a constant Sub and the FC writes the output through a
    Softmax: both ends; the conv between them quantizes."""
    rng = np.random.default_rng(7)
    proto = parse_model(CLASSIFIER, mean=np.full((1, 3, 1, 1), 0.4, np.float32),
                        w1=rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3,
                        w2=rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2,
                        wf=rng.standard_normal((10, 8)).astype(np.float32) * 0.3,
                        bf=rng.standard_normal(10).astype(np.float32) * 0.1)
    for i, node in enumerate(proto.graph.node):
        node.name = f"{node.op_type.lower()}{i}"
    result, out = _int8(proto, calibration=_calibration(tmp_path))
    assert _float_convs(out) == ["conv1"]
    ops = Counter(n.op_type for n in out.graph.node)
    assert ops["Gemm"] == 1 and ops["Conv"] == 2
    gemm = next(n for n in out.graph.node if n.op_type == "Gemm")
    # The float weight, no DequantizeLinear (scaled by the channel equalization of c2 → Gemm).
    assert gemm.input[1] in {t.name for t in out.graph.initializer}
    # The float head's bias takes back the mean shift of the quantized conv before it.
    assert result.log.totals()["QuantizeInt8"]["rewrites"] == {
        "Conv": 1, "QuantizeLinear": 2, "fold Relu": 1, "bias correction of a float layer": 1,
        "equalized channel region": 2}
    feeds = numerics.random_feeds(proto, seed=5)
    assert _cosine(numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]) > MIN_COSINE
    _, out = _int8(proto, calibration=_calibration(tmp_path), quant_keep_ends=False)
    assert _float_convs(out) == [] and "wf" not in {i for n in out.graph.node for i in n.input}


@pytest.mark.parametrize("activation", ["Relu", "com.microsoft.Gelu", "com.microsoft.FastGelu"])
def test_an_activation_before_the_output_keeps_the_last_layer_an_end(tmp_path, activation):
    """MatMul → Add(b) → activation → output: the MatMul is the last layer whichever activation
    follows (FuseGelu turns Add + Gelu into BiasGelu first), so keep_ends keeps it float."""
    rng = np.random.default_rng(8)
    proto = parse_model(f"""
        agraph (float[2, 16, 32] x, float[32, 32] w1, float[32] s, float[32, 32] w2,
                float[32] b) => (float[2, 16, 32] y) {{
            m1 = MatMul(x, w1)
            n = LayerNormalization <axis = -1> (m1, s)
            m2 = MatMul(n, w2)
            a = Add(m2, b)
            y = {activation}(a)
        }}""", '<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>\n',
        w1=rng.standard_normal((32, 32)).astype(np.float32) * 0.2,
        s=np.ones(32, np.float32), w2=rng.standard_normal((32, 32)).astype(np.float32) * 0.2,
        b=rng.standard_normal(32).astype(np.float32) * 0.1)
    result, out = _int8(proto, calibration=_calibration(tmp_path, (2, 16, 32)))
    assert "DynamicQuantizeMatMul" not in {n.op_type for n in out.graph.node}
    assert any("2 × a first or last layer (reads a graph input or writes a graph output; "
               "quant_keep_ends=False quantizes it)" in note for note in result.notes), result.notes


def test_keep_ends_quantizes_an_encoder_whole_and_keeps_an_lm_head_float(tmp_path):
    """BERT's GEMMs read and write normalized hidden states: none is an end. GPT-2's vocabulary
    projection writes the logits: it stays float."""
    bert = zoo.build("bert_base", layers=2, hidden=64, heads=2, intermediate=128, vocab=100)
    gpt2 = zoo.build("gpt2_small", layers=1, hidden=64, heads=2, vocab=100, positions=32)
    # Four DynamicQuantizeMatMuls a layer: the packed QKV, the output projection, FFN in and out.
    for proto, output, dynamic, matmuls in ((bert, "last_hidden_state", 8, 0),
                                            (gpt2, "logits", 4, 1)):
        feeds = zoo.sample_inputs(proto, seed=0, dims={"sequence_length": 16})
        path = tmp_path / "c.npz"
        np.savez(path, **{k: v[None] for k, v in feeds.items()})
        shapes = {k: list(v.shape) for k, v in feeds.items()}
        result = graphopt.optimize(proto, input_shapes=shapes, pass_options={
            "quantize": "int8", "calibration": str(path)})
        out = graphopt.to_onnx(result.model)
        ops = Counter(n.op_type for n in out.graph.node)
        assert (ops["DynamicQuantizeMatMul"], ops["MatMul"]) == (dynamic, matmuls), output
        if matmuls:
            head = next(n for n in out.graph.node if n.op_type == "MatMul")
            assert head.output[0] == output
        expected, actual = numerics.run(proto, feeds)[output], numerics.run(out, feeds)[output]
        assert _cosine(expected, actual) > 0.995, output


MATMUL = """
    agraph (float[2, 16, 32] x) => (float[2, 16, 32] y) {
        m1 = MatMul(x, w1)
        a1 = Add(m1, b1)
        g = Relu(a1)
        m2 = MatMul(g, w2)
        y = Add(b2, m2)
    }"""


def _matmul_model():
    rng = np.random.default_rng(2)
    return parse_model(MATMUL, w1=rng.standard_normal((32, 64)).astype(np.float32) * 0.2,
                       b1=rng.standard_normal(64).astype(np.float32) * 0.1,
                       w2=rng.standard_normal((64, 32)).astype(np.float32) * 0.2,
                       b2=rng.standard_normal(32).astype(np.float32) * 0.1)


def test_matmuls_become_dynamic_quantize_matmul_with_their_bias(tmp_path):
    proto = _matmul_model()
    result, out = _int8(proto, calibration=_calibration(tmp_path, (2, 16, 32)),
                        quant_keep_ends=False)
    nodes = [n for n in out.graph.node if n.op_type == "DynamicQuantizeMatMul"]
    assert len(nodes) == 2 and all(len(n.input) == 5 for n in nodes)  # bias folded in
    assert not any(n.op_type in ("MatMul", "Add") for n in out.graph.node)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in out.graph.initializer}
    assert inits[nodes[0].input[1]].dtype == np.int8
    # Per column, unless onnxruntime's int8 GEMM saturates on this CPU (probe.py): then one
    # scale per tensor, and the compile says so.
    saturates = int8_gemm_saturates()
    assert inits[nodes[0].input[2]].shape == (() if saturates else (64,))
    assert any("saturates" in note for note in result.notes) == saturates
    feeds = numerics.random_feeds(proto, seed=3)
    expected, actual = numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]
    # One activation scale per run for the whole [2,16,32] tensor, with K of only 32 and 64 to
    # average rounding over: looser than the conv net (BERT keeps ~0.9999, bench/precision.py).
    assert _cosine(expected, actual) > 0.995
    assert _loaded_ops(out, tmp_path)["DynamicQuantizeMatMul"] == 2


def test_an_add_skipped_between_dynamic_layers_is_said_to_run_in_float(tmp_path):
    # Between DynamicQuantizeMatMuls, whose outputs are float, an Add runs in float already:
    # the note had said it runs on their int8 codes.
    result, _ = _int8(_matmul_model(), calibration=_calibration(tmp_path, (2, 16, 32)),
                      quant_keep_ends=False, quant_skip={"Add", "Relu"})
    (note,) = [n for n in result.notes if "names no layer" in n]
    assert note.endswith("it runs in float already, between layers quantized dynamically, "
                         "whose outputs are float"), note


@pytest.mark.parametrize("activation,plain", [("BiasGelu", "Gelu"), ("FastGelu", "FastGelu")])
def test_a_biased_gelu_hands_its_bias_to_the_dynamic_matmul(tmp_path, activation, plain):
    """MatMul → BiasGelu(·, b): the bias goes into DynamicQuantizeMatMul's bias input and a
    plain Gelu stays, as for an Add (onnxruntime's CPU BiasGelu is slower than its Gelu)."""
    rng = np.random.default_rng(5)
    proto = parse_model(f"""
        agraph (float[2, 16, 32] x, float[32, 64] w, float[64] b) => (float[2, 16, 64] y) {{
            m = MatMul(x, w)
            y = com.microsoft.{activation}(m, b)
        }}""", '<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>\n',
        w=rng.standard_normal((32, 64)).astype(np.float32) * 0.2,
        b=rng.standard_normal(64).astype(np.float32) * 0.1)
    _, out = _int8(proto, calibration=_calibration(tmp_path, (2, 16, 32)),
                   quant_keep_ends=False)
    (matmul,) = [n for n in out.graph.node if n.op_type == "DynamicQuantizeMatMul"]
    (act,) = [n for n in out.graph.node if n.op_type == plain]
    assert len(matmul.input) == 5 and matmul.input[4] == "b"  # the bias folded in
    assert list(act.input) == [matmul.output[0]] and act.output[0] == "y"
    assert "BiasGelu" not in {n.op_type for n in out.graph.node}
    feeds = numerics.random_feeds(proto, seed=3)
    expected, actual = numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]
    assert _cosine(expected, actual) > 0.995


def test_attention_packs_its_qkv_gemm_into_dynamic_int8(tmp_path):
    proto = zoo.build("bert_base", layers=1, hidden=64, heads=2, intermediate=128, vocab=100)
    feeds = zoo.sample_inputs(proto, seed=0, dims={"sequence_length": 32})
    path = tmp_path / "c.npz"
    np.savez(path, **{k: v[None] for k, v in feeds.items()})
    result = graphopt.optimize(proto, input_shapes={"input_ids": [1, 32],
                                                    "attention_mask": [1, 32]},
                               pass_options={"quantize": "int8", "calibration": str(path),
                                             "quant_keep_ends": False})
    out = graphopt.to_onnx(result.model)
    ops = Counter(n.op_type for n in out.graph.node)
    assert ops["MultiHeadAttention"] == 1 and ops["Attention"] == 0
    assert ops["DynamicQuantizeMatMul"] == 4  # QKV, output projection, FFN in and out
    expected = numerics.run(proto, feeds)["last_hidden_state"]
    actual = numerics.run(out, feeds)["last_hidden_state"]
    assert _cosine(expected, actual) > MIN_COSINE
    # quant_skip takes the contrib op as graphopt's messages spell it, or bare.
    for spelling in ("com.microsoft::Attention", "Attention"):
        skipped = graphopt.optimize(proto, input_shapes={"input_ids": [1, 32],
                                                         "attention_mask": [1, 32]},
                                    pass_options={"quantize": "int8", "calibration": str(path),
                                                  "quant_keep_ends": False,
                                                  "quant_skip": {spelling}})
        ops = Counter(n.op_type for n in skipped.model.graph)
        assert ops["Attention"] == 1 and ops["DynamicQuantizeMatMul"] == 3, spelling
        assert not any("matches nothing" in note for note in skipped.notes), spelling


def test_int8_needs_calibration_that_fits(tmp_path):
    with pytest.raises(OptionError, match="calibration"):
        graphopt.optimize(_conv_model(), pass_options={"quantize": "int8"})
    path = tmp_path / "wrong.npz"
    np.savez(path, image=np.zeros((2, 1, 3, 16, 16), np.float32))
    # Read before any pass runs: the calibration's own message, not a failed pass's.
    with pytest.raises(OptionError, match=r"^calibration \S*wrong.npz: no array for model "
                                          r"input 'x'"):
        graphopt.optimize(_conv_model(), pass_options={"quantize": "int8",
                                                       "calibration": str(path)})
    with pytest.raises((OptionError, PassError), match="calibration_method|calibration-method"):
        graphopt.optimize(_conv_model(), pass_options={
            "quantize": "int8", "calibration": _calibration(tmp_path),
            "calibration_method": "kl"})


@pytest.mark.parametrize("target", ["cpu", "ascend310"])
@pytest.mark.parametrize("precision", ["fp16", "mixed-fp16"])
def test_int8_with_a_half_precision_mode_keeps_the_int8_layers(tmp_path, precision, target):
    # ATC's pairing of an AMCT model with a half precision mode: refused before (the precision
    # mode ran first and left int8 no float32 layer). QuantizeInt8 runs first now, and the
    # precision mode converts what it left float, keeping its int8 layers, AMCT's (no
    # QuantizeLinear after them) too.
    proto = _conv_model()
    result = graphopt.optimize(proto, precision=precision, quantize="int8", target=target,
                               calibration=_calibration(tmp_path),
                               pass_options={"quant_keep_ends": False})
    compiled = result.to_onnx()
    onnx.checker.check_model(compiled)
    convs = [n for n in compiled.graph.node if n.op_type in ("Conv", "FusedConv")]
    assert len(convs) == 3 and all(
        any(p.op_type == "DequantizeLinear" for p in compiled.graph.node if p.output[0] == i)
        for n in convs for i in n.input[:2]), [n.op_type for n in compiled.graph.node]
    assert any("kept the int8 layers of quantize='int8'" in note for note in result.notes)
    x = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)
    expected = numerics.run(proto, {"x": x})["y"]
    assert _cosine(numerics.run(compiled, {"x": x}, "all")["y"], expected) >= MIN_COSINE


@pytest.mark.parametrize("percentile", ["30", "0.5", "101"])
def test_cli_refuses_a_percentile_the_pass_would_refuse(tmp_path, capsys, percentile):
    # One range for the flag and the pass: (50, 100], named as the flag.
    src = tmp_path / "m.onnx"
    onnx.save(_conv_model(), src)
    rc, _, err = run_cli(capsys, "optimize", src, "-o", tmp_path / "q.onnx", "--quantize", "int8",
                         "--calibration", _calibration(tmp_path), "--calibration-method",
                         "percentile", "--calibration-percentile", percentile)
    assert rc == 2  # a value the flag does not take, as argparse's own refusals
    assert err.strip() == (f"graphopt: error: --calibration-percentile {float(percentile)}: must "
                           "be in (50, 100] (99.999 clips the top 0.001% of each tensor)")
    assert not (tmp_path / "q.onnx").exists()


def test_a_percentile_without_the_percentile_method_is_refused(tmp_path, capsys):
    # minmax ranges ignore it: the compile was byte for byte the one without the flag.
    src = tmp_path / "m.onnx"
    onnx.save(_conv_model(), src)
    rc, _, err = run_cli(capsys, "optimize", src, "-o", tmp_path / "q.onnx", "--quantize", "int8",
                         "--calibration", _calibration(tmp_path), "--calibration-percentile", "99")
    assert rc == 1 and "--calibration-percentile applies to --calibration-method percentile " \
        "(the ranges here come from minmax)" in err


@pytest.mark.parametrize("flags, message", [
    (["--quantize", "int8", "--disable-pass", "QuantizeInt8"],
     "--quantize int8 needs the QuantizeInt8 pass, which --disable-pass or a switch file"),
    (["--precision", "fp16", "--disable-pass", "ConvertPrecision"],
     "--precision fp16 needs the ConvertPrecision pass"),
    (["--quantize", "int4", "--switch-file", "SWITCH"],
     "--quantize int4 needs the QuantizeInt4Weights pass"),
])
def test_a_precision_asked_for_with_its_pass_switched_off_is_refused(tmp_path, capsys, flags,
                                                                      message):
    # The compile used to stay float32 under a header naming the pass.
    src = tmp_path / "m.onnx"
    onnx.save(_conv_model(), src)
    switch = tmp_path / "switch.txt"
    switch.write_text("QuantizeInt4Weights: off\n")
    flags = [str(switch) if f == "SWITCH" else f for f in flags]
    if "int8" in flags:
        flags += ["--calibration", _calibration(tmp_path)]
    rc, _, err = run_cli(capsys, "optimize", src, "-o", tmp_path / "q.onnx", *flags)
    assert rc == 1 and message in err


def test_one_calibration_set_serves_every_batch_profile(tmp_path):
    # --dynamic-dims "N:1,2": each profile pins N and checks the data against it; batch-1
    # samples are stacked two at a time for the N=2 profile.
    proto = _conv_model()
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    proto.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "N"
    result = graphopt.optimize(proto, target="cpu", dynamic_dims="N:1,2", pass_options={
        "quantize": "int8", "calibration": _calibration(tmp_path, shape=(3, 16, 16), n=5)})
    assert [p.result.log.totals()["QuantizeInt8"]["rewrites"]["Conv"] for p in result.profiles] \
        == [2, 2]  # the stem conv stays float (quant_keep_ends)
    path = tmp_path / "q.om"
    graphopt.save(result, path)
    session = graphopt.load(path)
    for batch in (1, 2):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 16, 16)).astype(np.float32)
        want = numerics.run(proto, {"x": x})["y"]
        assert _cosine(session.run({"x": x})["y"], want) > MIN_COSINE


def test_profiles_the_calibration_data_does_not_fit_take_the_ranges_of_one_it_fits(tmp_path):
    # Calibrated at 16x16, compiled for 24x24, 16x16 and 32x32: AMCT calibrates once, at one
    # shape, and ATC compiles every dynamic dim with those scales.
    proto = _conv_model()
    for value in (proto.graph.input[0], proto.graph.output[0]):
        dims = value.type.tensor_type.shape.dim
        dims[2].dim_param, dims[3].dim_param = "H", "W"
    result = graphopt.optimize(proto, target="cpu", dynamic_dims="H=24,W=24;H=16,W=16;H=32,W=32",
                               pass_options={"quantize": "int8",
                                             "calibration": _calibration(tmp_path, n=4)})
    assert ("QuantizeInt8: the calibration data fits profile profile1 (H=16, W=16), not "
            "profile0 (H=24, W=24), profile2 (H=32, W=32): they take the activation ranges "
            "measured there") in result.notes

    def constants(profile):  # every scale, zero point and corrected bias, by name
        return {name: v.constant() for name, v in profile.result.model.graph.initializers.items()
                if v.dtype != onnx.TensorProto.INT8}

    first, second, third = (constants(p) for p in result.profiles)
    assert first.keys() == second.keys() == third.keys()
    for name, value in second.items():  # the same ranges, and the float head's bias correction
        np.testing.assert_array_equal(first[name], value, err_msg=name)
        np.testing.assert_array_equal(third[name], value, err_msg=name)
    path = tmp_path / "q.om"
    graphopt.save(result, path)
    session = graphopt.load(path)
    for size in (16, 24, 32):
        x = np.random.default_rng(size).standard_normal((1, 3, size, size)).astype(np.float32)
        assert _cosine(session.run({"x": x})["y"], numerics.run(proto, {"x": x})["y"]) \
            > MIN_COSINE


def test_compare_judges_an_om_of_an_int8_onnx_by_cosine(tmp_path, capsys):
    # The .om's own compile quantized nothing; the .onnx it came from says it is lossy.
    model = tmp_path / "conv.onnx"
    onnx.save(_conv_model(), model)
    rc, _, err = run_cli(capsys, "optimize", model, "-o", tmp_path / "q.onnx", "--quantize",
                         "int8", "--calibration", _calibration(tmp_path), "-q")
    assert rc == 0, err
    rc, _, err = run_cli(capsys, "optimize", tmp_path / "q.onnx", "-o", tmp_path / "q.om", "-q")
    assert rc == 0, err
    assert graphopt.codegen.load_om(tmp_path / "q.om").extra["lossy_passes"] == ["QuantizeInt8"]
    rc, out, err = run_cli(capsys, "compare", tmp_path / "q.onnx", tmp_path / "q.om")
    assert "rule:      cosine >= 0.999" in out and rc == 0, out + err


def test_the_command_line_names_the_flag_that_quantizes_the_ends(tmp_path, capsys):
    model = tmp_path / "conv.onnx"
    onnx.save(_conv_model(), model)
    rc, out, err = run_cli(capsys, "optimize", model, "-o", tmp_path / "q.onnx", "--quantize",
                           "int8", "--calibration", _calibration(tmp_path), "--quant-skip", "conv2",
                           "--no-accuracy-report")
    assert rc == 0, err
    assert "QuantizeInt8 kept in float: 1 × a first or last layer (reads a graph input or " \
           "writes a graph output; --quantize-ends quantizes it); 1 × named by --quant-skip" \
           in out, out


def test_quantize_none_and_precision_none_mean_the_defaults():
    result = graphopt.optimize(_conv_model(), quantize=None, precision=None)
    assert "QuantizeInt8" not in result.log.totals()
    assert "ConvertPrecision" not in result.log.totals()


@pytest.mark.parametrize("text, why", [
    ("""g (float16[1,3,8,8] x) => (y) { y = Conv <pads = [1,1,1,1]> (x, w) }""",
     "1 × Conv of float16 data (int8 quantizes float32 layers)"),
    ("""g (float[1,3,4,8,8] x) => (y) { y = Conv <pads = [1,1,1,1,1,1]> (x, w) }""",
     "1 × 3-D Conv (graphopt quantizes 1-D and 2-D convs)"),
    # Left float with no word, beside the counted 3-D Conv.
    ("""g (float[1,3,8,8] x) => (y) { y = ConvTranspose (x, w) }""",
     "1 × ConvTranspose (graphopt's int8 quantizes Conv, Gemm and MatMul)"),
], ids=["float16", "conv3d", "convtranspose"])
def test_layers_no_form_can_quantize_are_named_in_a_note(tmp_path, text, why):
    rng = np.random.default_rng(2)
    rank = 5 if "1,3,4" in text else 4
    dtype = np.float16 if "float16" in text else np.float32
    channels = (3, 4) if "ConvTranspose" in text else (4, 3)  # its weight is [C_in, C_out…]
    w = rng.standard_normal(channels + (3,) * (rank - 2)).astype(dtype)
    proto = parse_model(text, w=w)
    shape = (1, 3, 4, 8, 8) if rank == 5 else (1, 3, 8, 8)
    calibration = tmp_path / "c.npz"
    np.savez(calibration, x=rng.standard_normal((2, *shape)).astype(dtype))
    result = graphopt.optimize(proto, pass_options={"quantize": "int8", "calibration": calibration,
                                                    "quant_keep_ends": False})
    assert f"QuantizeInt8 kept in float: {why}" in result.notes


def test_a_conv_whose_weight_folding_left_computed_is_named(tmp_path):
    # The light models' ConstantOfShape weights above --fold-size-limit: their convs stayed
    # float, and the note counted none of them, so the model looked quantized.
    proto = parse_model("""
        g (float[1,8,8,8] x) => (y) {
            w = ConstantOfShape <value = float[1] {0.01}> (shape)
            h = Conv <pads = [1,1,1,1]> (x, w)
            y = Relu(h)
        }""", shape=np.array([8, 8, 3, 3], np.int64))
    calibration = _calibration(tmp_path, shape=(1, 8, 8, 8))
    options = {"quant_keep_ends": False, "fold_size_limit": 1024}
    result = graphopt.optimize(proto, quantize="int8", calibration=calibration,
                               pass_options=options)
    assert "QuantizeInt8 kept in float: 1 × Conv whose weight is computed at run time from " \
           "constants (FoldConstants, from -O2 on, folds such constants but those larger than " \
           "fold_size_limit or of an op it cannot evaluate)" in result.notes, result.notes
    folded = graphopt.optimize(proto, quantize="int8", calibration=calibration,
                               pass_options={"quant_keep_ends": False})
    assert not [note for note in folded.notes if "kept in float" in note], folded.notes


@pytest.mark.parametrize("bias, level, why", [
    # A dynamo export's biases reach its convs through Expand and CastLike, which -O1 does not
    # fold: QuantizeInt8 made no rewrite and its note named none of the 11 float convs.
    ("b = Expand(b0, shape)", 1, "constants (FoldConstants, from -O2 on"),
    # At -O0 that CastLike still reads an activation (for its type): the convs stayed float,
    # and the note named none of them.
    ("c = CastLike(b0, a)\n b = Expand(c, shape)", 0, "the data (from -O1 on"),
])
def test_a_conv_whose_bias_is_computed_at_run_time_is_named(bias, level, why, tmp_path):
    proto = parse_model(f"""
        g (float[1,8,8,8] x) => (y) {{
            a = Relu(x)
            {bias}
            h = Conv <pads = [1,1,1,1]> (a, w, b)
            y = Relu(h)
        }}""", w=np.full((8, 8, 3, 3), 0.01, np.float32), b0=np.ones(1, np.float32),
        shape=np.array([8], np.int64))
    calibration = _calibration(tmp_path, shape=(1, 8, 8, 8))
    options = {"quant_keep_ends": False}
    result = graphopt.optimize(proto, level=level, quantize="int8", calibration=calibration,
                               pass_options=options)
    assert "QuantizeInt8 kept in float: 1 × Conv whose bias is computed at run time from " \
           f"{why}" in " ".join(result.notes), result.notes
    quantized = graphopt.optimize(proto, quantize="int8", calibration=calibration,
                                  pass_options=options)
    assert not [note for note in quantized.notes if "kept in float" in note], quantized.notes


def test_a_missing_calibration_file_is_called_missing(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(_conv_model(), src)
    rc, _, err = run_cli(capsys, "optimize", src, "-o", tmp_path / "q.onnx", "--quantize", "int8",
                         "--calibration", tmp_path / "nonexist.npz")
    assert rc == 1 and f"--calibration {tmp_path / 'nonexist.npz'}: no such file or directory" \
        in err, err
    assert not (tmp_path / "q.onnx").exists()


def test_range_options_that_dynamic_layers_ignore_are_named(tmp_path, capsys):
    # A BERT's MatMuls are all dynamic: --calibration-method and --activation-symmetric were
    # taken without a word, while a stray --calibration-percentile is refused.
    proto = parse_model("g (float[1,4,32] x) => (y) { h = MatMul(x, w) y = Relu(h) }",
                        w=np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32))
    src = tmp_path / "m.onnx"
    onnx.save(proto, src)
    calibration = _calibration(tmp_path, shape=(1, 4, 32))
    argv = ("optimize", src, "-o", tmp_path / "q.onnx", "--quantize", "int8", "--calibration",
            calibration, "--quantize-ends", "--no-accuracy-report")
    rc, out, err = run_cli(capsys, *argv, "--calibration-method", "entropy",
                           "--activation-symmetric")
    assert rc == 0, err
    assert "QuantizeInt8: --calibration-method entropy and --activation-symmetric change " \
           "nothing here: every layer it quantized is a dynamic MatMul" in out, out
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 0 and "change nothing" not in out and "changes nothing" not in out


def test_accuracy_report_runs_the_profile_the_calibration_data_fits(tmp_path, capsys):
    proto = _conv_model()
    for value in (proto.graph.input[0], proto.graph.output[0]):
        value.type.tensor_type.shape.dim[2].dim_param = "H"
    model = tmp_path / "conv.onnx"
    onnx.save(proto, model)
    rc, out, err = run_cli(capsys, "optimize", model, "-o", tmp_path / "q.om", "--quantize",
                           "int8", "--calibration", _calibration(tmp_path, n=2),
                           "--dynamic-dims", "H:24,16")
    assert rc == 0, err
    assert "no accuracy report" not in err
    assert "accuracy vs" in out and "[1,8,16,16]" in out.split("accuracy vs")[1]


def test_profiles_no_calibration_sample_fits_are_refused_naming_the_first(tmp_path):
    proto = _conv_model()
    for value in (proto.graph.input[0], proto.graph.output[0]):
        value.type.tensor_type.shape.dim[2].dim_param = "H"
    with pytest.raises(OptionError, match=r"^the calibration data fits none of the 2 shape "
                                          r"profiles \(profile0 \(H=24\), profile1 \(H=32\)\); "
                                          r"shape profile profile0 \(H=24\): calibration .*"
                                          r"sample has shape \[1, 3, 16, 16\]"):
        graphopt.optimize(proto, target="cpu", dynamic_dims="H:24,32", pass_options={
            "quantize": "int8", "calibration": _calibration(tmp_path, n=2)})


@pytest.mark.parametrize("options", [{"quantize": "int8"}, {"precision": "fp16"}],
                         ids=["dynamic-int8", "fp16"])
def test_profiles_no_calibration_sample_fits_are_refused_where_no_pass_needs_ranges(
        tmp_path, options):
    # A MatMul quantizes dynamically and fp16 reads the data for its report only: no pass
    # asked for statistics, so data that fit no profile compiled, without a report.
    proto = parse_model("g (float[1, S, 8] x) => (float[1, S, 4] y) { y = MatMul (x, w) }",
                        w=np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32))
    calibration = _calibration(tmp_path, shape=(1, 5, 8), n=2)
    with pytest.raises(OptionError, match=r"^the calibration data fits none of the 2 shape "
                                          r"profiles \(profile0 \(S=2\), profile1 \(S=3\)\); "
                                          r"shape profile profile0 \(S=2\): calibration "):
        graphopt.optimize(proto, target="cpu", dynamic_dims="S:2,3",
                          pass_options={**options, "calibration": calibration})
    graphopt.optimize(proto, target="cpu", dynamic_dims="S:2,5",
                      pass_options={**options, "calibration": calibration})


@pytest.mark.parametrize("options", [{"quantize": "int8"}, {"precision": "fp16"}],
                         ids=["dynamic-int8", "fp16"])
def test_data_that_fits_no_profile_is_refused_by_the_profile_it_came_closest_to(
        tmp_path, options):
    # Decode samples (ids [1, 1]) of a model of one KV head with two in `past`: refused by the
    # prefill profile for its ids, where the decode profile names the real fault.
    proto = parse_model("""
    g (float[1, S] ids, float[1, 2, P, 4] past) => (float[1, S] y, float[1, 2, P, 4] z) {
        y = Relu(ids)
        z = Relu(past)
    }""")
    folder = tmp_path / "cal"
    folder.mkdir()
    np.savez(folder / "decode.npz", ids=np.ones((1, 1), np.float32),
             past=np.ones((1, 3, 4, 4), np.float32))
    with pytest.raises(OptionError, match=r"shape profile profile1 \(S=1, P=4\): calibration "
                                          r".*decode.npz: input 'past' sample has shape "
                                          r"\[1, 3, 4, 4\]; the model expects \[1,2,4,4\]$"):
        graphopt.optimize(proto, target="cpu", dynamic_dims="S=4,P=0;S=1,P=4",
                          pass_options={**options, "calibration": str(folder)})


def test_a_heavy_head_kept_float_is_named_with_its_share_of_the_work(tmp_path):
    # GPT-2's head did 39% of its multiply-adds: kept float by default, its int8 compile ran
    # 1.46x over float32 where quantize_dynamic's ran 1.99x, and nothing said why.
    rng = np.random.default_rng(0)
    proto = parse_model("""
    g (float[1, 4, 16] x) => (float[1, 4, 64] y) {
        h = MatMul(x, w1)
        r = Relu(h)
        g = MatMul(r, w2)
        y = MatMul(g, head)
    }""", w1=rng.standard_normal((16, 16)).astype(np.float32),
        w2=rng.standard_normal((16, 16)).astype(np.float32),
        head=rng.standard_normal((16, 64)).astype(np.float32))
    notes = _int8(proto, calibration=_calibration(tmp_path, shape=(1, 4, 16)))[0].notes
    (note,) = [n for n in notes if "first and last layers kept in float do" in n]
    assert "do 83% of the multiply-adds of the float layers it could quantize; quant_keep_ends=False" in note
    # Quantized, they are named no more
    notes = _int8(proto, calibration=_calibration(tmp_path, shape=(1, 4, 16)),
                  quant_keep_ends=False)[0].notes
    assert not any("first and last layers kept in float do" in n for n in notes), notes


class _PassesRun(Instrument):
    def __init__(self):
        self.started, self.names = False, []

    def start(self, model):
        self.started = True

    def after_pass(self, model, record, log):
        self.names.append(record.name)


@pytest.mark.parametrize("model, arrays, message", [
    # No static layer: the pass itself never reads the data, the compile still checks it.
    ("matmul", {"banana": np.zeros((2, 5), np.float32)}, "no array for model input 'x'"),
    ("matmul", {"x": np.zeros((3, 2, 16, 64), np.float32)},
     r"input 'x' sample has shape \[2, 16, 64\]; the model expects \[2,16,32\]"),
    ("conv", {"x": np.full((2, 1, 3, 16, 16), np.nan, np.float32)},
     "input 'x' holds only NaN or Inf"),
    ("conv", {"x": np.r_[np.zeros((1, 1, 3, 16, 16)), np.full((1, 1, 3, 16, 16), 1e39)]},
     "input 'x' sample 1 holds values beyond float32"),
])
def test_calibration_data_is_checked_before_any_pass_runs(tmp_path, model, arrays, message):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    proto = _matmul_model() if model == "matmul" else _conv_model()
    ran = _PassesRun()
    with pytest.raises(OptionError, match=message) as info:
        graphopt.optimize(proto, instruments=[ran], pass_options={
            "quantize": "int8", "calibration": str(path)})
    assert str(info.value).startswith(f"calibration {path}: ")
    assert not ran.started and ran.names == []


@pytest.mark.parametrize("imputed", [True, False])
def test_missing_values_in_the_calibration_data_are_data(tmp_path, imputed):
    """NaN inputs an imputer fills (Where(IsNaN(x), 0, x)) calibrate the layers after it, as
    onnxruntime runs the model on such data; where the NaN reaches a quantized tensor, the
    compile says which and that its range covers the finite values."""
    rng = np.random.default_rng(2)
    proto = parse_model("""
        agraph (float[1, 3, 16, 16] x) => (float[1, 8, 16, 16] y) {
            nan = IsNaN(x)
            f = Where(nan, zero, x)
            c1 = Conv <pads = [1, 1, 1, 1]> (FILLED, w1, b1)
            r1 = Relu(c1)
            c2 = Conv <pads = [1, 1, 1, 1]> (r1, w2, b2)
            y = Relu(c2)
        }""".replace("FILLED", "f" if imputed else "x"), zero=np.float32(0),
        w1=rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3,
        b1=rng.standard_normal(8).astype(np.float32) * 0.1,
        w2=rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2,
        b2=rng.standard_normal(8).astype(np.float32) * 0.1)
    samples = rng.standard_normal((6, 1, 3, 16, 16)).astype(np.float32)
    samples[rng.random(samples.shape) < 0.05] = np.nan
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=samples)
    result, out = _int8(proto, calibration=str(calib), quant_keep_ends=False)
    assert Counter(n.op_type for n in out.graph.node)["QuantizeLinear"] >= 2
    noted = [n for n in result.notes if "held NaN or Inf" in n]
    if imputed:
        assert not noted, noted
        feeds = {"x": samples[0]}
        cos = _cosine(numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"])
        assert cos > MIN_COSINE
    else:
        assert noted and "'x' (6 of 6)" in noted[0], result.notes


@pytest.mark.parametrize("varied", [False, True])
def test_calibration_data_of_one_value_are_named(tmp_path, varied):
    # An all-zero calibration set compiled without a word: every range a point, and the
    # accuracy report, measured on that same data, read cosine 0.999999.
    rng = np.random.default_rng(4)
    proto = parse_model("""
        agraph (float[1, 3, 8, 8] x) => (float[1, 8, 8, 8] y) {
            c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
            y = Relu(c)
        }""", w=rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
        b=rng.standard_normal(8).astype(np.float32))
    samples = rng.standard_normal((4, 1, 3, 8, 8)).astype(np.float32) if varied \
        else np.zeros((4, 1, 3, 8, 8), np.float32)
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=samples)
    result, _ = _int8(proto, calibration=str(calib), quant_keep_ends=False)
    noted = [n for n in result.notes if "calibration data hold one value" in n]
    assert bool(noted) is not varied, result.notes
    if noted:
        assert "input(s) 'x' (every value 0)" in noted[0]


def test_a_tensor_the_float_model_makes_nan_is_refused_naming_it(tmp_path):
    """Finite inputs, but the float model computes NaN (sqrt(-1 - |x|)) for a tensor to be
    quantized: an error naming the data and the tensor, not stats' ValueError."""
    proto = parse_model("""
        agraph (float[1, 3, 16, 16] x) => (float[1, 8, 16, 16] y) {
            a = Abs(x)
            m = Sub(minus_one, a)
            n = Sqrt(m)
            c = Conv <pads = [1, 1, 1, 1]> (n, w)
            y = Relu(c)
        }""", w=np.ones((8, 3, 3, 3), np.float32), minus_one=np.float32(-1.0))
    nan = r"calibration \S+: the float model's tensor '[nc]' has no finite range"
    with pytest.raises((OptionError, PassError), match=nan) as info:
        graphopt.optimize(proto, level=1, pass_options={
            "quantize": "int8", "calibration": _calibration(tmp_path), "quant_keep_ends": False})
    assert "ValueError" not in str(info.value)


@pytest.mark.parametrize("samples, noted", [(4, True), (8, False)])
def test_ranges_from_few_calibration_samples_are_noted(tmp_path, samples, noted):
    result, _ = _int8(_conv_model(), calibration=_calibration(tmp_path, n=samples),
                      quant_keep_ends=False)
    few = [n for n in result.notes if "the activation ranges come from" in n]
    assert bool(few) == noted, result.notes
    if noted:
        assert f"come from {samples} calibration sample(s)" in few[0]


def test_a_fixed_batch_counts_the_samples_its_feeds_hold(tmp_path):
    # 32 images for a model fixed at batch 8: four feeds, 32 samples, no note.
    proto = _conv_model()
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 8
    proto.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 8
    result, _ = _int8(proto, calibration=_calibration(tmp_path, n=32), quant_keep_ends=False)
    assert not [n for n in result.notes if "the activation ranges come from" in n], result.notes
    result, _ = _int8(proto, calibration=_calibration(tmp_path, n=4), quant_keep_ends=False)
    assert [n for n in result.notes if "come from 4 calibration sample(s)" in n], result.notes


def test_a_state_input_of_fixed_first_dim_is_no_batch_of_samples(tmp_path):
    # silero-vad's state is [2, 1, 128]: its 2 is no batch, so 4 samples stay 4.
    from graphopt.quant.calib_data import InputSpec, read_calibration

    path = tmp_path / "c.npz"
    np.savez(path, x=np.ones((4, 1, 8), np.float32), state=np.zeros((4, 2, 1, 4), np.float32))
    specs = [InputSpec("x", np.dtype(np.float32), (1, 8)),
             InputSpec("state", np.dtype(np.float32), (2, 1, 4))]
    assert read_calibration(path, specs).samples == 4


def test_om_for_the_cpu_runs_int8_with_nchwc_left_to_float_convs(tmp_path):
    proto = _conv_model()
    result = graphopt.optimize(proto, target="cpu", pass_options={
        "quantize": "int8", "calibration": _calibration(tmp_path)})
    ops = Counter(n.qualified_op for n in result.model.graph)
    # keep_ends: conv0 reads the input, stays float and LayoutNchwc blocks it; conv2 and conv4
    # stay QDQ.
    assert ops["Conv"] == 2 and ops["com.microsoft.nchwc::Conv"] == 1
    graphopt.save(result, tmp_path / "m.om")
    session = graphopt.load(str(tmp_path / "m.om"))
    feeds = numerics.random_feeds(proto, seed=5)
    expected = numerics.run(proto, feeds)["y"]
    actual = session.run(feeds)["y"]
    assert _cosine(expected, actual) > MIN_COSINE


def test_maxpool_after_a_folded_relu_shares_its_input_range(tmp_path):
    rng = np.random.default_rng(4)
    proto = parse_model("""
        agraph (float[1, 3, 16, 16] x) => (float[1, 4, 8, 8] y) {
            c = Conv <pads = [1, 1, 1, 1]> (x, w1)
            r = Relu(c)
            p = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (r)
            c2 = Conv <pads = [1, 1, 1, 1]> (p, w2)
            y = Relu(c2)
        }""", w1=rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3,
        w2=rng.standard_normal((4, 4, 3, 3)).astype(np.float32) * 0.3)
    _, out = _int8(proto, calibration=_calibration(tmp_path), quant_keep_ends=False)
    producers = {o: n for n in out.graph.node for o in n.output}
    pool = next(n for n in out.graph.node if n.op_type == "MaxPool")
    dq_in = producers[pool.input[0]]
    (q_out,) = [n for n in out.graph.node if n.op_type == "QuantizeLinear"
                and n.input[0] == pool.output[0]]
    assert dq_in.op_type == "DequantizeLinear"
    assert list(dq_in.input[1:]) == list(q_out.input[1:])  # same scale and zero point
    feeds = numerics.random_feeds(proto, seed=5)
    assert _cosine(numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]) > MIN_COSINE


def test_maxpool_behind_a_float_conv_stays_float(tmp_path):
    """keep_ends keeps the stem conv float: its MaxPool runs float (blocked NCHWc on the CPU
    target) and the Q follows the pool, instead of a uint8 MaxPool on a generic NCHW kernel."""
    rng = np.random.default_rng(4)
    proto = parse_model("""
        agraph (float[1, 3, 16, 16] x) => (float[1, 16, 8, 8] y) {
            c = Conv <pads = [1, 1, 1, 1]> (x, w1)
            r = Relu(c)
            p = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (r)
            c2 = Conv <pads = [1, 1, 1, 1]> (p, w2)
            r2 = Relu(c2)
            c3 = Conv <pads = [1, 1, 1, 1]> (r2, w3)
            y = Relu(c3)
        }""", w1=rng.standard_normal((16, 3, 3, 3)).astype(np.float32) * 0.3,  # 16: one block
        w2=rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.1,   # of 8 or of 16
        w3=rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.1)
    _, out = _int8(proto, calibration=_calibration(tmp_path))
    producers = {o: n for n in out.graph.node for o in n.output}
    pool = next(n for n in out.graph.node if n.op_type == "MaxPool")
    assert producers[pool.input[0]].op_type == "Relu"
    assert [n.op_type for n in out.graph.node if pool.output[0] in n.input] == ["QuantizeLinear"]
    result = graphopt.optimize(proto, target="cpu", pass_options={
        "quantize": "int8", "calibration": _calibration(tmp_path)})
    blocked = Counter(n.qualified_op for n in result.model.graph)
    assert blocked["com.microsoft.nchwc::MaxPool"] == 1 and blocked["Conv"] == 1  # c2 stays QDQ


def test_a_float_first_layer_hands_its_codes_to_the_int8_trunk_channels_last(tmp_path):
    """BlazeFace's shape: the float stem's output is read by a depthwise int8 conv and by the
    residual Add. onnxruntime runs int8 convs in NHWC and cancels the Transposes around them
    only where one reaches the stem: with its codes written NCHW behind the blocked stem conv,
    a Transpose pair stayed around every int8 conv and the MaxPool ran on uint8 in NCHW."""
    rng = np.random.default_rng(3)

    def w(o, i, k=3):
        return (rng.standard_normal((o, i, k, k)) * np.sqrt(2 / (k * k * i))).astype(np.float32)

    proto = parse_model("""
        agraph (float[1, 3, 32, 32] x) => (float[1, 16, 8, 8] y) {
            c0 = Conv <pads = [1, 1, 1, 1], strides = [2, 2]> (x, w0)
            r0 = Relu(c0)
            d1 = Conv <pads = [1, 1, 1, 1], group = 16> (r0, dw1)
            p1 = Conv (d1, pw1)
            a1 = Add(p1, r0)
            r1 = Relu(a1)
            m = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (r1)
            d2 = Conv <pads = [1, 1, 1, 1], group = 16> (m, dw2)
            p2 = Conv (d2, pw2)
            a2 = Add(p2, m)
            r2 = Relu(a2)
            y = Conv (r2, head)
        }""", w0=w(16, 3), dw1=w(16, 1), pw1=w(16, 16, 1), dw2=w(16, 1), pw2=w(16, 16, 1),
        head=w(16, 16, 1))
    calibration = _calibration(tmp_path, shape=(1, 3, 32, 32))
    result = graphopt.optimize(proto, target="cpu", pass_options={
        "quantize": "int8", "calibration": calibration})
    (layout,) = [r for r in result.log.to_json()["passes"] if r["pass"] == "LayoutNchwc"]
    assert layout["rewrites"]["ReorderOutput to NHWC before QuantizeLinear"] == 1
    graphopt.save(result, tmp_path / "m.om")
    (member,) = [n for n in zipfile.ZipFile(tmp_path / "m.om").namelist()
                 if n.startswith("partitions/")]
    partition = onnx.load_from_string(zipfile.ZipFile(tmp_path / "m.om").read(member))
    loaded = Counter(n.op_type for n in numerics.optimized_by_onnxruntime(partition, "all")
                     .graph.node)
    assert loaded["QLinearConv"] == 4 and loaded["Transpose"] <= 2, loaded  # in, out
    assert loaded["MaxPool"] == 0 and loaded["NhwcMaxPool"] == 1, loaded
    feeds = numerics.random_feeds(proto, seed=5)
    expected = numerics.run(proto, feeds)["y"]
    assert _cosine(expected, graphopt.load(str(tmp_path / "m.om")).run(feeds)["y"]) > MIN_COSINE


CHANNEL_PADDING = """
    agraph (float[1, 3, 8, 8] x) => (float[1, 8, 8, 8] y) {
        c1 = Conv <pads = [1, 1, 1, 1]> (x, w1)
        r1 = Relu(c1)
        p = Pad <mode = "MODE"> (r1, pads, fill)
        c2 = Conv <pads = [1, 1, 1, 1]> (r1, w2)
        s = Add(c2, p)
        c3 = Conv <pads = [1, 1, 1, 1]> (s, w3)
        y = Relu(c3)
    }"""


@pytest.mark.parametrize("mode, fill, on_codes", [("constant", 0.0, True),
                                                  ("reflect", 0.0, True),
                                                  ("constant", 0.5, False)])
def test_a_pad_of_zeros_runs_on_the_codes(tmp_path, mode, fill, on_codes):
    # BlazeFace pads the channels of its skip path with zeros; onnxruntime keeps the Q/DQ
    # around a Pad and runs it in float between them (11 Pads of 1.1 ms). Zeros are the zero
    # point's code, and a reflected edge is codes already; a fill of 0.5 is neither.
    rng = np.random.default_rng(6)
    pads = [0, 0, 0, 0, 0, 4, 0, 0] if mode == "constant" else [0, 0, 1, 1, 0, 0, 1, 1]
    text = CHANNEL_PADDING.replace("MODE", mode)
    if mode == "reflect":
        text = text.replace("float[1, 3, 8, 8] x) => (float[1, 8, 8, 8] y",
                            "float[1, 3, 8, 8] x) => (float[1, 4, 10, 10] y")
        text = text.replace("c2 = Conv <pads = [1, 1, 1, 1]> (r1, w2)",
                            "c2 = Conv <pads = [2, 2, 2, 2]> (r1, w2)")
    channels = 8 if mode == "constant" else 4
    proto = parse_model(text, w1=rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3,
                        w2=rng.standard_normal((channels, 4, 3, 3)).astype(np.float32) * 0.2,
                        w3=rng.standard_normal((channels, channels, 3, 3)).astype(np.float32)
                        * 0.2, pads=np.array(pads, np.int64), fill=np.array(fill, np.float32))
    if mode == "reflect":  # reflect takes no fill
        proto = parse_model(text.replace("(r1, pads, fill)", "(r1, pads)"), **{
            t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer
            if t.name != "fill"})
    result, out = _int8(proto, calibration=_calibration(tmp_path, shape=(1, 3, 8, 8)),
                        quant_keep_ends=False)
    producers = {o: n for n in out.graph.node for o in n.output}
    pad = next(n for n in out.graph.node if n.op_type == "Pad")
    stats = result.log.totals()["QuantizeInt8"]["rewrites"]
    if on_codes:
        assert producers[pad.input[0]].op_type == "QuantizeLinear" and stats["Pad on codes"] == 1
        readers = [n.op_type for n in out.graph.node if pad.output[0] in n.input]
        assert readers == ["DequantizeLinear"]
        if mode == "constant":  # it fills with the zero point, the code of 0
            assert pad.input[2] == producers[pad.input[0]].input[2]
        assert _loaded_ops(out, tmp_path)["QuantizeLinear"] == 1  # the input's alone
    else:
        assert producers[pad.input[0]].op_type == "DequantizeLinear"
        assert "Pad on codes" not in stats
    feeds = numerics.random_feeds(proto, seed=5)
    assert _cosine(numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]) > MIN_COSINE


def test_fused_conv_at_o3_is_quantized_as_conv(tmp_path):
    proto = _conv_model()
    result = graphopt.optimize(proto, level=3, pass_options={
        "quantize": "int8", "calibration": _calibration(tmp_path), "quant_keep_ends": False})
    out = graphopt.to_onnx(result.model)
    ops = Counter(n.op_type for n in out.graph.node)
    assert ops["FusedConv"] == 0 and ops["Conv"] == 3
    feeds = numerics.random_feeds(proto, seed=5)
    assert _cosine(numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]) > MIN_COSINE
    assert _loaded_ops(out, tmp_path)["QLinearConv"] == 3


def test_a_matmul_of_untyped_data_stays_float_with_a_note(tmp_path):
    """ONNX shape inference types no contrib op, and InferShapes carries types only past those
    it knows (SAME_AS_INPUT and a few more): a MatMul reading another one's output cannot be
    checked for float32 data, and the note says so."""
    rng = np.random.default_rng(9)
    proto = parse_model("""
        agraph (float[2, 16, 32] x, float[32, 32] w1, float[1] axis, float[32, 32] w2)
                => (float[2, 1, 16, 32] y) {
            m = MatMul(x, w1)
            e = com.microsoft.ExpandDims(m, axis)
            y = MatMul(e, w2)
        }""", '<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>\n',
        w1=rng.standard_normal((32, 32)).astype(np.float32) * 0.2,
        axis=np.array(1, np.int32), w2=rng.standard_normal((32, 32)).astype(np.float32) * 0.2)
    result, out = _int8(proto, calibration=_calibration(tmp_path, (2, 16, 32)),
                        quant_keep_ends=False)
    assert [n.op_type for n in out.graph.node].count("MatMul") == 1
    assert any("1 × MatMul of data of unknown type" in note for note in result.notes), \
        result.notes


def test_layers_after_contrib_activations_are_typed_and_quantized(tmp_path):
    """InferShapes carries types past BiasGelu (onnxruntime's fused models are full of such
    ops), so the MatMuls after it quantize like the first."""
    rng = np.random.default_rng(9)
    proto = parse_model("""
        agraph (float[2, 16, 32] x, float[32, 32] w1, float[32] b, float[32, 32] w2,
                float[32, 32] w3) => (float[2, 16, 32] y) {
            m = MatMul(x, w1)
            g = com.microsoft.BiasGelu(m, b)
            m2 = MatMul(g, w2)
            r = Relu(m2)
            y = MatMul(r, w3)
        }""", '<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>\n',
        w1=rng.standard_normal((32, 32)).astype(np.float32) * 0.2, b=np.zeros(32, np.float32),
        w2=rng.standard_normal((32, 32)).astype(np.float32) * 0.2,
        w3=rng.standard_normal((32, 32)).astype(np.float32) * 0.2)
    result, out = _int8(proto, calibration=_calibration(tmp_path, (2, 16, 32)),
                        quant_keep_ends=False)
    assert [n.op_type for n in out.graph.node].count("DynamicQuantizeMatMul") == 3
    # Nothing is left float for want of a type; a CPU without VNNI adds its saturation note.
    assert not [note for note in result.notes if "saturates" not in note]
    feeds = numerics.random_feeds(proto, seed=3)
    assert _cosine(numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]) > 0.995


def test_a_model_before_opset_13_the_converter_refuses_stays_float_with_a_note(tmp_path,
                                                                             monkeypatch):
    def refused(*args):
        raise RuntimeError("no adapter")

    monkeypatch.setattr(onnx.version_converter, "convert_version", refused)
    rng = np.random.default_rng(6)
    proto = parse_model("""
        agraph (float[1, 3, 16, 16] x) => (float[1, 8, 16, 16] y) {
            c = Conv <pads = [1, 1, 1, 1]> (x, w)
            y = Relu(c)
        }""", header='<ir_version: 6, opset_import: ["" : 11]>\n',
        w=rng.standard_normal((8, 3, 3, 3)).astype(np.float32))
    result, out = _int8(proto, calibration=_calibration(tmp_path), quant_keep_ends=False)
    assert not any(n.op_type == "QuantizeLinear" for n in out.graph.node)
    assert any("QuantizeInt8 quantized nothing: the model imports ONNX opset 11" in note
               for note in result.notes)


def test_the_calibration_file_is_read_once_per_compile(tmp_path, monkeypatch):
    # Checked before the passes, then handed to QuantizeInt8 and its bias correction: a single
    # .npz of samples is loaded whole, three times before.
    from graphopt.quant import calib_data

    loads = []
    real = calib_data._load
    monkeypatch.setattr(calib_data, "_load", lambda file: loads.append(file) or real(file))
    result, _ = _int8(_conv_model(), calibration=_calibration(tmp_path))
    assert result.log.totals()["QuantizeInt8"]["rewrites"]["Conv"] == 2
    assert len(loads) == 1


def test_a_skipped_layer_stays_float_in_every_shape_profile(tmp_path):
    # The profiles of a compile for no target are portable partitions too: each must still
    # keep onnxruntime's WeightBiasQuantization away from the float layer.
    proto = _conv_model()
    for value in (*proto.graph.input, *proto.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "N"
    result = graphopt.optimize(proto, dynamic_dims="N:1,2", pass_options={
        "quantize": "int8", "calibration": _calibration(tmp_path), "quant_keep_ends": False,
        "quant_skip": {"conv2"}})
    path = tmp_path / "profiles.om"
    graphopt.save(result, path)
    artifact = graphopt.codegen.load_om(path)
    parts = artifact.manifest["partitions"]
    assert len(parts) == 2
    assert all(p["disabled_optimizers"] == ["WeightBiasQuantization"] for p in parts)


GEMM = """
    agraph (float[1, 512] x) => (float[1, 64] y) {
        h = Relu(x)
        y = Gemm <transB = 1> (h, w, b)
    }"""


def _gemm_model():
    # Uniform weights, as an untrained PyTorch Linear has: half of them past ±64 once quantized.
    rng = np.random.default_rng(0)
    return parse_model(GEMM, w=rng.uniform(-0.05, 0.05, (64, 512)).astype(np.float32),
                       b=np.zeros(64, np.float32))


def _weight_bounds(out) -> dict[str, int]:
    """The largest |int8 weight| each Gemm or Conv of `out` reads, by node name."""
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in out.graph.initializer}
    producers = {o: n for n in out.graph.node for o in n.output}
    return {n.name: int(np.abs(inits[producers[n.input[1]].input[0]].astype(np.int32)).max())
            for n in out.graph.node if n.op_type in ("Gemm", "Conv")}


@pytest.mark.parametrize("saturates", [True, False])
def test_layers_whose_codes_sit_high_get_weights_no_pair_can_saturate(tmp_path, monkeypatch,
                                                                      saturates):
    # Where onnxruntime's int8 GEMM adds pairs of products in 16 bits (probe.py), a layer whose
    # input codes sit high gets ±63 weights: symmetric activations (code + 128 in the kernel),
    # or a graph input of mid-range zero point; a Relu's output (zero point 0) keeps ±127.
    monkeypatch.setattr("graphopt.quant.int8.int8_gemm_saturates", lambda: saturates)
    narrow = 63 if saturates else 127
    calibration = _calibration(tmp_path, (1, 512))
    result, out = _int8(_gemm_model(), calibration=calibration, quant_keep_ends=False,
                        activation_symmetric=True)
    assert list(_weight_bounds(out).values()) == [narrow]
    assert any("get weights in ±63" in note for note in result.notes) == saturates
    _, out = _int8(_gemm_model(), calibration=calibration, quant_keep_ends=False)
    assert list(_weight_bounds(out).values()) == [127]
    _, out = _int8(_conv_model(), calibration=_calibration(tmp_path), quant_keep_ends=False)
    assert _weight_bounds(out) == {"conv0": narrow, "conv2": 127, "conv4": 127}


@pytest.mark.skipif(not int8_gemm_saturates(),
                    reason="onnxruntime's int8 GEMM does not saturate on this CPU (VNNI)")
def test_symmetric_int8_keeps_its_accuracy_in_onnxruntimes_int8_kernels(tmp_path):
    # At ORT_ENABLE_ALL the QDQ Gemm runs as QGemm; with ±127 weights its pair sums saturated
    # and the cosine fell to 0.990 where float simulation (ORT_DISABLE_ALL) showed 0.99996.
    proto = _gemm_model()
    _, out = _int8(proto, calibration=_calibration(tmp_path, (1, 512)), quant_keep_ends=False,
                   activation_symmetric=True)
    feeds = numerics.random_feeds(proto, seed=4)
    expected = numerics.run(proto, feeds)["y"]
    assert _cosine(expected, numerics.run(out, feeds, "all")["y"]) > MIN_COSINE


def _streaming_block(tail: str, opset: int = 21, outputs: str = "float[1, 16] present"):
    """A streaming conv block at `opset`: the state Concat feeds a quantized Conv, and `tail`
    takes the state out of it for the outputs after y (`outputs`). The model, and the seeded
    generator its weights came from."""
    rng = np.random.default_rng(0)
    proto = parse_model(f"""
        g (float[1, 4, 16] x, float[1, 8, 2] state) => (float[1, 8, 16] y, {outputs}) {{
            h = Conv (x, w1)
            p = Concat <axis = 2> (state, h)
            c2 = Conv (p, w2)
            r = Relu (c2)
            y = Conv (r, w3)
            {tail}
        }}""", header=f'<ir_version: 10, opset_import: ["" : {opset}]>\n',
        w1=(rng.standard_normal((8, 4, 1)) * 0.5).astype(np.float32),
        w2=(rng.standard_normal((8, 8, 3)) * 0.3).astype(np.float32),
        w3=(rng.standard_normal((8, 8, 1)) * 0.3).astype(np.float32),
        st=np.array([16], np.int64), en=np.array([18], np.int64), ax=np.array([2], np.int64),
        shp=np.array([1, 16], np.int64), idx=np.array([16, 17], np.int64))
    return proto, rng


def _quantized_om(proto, rng, path):
    """`proto` quantized on 8 seeded samples (symmetric activations, cpu target) and saved at
    `path`; the calibration file, and one seeded input to run."""
    calibration = path.parent / "calib.npz"
    np.savez(calibration, x=rng.standard_normal((8, 1, 4, 16)).astype(np.float32),
             state=rng.standard_normal((8, 1, 8, 2)).astype(np.float32))
    result = graphopt.optimize(proto, target="cpu", pass_options={
        "quantize": "int8", "calibration": str(calibration), "activation_symmetric": True})
    graphopt.save(result, path)
    feeds = {"x": rng.standard_normal((1, 4, 16)).astype(np.float32),
             "state": rng.standard_normal((1, 8, 2)).astype(np.float32)}
    return calibration, feeds


@pytest.mark.parametrize("opset", [17, 21])
def test_a_symmetric_int8_om_at_opset_21_loads_with_a_quantized_value_sliced_out(tmp_path,
                                                                                 opset):
    # A streaming conv block: the state Concat feeds a quantized Conv, and a Slice of it is a
    # graph output. onnxruntime's QDQPropagationTransformer copied the Q/DQ past the Slice with
    # output_dtype INT8, QDQS8ToU8Transformer then made the zero point uint8, and the .om was
    # refused at load ("output_dtype INT8 does not match y_zero_point type UINT8").
    proto, rng = _streaming_block("present = Slice (p, st, en, ax)", opset,
                                  "float[1, 8, 2] present")
    path = tmp_path / "s.om"
    calibration, feeds = _quantized_om(proto, rng, path)
    expected = numerics.run(proto, feeds)
    with graphopt.load(path) as session:
        actual = session.run(feeds)
    assert _cosine(expected["y"], actual["y"]) > 0.99
    # The state slices the float Concat, not its dequantized copy: exact, and nothing for
    # onnxruntime to propagate a Q/DQ pair past, so the portable .onnx loads at its full
    # level too (it had loaded only with the optimizer at "basic" or below).
    np.testing.assert_array_equal(actual["present"], expected["present"])
    portable = graphopt.optimize(proto, pass_options={
        "quantize": "int8", "calibration": str(calibration), "activation_symmetric": True})
    run = numerics.run(portable.to_onnx(), feeds, "all")
    np.testing.assert_array_equal(run["present"], expected["present"])
    assert _cosine(expected["y"], run["y"]) > 0.99


def test_a_value_a_branch_also_reads_keeps_its_float_reader_there(tmp_path):
    # r1 feeds a quantized Conv and is read inside an If branch: the branch keeps reading the
    # float value (a DequantizeLinear inserted in the branch made a cycle).
    rng = np.random.default_rng(4)
    proto = parse_model("""
        g (float[1, 4, 8, 8] x, bool c) => (float[1, 4, 8, 8] y, float[1, 4, 8, 8] z) {
            c1 = Conv <pads = [1, 1, 1, 1]> (x, w1)
            r1 = Relu(c1)
            c2 = Conv <pads = [1, 1, 1, 1]> (r1, w2)
            r2 = Relu(c2)
            y = Conv <pads = [1, 1, 1, 1]> (r2, w3)
            z = If (c) <then_branch = t () => (float[1, 4, 8, 8] a) { a = Neg(r1) },
                        else_branch = e () => (float[1, 4, 8, 8] b) { b = Identity(r1) }>
        }""", **{name: (rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32)
                 for name in ("w1", "w2", "w3")})
    calibration = tmp_path / "x.npz"
    np.savez(calibration, x=rng.standard_normal((8, 1, 4, 8, 8)).astype(np.float32),
             c=np.ones((8,), bool))
    result = graphopt.optimize(proto, quantize="int8", calibration=calibration,
                               pass_options={"quant_keep_ends": False})
    model = result.to_onnx()
    onnx.checker.check_model(model, full_check=True)
    assert any(n.op_type == "QuantizeLinear" for n in model.graph.node)
    feeds = {"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32), "c": np.array(True)}
    expected, actual = numerics.run(proto, feeds), numerics.run(model, feeds)
    for name in ("y", "z"):
        a, b = expected[name].ravel().astype(np.float64), actual[name].ravel().astype(np.float64)
        assert a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) > 0.999, name
    branch = next(n for n in model.graph.node if n.op_type == "If").attribute[0].g
    relu = next(n for n in model.graph.node if n.op_type == "Relu")
    assert [n.input for n in branch.node] == [[relu.output[0]]]  # the float value itself


def test_a_gemm_the_int8_form_cannot_take_is_named_in_a_note(tmp_path):
    rng = np.random.default_rng(0)
    proto = parse_model("""
        g (float[4, 32] x) => (float[4, 16] y) {
            h = Gemm <alpha = 0.5> (x, w, c)
            y = Relu(h)
        }""", w=(rng.standard_normal((32, 16)) * 0.2).astype(np.float32),
        c=(rng.standard_normal(16) * 0.1).astype(np.float32))
    calibration = tmp_path / "x.npz"
    np.savez(calibration, x=rng.standard_normal((8, 4, 32)).astype(np.float32))
    result = graphopt.optimize(proto, quantize="int8", calibration=calibration,
                               pass_options={"quant_keep_ends": False})
    assert "QuantizeInt8 kept in float: 1 × Gemm with alpha or beta other than 1" in result.notes


def test_a_layer_whose_output_feeds_a_log_stays_float(tmp_path):
    # A log-mel front end: the filterbank MatMul of a power spectrum spanning decades, then
    # log(· + ε). One int8 scale for the loud bins rounded the quiet ones, and the Log made
    # that rounding as large as the loud bins (onnx-asr's NeMo front end at cosine 0.87); the
    # layer after the Log quantizes as before.
    rng = np.random.default_rng(0)
    proto = parse_model("""
        g (float[1, 50, 64] power) => (float[1, 50, 16] y) {
            mel = MatMul(power, filters)
            floor = Add(mel, eps)
            logs = Log(floor)
            h = MatMul(logs, w)
            y = Relu(h)
        }""", filters=np.abs(rng.standard_normal((64, 16))).astype(np.float32) * 0.1,
        eps=np.array(1e-6, np.float32), w=rng.standard_normal((16, 16)).astype(np.float32))
    calibration = tmp_path / "power.npz"
    spectrum = 10.0 ** rng.uniform(-6, 3, (8, 1, 50, 64))  # quiet and loud bins
    np.savez(calibration, power=spectrum.astype(np.float32))
    result = graphopt.optimize(proto, quantize="int8", calibration=calibration,
                               pass_options={"quant_keep_ends": False})
    assert "QuantizeInt8 kept in float: 1 × its output feeds a Log, which makes the rounding " \
        "of its small values large" in result.notes, result.notes
    mels = [n for n in result.model.graph if n.op_type == "MatMul"
            and n.inputs[1].name == "filters"]
    assert len(mels) == 1 and mels[0].inputs[0].name == "power"  # read as float, no Q/DQ
    assert result.log.totals()["QuantizeInt8"]["rewrites"]["MatMul"] == 1  # the second one


@pytest.mark.parametrize("target", [None, "ascend310"])
def test_a_matmul_with_its_weight_first_or_3d_is_named_not_called_missing(tmp_path, target):
    # Both stayed float under "the model has no Conv, Gemm or MatMul with a constant weight".
    rng = np.random.default_rng(0)
    first = parse_model("g (float[1, 4, 16] x) => (float[1, 8, 16] y) { y = MatMul(w, x) }",
                        w=rng.standard_normal((8, 4)).astype(np.float32))
    batched = parse_model("g (float[1, 4, 16] x) => (float[1, 4, 8] y) { y = MatMul(x, w) }",
                          w=rng.standard_normal((1, 16, 8)).astype(np.float32))
    calibration = _calibration(tmp_path, shape=(1, 4, 16))
    for proto, why in ((first, "MatMul whose constant is its first operand"),
                       (batched, "MatMul with a 3-D weight")):
        result = graphopt.optimize(proto, quantize="int8", calibration=calibration, target=target,
                                   pass_options={"quant_keep_ends": False})
        assert not any("quantized nothing" in note for note in result.notes), result.notes
        assert any(note.startswith(f"QuantizeInt8 kept in float: 1 × {why}")
                   for note in result.notes), result.notes


def test_a_model_quantized_already_is_not_quantized_again(tmp_path):
    # The model's own Q/DQ (scale 0.05) sits between c1's Relu and c2.
    proto = _conv_model()
    scale = onnx.numpy_helper.from_array(np.array(0.05, np.float32), "s_own")
    zero = onnx.numpy_helper.from_array(np.array(0, np.uint8), "z_own")
    proto.graph.initializer.extend([scale, zero])
    nodes = list(proto.graph.node)
    (c2,) = [n for n in nodes if n.name == "conv2"]
    c2.input[0] = "r1_own"
    at = nodes.index(c2)
    nodes[at:at] = [onnx.helper.make_node("QuantizeLinear", ["r1", "s_own", "z_own"], ["r1_q"]),
                    onnx.helper.make_node("DequantizeLinear", ["r1_q", "s_own", "z_own"],
                                          ["r1_own"])]
    proto.graph.ClearField("node")
    proto.graph.node.extend(nodes)
    proto.graph.node[-2].input[1] = "c2"  # s = Add(c3, c2): r1's only reader is the model's Q
    result, out = _int8(proto, calibration=_calibration(tmp_path), quant_keep_ends=False)
    chain, value = [], "r1_own"
    producers = {o: n for n in out.graph.node for o in n.output}
    while value in producers and producers[value].op_type in ("QuantizeLinear",
                                                              "DequantizeLinear"):
        chain.append(producers[value].input[1])
        value = producers[value].input[0]
    assert chain == ["s_own", "s_own"]  # one pair, the model's: no second pair of graphopt's
    assert any("1 × already quantized" in note for note in result.notes), result.notes


def test_a_model_of_integer_ops_says_why_nothing_was_quantized(tmp_path):
    from onnxruntime.quantization import quantize_dynamic

    source = tmp_path / "float.onnx"
    onnx.save(_conv_model(), source)
    quantize_dynamic(str(source), str(tmp_path / "dynamic.onnx"))
    result, _ = _int8(onnx.load(tmp_path / "dynamic.onnx"), calibration=_calibration(tmp_path))
    assert any("already an integer op (ConvInteger)" in note for note in result.notes)


def test_a_qdq_model_from_quantize_static_is_named_quantized_already(tmp_path):
    # onnxruntime's quantize_static puts each weight behind a DequantizeLinear: the note had
    # said "the model has no Conv, Gemm or MatMul with a constant weight".
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.samples = iter([{"x": x} for x in np.load(_calibration(tmp_path))["x"]])

        def get_next(self):
            return next(self.samples, None)

    source = tmp_path / "float.onnx"
    onnx.save(_conv_model(), source)
    quantize_static(str(source), str(tmp_path / "qdq.onnx"), Reader())
    result, _ = _int8(onnx.load(tmp_path / "qdq.onnx"), calibration=_calibration(tmp_path))
    assert any("already quantized (its weight comes from the model's own DequantizeLinear)"
               in note for note in result.notes), result.notes
    assert not any("quantized nothing" in note for note in result.notes), result.notes


@pytest.mark.parametrize("per_channel", [True, False])
def test_a_bias_too_large_for_int32_at_a_tiny_input_scale_keeps_its_value(tmp_path, per_channel):
    # Activations near 1e-9 give a bias scale near 1e-13: a bias of 0.5 clipped to int32's
    # range lost its value (torchvision's DeepLabV3 head at random init output all zeros).
    # The weight scale widens until the bias fits.
    rng = np.random.default_rng(0)
    proto = parse_model("""
        agraph (float[1, 3, 16, 16] x) => (float[1, 8, 16, 16] y) {
            c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
            m = Mul(c1, tiny)
            c2 = Conv (m, w2, b2)
            y = Conv (c2, w3, b3)
        }""", w1=rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3,
        b1=rng.standard_normal(8).astype(np.float32) * 0.1, tiny=np.array(1e-9, np.float32),
        w2=rng.standard_normal((8, 8, 1, 1)).astype(np.float32) * 0.3,
        b2=np.full(8, 0.5, np.float32),
        w3=rng.standard_normal((8, 8, 1, 1)).astype(np.float32) * 0.3,
        b3=rng.standard_normal(8).astype(np.float32) * 0.1)
    _, out = _int8(proto, calibration=_calibration(tmp_path), quant_keep_ends=False,
                   per_channel=per_channel)
    biases = {i.name: onnx.numpy_helper.to_array(i) for i in out.graph.initializer
              if i.data_type == onnx.TensorProto.INT32}
    assert "b2_quantized" in biases  # the layer is quantized, its bias with it
    assert np.abs(biases["b2_quantized"]).max() < np.iinfo(np.int32).max
    feeds = {"x": np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)}
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = ort.InferenceSession(proto.SerializeToString(), options,
                                    providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    actual = ort.InferenceSession(out.SerializeToString(), options,
                                  providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert _cosine(actual, expected) > 0.9999


def test_calibration_takes_a_string_input_as_numpys_strings(tmp_path):
    # np.savez writes a string input as '<U' (an object array needs pickle, which graphopt
    # does not load): calibrating skl2onnx's pipelines with a categorical column was refused.
    rng = np.random.default_rng(0)
    proto = parse_model("""
        agraph (float[N, 8] x, string[N, 1] s) => (float[N, 4] y, string[N, 1] t) {
            y = Gemm(x, w, b)
            t = Identity(s)
        }""", w=rng.standard_normal((8, 4)).astype(np.float32),
        b=rng.standard_normal(4).astype(np.float32))
    np.savez(tmp_path / "c.npz", x=rng.standard_normal((4, 2, 8)).astype(np.float32),
             s=np.array([[["a"], ["bc"]]] * 4))
    _, out = _int8(proto, calibration=str(tmp_path / "c.npz"), quant_keep_ends=False)
    assert any(n.op_type == "DequantizeLinear" for n in out.graph.node)


def test_an_old_opset_is_converted_where_there_is_a_layer_to_quantize(tmp_path, monkeypatch):
    # PaddleOCR exports at opset 11: QuantizeInt8 quantized nothing. ONNX's version converter
    # takes the model to 13, rewriting the ops redefined there (Unsqueeze's axes, Softmax).
    rng = np.random.default_rng(0)
    header = '<ir_version: 7, opset_import: ["" : 11]>\n'
    conv = parse_model("""
    agraph (float[1, 3, 8, 8] x) => (float[1, 4, 64] y) {
      c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
      r = Relu(c)
      f = Flatten <axis = 2> (r)
      u = Unsqueeze <axes = [0]> (f)
      y = Softmax <axis = 1> (u)
    }""", header=header, w=rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
                       b=rng.standard_normal(4).astype(np.float32))
    calibration = _calibration(tmp_path, shape=(1, 3, 8, 8))
    result, out = _int8(conv, calibration=calibration, quant_keep_ends=False)
    assert "QuantizeInt8: the model imports ONNX opset 11; converted to 13 by ONNX's version " \
           "converter, which int8's form needs" in result.notes, result.notes
    assert {o.version for o in out.opset_import if o.domain in ("", "ai.onnx")} == {13}
    assert any(n.op_type == "DequantizeLinear" for n in out.graph.node)
    # Converted alone, the model computes what it did: Softmax over axis 1 at opset 11 is
    # over everything past it, at 13 over that axis alone.
    from graphopt.ir import load_onnx, to_onnx
    from graphopt.passes import Options
    from graphopt.quant.opset_upgrade import int8_ready

    converted = to_onnx(int8_ready(load_onnx(conv), Options(quantize="int8"))[0])
    for sample in rng.standard_normal((4, 1, 3, 8, 8)).astype(np.float32):
        expected = numerics.run(conv, {"x": sample})["y"]
        np.testing.assert_allclose(numerics.run(converted, {"x": sample})["y"], expected,
                                   rtol=1e-5, atol=1e-7)
        assert _cosine(numerics.run(out, {"x": sample})["y"], expected) > 0.99
    # A lone tree ensemble at opset 9 (skl2onnx's default for it) has nothing to quantize.
    relu = parse_model("agraph (float[2, 4] x) => (float[2, 4] y) { y = Relu(x) }",
                       header='<ir_version: 7, opset_import: ["" : 9]>\n')
    gemm = parse_model("agraph (float[2, 4] x) => (float[2, 3] y) { y = Gemm(x, w, b) }",
                       header='<ir_version: 7, opset_import: ["" : 9]>\n',
                       w=np.ones((4, 3), np.float32), b=np.zeros(3, np.float32))
    calibration = _calibration(tmp_path, shape=(2, 4))

    def refused(*args):
        raise RuntimeError("no adapter")

    monkeypatch.setattr(onnx.version_converter, "convert_version", refused)
    notes = [" ".join(graphopt.optimize(p, pass_options={"quantize": "int8",
                                                         "calibration": calibration}).notes)
             for p in (relu, gemm)]
    assert "opset" not in notes[0]
    assert "QuantizeInt8 quantized nothing: the model imports ONNX opset 9, and its int8 form " \
           "needs 13 (per-channel DequantizeLinear, Split's sizes as an input), per-tensor " \
           "too" in notes[1], notes[1]
    assert "QuantizeInt8: ONNX's version converter cannot take the model from opset 9 to 13 " \
           "(no adapter)" in notes[1], notes[1]


@pytest.mark.parametrize("axis, converts", [(1, False), (-1, True), (3, True)])
def test_a_hardmax_in_an_if_branch_keeps_an_old_opset_from_conversion(axis, converts):
    # ONNX's converter passes Hardmax through, whose axis=1 takes axes 1 on before opset 13
    # and axis 1 alone from it; the check ran the first calibration sample, which took the
    # other branch, and the int8 model had 15 of 64 elements wrong in this one. Over the last
    # axis the two meanings agree.
    from onnx import TensorProto, helper

    from graphopt.ir import load_onnx
    from graphopt.passes import Options
    from graphopt.quant.opset_upgrade import int8_ready

    def branch(name, node):
        return helper.make_graph([node], name, [], [helper.make_tensor_value_info(
            node.output[0], TensorProto.FLOAT, [1, 4, 4, 4])])

    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("If", ["flag"], ["y"],
                          then_branch=branch("then", helper.make_node("Hardmax", ["c"], ["t"],
                                                                      axis=axis)),
                          else_branch=branch("else", helper.make_node("Relu", ["c"], ["e"])))],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4]),
              helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])],
        [onnx.numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=6)
    model, note = int8_ready(load_onnx(proto), Options(quantize="int8",
                                                        input_shapes={"x": [1, 3, 4, 4]}))
    assert (model.opset("") == 13) == converts, note
    if not converts:
        assert "it would change what a Hardmax computes" in note, note


@pytest.mark.parametrize("op, opset", [("Upsample", 9), ("Resize", 10)])
def test_an_old_linear_upsample_converts_to_an_asymmetric_resize(tmp_path, op, opset):
    # Upsample-9 and Resize-10 sample at x / scale; ONNX's converter writes Resize-13 at its
    # default half_pixel, 2.4 off on a bilinear x2, so the check refused the conversion and a
    # YOLOv3-style model quantized nothing.
    from graphopt.ir import load_onnx
    from graphopt.passes import Options
    from graphopt.quant.opset_upgrade import int8_ready

    rng = np.random.default_rng(0)
    proto = parse_model(f"""
    agraph (float[1, 3, 6, 6] x) => (float[1, 4, 12, 12] y) {{
      c = Conv <pads = [1, 1, 1, 1]> (x, w)
      u = {op} <mode = "linear"> (c, s)
      y = Conv <pads = [1, 1, 1, 1]> (u, w2)
    }}""", header=f'<ir_version: 5, opset_import: ["" : {opset}]>\n',
                        w=rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
                        w2=rng.standard_normal((4, 4, 3, 3)).astype(np.float32),
                        s=np.array([1, 1, 2, 2], np.float32))
    model, note = int8_ready(load_onnx(proto), Options(quantize="int8",
                                                        input_shapes={"x": [1, 3, 6, 6]}))
    assert model.opset("") == 13, note
    (resize,) = [n for n in model.graph if n.op_type == "Resize"]
    assert resize.attr("coordinate_transformation_mode") in ("asymmetric", b"asymmetric")


def test_an_old_opset_with_open_dims_is_converted_checked_on_the_calibration_data(tmp_path):
    # The conversion was checked on seeded inputs with every open dim at 1: a [1, 3, 1, 1]
    # image, which PP-OCR's detector (opset 11) cannot take, so it stayed at 11 and quantized
    # nothing, the note quoting onnxruntime's refusal as the converter's.
    rng = np.random.default_rng(0)
    proto = parse_model("""
    agraph (float[1, 3, H, W] x) => (float[1, 4, 4, 4] y) {
      c = Conv <pads = [1, 1, 1, 1]> (x, w)
      y = Reshape(c, shape)
    }""", header='<ir_version: 7, opset_import: ["" : 11]>\n',
                        w=rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
                        shape=np.array([1, 4, 4, 4], np.int64))
    calibration = _calibration(tmp_path, shape=(1, 3, 4, 4))
    result, out = _int8(proto, calibration=calibration, quant_keep_ends=False)
    assert any("converted to 13 by ONNX's version converter" in n for n in result.notes), \
        result.notes
    assert any(n.op_type == "DequantizeLinear" for n in out.graph.node)
    # Without data it runs on, the note says the check could not run, and why.
    from graphopt.ir import load_onnx
    from graphopt.passes import Options
    from graphopt.quant.opset_upgrade import int8_ready

    _, note = int8_ready(load_onnx(proto), Options(quantize="int8"))
    assert "the conversion could not be checked, since onnxruntime cannot run the model on " \
           "seeded inputs with every open dim at 1" in note, note
    _, note = int8_ready(load_onnx(proto), Options(quantize="int8",
                                                   input_shapes={"x": [1, 3, 4, 4]}))
    assert "converted to 13" in note, note


def test_a_conversion_that_changes_the_outputs_is_not_used(tmp_path):
    # The converter passes Hardmax through from 11 to 13, where it works over one axis instead
    # of over all from it on: the conversion is checked against the model on seeded inputs.
    rng = np.random.default_rng(3)
    proto = parse_model("""
    agraph (float[2, 3, 4] x) => (float[2, 3, 4] y) {
      m = MatMul(x, w)
      y = Hardmax <axis = 1> (m)
    }""", header='<ir_version: 7, opset_import: ["" : 11]>\n',
                        w=rng.standard_normal((4, 4)).astype(np.float32))
    np.savez(tmp_path / "c.npz", x=rng.standard_normal((4, 2, 3, 4)).astype(np.float32))
    result = graphopt.optimize(proto, pass_options={"quantize": "int8",
                                                    "calibration": tmp_path / "c.npz"})
    assert any("cannot take the model from opset 11 to 13: its conversion computes other "
               "outputs" in note for note in result.notes), result.notes
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(numerics.run(result.to_onnx(), {"x": x})["y"],
                                  numerics.run(proto, {"x": x})["y"])


@pytest.mark.parametrize("activation", ["HardSwish", "LeakyRelu", "HardSigmoid", "Clip"])
def test_convs_o3_fused_with_an_activation_quantize_as_at_o2(tmp_path, activation):
    """-O3's FuseActivation wraps Conv + HardSwish (LeakyRelu, …) into FusedConv before
    QuantizeInt8, and QLinearConv folds only a Relu: those convs stayed float (timm's LCNet: 2
    of 32 quantized). Split again, they quantize as at -O2; the first and the last, kept float
    by quant_keep_ends, are FusedConvs again."""
    act = {"Clip": "Clip (c{i}, lo, hi)", "LeakyRelu": "LeakyRelu <alpha = 0.1> (c{i})",
           "HardSigmoid": "HardSigmoid <alpha = 0.25, beta = 0.4> (c{i})"}.get(
               activation, f"{activation} (c{{i}})")
    rng = np.random.default_rng(3)
    body = "\n".join(f"c{i} = Conv <pads = [1, 1, 1, 1]> ({'x' if i == 0 else f'a{i - 1}'}, "
                     f"w{i}, b{i})\n a{i} = {act.format(i=i)}" for i in range(4))
    weights = {f"w{i}": (rng.standard_normal((8, 3 if i == 0 else 8, 3, 3)) * 0.3)
               .astype(np.float32) for i in range(4)}
    weights.update({f"b{i}": (rng.standard_normal(8) * 0.1).astype(np.float32)
                    for i in range(4)})
    proto = parse_model(f"""
        agraph (float[1, 3, 16, 16] x) => (float[1, 8, 16, 16] y) {{
            {body}
            y = Identity (a3)
        }}""", lo=np.float32(0), hi=np.float32(6), **weights)
    counts = {}
    for level in (2, 3):
        result = graphopt.optimize(proto, level=level, pass_options={
            "quantize": "int8", "calibration": _calibration(tmp_path)})
        out = graphopt.to_onnx(result.model)
        onnx.checker.check_model(out)
        counts[level] = Counter(n.op_type for n in out.graph.node)
        feeds = numerics.random_feeds(proto, seed=5)
        assert _cosine(numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]) \
            > MIN_COSINE
    assert counts[3]["QuantizeLinear"] == counts[2]["QuantizeLinear"] > 0
    assert counts[3]["Conv"] == counts[2]["Conv"] - 2 and counts[3]["FusedConv"] == 2


@pytest.mark.parametrize("target", [None, "ascend310"])
def test_gemms_and_matmuls_o3_fused_with_an_activation_quantize_as_at_o2(tmp_path, target):
    """-O3 also wraps Gemm or a matrix MatMul + activation into FusedGemm, which QuantizeInt8
    did not take: an MLP quantized nothing, under the note that it had no Gemm or MatMul with a
    constant weight. Split again, they quantize as at -O2; the ends are FusedGemms again."""
    rng = np.random.default_rng(4)
    weights = {f"w{i}": (rng.standard_normal((32, 32)) * 0.2).astype(np.float32)
               for i in range(4)}
    weights.update(b0=(rng.standard_normal(32) * 0.1).astype(np.float32),
                   b2=(rng.standard_normal(32) * 0.1).astype(np.float32))
    proto = parse_model("""
        agraph (float[4, 32] x) => (float[4, 32] y) {
            g0 = Gemm <transB = 1> (x, w0, b0)
            a0 = LeakyRelu <alpha = 0.1> (g0)
            g1 = MatMul (a0, w1)
            a1 = Relu (g1)
            g2 = Gemm (a1, w2, b2)
            a2 = Sigmoid (g2)
            g3 = MatMul (a2, w3)
            y = Tanh (g3)
        }""", **weights)
    counts = {}
    for level in (2, 3):
        result = graphopt.optimize(proto, level=level, target=target, pass_options={
            "quantize": "int8", "calibration": _calibration(tmp_path, shape=(4, 32))})
        assert not any("quantized nothing" in note for note in result.notes), result.notes
        out = graphopt.to_onnx(result.model)
        onnx.checker.check_model(out)
        counts[level] = Counter(n.op_type for n in out.graph.node)
        feeds = numerics.random_feeds(proto, seed=5)
        assert _cosine(numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]) > 0.999
    for op in ("QuantizeLinear", "DynamicQuantizeMatMul"):
        assert counts[3][op] == counts[2][op], (op, counts)
    # The middle layers are int8: static on the NPU (AMCT's form); on the CPU dynamic, the
    # MatMuls outnumbering the convs (none), and the Gemm with them.
    quantized = "QuantizeLinear" if target else "DynamicQuantizeMatMul"
    assert counts[2][quantized] == (2 if not target else counts[2][quantized]) > 0, counts
    assert counts[3]["FusedGemm"] == 2, counts


@pytest.mark.parametrize("layer", ["MatMul", "Gemm"])
def test_a_gemm_among_dynamic_matmuls_is_dynamic_too(tmp_path, layer):
    """A Linear over 2-D rows, which exporters write as a Gemm (GPT-2's output projection in a
    one-token decoder step), is quantized as the model's other layers are: dynamically where
    its MatMuls are. Static, it alone kept the calibration's range, and an input beyond it was
    clipped. An MLP of Gemms alone stays static, calibrated."""
    rng = np.random.default_rng(6)
    proto = parse_model(f"""
        agraph (float[4, 32] x) => (float[4, 32] y) {{
            h0 = {layer} (x, w0)
            a0 = Relu (h0)
            h1 = {layer} (a0, w1)
            a1 = Relu (h1)
            h2 = Gemm <transB = 1> (a1, w2, b2)
            a2 = Relu (h2)
            h3 = {layer} (a2, w3)
            a3 = Relu (h3)
            y = Gemm (a3, w4, b4)
        }}""", **{f"w{i}": (rng.standard_normal((32, 32)) * 0.2).astype(np.float32)
                  for i in range(5)},
        b2=(rng.standard_normal(32) * 0.1).astype(np.float32),
        b4=(rng.standard_normal(1) * 0.1).astype(np.float32))
    result, out = _int8(proto, calibration=_calibration(tmp_path, shape=(4, 32)),
                        quant_keep_ends=False)
    ops = Counter(n.op_type for n in out.graph.node)
    if layer == "MatMul":
        assert ops["DynamicQuantizeMatMul"] == 5 and "QuantizeLinear" not in ops, ops
        inputs = [n.input for n in out.graph.node if n.op_type == "DynamicQuantizeMatMul"]
        assert [len(i) for i in inputs] == [4, 4, 5, 4, 5]  # the Gemms' biases as [N]
    else:
        assert ops["QuantizeLinear"] > 0 and "DynamicQuantizeMatMul" not in ops, ops
    onnx.checker.check_model(out)
    # Dynamic, an input 4× beyond the calibration's is measured, not clipped.
    feeds = {"x": (rng.standard_normal((4, 32)) * (4 if layer == "MatMul" else 1)).astype(
        np.float32)}
    assert _cosine(numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]) > 0.999


def test_a_dynamic_gemm_behind_static_convs_is_no_float_head(tmp_path):
    # Behind quantized convs, the Gemm made dynamic (its model's MatMuls outnumber the convs)
    # had also been taken for a float layer whose bias corrects the convs' rounding: the
    # correction then read the Gemm that the dynamic rewrite had removed (IndexError).
    rng = np.random.default_rng(0)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    proto = parse_model("""
        agraph (float[4, 16] x) => (float[4, 16] y) {
            u = Unsqueeze(x, ax)
            c = Conv <pads = [1, 1]> (u, cw, cb)
            r0 = Relu(c)
            c2 = Conv <pads = [1, 1]> (r0, cw, cb)
            r = Relu(c2)
            s = Squeeze(r, ax)
            m1 = MatMul(s, w1)
            a1 = Relu(m1)
            m2 = MatMul(a1, w2)
            a2 = Relu(m2)
            g = Gemm(a2, w4, b4)
            a3 = Relu(g)
            y = MatMul(a3, w3)
        }""", ax=np.array([1], np.int64), cw=w(1, 1, 3), cb=np.zeros(1, np.float32),
        w1=w(16, 16), w2=w(16, 16), w3=w(16, 16), w4=w(16, 16), b4=w(16))
    _, out = _int8(proto, calibration=_calibration(tmp_path, shape=(4, 16)))
    ops = Counter(n.op_type for n in out.graph.node)
    assert "Gemm" not in ops and ops["DynamicQuantizeMatMul"] >= 3, ops
    feeds = numerics.random_feeds(proto, seed=3)
    assert _cosine(numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]) > 0.999


def test_a_fused_conv_with_a_residual_input_is_not_split(tmp_path):
    """onnxruntime's FusedConv takes a fourth input Z (a residual sum its ConvAddActivation
    fusion adds), which no Conv takes: the split for the quantizer leaves it whole."""
    rng = np.random.default_rng(0)
    proto = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
         onnx.helper.make_node("Relu", ["c0"], ["r0"]),
         onnx.helper.make_node("FusedConv", ["r0", "w1", "b1", "r0"], ["f1"],
                               domain="com.microsoft", activation="Sigmoid", pads=[1, 1, 1, 1]),
         onnx.helper.make_node("Relu", ["f1"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 16, 16])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 16, 16])],
        [onnx.numpy_helper.from_array(a.astype(np.float32), name) for name, a in (
            ("w0", rng.standard_normal((8, 3, 3, 3)) * 0.3), ("b0", np.zeros(8)),
            ("w1", rng.standard_normal((8, 8, 3, 3)) * 0.2), ("b1", np.zeros(8)))]),
        opset_imports=[onnx.helper.make_opsetid("", 17),
                       onnx.helper.make_opsetid("com.microsoft", 1)], ir_version=8)
    result, out = _int8(proto, calibration=_calibration(tmp_path), quant_keep_ends=False)
    ops = Counter(n.op_type for n in out.graph.node)
    assert ops["FusedConv"] == 1 and ops["Conv"] == 1 and ops["QuantizeLinear"] >= 2
    feeds = numerics.random_feeds(proto, seed=5)
    assert _cosine(numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]) > MIN_COSINE


def test_a_compile_with_no_layer_to_quantize_says_it_quantized_nothing(tmp_path, capsys):
    # int4 said so; int8 wrote the float model with no note, and the report's note spoke of
    # int8 ranges fitted to the calibration data. A weight the model lets a caller override
    # is an input: its MatMul is no layer with a constant weight.
    from helpers import run_cli

    relu = parse_model("agraph (float[2, 4] x) => (float[2, 4] y) { y = Relu(x) }")
    overridable = parse_model("agraph (float[2, 4] x, float[4, 3] w) => (float[2, 3] y) "
                              "{ y = MatMul(x, w) }")
    weight = onnx.numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    overridable.graph.initializer.append(weight)
    calibration = _calibration(tmp_path, shape=(2, 4))
    for proto in (relu, overridable):
        result, _ = _int8(proto, calibration=calibration, quant_keep_ends=False)
        assert "QuantizeInt8 quantized nothing: the model has no Conv, Gemm or MatMul with a " \
               "constant weight" in " ".join(result.notes)
    onnx.save(relu, tmp_path / "relu.onnx")
    rc, out, err = run_cli(capsys, "optimize", tmp_path / "relu.onnx", "-o", tmp_path / "q.onnx",
                           "--quantize", "int8", "--calibration", calibration)
    assert rc == 0, err
    assert "quantized nothing" in out and "int8 ranges were fitted to" not in out


def test_a_model_of_dynamic_matmuls_alone_has_no_ranges_fitted_to_the_data(tmp_path, capsys):
    # Its MatMuls measure their input's range on every run: the report's note that int8
    # ranges were fitted to the calibration data was not so.
    from helpers import run_cli

    proto = parse_model("agraph (float[2, 4] x) => (float[2, 3] y) { y = MatMul(x, w) }",
                        w=np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))
    onnx.save(proto, tmp_path / "mm.onnx")
    calibration = _calibration(tmp_path, shape=(2, 4))
    rc, out, err = run_cli(capsys, "optimize", tmp_path / "mm.onnx", "-o", tmp_path / "q.onnx",
                           "--quantize", "int8", "--calibration", calibration,
                           "--quantize-ends")
    assert rc == 0, err
    assert "QuantizeInt8" in out and "int8 ranges were fitted to" not in out


@pytest.mark.parametrize("op", ["Conv", "MatMul"])
def test_a_layer_whose_weight_holds_nan_stays_float_with_a_note(tmp_path, op):
    # The dynamic MatMul kernel turned the NaN into finite outputs, the float model's NaN lost.
    rng = np.random.default_rng(7)
    if op == "Conv":
        text = """g (float[1,3,8,8] x) => (y) {
            h = Conv <pads = [1,1,1,1]> (x, w1)
            r = Relu (h)
            c = Conv <pads = [1,1,1,1]> (r, w)
            y = Relu (c)
        }"""
        w1, w = rng.standard_normal((4, 3, 3, 3)), rng.standard_normal((4, 4, 3, 3))
        shape = (1, 3, 8, 8)
    else:
        text = "g (float[1,4,8] x) => (y) { h = MatMul (x, w1)\n y = MatMul (h, w) }"
        w1, w = rng.standard_normal((8, 8)), rng.standard_normal((8, 8))
        shape = (1, 4, 8)
    w[0, 0] = np.nan
    proto = parse_model(text, w1=w1.astype(np.float32), w=w.astype(np.float32))
    calibration = tmp_path / "c.npz"
    np.savez(calibration, x=rng.standard_normal((2, *shape)).astype(np.float32))
    result = graphopt.optimize(proto, pass_options={"quantize": "int8", "calibration": calibration,
                                                    "quant_keep_ends": False})
    assert "QuantizeInt8 kept in float: 1 × its weight holds NaN or Inf (its int8 scale would " \
           "be NaN)" in " ".join(result.notes)
    x = rng.standard_normal(shape).astype(np.float32)
    expected = numerics.run(proto, {"x": x})["y"]
    actual = numerics.run(result.to_onnx(), {"x": x}, "all")["y"]
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))


def test_an_int8_compile_declares_no_domain_it_does_not_use(tmp_path):
    # com.microsoft stayed imported after every op of it was rewritten (MobileNetV2), and
    # `diff --pass` showed it as a change.
    import graphopt

    model = graphopt.zoo.build("mobilenetv2")
    calibration = tmp_path / "c.npz"
    rng = np.random.default_rng(0)
    np.savez(calibration, input=rng.standard_normal((2, 1, 3, 224, 224)).astype(np.float32))
    proto = graphopt.optimize(model, quantize="int8", calibration=str(calibration),
                              input_shapes="input:1,3,224,224").to_onnx()
    used = {node.domain for node in proto.graph.node}
    declared = {opset.domain for opset in proto.opset_import}
    given = {opset.domain for opset in model.opset_import}
    assert declared - given <= used, (declared, used)


@pytest.mark.parametrize("tail", [
    "sl = Slice (p, st, en, ax)\n            present = Reshape (sl, shp)",
    "g2 = Gather <axis = 2> (p, idx)\n            present = Reshape (g2, shp)"])
def test_a_state_moved_through_several_ops_to_an_output_is_exact(tmp_path, tail):
    # A streaming state sliced (or gathered) out of what a quantized Conv reads, then reshaped,
    # reaches the output as the float value: exact, not the dequantized codes.
    proto, rng = _streaming_block(tail)
    path = tmp_path / "s.om"
    _, feeds = _quantized_om(proto, rng, path)
    expected = numerics.run(proto, feeds)
    with graphopt.load(path) as session:
        actual = session.run(feeds)
    np.testing.assert_array_equal(actual["present"], expected["present"])


@pytest.mark.parametrize("level", [0, 2])
def test_a_model_quantized_already_at_opset_21_loads_with_a_signed_value_sliced_out(tmp_path,
                                                                                   level):
    # graphopt's own quantizer now hands a sliced state the float value; a model that comes
    # quantized (QuantizeLinear/DequantizeLinear pairs of its own, int8 zero point) still
    # needs onnxruntime's QDQ propagation off, or its partition is refused at load
    # ("output_dtype INT8 does not match y_zero_point type UINT8").
    rng = np.random.default_rng(0)
    proto = parse_model("""
        g (float[1, 4, 16] x) => (float[1, 8, 14] y, float[1, 8, 2] present) {
            h = Conv (x, w1)
            hq = QuantizeLinear (h, s, z)
            hd = DequantizeLinear (hq, s, z)
            w2 = DequantizeLinear (wq, ws, z)
            y = Conv (hd, w2)
            present = Slice (hd, st, en, ax)
        }""", header='<ir_version: 10, opset_import: ["" : 21]>\n',
        w1=(rng.standard_normal((8, 4, 1)) * 0.5).astype(np.float32), s=np.float32(0.05),
        z=np.int8(0), wq=rng.integers(-100, 100, (8, 8, 3)).astype(np.int8),
        ws=np.float32(0.01), st=np.array([14], np.int64), en=np.array([16], np.int64),
        ax=np.array([2], np.int64))
    graphopt.save(graphopt.optimize(proto, target="cpu", level=level), tmp_path / "q.om")
    feeds = {"x": rng.standard_normal((1, 4, 16)).astype(np.float32)}
    expected = numerics.run(proto, feeds)
    with graphopt.load(tmp_path / "q.om") as session:
        actual = session.run(feeds)
    np.testing.assert_array_equal(actual["present"], expected["present"])
    assert _cosine(expected["y"], actual["y"]) > 0.999


@pytest.mark.parametrize("level", [1, 2, 3])
def test_an_opset_10_qdq_models_om_loads_without_onnxruntimes_bias_rounding(tmp_path, level):
    # onnxruntime's WeightBiasQuantization quantizes the float bias beside an int8 weight with
    # a Round, which opset 10 lacks: the .om's session had failed to load ("No Op registered
    # for Round with domain_version of 10") after a compile that said nothing.
    rng = np.random.default_rng(0)
    proto = parse_model("""
    agraph (float[1, 3, 8, 8] x) => (float[1, 4, 8, 8] y) {
      xq = QuantizeLinear(x, xs, xz)
      xd = DequantizeLinear(xq, xs, xz)
      wd = DequantizeLinear(wq, ws, wz)
      y = Conv <pads = [1, 1, 1, 1]> (xd, wd, b)
    }""", header='<ir_version: 5, opset_import: ["" : 10]>\n',
        xs=np.float32(0.03), xz=np.uint8(128), ws=np.float32(0.01), wz=np.int8(0),
        wq=rng.integers(-100, 100, (4, 3, 3, 3)).astype(np.int8),
        b=rng.standard_normal(4).astype(np.float32))
    path = tmp_path / "q.om"
    graphopt.save(graphopt.optimize(proto, level=level), path)
    (part,) = graphopt.codegen.load_om(path).manifest["partitions"]
    assert "WeightBiasQuantization" in (part.get("disabled_optimizers") or [])
    x = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    with graphopt.load(path) as session:
        np.testing.assert_allclose(session.run(x)["y"], numerics.run(proto, x)["y"],
                                   rtol=1e-5, atol=1e-5)


def test_a_verification_that_misses_the_cosine_says_where_to_look(tmp_path, capsys):
    # Ranges fitted to inputs a hundred times smaller than the ones verified clip them all.
    source = tmp_path / "conv.onnx"
    onnx.save(_conv_model(), source)
    rng = np.random.default_rng(1)
    small, real = tmp_path / "small.npz", tmp_path / "real.npz"
    np.savez(small, x=(rng.standard_normal((8, 1, 3, 16, 16)) * 0.01).astype(np.float32))
    np.savez(real, x=rng.standard_normal((1, 3, 16, 16)).astype(np.float32))
    rc, out, err = run_cli(capsys, "optimize", source, "-o", tmp_path / "q.onnx", "--quantize",
                           "int8", "--calibration", small, "--verify", "--inputs", real)
    assert rc != 0 and "cosine" in err
    assert "`graphopt bisect MODEL --quantize int8 …` names the first layer" in err
    assert "--quant-skip keeps layers float, --calibration-method fits other ranges" in err
