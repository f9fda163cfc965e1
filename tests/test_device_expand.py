"""ExpandForDevice: an op the target's NPU lacks, as its ONNX function body, where the NPU has
every op of that body; kept on CPU targets and where the NPU has the op."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import parse_model

import graphopt
from graphopt import numerics

# opset 18: what the dynamo exporter writes for nn.Mish (TorchScript writes the three ops).
MISH_NET = """
    agraph (float[1, 4, 16, 16] x) => (float[1, 8, 16, 16] y) {
        c1 = Conv <pads = [1, 1, 1, 1]> (x, w1)
        m1 = Mish (c1)
        c2 = Conv <pads = [1, 1, 1, 1]> (m1, w2)
        y = Mish (c2)
    }"""


def _mish_net() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    proto = parse_model(MISH_NET, w1=(rng.standard_normal((8, 4, 3, 3)) * 0.3).astype(np.float32),
                        w2=(rng.standard_normal((8, 8, 3, 3)) * 0.3).astype(np.float32))
    proto.opset_import[0].version = 18
    return proto


def test_mish_runs_on_the_npu_as_softplus_tanh_and_mul():
    # CANN's ONNX operator list has Softplus and Tanh but no Mish: each Mish had sent its
    # neighbourhood to the host, and this net went there whole.
    proto = _mish_net()
    result = graphopt.optimize(proto, target="ascend310")
    ops = [n.op_type for n in result.model.graph]
    assert "Mish" not in ops and ops.count("Softplus") == 2 and ops.count("Tanh") == 2
    assert [p.device for p in result.partitioning.partitions] == ["npu"]
    assert result.log.totals()["ExpandForDevice"]["rewrites"] == {"MishAsSoftplusTanh": 2}
    out = result.to_onnx()
    onnx.checker.check_model(out)
    feeds = numerics.random_feeds(proto, seed=1)
    assert not numerics.compare(numerics.run(proto, feeds), numerics.run(out, feeds), 1e-5, 1e-6)


@pytest.mark.parametrize("alpha", ["", "<alpha = 1.702>"])
def test_swish_runs_on_the_npu_as_sigmoid_and_mul(alpha):
    # Opset 24's Swish: no NPU kernel, and the Conv before it went to the host with it.
    proto = parse_model(f"""
g (float[1, 4, 8, 8] x) => (float[1, 4, 8, 8] y) {{
  c = Conv <pads = [1, 1, 1, 1]> (x, w)
  y = Swish {alpha} (c)
}}""", header='<ir_version: 11, opset_import: ["" : 24]>\n',
        w=np.random.default_rng(0).standard_normal((4, 4, 3, 3)).astype(np.float32))
    result = graphopt.optimize(proto, target="ascend310")
    assert "Swish" not in [n.op_type for n in result.model.graph]
    assert [p.device for p in result.partitioning.partitions] == ["npu"]
    assert result.log.totals()["ExpandForDevice"]["rewrites"] == {"SwishAsSigmoid": 1}
    feeds = numerics.random_feeds(proto, seed=1)
    np.testing.assert_allclose(numerics.run(result.to_onnx(), feeds)["y"],
                               numerics.run(proto, feeds)["y"], rtol=1e-5, atol=1e-5)
    assert "Swish" in [n.op_type for n in graphopt.optimize(proto, target="cpu").model.graph]


@pytest.mark.parametrize("target", [None, "cpu", "ascend310"])
@pytest.mark.parametrize("alpha", ["", "<alpha = 1.5>"])
def test_swiglu_becomes_sigmoid_and_muls_that_onnxruntime_loads(target, alpha):
    # Opset 28's SwiGLU: onnxruntime 1.32 expands its function, whose Swish-24 it then finds
    # no kernel for, and refused the model; no NPU profile lists it either.
    rng = np.random.default_rng(2)
    proto = parse_model(f"""
