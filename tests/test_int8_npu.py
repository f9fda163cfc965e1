"""INT8 on NPU targets: AMCT's QDQ form, its placement on the NPU, and the int8 cube estimates."""

from __future__ import annotations

import json
import re
import shlex
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import parse_model, run_cli

import graphopt
from graphopt import numerics, zoo
from graphopt.codegen import OmSession
from graphopt.ir import to_onnx
from graphopt.partition.layouts import assign_layouts
from graphopt.passes.base import anchor_key
from graphopt.tuner.model import model_estimate
from graphopt.tuner.npu_model import estimate
from graphopt.tuner.tiling import GemmShape, Tiling, buffer_use, default_tiling, out_bytes
from graphopt.tuner.signature import model_kernels

RNG = np.random.default_rng(11)
TARGETS = Path(graphopt.__file__).parent / "partition" / "targets"
OPSET17 = '<ir_version: 8, opset_import: ["" : 17]>\n'


def weight(*shape: int, scale: float = 0.2) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def residual_net() -> onnx.ModelProto:
    """A stem conv, a residual block of two convs, one more conv and a classifier: three of the
    five cube layers are quantized (the stem and the head are the model's ends)."""
    return parse_model("""
        g (float[1,8,16,16] x) => (float[1,10] scores) {
            c0 = Conv <pads = [1,1,1,1]> (x, w0, b0)
            r0 = Relu (c0)
            c1 = Conv <pads = [1,1,1,1]> (r0, w1, b1)
            r1 = Relu (c1)
            c2 = Conv <pads = [1,1,1,1]> (r1, w2, b2)
            s = Add (c2, r0)
            r2 = Relu (s)
            c3 = Conv (r2, w3, b3)
            r3 = Relu (c3)
            p = GlobalAveragePool (r3)
            f = Flatten (p)
            scores = Gemm <transB = 1> (f, wf, bf)
        }""", w0=weight(16, 8, 3, 3), b0=weight(16), w1=weight(16, 16, 3, 3), b1=weight(16),
        w2=weight(16, 16, 3, 3), b2=weight(16), w3=weight(32, 16, 1, 1), b3=weight(32),
        wf=weight(10, 32), bf=weight(10))


def mlp() -> onnx.ModelProto:
    """Token MLP: MatMul + bias, Relu, MatMul + bias, MatMul (a transformer FFN's GEMMs)."""
    return parse_model("""
        g (float[1,16,64] x) => (float[1,16,32] y) {
            h0 = MatMul (x, w0)
            a0 = Add (h0, b0)
            r0 = Relu (a0)
            h1 = MatMul (r0, w1)
            a1 = Add (h1, b1)
            r1 = Relu (a1)
            h2 = MatMul (r1, w2)
            y = Add (h2, b2)
        }""", w0=weight(64, 128, scale=0.1), b0=weight(128), w1=weight(128, 64, scale=0.1),
        b1=weight(64), w2=weight(64, 32, scale=0.1), b2=weight(32))


def calibration(tmp_path, name: str, shape: tuple[int, ...], samples: int = 8):
    path = tmp_path / f"{name}.npz"
    np.savez(path, **{name: RNG.standard_normal((samples, *shape)).astype(np.float32)})
    return path


