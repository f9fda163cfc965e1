"""The analytical NPU cost model and tiling space (graphopt.tuner): feasibility names the
buffer, estimates move the right way with work, buffering, cores and fusion, and the default
tiling is feasible everywhere but leaves room for tuning."""

from __future__ import annotations

import dataclasses
import itertools

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
from graphopt.tuner.signature import node_signature

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


SHAPES = {
    "matmul_256": GemmShape(1, 256, 256, 256, "float16"),
    "bert_qkv": GemmShape(1, 128, 768, 768, "float16"),
    "bert_ffn": GemmShape(1, 128, 768, 3072, "float16"),
    "bert_ffn_int8": GemmShape(1, 128, 768, 3072, "int8"),
    "resnet_conv1": GemmShape(1, 112 * 112, 3 * 7 * 7, 64, "float16"),
    "resnet_3x3_64": GemmShape(1, 56 * 56, 64 * 9, 64, "float16"),
    "resnet_1x1_256": GemmShape(1, 56 * 56, 256, 64, "float16"),
    "resnet_3x3_512": GemmShape(1, 7 * 7, 512 * 9, 512, "float16"),
    "resnet_1x1_2048": GemmShape(1, 7 * 7, 1024, 2048, "float16"),
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
    assert gemm_shape(node) == GemmShape(1, 32 * 32, 32 * 2 * 2, 16, "float32")
    assert node_signature(node, "ascend310") == "ascend310/conv/b1_m1024_k128_n16/float16"
    grouped = ir("g (float[1, 32, 8, 8] x, float[32, 4, 3, 3] w) => (y) {\n"
                 "  y = ConvTranspose <group = 4, pads = [1, 1, 1, 1]> (x, w)\n}")
    # Its 4 groups of 8 → 4 channels packed into one GEMM, as a grouped Conv's are.
    assert gemm_shape(the(grouped, "ConvTranspose")) == GemmShape(1, 64, 4 * 8 * 9, 16,
                                                                  "float32")
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
    assert gemm_shape(nodes["c"]) == GemmShape(1, 112 * 112, 3 * 49, 64, "float16")
    # CANN packs 4 groups of 8 in, 4 out into one GEMM 32 wide in, 16 out.
    assert gemm_shape(nodes["d"]) == GemmShape(2, 56 * 56, 4 * 8 * 9, 16, "float16")
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
