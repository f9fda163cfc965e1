"""Tests for graphopt.zoo: validity, determinism, exporter-shaped patterns and parameter counts."""

from __future__ import annotations

import collections
import functools
import math
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import graphopt
from graphopt import numerics, zoo

# Small variants keep the file fast; defaults are built weightless (for real under GRAPHOPT_SLOW).
SMALL = {
    "tiny": {},
    "matmul256": {"size": 64},
    "resnet50": {"blocks": (1, 2, 1, 1), "width": 0.25, "image_size": 64, "num_classes": 10},
    "mobilenetv2": {"width": 0.25, "image_size": 64, "num_classes": 10},
    "blazepalm": {"image_size": 64, "width": 0.5},
    "lcnetv3": {"image_size": 64, "scale": 0.5},
    "unet": {"base_channels": 8, "image_size": 64},
    "bert_base": {"layers": 2, "hidden": 64, "heads": 4, "intermediate": 128, "vocab": 100,
                  "max_positions": 32},
    "gpt2_small": {"layers": 2, "hidden": 64, "heads": 4, "vocab": 100, "positions": 32},
}
DIMS = {"batch_size": 2, "sequence_length": 8}
EXPECTED_SHAPE = {
    "tiny": (1, 10), "matmul256": (64, 64), "resnet50": (2, 10), "mobilenetv2": (2, 10),
    "blazepalm": (2, 32, 17), "lcnetv3": (2, 1, 2, 2),
    "bert_base": (2, 8, 64), "gpt2_small": (2, 8, 100), "unet": (2, 2, 64, 64),
}
NAMES = list(SMALL)

slow = pytest.mark.skipif(os.environ.get("GRAPHOPT_SLOW") != "1",
                          reason="full-size weights; set GRAPHOPT_SLOW=1")


@functools.cache
def small(name: str) -> onnx.ModelProto:
    return zoo.build(name, **SMALL[name])


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def op_counts(model: onnx.ModelProto) -> collections.Counter[str]:
    return collections.Counter(n.op_type for n in model.graph.node)


def constant_values(model: onnx.ModelProto) -> list[np.ndarray]:
    return [numpy_helper.to_array(n.attribute[0].t)
            for n in model.graph.node if n.op_type == "Constant"]


def test_registry_and_listing():
    assert set(zoo.ZOO) == set(NAMES)
    listed = zoo.list_models()
    assert [n for n, _ in listed] == list(zoo.ZOO)
    assert all(desc and "\n" not in desc for _, desc in listed)