g (float[2, 8] x) => (float[2, 16] y) {{
  a = MatMul(x, wg)
  b = MatMul(x, wu)
  y = SwiGLU {alpha} (a, b)
}}""", header='<ir_version: 11, opset_import: ["" : 28]>\n',
        wg=rng.standard_normal((8, 16)).astype(np.float32),
        wu=rng.standard_normal((8, 16)).astype(np.float32))
    with pytest.raises(Exception, match="Swish"):
        numerics.run(proto, {"x": np.ones((2, 8), np.float32)})  # the premise
    result = graphopt.optimize(proto, target=target)
    assert result.log.totals()["ExpandForDevice"]["rewrites"] == {"SwiGLUAsSigmoid": 1}
    x = rng.standard_normal((2, 8)).astype(np.float32)
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    a, b = x @ weights["wg"], x @ weights["wu"]
    scale = 1.5 if alpha else 1.0
    expected = a / (1 + np.exp(-scale * a)) * b
    np.testing.assert_allclose(numerics.run(result.to_onnx(), {"x": x})["y"], expected,
                               rtol=1e-5, atol=1e-5)


def test_mish_stays_one_op_where_the_cpu_runs_it():
    for target in (None, "cpu"):
        ops = [n.op_type for n in graphopt.optimize(_mish_net(), target=target).model.graph]
        assert ops.count("Mish") == 2, (target, ops)


B, S, D, HEADS = 2, 6, 8, 2
MS = "com.microsoft"


def _ort_bert(mask_form: str = "embed") -> onnx.ModelProto:
    """A one-layer BERT as onnxruntime's transformer optimizer saves it (opset 14):
    EmbedLayerNormalization, whose mask index (the ones counted in each mask row) feeds
    Attention; or Attention with a raw [B, S] mask (`raw`) or none (`none`)."""
    helper, rng = onnx.helper, np.random.default_rng(1)

    def weight(name, *shape):
        return onnx.numpy_helper.from_array((rng.standard_normal(shape) * 0.5).astype(np.float32),
                                            name)
    mask_input = {"embed": "mask_index", "raw": "mask", "none": ""}[mask_form]
    nodes = [helper.make_node("EmbedLayerNormalization",
                              ["ids", "segments", "words", "positions", "segment_table", "gamma",
                               "beta", "mask"], ["embedded", "mask_index"], domain=MS,
                              epsilon=1e-12),
             helper.make_node("Attention", ["embedded", "qkv", "qkv_bias", mask_input],
                              ["context"], domain=MS, num_heads=HEADS),
             helper.make_node("MatMul", ["context", "out"], ["y"])]
    inits = [weight("words", 20, D), weight("positions", 16, D), weight("segment_table", 2, D),
             weight("gamma", D), weight("beta", D), weight("qkv", D, 3 * D),
             weight("qkv_bias", 3 * D), weight("out", D, D)]
    ints = [helper.make_tensor_value_info(n, onnx.TensorProto.INT32, [B, S])
            for n in ("ids", "segments", "mask")]
    graph = helper.make_graph(nodes, "bert", ints, [helper.make_tensor_value_info(
        "y", onnx.TensorProto.FLOAT, [B, S, D])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14),
                                                   helper.make_opsetid(MS, 1)], ir_version=8)


def _bert_feeds():
    rng = np.random.default_rng(2)
    mask = np.ones((B, S), np.int32)
    mask[1, 4:] = 0  # the second sequence is padded
    mask[0, 2] = 0   # and a hole, which the counted length does not see
    mask[0, 3] = 2   # which a raw mask keeps (above 0) and the count skips (not 1)
    return {"ids": rng.integers(0, 20, (B, S)).astype(np.int32),
            "segments": rng.integers(0, 2, (B, S)).astype(np.int32), "mask": mask}


def _same_as_onnxruntime(proto, result):
    feeds = _bert_feeds()
    expected = numerics.run(proto, feeds)["y"]
    got = numerics.run(result.to_onnx(), feeds)["y"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_an_onnxruntime_bert_runs_on_an_npu_without_its_contrib_kernels():
    # The 310 has neither op: both become ONNX ops, and the whole model stays on the NPU.
    proto = _ort_bert()
    result = graphopt.optimize(proto, target="ascend310")
    ops = [n.qualified_op for n in result.model.graph]
    assert not any(op.startswith(MS) for op in ops), ops
    assert [p.device for p in result.partitioning.partitions] == ["npu"]
    assert result.model.opset("") == 17  # for LayerNormalization
    _same_as_onnxruntime(proto, result)


def test_an_npu_with_attention_keeps_it_and_reads_the_mask_counted():
    # The 910B runs Attention: it stays, its mask index counted from the mask by ONNX ops,
    # so that the EmbedLayerNormalization it has no kernel for expands too.
    proto = _ort_bert()
    result = graphopt.optimize(proto, target="ascend910b")
    ops = [n.qualified_op for n in result.model.graph]
    assert f"{MS}::Attention" in ops and f"{MS}::EmbedLayerNormalization" not in ops
    assert result.log.totals()["ExpandForDevice"]["rewrites"] == {
        "MaskIndexCounted": 1, "EmbedLayerNormAsGathers": 1}
    assert [p.device for p in result.partitioning.partitions] == ["npu"]
    _same_as_onnxruntime(proto, result)


def test_attention_with_a_raw_mask_or_none_expands_alike():
    for form in ("raw", "none"):
        proto = _ort_bert(form)
        result = graphopt.optimize(proto, target="ascend310")
        assert not any(n.domain == MS for n in result.model.graph), form
        _same_as_onnxruntime(proto, result)


def test_the_cpu_keeps_onnxruntimes_bert_ops():
    result = graphopt.optimize(_ort_bert(), target="cpu")
    assert {f"{MS}::Attention", f"{MS}::EmbedLayerNormalization"} <= {
        n.qualified_op for n in result.model.graph}


def _group_norm(opset: int, groups: int = 4, channels: int = 8):
    rng = np.random.default_rng(3)
    return parse_model(f"""
