"""The analytical NPU cost model and tiling space (graphopt.tuner): feasibility names the
buffer, estimates move the right way with work, buffering, cores and fusion, and the default
tiling is feasible everywhere but leaves room for tuning."""

from __future__ import annotations

import dataclasses
import itertools
import math

import onnx
import onnx.parser
import pytest

from graphopt import optimize
from graphopt.ir import load_onnx
from graphopt.partition.target import load_target
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.tuner import (GemmShape, Tiling, best_tiling, default_tiling, estimate, feasible,
                            gemm_shape, group_estimate, model_estimate, tiling_space,
                            transfer_estimate, vector_estimate)
from graphopt.tuner.signature import node_signature, parse_signature
from graphopt.tuner.tiling import ConvGeometry

NPUS = ("ascend310", "ascend310b", "ascend910b")
HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'


def npu(name: str):
    return load_target(name).device("npu")


def ir(text: str):
    model = load_onnx(onnx.parser.parse_model(HEADER + text))
    infer_shapes(model)
    return model


def the(model, op_type):
    (node,) = [n for n in model.graph if n.op_type == op_type]
    return node


def conv(cin: int, size: int, cout: int, kernel: int, stride: int = 1, pad: int = 0,
         dtype: str = "float16", batch: int = 1, dilation: int = 1) -> GemmShape:
    """The GemmShape gemm_shape gives a square 2-D Conv (with its geometry)."""
    out = (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1
    geometry = ConvGeometry((size, size), (out, out), (kernel, kernel), (stride, stride),
                            (dilation, dilation))
    return GemmShape(1, batch * out * out, cin * kernel * kernel, cout, dtype, geometry)


SHAPES = {
    "matmul_256": GemmShape(1, 256, 256, 256, "float16"),
    "bert_qkv": GemmShape(1, 128, 768, 768, "float16"),
    "bert_ffn": GemmShape(1, 128, 768, 3072, "float16"),
    "bert_ffn_int8": GemmShape(1, 128, 768, 3072, "int8"),
    "resnet_conv1": conv(3, 224, 64, 7, 2, 3),
    "resnet_3x3_64": conv(64, 56, 64, 3, 1, 1),
    "resnet_1x1_256": conv(256, 56, 64, 1),
    "resnet_3x3_512": conv(512, 7, 512, 3, 1, 1),
    "resnet_1x1_2048": conv(1024, 7, 2048, 1),
    "resnet_3x3_int8": conv(256, 14, 256, 3, 1, 1, "int8"),
    "attention_scores": GemmShape(12, 128, 64, 128, "float16"),
}


@pytest.mark.parametrize("target", NPUS)
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_default_tiling_is_feasible(target, name):
    device = npu(target)
    tiling = default_tiling(SHAPES[name], device)
    assert feasible(tiling, SHAPES[name], device) is None
    result = estimate(SHAPES[name], tiling, device)
    assert result.seconds > device.launch_overhead_s and result.cycles > 0


@pytest.mark.parametrize("target", NPUS)
def test_bigger_work_is_never_cheaper_under_the_default(target):
    device = npu(target)
    sizes = [1, 16, 17, 100, 128, 255, 256, 300, 768, 1024]
    for m, k, n in itertools.product(sizes, repeat=3):
        base = estimate(GemmShape(1, m, k, n), None, device).seconds
        for bigger in ((m + 1, k, n), (m, k + 1, n), (m, k, n + 1), (2 * m, k, n), (m, 2 * k, n),
                       (m, k, 2 * n)):
            assert estimate(GemmShape(1, *bigger), None, device).seconds >= base * (1 - 1e-9), \
                ((m, k, n), bigger)
        assert estimate(GemmShape(2, m, k, n), None, device).seconds >= base


def test_infeasible_tilings_name_the_buffer():
    shape = SHAPES["matmul_256"]
    a310, a910 = npu("ascend310"), npu("ascend910b")
    # L0C: 256×128 fp32 accumulators, double buffered = 256 KiB; the 310 has 256, the 910B 128.
    wide = Tiling(256, 128, 64, 2, True, 1)
    assert feasible(wide, shape, a310) is None
    assert feasible(wide, shape, a910).startswith("L0C overflows")
    # L1: 8 K-steps of 128×128 A and B tiles, double buffered = 1 MiB; 310 1 MiB, 910B 512 KiB.
    deep = Tiling(128, 128, 128, 8, True, 1)
    assert feasible(deep, GemmShape(1, 256, 2048, 256), a310) is None
    assert feasible(deep, GemmShape(1, 256, 2048, 256), a910).startswith("L1 overflows")
    # L0A: 256×128 fp16 double buffered = 128 KiB on a 64 KiB L0A, on every profile.
    assert feasible(Tiling(256, 16, 128, 1, True, 1), shape, a310).startswith("L0A overflows")
    assert feasible(Tiling(16, 256, 128, 1, True, 1), shape, a310).startswith("L0B overflows")
    assert "multiple of the cube" in feasible(Tiling(24, 16, 16, 1, True, 1), shape, a310)
    assert "AI cores" in feasible(Tiling(16, 16, 16, 1, True, 3), shape, a310)
    with pytest.raises(ValueError, match="L0C overflows"):
        estimate(shape, wide, a910)
    assert all(feasible(t, shape, a910) is None for t in itertools.islice(tiling_space(shape, a910), 500))


def test_double_buffering_helps_memory_bound_and_barely_costs_compute_bound():
    device = npu("ascend310")
    gemv = GemmShape(1, 16, 4096, 4096)
    on = estimate(gemv, Tiling(16, 128, 128, 2, True, 2), device)
    off = estimate(gemv, Tiling(16, 128, 128, 2, False, 2), device)
    assert on.bound == "memory" and on.cycles < 0.85 * off.cycles
    square = GemmShape(1, 1024, 1024, 1024)
    on = estimate(square, Tiling(256, 128, 64, 8, True, 1), device)
    off = estimate(square, Tiling(256, 128, 64, 8, False, 1), device)
    assert on.breakdown["cube_cycles"] >= on.breakdown["gm_to_l1_cycles"]  # the cube sets the pace
    assert on.cycles <= off.cycles * 1.05


@pytest.mark.parametrize("target", ["ascend310", "ascend910b"])
@pytest.mark.parametrize("shape", [GemmShape(1, 64, 64, 64), GemmShape(1, 1, 1024, 1024),
                                   GemmShape(8, 128, 64, 768), GemmShape(1, 196, 2304, 256,
                                                                         "int8")])
def test_double_buffering_never_prices_a_tiling_slower(target, shape):
    # The pipeline fill charged the first L1 load's steps, which the loop counts already, and
    # the last writeback twice: 64x32x48 at L1 depth 2 on both cores of the 310 priced 1,122
    # cycles double buffered, 710 single.
    device = npu(target)
    for tiling in itertools.islice(tiling_space(shape, device), 0, None, 3):  # a third: time
        if tiling.double_buffer:
            single = dataclasses.replace(tiling, double_buffer=False)
            assert estimate(shape, tiling, device).cycles <= \
                estimate(shape, single, device).cycles * (1 + 1e-9), tiling


def test_memory_bound_shapes_come_out_as_such():
    device = npu("ascend910b")
    assert estimate(GemmShape(1, 1, 4096, 4096), None, device).bound == "memory"
    breakdown = estimate(GemmShape(1, 1, 4096, 4096), None, device).breakdown
    assert breakdown["gm_to_l1_cycles"] > 10 * breakdown["cube_cycles"]


def test_more_cores_help_a_large_gemm():
    device = npu("ascend910b")
    shape = GemmShape(1, 2048, 2048, 2048)
    times = [estimate(shape, Tiling(128, 128, 64, 2, True, cores), device).cycles
             for cores in (1, 4, 20)]
    assert times[0] > times[1] > times[2]
    assert times[0] / times[2] > 1.5


def test_ascend310_matmul_256_has_a_tiling_faster_than_the_default():
    """The tuning acceptance example: exhaustive search over the whole space (1.161x in
    cycles, 1.093x in seconds; the issue's goal of 1.30x is not met, see the README)."""
    device = npu("ascend310")
    shape = SHAPES["matmul_256"]
    space = list(tiling_space(shape, device))
    assert len(space) == 25784
    default = estimate(shape, default_tiling(shape, device), device)
    best, found = best_tiling(shape, device, space)
    assert default_tiling(shape, device) == Tiling(128, 128, 128, 2, True, 2)
    # Kernel cycles on the AI cores; seconds add the same 10 µs launch to both.
    assert default.cycles / found.cycles >= 1.15
    assert default.seconds > found.seconds
    assert feasible(best, shape, device) is None


@pytest.mark.parametrize("shape", [GemmShape(64, 16, 16, 16), GemmShape(1, 3136, 64, 256),
                                   GemmShape(1, 196, 256, 1024, "int8")],
                         ids=["batched-tiny", "one-k-step", "int8-one-k-step"])
def test_the_best_tiling_is_never_worse_than_the_default(shape):
    # With one K-step, an L1 depth of 2 brings no second step: its DMA costs the same as at
    # depth 1, which the space holds (it used to halve the setup of a DMA that cannot be shared).
    device = npu("ascend310")
    default = estimate(shape, default_tiling(shape, device), device)
    assert best_tiling(shape, device)[1].cycles <= default.cycles


def test_conv_transpose_is_a_cube_kernel_over_its_output_pixels():
    # CANN runs it as a conv over the stride-dilated input: one GEMM row per output pixel.
    model = ir("g (float[1, 32, 16, 16] x, float[32, 16, 2, 2] w) => (y) {\n"
               "  y = ConvTranspose <strides = [2, 2]> (x, w)\n}")
    node = the(model, "ConvTranspose")
    assert gemm_shape(node) == GemmShape(1, 32 * 32, 32 * 2 * 2, 16, "float32", ConvGeometry(
        (16, 16), (32, 32), (2, 2), (2, 2), (1, 1), transposed=True))
    assert node_signature(node, "ascend310") == \
        "ascend310/conv/b1_m1024_k128_n16_i16x16_o32x32_f2x2_s2x2_d1x1_t/float16"
    assert parse_signature(node_signature(node, "ascend310"))[2] == \
        dataclasses.replace(gemm_shape(node), dtype="float16")
    grouped = ir("g (float[1, 32, 8, 8] x, float[32, 4, 3, 3] w) => (y) {\n"
                 "  y = ConvTranspose <group = 4, pads = [1, 1, 1, 1]> (x, w)\n}")
    # Its 4 groups of 8 → 4 channels packed into one GEMM, as a grouped Conv's are.
    assert gemm_shape(the(grouped, "ConvTranspose")).conv.inputs == (8, 8)
    assert dataclasses.replace(gemm_shape(the(grouped, "ConvTranspose")), conv=None) == \
        GemmShape(1, 64, 4 * 8 * 9, 16, "float32")
    # Depthwise, 64 channels on 56×56: one 1-wide GEMM per channel had priced it above the
    # dense ConvTranspose of 64 times the work.
    device = npu("ascend310")
    depthwise = ir("g (float[1, 64, 56, 56] x, float[64, 1, 3, 3] w) => (y) {\n"
                   "  y = ConvTranspose <group = 64, pads = [1, 1, 1, 1]> (x, w)\n}")
    dense = ir("g (float[1, 64, 56, 56] x, float[64, 64, 3, 3] w) => (y) {\n"
               "  y = ConvTranspose <pads = [1, 1, 1, 1]> (x, w)\n}")
    assert estimate(the(depthwise, "ConvTranspose"), None, device).seconds < \
        estimate(the(dense, "ConvTranspose"), None, device).seconds


def test_vector_and_fused_group_estimates():
    model = ir("g (float16[64, 1024] x, float16[1024] b) => (float16[64, 1024] y) {\n"
               "  a = Add(x, b)\n  r = Relu(a)\n  s = Sigmoid(r)\n  y = Mul(s, x)\n}")
    device = npu("ascend310")
    nodes = model.graph.nodes()
    separate = [vector_estimate(n, device) for n in nodes]
    fused = group_estimate(nodes, device)
    assert fused.seconds < sum(e.seconds for e in separate)
    assert fused.breakdown["bytes"] == (64 * 1024 + 1024 + 64 * 1024) * 2  # x, b in; y out
    assert separate[0].breakdown["bound"] == "memory"
    assert vector_estimate(the(model, "Sigmoid"), device).breakdown["compute_s"] > \
        vector_estimate(the(model, "Relu"), device).breakdown["compute_s"]
    target = load_target("ascend310")
    copy = transfer_estimate(3_000_000, target)
    assert copy.seconds == pytest.approx(target.transfer_latency_s + 1e-3)


READS = {"Gather": ("y = Gather(t, ids)", 128 * 8),
         "Slice": ("y = Slice(t, starts, ends)", 2 * 8),
         "GatherElements": ("y = GatherElements(t, rows)", 128 * 768 * 8),
         "Compress": ("y = Compress <axis = 0> (t, keep)", None)}


@pytest.mark.parametrize("op", READS)
def test_a_gather_or_slice_reads_what_it_outputs_not_its_whole_input(op):
    # The vector model had counted an embedding Gather's whole table: BERT-base's word
    # embedding lookup of 128 rows priced as 1.8 ms, its costliest kernel on ascend310.
    device = npu("ascend310")
    read, index_bytes = READS[op]
    costs = []
    for rows in (1000, 100_000):
        model = ir(f"g (float16[{rows}, 768] t, int64[128] ids, int64[128, 768] rows,"
                   f" bool[{rows}] keep) => (float16[128, 768] y) {{\n"
                   "  starts = Constant <value = int64[1] {0}> ()\n"
                   "  ends = Constant <value = int64[1] {128}> ()\n"
                   f"  {read}\n}}")
        costs.append(vector_estimate(the(model, op), device).breakdown["bytes"])
        if index_bytes is None:  # the mask is as long as the table: it is read whole
            costs[-1] -= rows
    assert costs[0] == costs[1] == 2 * 128 * 768 * 2 + (index_bytes or 0)


def test_fused_function_call_is_one_kernel():
    from graphopt.passes import Options, PassContext
    from graphopt.passes.fusion.elementwise import FuseElementwise
    model = ir("g (float16[64, 1024] x, float16[1024] b) => (float16[64, 1024] y) {\n"
               "  a = Add(x, b)\n  r = Relu(a)\n  s = Sigmoid(r)\n  y = Mul(s, x)\n}")
    device = npu("ascend310")
    separate = sum(vector_estimate(n, device).seconds for n in model.graph)
    FuseElementwise().run(model, PassContext(Options()))
    (call,) = model.graph.nodes()
    fused = group_estimate([call], device, model)
    assert fused.seconds < separate
    assert fused.breakdown["fused_nodes"] == 4


def test_gemm_shape_of_nodes():
    model = ir("g (float16[2, 12, 128, 64] q, float16[2, 12, 64, 128] k, float16[1, 128, 768] h,"
               " float16[768, 3072] w, float16[3072, 768] wt, float16[1, 3, 224, 224] x,"
               " float16[64, 3, 7, 7] cw, float16[32, 8, 3, 3] dw, float16[1, 64, 56, 56] z)"
               " => (float16[2, 12, 128, 128] s, float16[1, 128, 3072] f, float16[128, 3072] g,"
               " float16[1, 64, 112, 112] c, float16[1, 32, 56, 56] d) {\n"
               "  s = MatMul(q, k)\n  f = MatMul(h, w)\n"
               "  h2 = Reshape(h, shape)\n  g = Gemm(h2, wt) <transB = 1>\n"
               "  c = Conv(x, cw) <strides = [2, 2], pads = [3, 3, 3, 3]>\n"
               "  d = Conv(z, dw) <group = 8, pads = [1, 1, 1, 1]>\n}"
               .replace("Reshape(h, shape)", "Flatten(h) <axis = 2>"))
    nodes = {n.output.name: n for n in model.graph}
    nodes["g"].inputs[0].shape = (128, 768)
    assert gemm_shape(nodes["s"]) == GemmShape(24, 128, 64, 128, "float16")
    assert gemm_shape(nodes["f"]) == GemmShape(1, 128, 768, 3072, "float16")
    assert gemm_shape(nodes["g"]) == GemmShape(1, 128, 768, 3072, "float16")
    assert gemm_shape(nodes["c"]) == GemmShape(1, 112 * 112, 3 * 49, 64, "float16", ConvGeometry(
        (224, 224), (112, 112), (7, 7), (2, 2), (1, 1)))
    assert gemm_shape(nodes["c"]) == conv(3, 224, 64, 7, 2, 3)
    # CANN packs 4 groups of 8 in, 4 out into one GEMM 32 wide in, 16 out.
    assert gemm_shape(nodes["d"]) == GemmShape(2, 56 * 56, 4 * 8 * 9, 16, "float16", ConvGeometry(
        (56, 56), (56, 56), (3, 3), (1, 1), (1, 1)))
    with pytest.raises(ValueError, match="not a cube op"):
        gemm_shape(nodes["g"].inputs[0].producer)


CONV_NET = """g (float[1, 3, 64, 64] input) => (float[1, 16] out) {
  c1 = Conv(input, w1) <pads = [1, 1, 1, 1]>
  r1 = Relu(c1)
  c2 = Conv(r1, w2) <pads = [1, 1, 1, 1], strides = [2, 2]>
  a = Add(c2, bias)
  r2 = Relu(a)
  p = GlobalAveragePool(r2)
  f = Flatten(p)
  out = Gemm(f, wf, bf)
}"""


def _conv_net():
    import numpy as np
    from onnx import numpy_helper
    proto = onnx.parser.parse_model(HEADER + CONV_NET)
    rng = np.random.default_rng(0)
    for name, shape in (("w1", (8, 3, 3, 3)), ("w2", (16, 8, 3, 3)), ("bias", (1, 16, 1, 1)),
                        ("wf", (16, 16)), ("bf", (16,))):
        proto.graph.initializer.append(
            numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name))
    return proto


