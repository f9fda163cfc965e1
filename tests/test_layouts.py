"""Device formats of NPU partitions: NC1HWC0 activations, FRACTAL_Z conv weights, FRACTAL_NZ
matmul operands, and TransData only where formats really change once pairs that meet cancel."""

from __future__ import annotations

import json

import numpy as np
import onnx.parser
from helpers import parse_model

import graphopt
from graphopt import zoo
from graphopt.partition.layouts import FRACTAL_NZ, FRACTAL_Z, NC1HWC0
from graphopt.partition.report import format_partitioning

RNG = np.random.default_rng(3)


def build(text: str, **weights: np.ndarray) -> onnx.ModelProto:
    return parse_model(text, **weights)


def weight(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.1).astype(np.float32)


def layout_of(proto, **options):
    result = graphopt.optimize(proto, target="ascend310", **options)
    (layout,) = result.partitioning.layouts.values()
    return layout


def _conv_relu() -> onnx.ModelProto:
    return build("""
        g (float[1,32,28,28] x) => (float[1,32,28,28] y) {
            a = Conv <pads = [1,1,1,1]> (x, w1)
            y = Relu (a)
        }""", w1=weight(32, 32, 3, 3))


def conversions(layout) -> list[tuple[str, str, str]]:
    return sorted((t["tensor"], t["from"], t["to"]) for t in layout.transdata)


def test_conv_chain_converts_only_at_its_ends():
    proto = build("""
        g (float[1,32,28,28] x) => (float[1,32,28,28] y) {
            a = Conv <pads = [1,1,1,1]> (x, w1)
            r = Relu (a)
            b = Conv <pads = [1,1,1,1]> (r, w2)
            s = Add (b, x)
            y = Relu (s)
        }""", w1=weight(32, 32, 3, 3), w2=weight(32, 32, 3, 3))
    layout = layout_of(proto, level=1)
    assert layout.formats == {"a": NC1HWC0, "r": NC1HWC0, "b": NC1HWC0, "s": NC1HWC0, "y": NC1HWC0}
    assert layout.weights == {"w1": FRACTAL_Z, "w2": FRACTAL_Z}
    # x enters once for the conv and once for the residual Add, which reads it as NC1HWC0 too;
    # y leaves once. Naively every conv converts in and out, and the Add and Relus read ND.
    assert conversions(layout) == [("x", "ND", NC1HWC0), ("y", NC1HWC0, "ND")]
    entering = next(t for t in layout.transdata if t["tensor"] == "x")
    assert len(entering["readers"]) == 2  # one conversion serves the conv and the Add
    assert layout.naive_transdata > len(layout.transdata)


def test_matmul_operands_are_fractal_nz_and_reshape_reads_nd():
    proto = build("""
        g (float[64,256] x) => (float[4,16,128] y) {
            h = MatMul (x, w)
            b = Add (h, bias)
            y = Reshape (b, shape)
        }""", w=weight(256, 128), bias=weight(128), shape=np.array([4, 16, 128], np.int64))
    layout = layout_of(proto, level=1)
    assert layout.weights == {"w": FRACTAL_NZ}
    assert layout.formats == {"h": FRACTAL_NZ, "b": FRACTAL_NZ}
    assert conversions(layout) == [("b", FRACTAL_NZ, "ND"), ("x", "ND", FRACTAL_NZ)]


def test_resnet_converts_four_times_instead_of_around_every_op():
    proto = zoo.build("resnet50", blocks=(1, 1, 1, 1), width=0.25, image_size=64)
    layout = layout_of(proto, input_shapes="input:1,3,64,64")
    assert set(layout.weights.values()) == {FRACTAL_Z, FRACTAL_NZ}
    # In for the stem conv; out of NC1HWC0 for Flatten; into FRACTAL_NZ for the classifier Gemm;
    # the logits back to ND for the caller.
    assert len(layout.transdata) == 4
    assert layout.naive_transdata > 20


def test_formats_travel_in_the_artifact(tmp_path):
    proto = zoo.build("resnet50", blocks=(1, 1, 1, 1), width=0.25, image_size=64)
    result = graphopt.optimize(proto, target="ascend310", input_shapes="input:1,3,64,64")
    graphopt.save(result, tmp_path / "r.om")
    extra = graphopt.codegen.load_om(tmp_path / "r.om").extra
    (entry,) = extra["partitioning"]["layouts"].values()
    assert len(entry["transdata"]) == 4 and FRACTAL_Z in entry["weights"].values()
    # The partition model itself stays ND: onnxruntime runs it unchanged.
    ops = {n.op_type for n in graphopt.codegen.load_om(tmp_path / "r.om").partitions[0].model.graph.node}
    assert "TransData" not in ops


def test_host_partitions_have_no_formats():
    result = graphopt.optimize(build("""
        g (float[8] x) => (float[8] y) { y = Relu (x) }"""), target="cpu")
    assert result.partitioning.layouts == {}