g (float[2, {channels}, 6, 5] x) => (float[2, {channels}, 6, 5] y) {{
  c = Conv <pads = [1, 1, 1, 1]> (x, w)
  n = GroupNormalization <num_groups = {groups}, epsilon = 0.001> (c, scale, bias)
  y = Relu(n)
}}""", header=f'<ir_version: {10 if opset >= 21 else 8}, opset_import: ["" : {opset}]>\n',
        w=(rng.standard_normal((channels, channels, 3, 3)) * 0.3).astype(np.float32),
        scale=rng.uniform(0.5, 1.5, channels).astype(np.float32),
        bias=rng.uniform(-0.5, 0.5, channels).astype(np.float32))


def test_group_normalization_becomes_instance_normalization_where_no_kernel_runs_it():
    # onnxruntime's CPU provider has no GroupNormalization kernel (it expands the ONNX
    # function, about 30 ops), nor do the NPU profiles: the InstanceNormalization form, as
    # TorchScript exports group_norm, runs on both.
    proto = _group_norm(21)
    for target in (None, "ascend310"):
        result = graphopt.optimize(proto, target=target)
        ops = [n.op_type for n in result.model.graph]
        assert "GroupNormalization" not in ops and "InstanceNormalization" in ops, ops
        if target:
            assert [p.device for p in result.partitioning.partitions] == ["npu"]
        x = np.random.default_rng(5).standard_normal((2, 8, 6, 5)).astype(np.float32)
        np.testing.assert_allclose(numerics.run(result.to_onnx(), {"x": x})["y"],
                                   numerics.run(proto, {"x": x})["y"], rtol=1e-5, atol=1e-5)


def test_group_normalization_is_typed_without_the_models_value_info():
    # ONNX's inference types no GroupNormalization (a function op): without value_info the
    # values after it had no shape, and an NPU compile called the static model dynamic.
    proto = _group_norm(21)
    del proto.graph.value_info[:]
    result = graphopt.optimize(proto, target="ascend910b", disable_passes=["ExpandForDevice"])
    values = {v.name: v for v in result.model.graph.all_values()}
    assert values["n"].shape == (2, 8, 6, 5)


def _onnx_attention(mask: str = "", causal: int = 0):
    """ONNX's Attention (opset 23) over [B, N, S, H] heads, as the dynamo exporter writes
    scaled_dot_product_attention there: no mask, an additive float mask or a bool one."""
    types = {"": "", "float": ", float[1, 1, 5, 5] m", "bool": ", bool[1, 1, 5, 5] m"}[mask]
    return parse_model(f"""
g (float[2, 3, 5, 4] q, float[2, 3, 5, 4] k, float[2, 3, 5, 4] v{types}) => (float[2, 3, 5, 4] y) {{
  a = Attention <is_causal = {causal}> (q, k, v{", m" if mask else ""})
  y = Relu(a)
}}""", header='<ir_version: 11, opset_import: ["" : 23]>\n')


@pytest.mark.parametrize("mask, causal", [("", 0), ("", 1), ("float", 0)])
def test_onnx_attention_runs_on_an_npu_as_matmuls(mask, causal):
    proto = _onnx_attention(mask, causal)
    result = graphopt.optimize(proto, target="ascend310")
    assert "Attention" not in [n.op_type for n in result.model.graph]
    assert [p.device for p in result.partitioning.partitions] == ["npu"]
    feeds = numerics.random_feeds(proto, seed=2)
    np.testing.assert_allclose(numerics.run(result.to_onnx(), feeds)["y"],
                               numerics.run(proto, feeds)["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window, causal", [("left_window_size = 1, right_window_size = 2", 0),
                                            ("left_window_size = 0", 0),
                                            ("left_window_size = 2", 1),
                                            ("right_window_size = 1", 0)])
def test_an_onnx_attentions_sliding_window_is_kept_as_matmuls(window, causal):
    # Opset 25's window bounds the keys each query sees; the expansion computed full
    # attention (ONNX's test_attention_bidirectional_window gave 2 2 2 2 2 for 1 1.5 2.5 3 3.5).
    proto = parse_model(f"""