def test_model_estimate_of_a_partitioned_conv_net():
    result = optimize(_conv_net(), target="ascend310", level=3)
    report = model_estimate(result.model, result.partitioning)
    kinds = report.by_kind()
    assert kinds.get("cube", 0) > 0 and kinds.get("transfer", 0) > 0
    assert report.seconds == pytest.approx(sum(r.seconds for r in report.rows))
    cube_rows = [r for r in report.rows if r.kind == "cube"] + \
        [r for r in report.rows if r.kind == "group" and "tiling" in r.estimate.breakdown]
    assert cube_rows
    assert "total (estimate)" in report.table()
    # Given tilings replace the default for their node.
    row = next(r for r in report.rows if r.kind == "cube")
    slow = Tiling(16, 16, 16, 1, False, 1)
    again = model_estimate(result.model, result.partitioning, {row.name: slow})
    assert next(r for r in again.rows if r.name == row.name).tiling == slow
    assert again.seconds > report.seconds


def test_model_estimate_of_zoo_resnet50():
    zoo = pytest.importorskip("graphopt.zoo")
    proto = zoo.build("resnet50", blocks=(1, 1, 1, 1), width=0.25, image_size=64)
    result = optimize(proto, target="ascend310", input_shapes="input:1,3,64,64")
    report = model_estimate(result.model, result.partitioning)
    convs = [r for r in report.rows if r.kind == "cube"]
    assert len(convs) >= 10
    assert all(r.tiling is not None and r.seconds > 0 for r in convs)
    assert report.seconds > sum(r.seconds for r in convs)