def test_unknown_name_lists_known_models():
    with pytest.raises(KeyError) as err:
        zoo.build("resnet51")
    assert all(name in str(err.value) for name in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_full_check_and_metadata(name):
    model = small(name)
    onnx.checker.check_model(model, full_check=True)
    assert model.producer_name == "graphopt.zoo"
    assert 8 <= model.ir_version <= 9
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert {p.key: p.value for p in model.metadata_props}["graphopt.zoo.model"] == name


@pytest.mark.parametrize("name", NAMES)
def test_runs_finite_with_expected_shape(name):
    model = small(name)
    outputs = run(model, zoo.sample_inputs(model, dims=DIMS))
    assert len(outputs) == 1
    assert outputs[0].shape == EXPECTED_SHAPE[name]
    assert outputs[0].dtype == np.float32
    assert np.isfinite(outputs[0]).all()
    # Well-conditioned: neither vanishing nor exploding at these weight scales.
    assert 1e-3 < float(np.abs(outputs[0]).max()) < 1e3


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_bytes(name):
    assert zoo.build(name, **SMALL[name]).SerializeToString() == small(name).SerializeToString()
    a, b = zoo.sample_inputs(small(name), seed=3), zoo.sample_inputs(small(name), seed=3)
    assert all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", NAMES)
def test_exporter_naming(name):
    g = small(name).graph
    graph_outputs = {o.name for o in g.output}
    assert len({n.name for n in g.node}) == len(g.node)
    for node in g.node:
        assert node.name.startswith("/") and node.name.split("/")[-1].split("_")[0] == node.op_type
        for i, out in enumerate(node.output):
            assert out == f"{node.name}_output_{i}" or out in graph_outputs


def test_weights_only_mode_keeps_the_graph():
    for name in NAMES:
        full, stub = small(name), zoo.build(name, weights=False, **SMALL[name])
        assert [n.SerializeToString() for n in full.graph.node] == \
               [n.SerializeToString() for n in stub.graph.node]
        assert all(not t.raw_data and t.data_location == onnx.TensorProto.EXTERNAL
                   for t in stub.graph.initializer)
        assert zoo.param_count(full) == zoo.param_count(stub)


def test_tiny_quickstart():
    model = small("tiny")
    assert model.ByteSize() < 100_000
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [1, 3, 32, 32]
    ops = op_counts(model)
    for leftover in ("Identity", "Dropout", "Cast", "Shape", "Gather", "Unsqueeze", "Concat",
                     "Reshape", "Flatten", "Mul"):
        assert ops[leftover] == 1, leftover
    assert ops["Conv"] == ops["BatchNormalization"] == ops["Relu"] == 2


def test_matmul_numerics():
    model = small("matmul256")
    x = zoo.sample_inputs(model)["x"]
    w = numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_allclose(run(model, {"x": x})[0], x @ w, rtol=1e-4, atol=1e-4)


def test_cnn_patterns():
    res = small("resnet50")
    producers = {o: n for n in res.graph.node for o in n.output}
    convs = [n for n in res.graph.node if n.op_type == "Conv"]
    # stem + 3 per bottleneck + one downsample per stage
    assert len(convs) == 1 + 3 * sum(SMALL["resnet50"]["blocks"]) + 4
    assert all(len(c.input) == 2 for c in convs)  # bias=False
    bns = [n for n in res.graph.node if n.op_type == "BatchNormalization"]
    assert len(bns) == len(convs) and all(producers[b.input[0]].op_type == "Conv" for b in bns)
    assert "layer1.0.conv1.weight" in {t.name for t in res.graph.initializer}
    assert any(n.name == "/layer1/layer1.0/conv1/Conv" for n in res.graph.node)

    mob = small("mobilenetv2")
    producers = {o: n for n in mob.graph.node for o in n.output}
    weights = {t.name: t for t in mob.graph.initializer}
    depthwise = [n for n in mob.graph.node if n.op_type == "Conv"
                 and onnx.helper.get_node_attr_value(n, "group") > 1]
    assert len(depthwise) == 17
    assert all(weights[n.input[1]].dims[1] == 1 for n in depthwise)
    clips = [n for n in mob.graph.node if n.op_type == "Clip"]
    assert len(clips) == 2 * 17 - 1 + 2  # every block but the first expands; stem and head too
    for clip in clips:
        bounds = [numpy_helper.to_array(producers[i].attribute[0].t) for i in clip.input[1:]]
        assert [float(b) for b in bounds] == [0.0, 6.0]


def test_unet_patterns():
    model = small("unet")
    g, depth, base = model.graph, 4, SMALL["unet"]["base_channels"]
    ops = op_counts(model)
    # DoubleConv in inc, each down and each up, plus outc's 1×1
    assert ops["Conv"] == 2 * (2 * depth + 1) + 1
    assert ops["BatchNormalization"] == ops["Relu"] == 2 * (2 * depth + 1)
    assert ops["MaxPool"] == ops["ConvTranspose"] == ops["Concat"] == depth
    producers = {o: n for n in g.node for o in n.output}
    weights = {t.name: t for t in g.initializer}
    assert all(producers[n.input[0]].op_type == "Conv"
               for n in g.node if n.op_type == "BatchNormalization")
    concats = [n for n in g.node if n.op_type == "Concat"]
    assert [n.name for n in concats] == [f"/up{i}/Concat" for i in range(1, depth + 1)]
    for i, cat in enumerate(concats, 1):
        skip, up = (producers[v] for v in cat.input)
        # torch.cat([x2, x1]): the encoder's skip first, the up-sampled tensor second
        assert onnx.helper.get_node_attr_value(cat, "axis") == 1
        assert skip.op_type == "Relu" and up.op_type == "ConvTranspose"
        assert skip.name.startswith(f"/down{depth - i}/" if i < depth else "/inc/")
        cin = base * 2 ** (depth + 1 - i)
        assert list(weights[up.input[1]].dims) == [cin, cin // 2, 2, 2]
    assert up.name == f"/up{depth}/up/ConvTranspose" and f"up{depth}.up.bias" in weights
    assert "down1.maxpool_conv.1.double_conv.0.weight" in weights
    outc = producers["logits"]
    assert outc.name == "/outc/conv/Conv" and len(outc.input) == 3  # OutConv keeps its bias
    shallow = op_counts(zoo.build("unet", weights=False, base_channels=4, depth=2,
                                  image_size=32))
    assert shallow["Conv"] == 11 and shallow["MaxPool"] == shallow["Concat"] == 2
    with pytest.raises(ValueError, match="multiple of 2\\*\\*depth = 16"):
        zoo.build("unet", weights=False, image_size=200)


def test_unet_optimize_folds_batch_norm_and_keeps_outputs():
    proto = small("unet")
    model = graphopt.optimize(proto).model
    ops = collections.Counter(n.op_type for n in model.graph)
    assert ops["BatchNormalization"] == 0
    assert ops["Conv"] == op_counts(proto)["Conv"] == 19
    assert ops["ConvTranspose"] == ops["Concat"] == ops["MaxPool"] == 4
    after = graphopt.to_onnx(model)
    onnx.checker.check_model(after, full_check=True)
    feeds = zoo.sample_inputs(proto, seed=1, dims=DIMS)
    np.testing.assert_allclose(run(after, feeds)[0], run(proto, feeds)[0], rtol=1e-4, atol=1e-5)


def test_resnet_raw_dynamo_computes_zero_biases_at_run_time_and_graphopt_folds_them():
    raw = zoo.build("resnet50", width=0.25, raw_dynamo=True)
    plain = zoo.build("resnet50", width=0.25)
    onnx.checker.check_model(raw, full_check=True)
    ops = collections.Counter(n.op_type for n in raw.graph.node)
    assert ops["CastLike"] == ops["Conv"] == 53 and ops["Expand"] == 106
    feeds = zoo.sample_inputs(plain, seed=0)
    assert np.array_equal(numerics.run(raw, feeds)["logits"], numerics.run(plain, feeds)["logits"])
    folded = collections.Counter(n.op_type for n in graphopt.optimize(raw).model.graph)
    assert not folded["CastLike"] and not folded["Expand"] and not folded["BatchNormalization"]
    assert folded["Conv"] == 53


def test_bert_patterns():
    layers, model = SMALL["bert_base"]["layers"], small("bert_base")
    ops = op_counts(model)
    lns = 2 * layers + 1
    assert ops["ReduceMean"] == 2 * lns and ops["Sqrt"] == ops["Pow"] == lns
    assert ops["Erf"] == ops["Softmax"] == layers
    assert ops["MatMul"] == 8 * layers
    assert ops["LayerNormalization"] == ops["Gelu"] == ops["Where"] == 0
    consts = [float(c) for c in constant_values(model) if c.dtype == np.float32 and c.ndim == 0]
    assert np.float32(math.sqrt(2)) in consts and np.float32(np.finfo(np.float32).min) in consts
    assert consts.count(4.0) == layers  # Div by sqrt(head_dim = 16)
    producers = {o: n for n in model.graph.node for o in n.output}
    assert all(producers[n.input[1]].op_type == "Concat"
               for n in model.graph.node if n.op_type == "Reshape")
    assert model.graph.output[0].name == "last_hidden_state"


def test_gpt2_patterns():
    layers, model = SMALL["gpt2_small"]["layers"], small("gpt2_small")
    ops = op_counts(model)
    assert ops["ReduceMean"] == 2 * (2 * layers + 1)
    assert ops["Tanh"] == ops["Softmax"] == ops["Where"] == ops["Split"] == layers
    assert ops["Slice"] == 2 * layers and ops["Erf"] == 0
    assert ops["MatMul"] == 6 * layers + 1
    consts = [float(c) for c in constant_values(model) if c.dtype == np.float32 and c.ndim == 0]
    for value in (0.5, 3.0, 0.044715, math.sqrt(2 / math.pi)):
        assert np.float32(value) in consts
    masks = [t for t in model.graph.initializer if t.name.endswith(".attn.bias")]
    assert len(masks) == layers and masks[0].data_type == onnx.TensorProto.BOOL
    assert np.array_equal(numpy_helper.to_array(masks[0])[0, 0],
                          np.tril(np.ones((32, 32), bool)))


def test_bert_ignores_padded_tokens():
    model = small("bert_base")
    feeds = zoo.sample_inputs(model, seed=1, dims={"batch_size": 1, "sequence_length": 12})
    keep = feeds["attention_mask"][0].astype(bool)
    assert keep[0] and not keep[-1]
    changed = {**feeds, "input_ids": np.where(keep, feeds["input_ids"], 0)}
    a, b = run(model, feeds)[0], run(model, changed)[0]
    np.testing.assert_allclose(a[0, keep], b[0, keep], rtol=1e-5, atol=1e-5)


def test_gpt2_is_causal():
    model = small("gpt2_small")
    feeds = zoo.sample_inputs(model, seed=1)
    changed = {"input_ids": feeds["input_ids"].copy()}
    changed["input_ids"][:, -1] = (changed["input_ids"][:, -1] + 1) % 100
    a, b = run(model, feeds)[0], run(model, changed)[0]
    np.testing.assert_allclose(a[:, :-1], b[:, :-1], rtol=1e-5, atol=1e-5)
    assert not np.allclose(a[:, -1], b[:, -1])


def test_sample_inputs():
    model = small("bert_base")
    feeds = zoo.sample_inputs(model, dims={"batch_size": 4, "sequence_length": 20})
    assert feeds["input_ids"].shape == feeds["attention_mask"].shape == (4, 20)
    assert feeds["input_ids"].dtype == np.int64 and feeds["input_ids"].max() < 100
    for row in feeds["attention_mask"]:
        n = int(row.sum())
        assert 0 < n < 20 and row[:n].all() and not row[n:].any()
    assert zoo.sample_inputs(model)["input_ids"].shape == (1, 16)
    with pytest.raises(ValueError):
        zoo.sample_inputs(model, dims={"sequence_length": 33})
    image = zoo.sample_inputs(small("resnet50"))["input"]
    assert image.shape == (1, 3, 64, 64) and image.dtype == np.float32


# Exact torch parameter counts (torchvision / HF without BERT's pooler), read from dims only.
DEFAULT_PARAMS = {"resnet50": 25_557_032, "mobilenetv2": 3_504_872, "bert_base": 108_891_648,
                  "gpt2_small": 1_868_800, "tiny": 5_466, "matmul256": 65_536,
                  "unet": 31_037_698, "blazepalm": 92_842, "lcnetv3": 659_267}


@pytest.mark.parametrize("name", NAMES)
def test_default_size_parameter_counts(name):
    assert zoo.param_count(zoo.build(name, weights=False)) == DEFAULT_PARAMS[name]


def test_headline_sizes():
    millions = {n: zoo.param_count(zoo.build(n, weights=False)) / 1e6
                for n in ("resnet50", "bert_base")}
    assert millions["resnet50"] == pytest.approx(25.5, abs=0.1)
    assert millions["bert_base"] == pytest.approx(110, rel=0.02)


@slow
@pytest.mark.parametrize("name", ["resnet50", "bert_base"])
def test_full_size_materialised(name):
    model = zoo.build(name)
    onnx.checker.check_model(model, full_check=True)
    assert zoo.param_count(model) == DEFAULT_PARAMS[name]
    out = run(model, zoo.sample_inputs(model))[0]
    assert np.isfinite(out).all()


def test_zoo_build_takes_a_builders_size_options_from_the_command_line(tmp_path, capsys):
    # The README's tables use small sizes (a 4-layer bert_base) that only Python could build.
    from helpers import run_cli

    out = tmp_path / "bert.onnx"
    rc, text, err = run_cli(capsys, "zoo", "build", "bert_base", "-o", out, "--set", "layers=2",
                            "--set", "hidden=64", "--set", "heads=2", "--set", "intermediate=128")
    assert rc == 0, err
    expected = zoo.build("bert_base", layers=2, hidden=64, heads=2, intermediate=128)
    assert onnx.load(out).SerializeToString() == expected.SerializeToString()
    rc, _, err = run_cli(capsys, "zoo", "build", "resnet50", "-o", tmp_path / "r.onnx",
                         "--set", "blocks=1,1,1,1", "--set", "width=0.125", "--set", "nhwc=true")
    assert rc == 0, err
    for setting, message in (("layer=2", "NAME one of its size options (layers=12, hidden=768"),
                             ("layers=two", "layers takes a value like its default, 12"),
                             ("hidden=100", "hidden 100 is not divisible by heads 12")):
        rc, _, err = run_cli(capsys, "zoo", "build", "bert_base", "-o", out, "--set", setting)
        assert rc == 2 and message in err, err
    rc, text, _ = run_cli(capsys, "zoo", "list")
    assert "layers=12, hidden=768, heads=12" in text