g (float[2, 3, 5, 4] q, float[2, 3, 5, 4] k, float[2, 3, 5, 4] v) => (float[2, 3, 5, 4] y) {{
  y = Attention <{window}, is_causal = {causal}> (q, k, v)
}}""", header='<ir_version: 11, opset_import: ["" : 25]>\n')
    result = graphopt.optimize(proto, target="ascend310")
    assert "Attention" not in [n.op_type for n in result.model.graph]
    feeds = numerics.random_feeds(proto, seed=4)
    np.testing.assert_allclose(numerics.run(result.to_onnx(), feeds)["y"],
                               numerics.run(proto, feeds)["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs, mask", [("scale = 0.0", ""), ("scale = -0.5", ""),
                                         ("", "float[5, 1] m"), ("", "float[1, 1, 5, 2] m")])
def test_an_onnx_attentions_zero_scale_negative_scale_and_short_mask(attrs, mask):
    # A scale of 0 had been read as the default 1/√H (0.35 off); a negative one, which gives
    # NaN in onnxruntime, and a mask shorter than the keys, which opset 24 pads with -inf
    # where the expansion's Add broadcast it (or failed), keep the op.
    proto = parse_model(f"""
g (float[1, 2, 5, 4] q, float[1, 2, 5, 4] k, float[1, 2, 5, 4] v{", " + mask if mask else ""})
  => (float[1, 2, 5, 4] y) {{
  y = Attention <{attrs or "is_causal = 0"}> (q, k, v{", m" if mask else ""})
}}""", header='<ir_version: 11, opset_import: ["" : 25]>\n')
    result = graphopt.optimize(proto, target="ascend310")
    expanded = "Attention" not in [n.op_type for n in result.model.graph]
    assert expanded == (attrs == "scale = 0.0")
    feeds = numerics.random_feeds(proto, seed=5)
    want, got = numerics.run(proto, feeds)["y"], numerics.run(result.to_onnx(), feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_onnx_attention_with_a_bool_mask_or_on_the_cpu_stays():
    result = graphopt.optimize(_onnx_attention("bool"), target="ascend310",
                               trace_rules=["OnnxAttentionAsMatMuls"])
    assert "Attention" in [n.op_type for n in result.model.graph]
    assert any("is not additive" in line for line in result.traces), result.traces
    assert "Attention" in [n.op_type for n in graphopt.optimize(_onnx_attention()).model.graph]


@pytest.mark.parametrize("masked", [-np.inf, np.finfo(np.float32).min])
def test_a_row_an_onnx_attention_mask_masks_whole_gives_zeros(masked):
    # A left-padded sequence's padding rows mask every key: onnxruntime's kernel gives 0
    # there, a plain Softmax NaN, which the next layer would spread to every token. The kernel
    # takes float32's lowest, transformers' mask value, as -inf: Softmax had averaged V.
    proto = _onnx_attention("float")
    mask = np.zeros((1, 1, 5, 5), np.float32)
    mask[..., 1, :] = masked
    mask[..., 3, :2] = masked
    feeds = {**numerics.random_feeds(proto, seed=3), "m": mask}
    result = graphopt.optimize(proto, target="ascend310")
    got = numerics.run(result.to_onnx(), feeds)["y"]
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, numerics.run(proto, feeds)["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("where", ["query", "mask nan", "mask inf"])
def test_a_nan_the_data_brings_through_an_onnx_attention_stays_nan(where):
    # The expansion's guard for rows masked whole made every NaN of the probabilities 0: a NaN
    # query element, or a NaN or +inf mask entry, came out as 0 where the kernel gives NaN.
    proto = _onnx_attention("float")
    feeds = numerics.random_feeds(proto, seed=3)
    mask = np.zeros((1, 1, 5, 5), np.float32)
    mask[..., 3] = -np.inf
    if where == "query":
        feeds["q"][0, 1, 2, 0] = np.nan
    else:
        mask[0, 0, 1, 2] = np.nan if where == "mask nan" else np.inf
    feeds["m"] = mask
    result = graphopt.optimize(proto, target="ascend310")
    got, expected = numerics.run(result.to_onnx(), feeds)["y"], numerics.run(proto, feeds)["y"]
    assert np.isnan(expected).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    finite = ~np.isnan(expected)
    np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-5, atol=1e-5)