@pytest.mark.parametrize("attrs,a,b", [
    ({"transBatchA": 1}, (17, 4, 64), (4, 64, 32)),
    ({"transBatchB": 1}, (4, 17, 64), (64, 4, 32)),
    ({"transBatchB": 1, "transB": 1}, (4, 17, 64), (32, 4, 64)),
    ({"transBatchA": 1, "transA": 1, "transBatchB": 1, "transB": 1}, (64, 4, 17), (32, 4, 64)),
])
def test_fused_matmul_batch_transposes_give_onnxruntimes_gemm(attrs, a, b):
    # onnxruntime computes [4, 17, 32] from each: 4 GEMMs of 17×64×32.
    from graphopt.tuner.tiling import op_gemm_shape

    assert op_gemm_shape("FusedMatMul", attrs, a, b, "float16") == \
        GemmShape(4, 17, 64, 32, "float16")


def test_the_default_tiling_takes_base_blocks_of_a_cube_not_a_multiple_of_16():
    # A profile's cube of 12 made every 128-element base block infeasible (not a multiple of
    # the cube), and the default fell to one cube per tile: 9x slower than tuned.
    import dataclasses

    device = dataclasses.replace(npu("ascend310"), cube={"float16": (12, 12, 12)})
    shape = GemmShape(1, 256, 256, 256, "float16")
    tiling = default_tiling(shape, device)
    assert feasible(tiling, shape, device) is None
    assert (tiling.base_m, tiling.base_n, tiling.base_k) == (120, 120, 120)