def quantized(proto, tmp_path, input_shape, target="ascend310", **options):
    return graphopt.optimize(proto, target=target, quantize="int8",
                             calibration=calibration(tmp_path, "x", input_shape), **options)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def run_om(result, tmp_path, feeds) -> dict:
    path = tmp_path / "model.om"
    graphopt.save(result, path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the CPU stand-in notice
        return OmSession(path).run(feeds)


def dequantize_nodes(model):
    return [n for n in model.graph if n.op_type == "DequantizeLinear"]


# --- the form ------------------------------------------------------------------------------


def test_conv_net_quantizes_in_amct_form_and_stays_on_the_npu(tmp_path):
    proto = residual_net()
    result = quantized(proto, tmp_path, (1, 8, 16, 16))
    model = result.model
    placed = result.partitioning.placements
    assert {p.device for p in placed.values()} == {"npu"}, result.partitioning.fallbacks()
    assert not [n for n in result.notes if n.startswith("--quantize")]
    convs = {n.name or n.outputs[0].name: n for n in model.graph if n.op_type == "Conv"}
    int8 = [n for n in convs.values() if n.inputs[0].producer is not None
            and n.inputs[0].producer.op_type == "DequantizeLinear"]
    assert len(int8) == 3  # c1, c2, c3; the stem reads the graph input
    # Q/DQ feed the cube layers alone: the residual Add reads float r0, every Relu stays.
    for dq in dequantize_nodes(model):
        if not dq.inputs[0].is_constant:
            assert {n.op_type for n in dq.outputs[0].consumers()} == {"Conv"}
    add = next(n for n in model.graph if n.op_type == "Add")
    assert all(v.producer.op_type in ("Conv", "Relu") for v in add.inputs)
    assert sum(n.op_type == "Relu" for n in model.graph) == 4
    assert not any(n.op_type == "QuantizeLinear" and n.inputs[0].is_graph_output
                   for n in model.graph)
    # Conv weights per output channel, activations per tensor.
    for conv in int8:
        scale = conv.inputs[1].producer.inputs[1].constant()
        assert scale.shape == (conv.inputs[1].shape[0],)
        assert conv.inputs[0].producer.inputs[1].constant().size == 1
    feeds = {"x": RNG.standard_normal((1, 8, 16, 16)).astype(np.float32)}
    expected = numerics.run(proto, feeds)["scores"]
    actual = run_om(result, tmp_path, feeds)["scores"]
    assert cosine(actual, expected) > 0.999
    for part in result.partition_models.values():
        onnx.checker.check_model(to_onnx(part), full_check=True)


def test_matmuls_are_static_with_one_weight_scale_on_the_npu(tmp_path):
    proto = mlp()
    result = quantized(proto, tmp_path, (1, 16, 64), pass_options={"quant_keep_ends": False})
    model = result.model
    ops = [n.qualified_op for n in model.graph]
    assert "com.microsoft::DynamicQuantizeMatMul" not in ops
    matmuls = [n for n in model.graph if n.op_type == "MatMul"]
    assert len(matmuls) == 3
    for node in matmuls:
        data, w = (v.producer for v in node.inputs)
        assert data.op_type == w.op_type == "DequantizeLinear"
        assert w.inputs[1].constant().size == 1  # per tensor: AMCT's Gemm/MatMul form
    assert any("Gemm and MatMul weights get one scale per tensor" in n for n in result.notes)
    assert {p.device for p in result.partitioning.placements.values()} == {"npu"}
    feeds = {"x": RNG.standard_normal((1, 16, 64)).astype(np.float32)}
    expected = numerics.run(proto, feeds)["y"]
    assert cosine(run_om(result, tmp_path, feeds)["y"], expected) > 0.999
    # The same options on the cpu target keep onnxruntime's dynamic MatMuls.
    on_cpu = quantized(proto, tmp_path, (1, 16, 64), target="cpu",
                       pass_options={"quant_keep_ends": False})
    assert "com.microsoft::DynamicQuantizeMatMul" in [n.qualified_op for n in on_cpu.model.graph]


def test_sequence_profiles_share_the_ranges_of_the_length_calibrated(tmp_path):
    # ATC's dynamic dims with an AMCT model: one calibration, at sequence length 16.
    proto = mlp()
    for value in (proto.graph.input[0], proto.graph.output[0]):
        value.type.tensor_type.shape.dim[1].dim_param = "seq"
    result = quantized(proto, tmp_path, (1, 16, 64), dynamic_dims="seq:8,16,32",
                       pass_options={"quant_keep_ends": False})
    for profile in result.profiles:
        assert sum(n.op_type == "QuantizeLinear" for n in profile.result.model.graph) == 3
        assert {p.device for p in profile.result.partitioning.placements.values()} == {"npu"}
    path = tmp_path / "seq.om"
    graphopt.save(result, path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        session = OmSession(path)
    for seq in (8, 16, 32):
        x = RNG.standard_normal((1, seq, 64)).astype(np.float32)
        assert cosine(session.run({"x": x})["y"], numerics.run(proto, {"x": x})["y"]) > 0.999


def test_profiles_whose_fusions_differ_find_the_ranges_by_the_layers_reading_them(tmp_path):
    # At batch 1 a BERT's embeddings fuse into SkipLayerNormalization, at batch 2 they stay a
    # LayerNormalization: their output is named differently, the MatMuls reading it are not.
    proto = zoo.build("bert_base", layers=2, hidden=64, heads=4, intermediate=128, vocab=100,
                      max_positions=32)
    path = tmp_path / "bert_calib.npz"
    ids = RNG.integers(0, 100, (4, 1, 16))
    np.savez(path, input_ids=ids, attention_mask=np.ones_like(ids))
    result = graphopt.optimize(proto, target="ascend310", quantize="int8", calibration=path,
                               dynamic_dims="batch_size=1,sequence_length=16;"
                                            "batch_size=2,sequence_length=8")
    first, second = (Counter(n.qualified_op for n in p.result.model.graph)
                     for p in result.profiles)
    assert first - second == Counter({"com.microsoft::SkipLayerNormalization": 1})

    def input_scales(profile):  # each quantized MatMul's input scale, by the MatMul's name
        return {n.name: float(n.inputs[0].producer.inputs[1].constant())
                for n in profile.result.model.graph if n.op_type == "MatMul"
                and n.inputs[0].producer is not None
                and n.inputs[0].producer.op_type == "DequantizeLinear"}

    measured, borrowed = (input_scales(p) for p in result.profiles)
    assert len(measured) == 12 and borrowed == measured
    graphopt.save(result, tmp_path / "bert.om")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        session = OmSession(tmp_path / "bert.om")
    for batch, seq in ((1, 16), (2, 8)):
        feeds = {"input_ids": RNG.integers(0, 100, (batch, seq)),
                 "attention_mask": np.ones((batch, seq), np.int64)}
        want = numerics.run(proto, feeds)["last_hidden_state"]
        assert cosine(session.run(feeds)["last_hidden_state"], want) > 0.999


def test_tune_quantizes_as_optimize_does_and_optimize_finds_the_int8_tilings(tmp_path, capsys):
    model = tmp_path / "net.onnx"
    onnx.save(residual_net(), model)
    calib = calibration(tmp_path, "x", (1, 8, 16, 16))
    db = tmp_path / "tuning.db"
    flags = ["--target", "ascend310", "--quantize", "int8", "--calibration", calib]
    rc, out, err = run_cli(capsys, "tune", model, *flags, "--trials", "12", "--tuning-db", db,
                           "-q")
    assert rc == 0, err
    assert "/int8 " in out and "/float16 " in out  # the quantized convs, the float ends
    # The line tune prints compiles the int8 model: it had left the flags out, and said only
    # "(with the same precision options)", so that, pasted, it compiled a float model.
    line = next(line for line in out.splitlines() if line.startswith("apply them: "))
    argv = shlex.split(line.removeprefix("apply them: graphopt "))
    assert argv[argv.index("--quantize") + 1] == "int8"
    assert argv[argv.index("--calibration") + 1] == str(calib)
    argv[argv.index("-o") + 1] = str(tmp_path / "net.om")
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 0, err
    # Every cube kernel's signature, int8 ones included, is found: a tuned tiling, or the
    # default where the few trials found none faster.
    note = next(line for line in out.splitlines() if "--tuning-db: tuned tilings" in line)
    found = re.search(r"for (\d+) of (\d+) NPU cube kernel\(s\) on ascend310(?:; (\d+) keep)?",
                      note)
    assert int(found[1]) + int(found[3] or 0) == int(found[2]) and int(found[1]) > 0, note
    kernels = graphopt.codegen.load_om(tmp_path / "net.om").extra["kernels"]["partitions"]
    assert sum(k.get("tiling_source") == "tuned" for rows in kernels.values()
               for k in rows) == int(found[1])
    # The float compile finds the int8 shapes in another dtype only, and says so: it had
    # counted them as kernels the knowledge base does not hold.
    rc, out, err = run_cli(capsys, "optimize", model, "-o", tmp_path / "float.om", "--target",
                           "ascend310", "--tuning-db", db)
    assert rc == 0 and "other(s) have tilings stored for their shapes in int8 only" in out, out
    rc, out, err = run_cli(capsys, "tune", model, *flags, "--job", "subgraph")
    assert rc != 0 and "--precision/--quantize apply to --job op" in err


# --- the cost model ------------------------------------------------------------------------


def test_quantized_cube_kernels_are_int8_and_estimated_faster(tmp_path, capsys):
    proto = residual_net()
    float_result = graphopt.optimize(proto, target="ascend310")
    int8_result = quantized(proto, tmp_path, (1, 8, 16, 16))
    kernels = model_kernels(int8_result.model, int8_result.partitioning)
    dtypes = sorted(k.signature.rsplit("/", 1)[1] for k in kernels)
    assert dtypes.count("int8") >= 2 and "float16" in dtypes  # the float ends stay fp16
    float_rows = {r.name: r for r in model_estimate(
        float_result.model, float_result.partitioning).rows if r.kind == "cube"}
    int8_rows = {r.name: r for r in model_estimate(
        int8_result.model, int8_result.partitioning).rows if r.kind == "cube"}
    conv = next(n for n in int8_result.model.graph if n.op_type == "Conv"
                and n.inputs[0].producer is not None
                and n.inputs[0].producer.op_type == "DequantizeLinear")
    key = anchor_key(conv)
    assert int8_rows[key].estimate.cycles < float_rows[key].estimate.cycles
    # A weight's dequantization is done offline; an activation's is the cube's own.
    rows = {r.name: r for r in model_estimate(int8_result.model, int8_result.partitioning).rows}
    for dq in dequantize_nodes(int8_result.model):
        assert rows[anchor_key(dq)].seconds == 0.0
    # Each QuantizeLinear runs in the epilogue of the kernel that computes its input.
    quantize = [n for n in int8_result.model.graph if n.op_type == "QuantizeLinear"]
    assert quantize and all(rows[anchor_key(q)].estimate.breakdown["launch_s"] == 0.0
                            and rows[anchor_key(q)].seconds > 0 for q in quantize)
    assert model_estimate(int8_result.model, int8_result.partitioning).seconds \
        < model_estimate(float_result.model, float_result.partitioning).seconds
    # The artifact records each cube kernel's dtype, and inspect counts the int8 ones.
    graphopt.save(int8_result, tmp_path / "q.om")
    records = [r for part in graphopt.load(tmp_path / "q.om").artifact.extra["kernels"][
        "partitions"].values() for r in part if "tiling" in r]
    int8 = [r for r in records if r["dtype"] == "int8"]
    assert {r["dtype"] for r in records} == set(dtypes) and len(int8) >= 2
    rc, out, _ = run_cli(capsys, "inspect", tmp_path / "q.om")
    assert rc == 0 and f"{len(records)} ({len(int8)} int8)" in out, out


def test_an_int8_kernel_writes_float16_through_its_dequantize_epilogue():
    device = graphopt.partition.load_target("ascend310").device("npu")
    big = GemmShape(1, 1024, 1024, 1024, "int8")
    assert out_bytes(big) == 2  # AscendDequant in the UB: float16 reaches GM, not int32
    assert buffer_use(default_tiling(big, device), big)["UB"] \
        == default_tiling(big, device).base_m * default_tiling(big, device).base_n * 4 * 2
    half, int8 = (estimate(GemmShape(1, 1024, 1024, 1024, dtype), None, device)
                  for dtype in ("float16", "int8"))
    assert half.cycles / int8.cycles > 1.5  # compute bound: the int8 cube's doubled rate
    # The dequantize costs vector cycles in each tile's epilogue.
    tiling = Tiling(128, 128, 128, cores=2)
    wide = [estimate(GemmShape(1, 3136, 128, 256, dtype), tiling, device)
            for dtype in ("float16", "int8")]
    extra = wide[1].breakdown["writeback_cycles"] - wide[0].breakdown["writeback_cycles"]
    assert extra == pytest.approx(wide[1].breakdown["tiles_on_busiest_core"] * 128 * 128 * 4 / 256)


def test_a_dequantize_read_by_a_float_op_is_an_antiquant_kernel(tmp_path):
    proto = parse_model("""
        g (float[1,64,32] x) => (float[1,64,32] y) {
            q = QuantizeLinear (x, s, z)
            d = DequantizeLinear (q, s, z)
            y = Sigmoid (d)
        }""", s=np.float32(0.05), z=np.uint8(128))
    result = graphopt.optimize(proto, target="ascend310")
    assert {p.device for p in result.partitioning.placements.values()} == {"npu"}
    rows = {r.op: r for r in model_estimate(result.model, result.partitioning).rows}
    assert rows["DequantizeLinear"].estimate.breakdown["launch_s"] > 0  # an AscendAntiQuant
    assert rows["QuantizeLinear"].estimate.breakdown["launch_s"] > 0  # no kernel to fuse into


def test_a_quantize_after_a_view_fuses_into_the_kernel_before_the_view():
    # A classifier's Flatten before its quantized Gemm: the QuantizeLinear after the Flatten
    # was priced as a kernel of its own (10 µs on ascend310), so --quantize-ends estimated
    # the int8 head slower than the float one.
    def quantize_launch(outputs: str) -> float:
        proto = parse_model(f"""
            g (float[1,8,4,4] x) => ({outputs}) {{
                p = GlobalAveragePool (x)
                f = Flatten (p)
                q = QuantizeLinear (f, s, z)
                d = DequantizeLinear (q, s, z)
                y = Sigmoid (d)
            }}""", s=np.float32(0.05), z=np.uint8(128))
        result = graphopt.optimize(proto, target="ascend310")
        rows = {r.op: r for r in model_estimate(result.model, result.partitioning).rows}
        return rows["QuantizeLinear"].estimate.breakdown["launch_s"]

    assert quantize_launch("float[1,8] y") == 0
    # The float values are read on the way too: the pool writes them, the quantize is its own.
    assert quantize_launch("float[1,8] y, float[1,8] f") > 0


# --- what the NPU cannot take --------------------------------------------------------------


def qdq_matmul(weight_scale: np.ndarray, axis: str = "") -> onnx.ModelProto:
    return parse_model(f"""
        g (float[1,16,64] x) => (float[1,16,32] y) {{
            q = QuantizeLinear (x, s, z)
            d = DequantizeLinear (q, s, z)
            wd = DequantizeLinear {axis} (wq, ws, wz)
            y = MatMul (d, wd)
        }}""", s=np.float32(0.05), z=np.uint8(128),
        wq=RNG.integers(-127, 128, (64, 32)).astype(np.int8), ws=weight_scale,
        wz=np.zeros(weight_scale.shape, np.int8))


def host_reasons(result) -> dict[str, str]:
    return {n.op_type + ":" + (n.name or n.outputs[0].name): r
            for n, r in result.partitioning.fallbacks()}


def test_a_matmul_weight_per_channel_stays_on_the_host_with_the_reason():
    per_tensor = graphopt.optimize(qdq_matmul(np.float32(0.01)), target="ascend310")
    assert {p.device for p in per_tensor.partitioning.placements.values()} == {"npu"}
    per_column = graphopt.optimize(qdq_matmul(np.full(32, 0.01, np.float32), "<axis = 1>"),
                                   target="ascend310")
    reasons = [r for n, r in per_column.partitioning.fallbacks()
               if n.op_type == "DequantizeLinear"]
    assert ("MatMul (output %y) weight %wq quantized per channel: AMCT's NPU form takes Gemm "
            "and MatMul weights per tensor") in reasons


@pytest.mark.parametrize("text, expected", [
    # An activation quantized per channel.
    ("""q = QuantizeLinear <axis = 1> (x, sc, zc)
        d = DequantizeLinear <axis = 1> (q, sc, zc)
        y = Relu (d)""", "per axis: AscendQuant and AscendDequant take one scale per activation"),
    # Two quantized activations into one MatMul.
    ("""q = QuantizeLinear (x, s, z)
        d = DequantizeLinear (q, s, z)
        t = Transpose <perm = [0, 2, 1]> (x)
        q2 = QuantizeLinear (t, s, z)
        d2 = DequantizeLinear (q2, s, z)
        m = MatMul (d, d2)
        y = ReduceSum <keepdims = 1> (m, axes)""", "quantizes only constant weights"),
    # A quantized constant that is no layer's weight.
    ("""cd = DequantizeLinear (cq, s, z)
        y = Add (x, cd)""", "quantizes only Conv, Gemm and MatMul weights"),
])
def test_qdq_outside_amct_form_stays_on_the_host_with_the_reason(text, expected):
    header_io = "g (float[1,16,16] x) => (y) {"
    proto = parse_model(f"{header_io}\n{text}\n}}", s=np.float32(0.05), z=np.uint8(128),
                        sc=np.full(16, 0.05, np.float32), zc=np.full(16, 128, np.uint8),
                        cq=RNG.integers(0, 255, (1, 16, 16)).astype(np.uint8),
                        axes=np.array([2], np.int64))
    result = graphopt.optimize(proto, target="ascend310")
    reasons = [r for n, r in result.partitioning.fallbacks()
               if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert any(expected in r for r in reasons), reasons


def qdq_layer(op: str, weight: np.ndarray, scale: np.ndarray, attrs: str = "",
              zero: np.ndarray | None = None, shape: str = "1,16,64") -> onnx.ModelProto:
    """x → Q → DQ → `op`(·, DQ(weight)) → y, a QDQ layer as a QAT export writes it."""
    zero = np.zeros(scale.shape, np.int8) if zero is None else zero
    return parse_model(f"""
        g (float[{shape}] x) => (y) {{
            q = QuantizeLinear (x, s, z)
            d = DequantizeLinear (q, s, z)
            wd = DequantizeLinear {attrs} (wq, ws, wz)
            y = {op} (d, wd)
        }}""", s=np.float32(0.05), z=np.uint8(128), wq=weight, ws=scale, wz=zero)


def int8_weight(*shape: int) -> np.ndarray:
    return RNG.integers(-127, 128, shape).astype(np.int8)


@pytest.mark.parametrize("proto, expected", [
    (qdq_layer("Conv", int8_weight(8, 16, 3, 3), np.full(16, 0.01, np.float32), "<axis = 1>",
               shape="1,16,8,8"),
     "quantized along axis 1: AMCT's NPU form takes one scale per output channel (axis 0)"),
    (qdq_layer("MatMul", int8_weight(2, 64, 32), np.float32(0.01), shape="2,16,64"),
     "has 3 dims: AMCT's NPU form quantizes a MatMul's 2-D weight only"),
    (qdq_layer("MatMul", int8_weight(64, 32), np.float32(0.01), zero=np.int8(3)),
     "has a non-zero zero point: AMCT's NPU form quantizes weights symmetrically"),
], ids=["conv-weight-per-input-channel", "matmul-3d-weight", "asymmetric-weight"])
def test_weights_outside_amct_form_keep_their_layer_on_the_host(proto, expected):
    result = graphopt.optimize(proto, target="ascend310")
    reasons = {n.op_type: r for n, r in result.partitioning.fallbacks()}
    assert expected in reasons["DequantizeLinear"]
    layer = next(op for op in ("Conv", "MatMul") if op in reasons)
    assert reasons[layer].startswith("its weight's DequantizeLinear stays on the host: ")


def test_a_per_channel_gemm_head_takes_its_dequantized_input_and_bias_to_the_host():
    # onnxruntime's per-channel QDQ of a classifier head: the Gemm stays on the host, and the
    # DequantizeLinear of its input and bias with it, so int8 data crosses the link, not float.
    proto = parse_model("""
        g (float[1,64] x) => (y) {
            q = QuantizeLinear (x, s, z)
            d = DequantizeLinear (q, s, z)
            wd = DequantizeLinear <axis = 0> (wq, ws, wz)
            bd = DequantizeLinear (bq, bs)
            y = Gemm <transB = 1> (d, wd, bd)
        }""", s=np.float32(0.05), z=np.uint8(128), wq=int8_weight(10, 64),
        ws=np.full(10, 0.01, np.float32), wz=np.zeros(10, np.int8),
        bq=RNG.integers(-500, 500, 10).astype(np.int32), bs=np.float32(0.0005))
    result = graphopt.optimize(proto, target="ascend310", level=1)
    host = {n.name or n.outputs[0].name: p.device for n, p in result.partitioning.placements.items()}
    assert host["y"] == host["d"] == host["bd"] == host["wd"] == "cpu"
    reason = dict((n.outputs[0].name, r) for n, r in result.partitioning.fallbacks())["d"]
    assert reason.startswith("read only by layers that stay on the host (its weight's")


def test_dequantized_activation_of_another_dtype_stays_on_the_host():
    proto = parse_model("""
        g (int32[1,16] x) => (y) {
            d = DequantizeLinear (x, s)
            y = Relu (d)
        }""", s=np.float32(0.05))
    result = graphopt.optimize(proto, target="ascend310")
    (reason,) = [r for n, r in result.partitioning.fallbacks() if n.op_type == "DequantizeLinear"]
    assert reason == ("DequantizeLinear of a int32 activation %x: AscendDequant and "
                      "AscendAntiQuant take int8")


def test_a_profile_without_an_int8_cube_keeps_quantized_ops_on_the_host(tmp_path):
    profile = json.loads((TARGETS / "ascend310.json").read_text())
    npu = profile["devices"][0]
    del npu["cube"]["int8"], npu["peak_ops_per_s"]["int8"], profile["sources"]["npu.cube.int8"]
    del profile["sources"]["npu.peak_ops_per_s.int8"]
    path = tmp_path / "no_int8.json"
    path.write_text(json.dumps(profile))
    result = graphopt.optimize(qdq_layer("MatMul", int8_weight(64, 32), np.float32(0.01)),
                               target=str(path))
    reasons = [r for n, r in result.partitioning.fallbacks() if n.op_type == "QuantizeLinear"]
    assert reasons == ["QuantizeLinear: the npu profile has no int8 cube (cube.int8), so no "
                       "int8 kernels"]


def test_fused_groups_take_dequantized_weights_and_stay_on_the_npu(tmp_path):
    # -O3 with epilogue fusion: a Conv heads its elementwise group, a graphopt:: call.
    proto = residual_net()
    options = {"elementwise_epilogues": True}
    plain = graphopt.optimize(proto, target="ascend310", level=3, pass_options=options)
    result = quantized(proto, tmp_path, (1, 8, 16, 16), level=3, pass_options=options)
    assert any(n.domain == "graphopt" for n in result.model.graph)
    assert {p.device for p in result.partitioning.placements.values()} == {"npu"}
    assert model_estimate(result.model, result.partitioning).seconds \
        < model_estimate(plain.model, plain.partitioning).seconds
    feeds = {"x": RNG.standard_normal((1, 8, 16, 16)).astype(np.float32)}
    assert cosine(run_om(result, tmp_path, feeds)["scores"],
                  numerics.run(proto, feeds)["scores"]) > 0.999


def test_fused_convs_with_any_activation_are_quantized_at_o3(tmp_path):
    # FuseActivation makes FusedConv(Clip) of Conv + Clip(0, 6); AMCT keeps the activation.
    proto = parse_model("""
        g (float[1,8,16,16] x) => (float[1,10] scores) {
            c0 = Conv <pads = [1,1,1,1]> (x, w0)
            r0 = Clip (c0, lo, hi)
            c1 = Conv <pads = [1,1,1,1]> (r0, w1)
            r1 = Clip (c1, lo, hi)
            c2 = Conv <pads = [1,1,1,1]> (r1, w2)
            r2 = Clip (c2, lo, hi)
            p = GlobalAveragePool (r2)
            f = Flatten (p)
            scores = Gemm <transB = 1> (f, wf)
        }""", w0=weight(16, 8, 3, 3), w1=weight(16, 16, 3, 3), w2=weight(16, 16, 3, 3),
        wf=weight(10, 16), lo=np.float32(0), hi=np.float32(6))
    result = quantized(proto, tmp_path, (1, 8, 16, 16), level=3)
    fused = [n for n in result.model.graph if n.op_type == "FusedConv"]
    assert fused and sum(n.inputs[0].producer is not None
                         and n.inputs[0].producer.op_type == "DequantizeLinear" for n in fused) == 2
    feeds = {"x": RNG.standard_normal((1, 8, 16, 16)).astype(np.float32)}
    assert cosine(run_om(result, tmp_path, feeds)["scores"],
                  numerics.run(proto, feeds)["scores"]) > 0.999


def test_quantized_weights_are_converted_offline_not_by_transdata(tmp_path):
    proto = residual_net()
    layouts = assign_layouts(graphopt.optimize(proto, target="ascend310").partitioning)
    int8 = assign_layouts(quantized(proto, tmp_path, (1, 8, 16, 16)).partitioning)
    (plain,), (quant,) = layouts.values(), int8.values()
    assert len(quant.weights) == len(plain.weights) and len(quant.transdata) == len(plain.transdata)


def test_quantized_ops_left_on_the_host_are_named_in_a_note(tmp_path):
    # INT4's MatMulNBits is onnxruntime's own: no NPU kernel.
    result = graphopt.optimize(mlp(), target="ascend310", quantize="int4")
    (note,) = [n for n in result.notes if n.startswith("quantize='int4' target='ascend310'")]
    placed = result.partitioning.placements
    host = sum(p.device == "cpu" for p in placed.values())
    others = host - 3
    assert others > 0 and note == (
        "quantize='int4' target='ascend310': 3 quantized op(s) (com.microsoft::MatMulNBits) run "
        "on the host CPU, e.g.: no npu kernel for com.microsoft::MatMulNBits; "
        f"{others} other node(s) run there too, for their own reasons (`graphopt partition` "
        "lists every reason)")
    assert not [n for n in graphopt.optimize(mlp(), target="ascend310").notes
                if "--quantize" in n]


# --- judged as the NPU computes it --------------------------------------------------------


def test_an_npu_int8_compile_is_judged_without_the_cpus_int8_kernels(tmp_path):
    # The NPU sums int8 products in int32; the CPU provider standing in for it would fuse the
    # Q/DQ pairs into its own int8 kernels, whose 16-bit pair sums saturate without VNNI. The
    # .onnx says it was made for an NPU, which deployed_level reads, and the .om's NPU
    # partition runs at "basic", where onnxruntime keeps the pairs as they are.
    from graphopt.codegen import load_om
    from graphopt.tools.accuracy_rule import LOSSY_DEVICE_KEY, deployed_level

    proto = residual_net()
    npu = quantized(proto, tmp_path, (1, 8, 16, 16))
    written = npu.to_onnx()
    props = {p.key: p.value for p in written.metadata_props}
    assert props[LOSSY_DEVICE_KEY] == "npu" and deployed_level(written.metadata_props) == "disable"
    cpu = quantized(proto, tmp_path, (1, 8, 16, 16), target="cpu")
    assert deployed_level(cpu.to_onnx().metadata_props) == "all"
    graphopt.save(npu, tmp_path / "npu.om")
    (part,) = load_om(tmp_path / "npu.om").manifest["partitions"]
    assert part["device"] == "npu" and part["optimization_level"] == "basic"
    feeds = {"x": RNG.standard_normal((1, 8, 16, 16)).astype(np.float32)}
    simulated = numerics.run(written, feeds)["scores"]  # ORT_DISABLE_ALL: Q/DQ in float
    np.testing.assert_allclose(run_om(npu, tmp_path, feeds)["scores"], simulated, rtol=1e-5,
                               atol=1e-6)
