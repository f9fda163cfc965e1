"""An NPU partition's memory plan counts its tensors as the device stores them: blocked formats
padded to their blocks, weights in their offline formats, and each TransData's copy."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import parse_model

import graphopt
from graphopt.ir.dtypes import DType
from graphopt.partition.format_bytes import DeviceFormats, format_nbytes
from graphopt.passes.memory import verify_plan


def test_blocked_formats_pad_to_their_blocks():
    # 24 channels hold 32 in NC1HWC0 (C0 16); int8's C0 is 32; a 1-D conv's input has H = 1.
    assert format_nbytes("NC1HWC0", [1, 24, 56, 56], DType.FLOAT) == 1 * 32 * 56 * 56 * 4
    assert format_nbytes("NC1HWC0", [2, 24, 7, 7], DType.INT8) == 2 * 32 * 7 * 7
    assert format_nbytes("NC1HWC0", [1, 17, 100], DType.FLOAT16) == 32 * 100 * 2
    assert format_nbytes("NDC1HWC0", [1, 3, 4, 5, 6], DType.FLOAT) == 16 * 4 * 5 * 6 * 4
    # A 768-vector is one row of sixteen; [2, 3, 40] pads rows to 16 and columns to 48.
    assert format_nbytes("FRACTAL_NZ", [1, 768], DType.FLOAT) == 16 * 768 * 4
    assert format_nbytes("FRACTAL_NZ", [2, 3, 40], DType.FLOAT16) == 2 * 16 * 48 * 2
    # Conv weights [Co, Ci, kh, kw]: Ci to C0, Co to 16 (a depthwise conv's 1 input channel
    # takes a block, the packed groups' diagonal).
    assert format_nbytes("FRACTAL_Z", [144, 1, 3, 3], DType.FLOAT16) == 16 * 9 * 144 * 2
    assert format_nbytes("FRACTAL_Z", [20, 8, 1, 1], DType.INT8) == 32 * 32
    # ND, an unknown format or a rank the format does not take: the plain bytes.
    for fmt, shape in (("ND", [3, 5]), ("FRACTAL_NZ", [7]), ("NC1HWC0", [2, 3])):
        assert format_nbytes(fmt, shape, DType.FLOAT) == 4 * int(np.prod(shape))


def _npu_compile():
    # Channels that do not fill a block: 8 in, 24 between the convs.
    rng = np.random.default_rng(3)
    proto = parse_model("""
        g (float[1,8,16,16] x) => (float[1,10] y) {
            c1 = Conv <pads = [1,1,1,1]> (x, w1)
            r1 = Relu (c1)
            c2 = Conv <pads = [1,1,1,1]> (r1, w2)
            r2 = Relu (c2)
            p = GlobalAveragePool (r2)
            f = Flatten (p)
            y = Gemm <transB = 1> (f, wf)
        }""", w1=rng.standard_normal((24, 8, 3, 3)).astype(np.float32),
        w2=rng.standard_normal((24, 24, 3, 3)).astype(np.float32),
        wf=rng.standard_normal((10, 24)).astype(np.float32))
    return graphopt.optimize(proto, target="ascend310")


def test_an_npu_plan_counts_the_device_formats_and_their_transdata_copies():
    result = _npu_compile()
    (name, plan), = result.memory_plans.items()
    layout = result.partitioning.layouts[name]
    assert plan.formats == DeviceFormats.of(layout)
    model = result.partition_models[name]
    values = {v.name: v for n in model.graph for v in n.outputs if v is not None}
    # The convs' outputs are NC1HWC0: 24 channels take 32 (the pooled [1, 24, 1, 1] too).
    blocked = [t for t, fmt in layout.formats.items() if fmt == "NC1HWC0" and t in plan.tensors]
    assert len(blocked) >= 3
    for tensor in blocked:
        value = values[tensor]
        assert plan.tensors[tensor].size == \
            format_nbytes("NC1HWC0", value.static_shape, value.dtype) == \
            value.static_shape[0] * 32 * int(np.prod(value.static_shape[2:])) * 4
    # Every TransData makes a copy of its own, in the arena from its writer to its readers:
    # the input converted for the first conv, and the pooled features leaving NC1HWC0.
    copies = {t.name: t for t in plan.tensors.values() if "@" in t.name}
    assert "x@NC1HWC0" in copies and copies["x@NC1HWC0"].size == 16 * 16 * 16 * 4
    assert len(copies) == len(layout.transdata) == plan.transdata_copies
    # Weights in their offline formats: FRACTAL_Z pads w1's 8 input channels to 16.
    assert layout.weights["w1"] == "FRACTAL_Z"
    assert plan.weight_bytes > 4 * (24 * 8 * 9 + 24 * 24 * 9 + 10 * 24)
    # Checked against the graph with the same formats: sizes, lifetimes, and no two tensors
    # live at a common step share a byte.
    verify_plan(plan, model)
    assert "device formats" in plan.summary() and plan.to_dict()["sizes"] == "device formats"


def test_a_cpu_plan_stays_nd():
    proto = parse_model("""
        g (float[1,8,16,16] x) => (float[1,24,16,16] y) {
            c = Conv <pads = [1,1,1,1]> (x, w)
            y = Relu (c)
        }""", w=np.ones((24, 8, 3, 3), np.float32))
    (plan,) = graphopt.optimize(proto, target="cpu").memory_plans.values()
    assert plan.formats is None and "sizes" not in plan.to_dict()
    assert all("@" not in name for name in plan.tensors)


def test_a_grouped_convs_weights_are_stored_group_enlarged():
    # CANN packs e groups into one block-diagonal weight: ShuffleNet's [272, 68, 1, 1] at
    # group 4 takes 295,936 bytes, where a dense [272, 68] count gave 87,040.
    assert format_nbytes("FRACTAL_Z", [272, 68, 1, 1], DType.FLOAT, group=4) == 295_936
    assert format_nbytes("FRACTAL_Z", [144, 1, 3, 3], DType.FLOAT16, group=144) == \
        9 * 9 * 16 * 16 * 2  # depthwise: 9 packs of 16 channels


def test_int8_weights_are_padded_where_they_are_stored():
    # The layout names the DequantizeLinear's output, which takes no memory (the int8 kernel
    # reads the int8 weight): the int8 initializer itself is stored in FRACTAL_Z.
    import tempfile

    from helpers import write_calibration

    rng = np.random.default_rng(4)
    proto = parse_model("""
        g (float[1,8,16,16] x) => (float[1,24,16,16] y) {
            c = Conv <pads = [1,1,1,1]> (x, w)
            y = Relu (c)
        }""", w=rng.standard_normal((24, 8, 3, 3)).astype(np.float32))
    with tempfile.TemporaryDirectory() as folder:
        calibration = write_calibration(folder, rng.standard_normal((4, 1, 8, 16, 16)),
                                        "stacked")
        result = graphopt.optimize(proto, target="ascend310", quantize="int8",
                                   calibration=calibration,
                                   pass_options={"quant_keep_ends": False})
    (plan,) = result.memory_plans.values()
    int8 = [v for v in result.model.graph.initializers.values()
            if v.dtype == DType.INT8 and v.shape == (24, 8, 3, 3)]
    assert len(int8) == 1 and plan.weight_bytes >= format_nbytes(
        "FRACTAL_Z", [24, 8, 3, 3], DType.INT8) == 32 * 9 * 32 > 24 * 8 * 9


def test_a_blocked_output_also_read_inside_keeps_its_blocked_original():
    # An NC1HWC0 conv output that leaves for the caller and is flattened inside: the caller's
    # ND copy serves the Flatten, and the arena holds the NC1HWC0 original until converted.
    rng = np.random.default_rng(6)
    proto = parse_model("""
        g (float[1,8,6,6] x) => (float[1,24,6,6] c1, float[1,10] y) {
            c1 = Conv <pads = [1,1,1,1]> (x, w1)
            f = Flatten (c1)
            y = Gemm <transB = 1> (f, wf)
        }""", w1=rng.standard_normal((24, 8, 3, 3)).astype(np.float32),
        wf=rng.standard_normal((10, 24 * 36)).astype(np.float32))
    result = graphopt.optimize(proto, target="ascend310")
    (name, plan), = result.memory_plans.items()
    assert "c1@NC1HWC0" in plan.tensors and "c1@ND" not in plan.tensors
    assert plan.tensors["c1@NC1HWC0"].size == 32 * 36 * 4
    verify_plan(plan, result.partition_models[name])


def test_memory_reorder_orders_by_the_device_sizes():
    # Ordered by ND sizes, a reorder had raised an NPU partition's work memory (81 → 89 KiB)
    # and called the order optimal.
    rng = np.random.default_rng(2)
    proto = parse_model("""
        g (float[1,64] x, float[4,2048] y) => (float[1,2304] z) {
            a1 = MatMul (x, wa1)
            a = MatMul (a1, wa2)
            b1 = Mul (y, c)
            b = ReduceSum <keepdims = 1> (b1, ax)
            z = Concat <axis = 1> (a, b)
        }""", wa1=(rng.standard_normal((64, 1024)) * 0.05).astype(np.float32),
        wa2=(rng.standard_normal((1024, 256)) * 0.05).astype(np.float32),
        c=np.array([2.0], np.float32), ax=np.array([0], np.int64))
    plain = graphopt.optimize(proto, target="ascend310")
    reordered = graphopt.optimize(proto, target="ascend310", memory_reorder=True)
    (before,), (after,) = plain.memory_plans.values(), reordered.memory_plans.values()
    assert after.arena_bytes <= before.arena_bytes and after.lower_bound <= before.lower_bound
    verify_plan(after, next(iter(reordered.partition_models.values())))


def test_a_tensor_read_through_its_copies_dies_once_they_are_written():
    # The Flatten reads c1@ND and the Gemm f@FRACTAL_NZ: c1 and f had stayed live to their
    # readers' steps, and the plan's peak was 14% over what the device needs.
    rng = np.random.default_rng(6)
    proto = parse_model("""
        g (float[1,8,6,6] x) => (float[1,10] y) {
            c1 = Conv <pads = [1,1,1,1]> (x, w1)
            f = Flatten (c1)
            y = Gemm <transB = 1> (f, wf)
        }""", w1=rng.standard_normal((24, 8, 3, 3)).astype(np.float32),
        wf=rng.standard_normal((10, 24 * 36)).astype(np.float32))
    result = graphopt.optimize(proto, target="ascend310")
    (name, plan), = result.memory_plans.items()
    tensors = plan.tensors
    assert {"c1@ND", "f@FRACTAL_NZ"} <= set(tensors)
    assert tensors["c1"].last == tensors["c1"].first == tensors["c1@ND"].first
    assert tensors["f"].last == tensors["f"].first == tensors["f@FRACTAL_NZ"].first
    assert tensors["f@FRACTAL_NZ"].last > tensors["f"].last
    verify_plan(plan, result.partition_models[name])
    # The arena executor runs ND plans only, and says so of this one.
    from graphopt.passes.memory import MemoryPlanError, check_plan

    with pytest.raises(MemoryPlanError, match="sized in an NPU's device formats"):
        check_plan(result.partition_models[name], plan)