# --- a conv's A operand: input bands, not the im2col matrix ---------------------------------


def _gemm(shape: GemmShape) -> GemmShape:
    """The same GEMM priced as before convs carried their geometry: A read as im2col."""
    return dataclasses.replace(shape, conv=None)


def _sample(shape, device, step=7):
    return list(itertools.islice(tiling_space(shape, device), 0, None, step))


@pytest.mark.parametrize("target", ["ascend310", "ascend910b"])
@pytest.mark.parametrize("name", ["resnet_conv1", "resnet_3x3_64", "resnet_3x3_512",
                                  "resnet_3x3_int8"])
def test_a_conv_reads_no_more_than_its_im2col_and_at_least_its_input(target, name):
    # The model had charged the feature map kh·kw-fold: A's GM→L1 traffic was the im2col
    # matrix, where MTE2 moves input bands and load3d expands them in L1→L0A. Whatever the
    # tiling, the busiest core's share of the input is at least input / cores.
    device = npu(target)
    shape = SHAPES[name]
    geometry = shape.conv
    cin = shape.k // geometry.taps
    input_bytes = cin * math.prod(geometry.inputs) * (1 if shape.dtype == "int8" else 2)
    floor = input_bytes / device.memory_bandwidth * device.clock_hz
    for tiling in _sample(_gemm(shape), device, 11):
        conv_gm = estimate(shape, tiling, device).breakdown["gm_to_l1_cycles"]
        assert floor <= conv_gm <= \
            estimate(_gemm(shape), tiling, device).breakdown["gm_to_l1_cycles"] * (1 + 1e-9), tiling
    default = estimate(shape, None, device).breakdown["gm_to_l1_cycles"]
    assert default < estimate(_gemm(shape), None, device).breakdown["gm_to_l1_cycles"]


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_a_1x1_conv_costs_what_its_gemm_does(stride, dtype):
    # Its band is its own pixels (stride 1) or more than the sampled ones (stride 2), which a
    # strided DMA reads instead: never more than the GEMM's A tile.
    device = npu("ascend310")
    shape = conv(256, 56, 128, 1, stride, dtype=dtype)
    space = list(tiling_space(shape, device))
    assert space == list(tiling_space(_gemm(shape), device))
    for tiling in space[::13]:
        assert estimate(shape, tiling, device).cycles == \
            estimate(_gemm(shape), tiling, device).cycles
    assert estimate(shape, None, device).cycles == estimate(_gemm(shape), None, device).cycles