def test_an_npu_without_a_cube_engine_keeps_its_tensors_nd(tmp_path):
    # The formats are the cube's: a profile whose convs run on a vector engine has none.
    profile = tmp_path / "nocube.json"
    profile.write_text(json.dumps({
        "schema_version": 1, "name": "nocube", "primary": "npu", "host": "cpu",
        "transfer": {"bandwidth": 1e9, "latency_s": 1e-5},
        "devices": [
            {"name": "npu", "kind": "npu", "providers": ["CANNExecutionProvider"],
             "static_shapes": True, "peak_ops_per_s": {"float32": 1e12},
             "memory_bandwidth": 1e10, "launch_overhead_s": 1e-5,
             "engines": {"vec": {"kind": "vector", "ops": {"Conv": {}, "Relu": {}}}}},
            {"name": "cpu", "kind": "cpu", "providers": ["CPUExecutionProvider"],
             "ops": "onnxruntime", "peak_ops_per_s": {"float32": 1e11},
             "memory_bandwidth": 1e10, "launch_overhead_s": 1e-6}]}))
    proto = _conv_relu()
    result = graphopt.optimize(proto, target=str(profile), level=1)
    assert [p.device for p in result.partitioning.partitions] == ["npu"]
    assert result.partitioning.layouts == {}
    assert "device formats" not in format_partitioning(result.partitioning)


def test_cancelling_never_ends_with_more_conversions_than_the_naive_placement():
    # NZ carried into the Add would convert the bias computed at run time to NZ and the sum
    # back to ND for the Softmax: two conversions for the one it saves (T5's attention).
    layout = layout_of(build("""
        g (float[1,64,64] a, float[1,64,64] b, float[1,64,64] m) => (float[1,64,64] y) {
          s = MatMul(a, b)
          bias = Relu(m)
          t = Add(s, bias)
          y = Softmax(t)
        }"""))
    assert layout.naive_transdata == 3
    assert len(layout.transdata) == 3
    assert ("s", FRACTAL_NZ, "ND") in conversions(layout)


def test_a_conv_a_profile_runs_on_its_vector_engine_gets_no_fractal_format_nor_tiling(tmp_path):
    # Moved to the vector engine, Conv was still laid out in FRACTAL_Z, given a cube tiling in
    # the .om's kernel records and offered to `tune`: as if the cube ran it.
    from graphopt.cli_targets import target_json
    from graphopt.partition import load_target
    from graphopt.tuner.signature import model_kernels

    doc = target_json(load_target("ascend310"))
    npu = next(d for d in doc["devices"] if d["name"] == "npu")
    npu["engines"]["vector"]["ops"]["Conv"] = npu["engines"]["cube"]["ops"].pop("Conv")
    doc["name"] = "conv_on_vector"
    path = tmp_path / "board.json"
    path.write_text(json.dumps(doc))
    proto = _conv_relu()
    result = graphopt.optimize(proto, target=str(path), level=1)
    (layout,) = result.partitioning.layouts.values()
    assert layout.weights == {} and layout.formats == {} and layout.transdata == []
    assert model_kernels(result.model, result.partitioning) == []


def test_1d_and_3d_convs_read_their_device_formats():
    # Only rank-4 convs had any: a 1-D conv (which CANN runs as a 2-D one over [N, C, 1, W])
    # and a 3-D one reported all ND and no TransData, understating their conversions.
    from graphopt.partition.layouts import FRACTAL_Z_3D, NDC1HWC0

    one = build("""
        g (float[1,32,512] x) => (float[1,32,512] y) {
            a = Conv <pads = [1,1]> (x, w)
            y = Relu (a)
        }""", w=weight(32, 32, 3))
    layout = layout_of(one, level=1)
    assert layout.formats == {"a": NC1HWC0, "y": NC1HWC0} and layout.weights == {"w": FRACTAL_Z}
    three = build("""
        g (float[1,16,8,16,16] x) => (float[1,16,8,16,16] y) {
            a = Conv <pads = [1,1,1,1,1,1]> (x, w)
            y = Relu (a)
        }""", w=weight(16, 16, 3, 3, 3))
    layout = layout_of(three, level=1)
    assert layout.formats == {"a": NDC1HWC0, "y": NDC1HWC0}
    assert layout.weights == {"w": FRACTAL_Z_3D}
    assert conversions(layout) == [("x", "ND", NDC1HWC0), ("y", NDC1HWC0, "ND")]


def _dense_block(growth: int, axis: int = 1) -> onnx.ModelProto:
    """Two convs whose outputs a Concat joins and a third conv reads (a DenseNet's or an
    RRDB's dense connection), `growth` channels each, joined along `axis`."""
    joined = [1, 2 * growth, 14, 14] if axis == 1 else [1, growth, 28, 14]
    return build(f"""
        g (float[1,{growth},14,14] x) => (float[1,16,{joined[2]},14] y) {{
            a = Conv <pads = [1,1,1,1]> (x, w1)
            b = Conv <pads = [1,1,1,1]> (a, w2)
            c = Concat <axis = {axis}> (a, b)
            y = Conv <pads = [1,1,1,1]> (c, w3)
        }}""", w1=weight(growth, growth, 3, 3), w2=weight(growth, growth, 3, 3),
                 w3=weight(16, joined[1], 3, 3))


def test_a_concat_of_whole_channel_blocks_joins_them_in_nc1hwc0():
    layout = layout_of(_dense_block(32))
    assert layout.formats["c"] == NC1HWC0
    assert conversions(layout) == [("x", "ND", NC1HWC0), ("y", NC1HWC0, "ND")]
    # Along H the channels need not fill blocks: the Concat joins rows of whole pixels.
    layout = layout_of(_dense_block(24, axis=2))
    assert layout.formats["c"] == NC1HWC0 and len(layout.transdata) == 2


def test_a_concat_of_channels_that_split_a_block_reads_them_nd():
    # 24 channels end inside their second 16-channel block: joined in NC1HWC0, the second
    # input's channels would start after padding.
    layout = layout_of(_dense_block(24))
    assert "c" not in layout.formats
    assert ("a", NC1HWC0, "ND") in conversions(layout)