def test_a_strided_conv_reads_more_input_per_output_pixel():
    # One GEMM (3136 × 576 × 64), two convs: stride 2 over 112×112 spans twice the input rows.
    device = npu("ascend310")
    dense, strided = conv(64, 56, 64, 3, 1, 1), conv(64, 112, 64, 3, 2, 1)
    assert _gemm(dense) == _gemm(strided)
    for tiling in [None] + _sample(dense, device, 17):
        one = estimate(dense, tiling, device).breakdown["gm_to_l1_cycles"]
        two = estimate(strided, tiling, device).breakdown["gm_to_l1_cycles"]
        im2col = estimate(_gemm(dense), tiling, device).breakdown["gm_to_l1_cycles"]
        # Equal only where both reach the im2col bound (tiles of a few pixels).
        assert one < two <= im2col * (1 + 1e-9) or one == two == im2col, tiling
    assert estimate(dense, None, device).cycles < estimate(strided, None, device).cycles


@pytest.mark.parametrize("target", ["ascend310", "ascend910b"])
def test_bigger_convs_are_never_cheaper_under_the_default(target):
    device = npu(target)
    sizes, channels = (7, 14, 28, 56), (16, 32, 64, 256)
    for kernel, size, cin, cout in itertools.product((1, 3, 5), sizes, channels, channels):
        base = estimate(conv(cin, size, cout, kernel, 1, kernel // 2), None, device).seconds
        for bigger in ((cin * 2, size, cout), (cin, size * 2, cout), (cin, size, cout * 2),
                       (cin + 16, size, cout), (cin, size + 1, cout)):
            c, s, o = bigger
            assert estimate(conv(c, s, o, kernel, 1, kernel // 2), None, device).seconds >= \
                base * (1 - 1e-9), (kernel, size, cin, cout, bigger)
        assert estimate(conv(cin, size, cout, kernel, 1, kernel // 2, batch=2), None,
                        device).seconds >= base


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("case", [(56, 3, 1, 1, 1), (224, 7, 2, 3, 1), (14, 3, 1, 1, 1),
                                  (28, 3, 1, 2, 2), (17, 5, 2, 2, 1), (56, 1, 2, 0, 1)])
def test_the_band_is_the_input_rows_a_tile_spans(case, batch):
    # Brute force: per image, the input rows from the first to the last a tile's taps reach
    # (tiles of `run` output pixels start every `run`), whole rows of Wi, as CANN's M mode
    # loads them, against ConvGeometry.band's mean and worst. The band counts the padding rows
    # at the border up to the image's own rows (up to 15% over on these small images), and
    # one halo for a tile crossing into the next image (3% under); a tile within one output
    # row reads its window (HW mode): less than whole rows, more than its own input pixels.
    size, kernel, stride, pad, dilation = case
    geometry = conv(8, size, 8, kernel, stride, pad, dilation=dilation, batch=batch).conv
    out = geometry.outputs[0]
    m = batch * out * out
    for run in (16, 64, 100, 128, 256, 512, 1024):
        if run > m:
            continue
        spans, pixels = [], []
        for start in range(0, m - run + 1, run):
            rows, touched = {}, set()
            for pixel in range(start, start + run):
                image, oh, ow = pixel // (out * out), pixel % (out * out) // out, pixel % out
                lo, hi = oh * stride - pad, oh * stride - pad + (kernel - 1) * dilation
                first, last = rows.get(image, (max(0, lo), min(size - 1, hi)))
                rows[image] = (min(first, max(0, lo)), max(last, min(size - 1, hi)))
                touched |= {(image, h, w) for h in range(lo, hi + 1, dilation)
                            for w in range(ow * stride - pad, ow * stride - pad
                                           + (kernel - 1) * dilation + 1, dilation)
                            if 0 <= h < size and 0 <= w < size}
            spans.append(sum(last - first + 1 for first, last in rows.values()) * size)
            pixels.append(len(touched))
        mean, band = sum(spans) / len(spans), geometry.band(run, batch)
        if run < out:
            assert sum(pixels) / len(pixels) <= band < mean, run
            continue
        assert 0.97 * mean <= band <= 1.15 * mean, run
        assert max(spans) <= geometry.band(run, batch, worst=True), run


def test_a_tile_within_one_output_row_reads_its_window():
    geometry = conv(3, 224, 64, 7, 2, 3).conv  # 112 outputs a row
    assert geometry.band(16, 1) == 7 * (15 * 2 + 7)
    assert geometry.band(1, 1) == 49  # one pixel: its window


def test_k_steps_of_whole_channel_blocks_bring_each_band_once():
    # K runs C1·kh·kw·C0: a 3×3 fp16 conv's block of 16 channels is 144 K elements. Loads of
    # whole blocks bring each channel's band once; a load of 128 splits blocks, and a block
    # split between two loads comes twice; a deeper L1 shares one load's band over its steps.
    from graphopt.tuner.tiling import conv_reads

    shape = conv(64, 56, 64, 3, 1, 1)
    band = shape.conv.band(256, 1)
    assert conv_reads(shape, 256, 144)[0] == pytest.approx(64 * band)
    assert conv_reads(shape, 256, 288)[0] == pytest.approx(64 * band)
    assert conv_reads(shape, 256, 576)[0] == pytest.approx(64 * band)
    split = conv_reads(shape, 256, 128)[0]
    assert 64 * band < split <= 2 * 64 * band
    assert conv_reads(shape, 256, 256)[0] < split  # depth 2 of 128: fewer blocks split
    device = npu("ascend310")
    aligned = estimate(shape, Tiling(64, 64, 144, 1, True, 2), device)
    misaligned = estimate(shape, Tiling(64, 64, 128, 1, True, 2), device)
    assert aligned.breakdown["gm_to_l1_cycles"] < misaligned.breakdown["gm_to_l1_cycles"]


@pytest.mark.parametrize("target", NPUS)
def test_a_conv_fits_l1_where_its_gemm_does(target):
    # The L1 holds a load's band, never more than its im2col: a tiling feasible for the GEMM is
    # feasible for the conv, and a deep one the GEMM cannot hold may fit.
    from graphopt.tuner.tiling import buffer_use

    device = npu(target)
    for name in ("resnet_conv1", "resnet_3x3_64", "resnet_3x3_512", "resnet_3x3_int8"):
        shape = SHAPES[name]
        gemm_space = set(tiling_space(_gemm(shape), device))
        conv_space = set(tiling_space(shape, device))
        assert gemm_space <= conv_space
        for tiling in list(gemm_space)[::29]:
            assert buffer_use(tiling, shape)["L1"] <= buffer_use(tiling, _gemm(shape))["L1"]
    # 16 K-steps of 144 (one block of 16 channels each), 8 to a load of 112 pixels' bands.
    deep = Tiling(112, 16, 144, 8, True, 1)
    shape = conv(256, 14, 256, 3, 1, 1)
    assert feasible(deep, _gemm(shape), npu("ascend910b")).startswith("L1 overflows")
    assert feasible(deep, shape, npu("ascend910b")) is None
    assert deep in set(tiling_space(shape, npu("ascend910b")))


def test_grouped_and_transposed_convs_read_bands_too():
    device = npu("ascend310")
    depthwise = ir("g (float[1, 144, 56, 56] x, float[144, 1, 3, 3] w) => (y) {\n"
                   "  y = Conv <group = 144, pads = [1, 1, 1, 1]> (x, w)\n}")
    up = ir("g (float[1, 64, 28, 28] x, float[64, 32, 4, 4] w) => (y) {\n"
            "  y = ConvTranspose <strides = [2, 2], pads = [1, 1, 1, 1]> (x, w)\n}")
    for model, op in ((depthwise, "Conv"), (up, "ConvTranspose")):
        shape = gemm_shape(the(model, op))
        conv_gm = estimate(shape, None, device).breakdown["gm_to_l1_cycles"]
        assert conv_gm < estimate(_gemm(shape), None, device).breakdown["gm_to_l1_cycles"]
    # A ConvTranspose of stride 2 reads a quarter of the dilated input's pixels from GM.
    shape = gemm_shape(the(up, "ConvTranspose"))
    assert shape.conv.band(56 * 56, 1) == 28 * 28


def test_conv_signatures_carry_the_geometry_and_parse_back():
    # One GEMM, two convs priced apart: two kernels, two tunings.
    from graphopt.tuner.signature import legacy_signature, signature

    shape = conv(64, 56, 64, 3, 1, 1)
    sig = signature("ascend310", "conv", shape)
    assert sig == "ascend310/conv/b1_m3136_k576_n64_i56x56_o56x56_f3x3_s1x1_d1x1/float16"
    assert parse_signature(sig) == ("ascend310", "conv", shape)
    assert signature("ascend310", "conv", conv(64, 112, 64, 3, 2, 1)) != sig
    assert legacy_signature(sig) == "ascend310/conv/b1_m3136_k576_n64/float16"
    assert legacy_signature("ascend310/gemm/b1_m256_k256_n256/float16") is None
    with pytest.raises(ValueError, match="names its geometry"):
        signature("ascend310", "conv", _gemm(shape))
    for text, why in (("gemm/b1_m3136_k576_n64_i56x56_o56x56_f3x3_s1x1_d1x1", "only a conv"),
                      ("conv/b1_m3136_k576_n64_i56x56_o56_f3x3_s1x1_d1x1", "numbers of spatial"),
                      ("conv/b1_m3000_k576_n64_i56x56_o56x56_f3x3_s1x1_d1x1", "M 3000"),
                      ("conv/b1_m3136_k576_n64_i56x56_o56x56_f3x3_s0x1_d1x1", "below 1")):
        with pytest.raises(ValueError, match=why):
            parse_signature(f"ascend310/{text}/float16")
    # A 3-D conv: 27 taps, its bands over depth and height.
    model = ir("g (float[1, 32, 16, 28, 28] x, float[32, 32, 3, 3, 3] w) => (y) {\n"
               "  y = Conv <pads = [1, 1, 1, 1, 1, 1]> (x, w)\n}")
    node = the(model, "Conv")
    shape = gemm_shape(node)
    assert node_signature(node, "ascend310") == \
        "ascend310/conv/b1_m12544_k864_n32_i16x28x28_o16x28x28_f3x3x3_s1x1x1_d1x1x1/float16"
    assert parse_signature(node_signature(node, "ascend310"))[2] == \
        dataclasses.replace(shape, dtype="float16")
    from graphopt.tuner.tiling import conv_reads

    # 128 pixels: one depth slice's 3 input slices of 7.4 rows of 28, against 27 taps each.
    band = shape.conv.band(128, 1)
    assert band == pytest.approx(3 * (1 + 124 / 28 + 2) * 28)
    assert conv_reads(shape, 128, 864)[0] == pytest.approx(32 * band)
    assert 32 * band < 128 * 864 / 5
    device = npu("ascend310")
    assert estimate(shape, None, device).breakdown["gm_to_l1_cycles"] < \
        0.6 * estimate(_gemm(shape), None, device).breakdown["gm_to_l1_cycles"]
