"""Target profiles: the shipped files load and conform, their figures are sourced, the cpu table is
the installed onnxruntime's, bad user profiles fail with one line naming file and key, and
`graphopt targets` prints the table and a description."""

from __future__ import annotations

import argparse
import copy
import json
import re

import numpy as np
import onnx.defs
import pytest
from helpers import parse_model
from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

import graphopt
from graphopt.cli_targets import add_targets_parser
from graphopt.errors import OptionError
from graphopt.ir import load_onnx
from graphopt.partition.placement import place
from graphopt.partition.target import builtin_targets, load_target
from graphopt.partition.target_ort import (cpu_kernel_binds, nchwc_block_size, op_key,
                                           ort_cpu_kernels)
from graphopt.partition.target_schema import KEYWORDS, TARGET_SCHEMA, check

NPU_TARGETS = ["ascend310", "ascend310b", "ascend910b"]
CONTRIB = '<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>\n'
KIB = 1024

# Ops whose output shape depends on tensor data, control flow, sequences, strings: host only.
# (Range, OneHot, ConstantOfShape and RoiAlign have CANN kernels: a node of theirs whose shapes
# are not static stays on the host for that, test_cann_onnx_ops.py.)
HOST_ONLY = ["NonMaxSuppression", "TopK", "NonZero", "Unique", "Compress", "MaxRoiPool", "If",
             "Loop", "Scan", "SequenceAt", "SequenceConstruct", "SplitToSequence",
             "ConcatFromSequence", "StringNormalizer", "RegexFullMatch"]


def _shipped_json(name: str) -> dict:
    with open(load_target(name).path, encoding="utf-8") as f:
        return json.load(f)


def _minimal() -> dict:
    """A small valid two-device profile that the bad-profile tests break one key at a time."""
    return {
        "schema_version": 1, "name": "board", "primary": "npu", "host": "cpu",
        "transfer": {"bandwidth": 1e9, "latency_s": 1e-5},
        "devices": [
            {"name": "npu", "kind": "npu", "providers": ["CANNExecutionProvider"],
             "static_shapes": True, "cube": {"float16": [16, 16, 16]}, "ai_cores": 2,
             "clock_hz": 1e9, "buffers": {"L0A": 65536, "L0B": 65536, "L0C": 262144,
                                          "L1": 1048576, "UB": 262144},
             "peak_ops_per_s": {"float16": 1e12},
             "memory_bandwidth": 1e10, "launch_overhead_s": 1e-5,
             "engines": {"cube": {"kind": "cube", "ops": {"Conv": {"dtypes": ["float16"]}}}}},
            {"name": "cpu", "kind": "cpu", "providers": ["CPUExecutionProvider"],
             "ops": "onnxruntime", "peak_ops_per_s": {"float32": 1e11},
             "memory_bandwidth": 1e10, "launch_overhead_s": 1e-6},
        ],
    }


def _load(tmp_path, doc, name="my.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc) if isinstance(doc, dict) else doc, encoding="utf-8")
    return load_target(str(path)), str(path)


def _error(tmp_path, doc) -> str:
    path = tmp_path / "my.json"
    path.write_text(json.dumps(doc) if isinstance(doc, dict) else doc, encoding="utf-8")
    with pytest.raises(OptionError) as info:
        load_target(str(path))
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"target={str(path)!r}: ")
    return message


# --- shipped profiles ----------------------------------------------------------------------


def test_builtin_names():
    assert builtin_targets() == ["ascend310", "ascend310b", "ascend910b", "cpu"]


@pytest.mark.parametrize("name", ["ascend310", "ascend310b", "ascend910b", "cpu"])
def test_shipped_profile_loads_and_conforms(name):
    check(_shipped_json(name))  # the hand checker, which interprets TARGET_SCHEMA
    target = load_target(name)
    assert target.name == name and target is load_target(name)  # built-ins are cached
    assert [d.kind for d in target.devices].count("cpu") == 1
    assert target.device(target.host).kind == "cpu"
    host = target.device(target.host)
    assert host.providers == ("CPUExecutionProvider",) and host.kernel_source == "onnxruntime"


@pytest.mark.parametrize("name", NPU_TARGETS)
def test_npu_device(name):
    target = load_target(name)
    npu = target.device(target.primary)
    assert npu.kind == "npu" and npu.static_shapes_only
    assert npu.providers == ("CANNExecutionProvider", "CPUExecutionProvider")
    assert dict(npu.engines) == {"cube": "cube", "vector": "vector", "aicpu": "aicpu"}
    assert npu.cube["float16"] == (16, 16, 16) and npu.cube["int8"] == (16, 32, 16)
    assert target.transfer_bandwidth > 0 and target.transfer_latency_s > 0
    conv = npu.kernel("Conv")
    assert conv.engine == "cube" and {"float16", "float32"} <= conv.dtypes and conv.note
    assert npu.kernel("FusedConv", "com.microsoft").engine == "cube"
    assert npu.kernel("Resize").attributes["mode"] == ("nearest", "linear")
    assert npu.kernel("Pad").attributes["mode"] == ("constant", "reflect", "edge")
    # Shape arithmetic on int64 runs on the AI CPU; the same op in float16 on the vector unit.
    assert npu.kernel("Add").engine == "vector"
    assert npu.kernel("Add", "", "int64").engine == "aicpu"
    assert npu.kernel("Shape").engine == "aicpu"


def test_buffer_figures():
    buffers = {n: dict(load_target(n).device("npu").buffers) for n in NPU_TARGETS}
    assert buffers["ascend310"] == {"L0A": 64 * KIB, "L0B": 64 * KIB, "L0C": 256 * KIB,
                                    "L1": 1024 * KIB, "UB": 256 * KIB}
    assert buffers["ascend910b"] == {"L0A": 64 * KIB, "L0B": 64 * KIB, "L0C": 128 * KIB,
                                     "L1": 512 * KIB, "UB": 192 * KIB}
    assert buffers["ascend310b"]["UB"] == 256 * KIB and buffers["ascend310b"]["L0A"] == 64 * KIB


def test_headline_figures():
    a310, b310, b910 = (load_target(n).device("npu") for n in NPU_TARGETS)
    assert (a310.ai_cores, a310.peak_ops_per_s["float16"], a310.peak_ops_per_s["int8"]) == \
        (2, 8e12, 16e12)
    assert b310.peak_ops_per_s["int8"] in (4e12, 8e12)
    assert 20 <= b910.ai_cores <= 25 and b910.peak_ops_per_s["float16"] > 2.5e14
    assert "bfloat16" in b910.peak_ops_per_s and "bfloat16" in b910.kernel("MatMul").dtypes
    assert "bfloat16" not in a310.kernel("MatMul").dtypes
    assert b910.memory_bandwidth > 1e12 > a310.memory_bandwidth


@pytest.mark.parametrize("name", ["ascend310", "ascend310b", "ascend910b", "cpu"])
def test_every_figure_has_a_source(name):
    target = load_target(name)
    missing = [key for key in target.figures() if key not in target.sources]
    assert not missing
    for key, source in target.sources.items():
        assert len(source) > 20, key
        if "estimate" in source.split(":")[0]:
            assert source.startswith("estimate: "), key


@pytest.mark.parametrize("name", NPU_TARGETS)
def test_data_dependent_and_control_flow_ops_stay_on_host(name):
    target = load_target(name)
    npu, host = target.device("npu"), target.device("cpu")
    for op in HOST_ONLY:
        assert npu.kernel(op) is None, op
    assert not npu.has_kernel("NonMaxSuppression", "", "float32")
    assert host.has_kernel("NonMaxSuppression", "", "float32") and host.has_kernel("TopK", "", None)


@pytest.mark.parametrize("name", NPU_TARGETS)
def test_npu_ops_are_real_onnx_or_contrib_ops(name):
    known = {op_key(s.name, s.domain) for s in ort_c.get_all_operator_schema()}
    assert [key for key in load_target(name).device("npu").kernels if key not in known] == []


def test_fusion_outputs_have_npu_kernels_where_cann_does():
    b910, a310 = load_target("ascend910b").device("npu"), load_target("ascend310").device("npu")
    for op in ("FusedConv", "FusedGemm", "FusedMatMul", "Gelu", "FastGelu", "BiasGelu",
               "QuickGelu", "SkipLayerNormalization"):
        assert a310.has_kernel(op, "com.microsoft", "float16"), op
    assert b910.kernel("MultiHeadAttention", "com.microsoft").note
    assert a310.kernel("MultiHeadAttention", "com.microsoft") is None  # no fused kernel on 310
    # A language model's kernels (FusedInferAttentionScore, RotaryPositionEmbedding,
    # WeightQuantBatchMatmulV2) are Atlas A2's alone.
    for op in ("GroupQueryAttention", "RotaryEmbedding", "MatMulNBits"):
        assert b910.has_kernel(op, "com.microsoft", "float16"), op
        for other in ("ascend310", "ascend310b"):
            assert load_target(other).device("npu").kernel(op, "com.microsoft") is None, op


@pytest.mark.parametrize("attrs, device, reason", [
    ("K = 4096, N = 4096, bits = 4, block_size = 32", "npu", None),
    ("K = 4096, N = 4096, bits = 4, block_size = 128", "npu", None),
    ("K = 4096, N = 4096, bits = 8, block_size = 64", "npu", None),
    # onnxruntime's smallest block, below CANN's group of 32
    ("K = 4096, N = 4096, bits = 4, block_size = 16",
     "cpu", "attribute block_size=16 of com.microsoft::MatMulNBits: takes 32 to 65535"),
    # a large vocabulary's output head: N past the kernel's 65535
    ("K = 4096, N = 128256, bits = 4, block_size = 32",
     "cpu", "attribute N=128256 of com.microsoft::MatMulNBits: takes 1 to 65535"),
    ("K = 4096, N = 4096, bits = 2, block_size = 32",
     "cpu", "attribute bits=2 of com.microsoft::MatMulNBits: takes 4, 8"),
])
def test_weight_only_gemms_go_to_the_910b_within_cann_limits(attrs, device, reason):
    n = int(re.search(r"N = (\d+)", attrs).group(1))
    blocks = 4096 // int(re.search(r"block_size = (\d+)", attrs).group(1))
    bits = int(re.search(r"bits = (\d+)", attrs).group(1))
    size = 4096 // blocks * bits // 8
    text = f"""
        g (float16[1, 8, 4096] a, uint8[{n}, {blocks}, {size}] b, float16[{n * blocks}] s)
          => (float16[1, 8, {n}] y) {{
            y = com.microsoft.MatMulNBits <{attrs}> (a, b, s)
        }}"""
    model = load_onnx(parse_model(text, header=CONTRIB))
    ((_, placement),) = place(model, load_target("ascend910b")).items()
    assert placement.device == device
    assert placement.reason == reason


def test_a_weight_only_gemm_with_an_act_order_index_stays_on_the_host():
    # WeightQuantBatchMatmulV2 takes no g_idx: GPTQ's act-order exports had gone to the NPU.
    text = """
        g (float16[1, 8, 64] a, uint8[64, 2, 16] b, float16[128] s, int32[64] gidx)
          => (float16[1, 8, 64] y) {
            y = com.microsoft.MatMulNBits <K = 64, N = 64, bits = 4, block_size = 32>
                (a, b, s, , gidx)
        }"""
    model = load_onnx(parse_model(text, header=CONTRIB))
    ((_, placement),) = place(model, load_target("ascend910b")).items()
    assert placement.device == "cpu"
    assert placement.reason == "input 4 (%gidx) of com.microsoft::MatMulNBits: the kernel " \
                               "takes no such operand"


@pytest.mark.parametrize("attrs, device", [
    ("num_heads = 32, kv_num_heads = 8", "npu"),
    ("num_heads = 32, kv_num_heads = 8, local_window_size = 4096", "npu"),  # a band mask
    ("num_heads = 32, kv_num_heads = 8, do_rotary = 1", "npu"),
    ("num_heads = 32, kv_num_heads = 8, softcap = 50.0", "cpu"),  # Gemma 2's capping
    ("num_heads = 32, kv_num_heads = 8, smooth_softmax = 1", "cpu"),  # an attention sink
])
def test_grouped_query_attention_goes_to_the_910b_unless_it_caps_or_sinks(attrs, device):
    text = f"""
        g (float16[1, 16, 4096] q, float16[1, 16, 1024] k, float16[1, 16, 1024] v,
           float16[1, 8, 100, 128] pk, float16[1, 8, 100, 128] pv, int32[1] lens, int32 total)
          => (float16[1, 16, 4096] y, float16[1, 8, 116, 128] k2, float16[1, 8, 116, 128] v2) {{
            y, k2, v2 = com.microsoft.GroupQueryAttention <{attrs}> (q, k, v, pk, pv, lens, total)
        }}"""
    placements = place(load_onnx(parse_model(text, header=CONTRIB)), load_target("ascend910b"))
    (placement,) = placements.values()
    assert placement.device == device, placement.reason
    if device == "cpu":
        assert "of com.microsoft::GroupQueryAttention: takes 0" in placement.reason


# --- the cpu table is onnxruntime's ------------------------------------------------------


def test_cpu_kernels_match_installed_onnxruntime():
    cpu = load_target("cpu").device("cpu")
    registry: dict[str, set[str]] = {}
    for k in ort_c.get_all_opkernel_def():
        if k.provider == "CPUExecutionProvider":
            registry.setdefault(op_key(k.op_name, k.domain), set()).update(
                t for types in k.type_constraints.values() for t in types)
    # Besides, the ONNX ops whose function body onnxruntime inlines, in their body's types.
    assert set(registry) <= set(cpu.kernels)
    assert all(onnx.defs.get_schema(op).has_function for op in set(cpu.kernels) - set(registry))
    assert cpu.has_kernel("HardSwish", "", "float32")  # HardSigmoid and Mul, or its own
    assert cpu.kernel("GroupNormalization") is None  # a body made per node: not listable
    assert cpu.has_kernel("FusedConv", "com.microsoft", "float32")
    fp16_fused_conv = "tensor(float16)" in registry["com.microsoft::FusedConv"]
    assert cpu.has_kernel("FusedConv", "com.microsoft", "float16") == fp16_fused_conv
    assert cpu.has_kernel("Conv", "ai.onnx", "float32") and cpu.has_kernel("Conv", "", None)
    assert not cpu.has_kernel("NoSuchOp", "", None) and cpu.kernel("NoSuchOp") is None
    assert "bool" in cpu.kernel("Equal").dtypes  # the output's type counts too
    assert cpu.kernel("Relu").engine == "cpu" and dict(cpu.engines) == {"cpu": "cpu"}


@pytest.mark.parametrize("flags,machine,expected", [
    ("fpu sse2 avx avx2 avx512f", "x86_64", 16), ("fpu sse2 avx avx2 fma", "x86_64", 8),
    ("fpu sse2", "x86_64", 0), ("fp asimd", "aarch64", 0)])
def test_nchwc_block_size(tmp_path, monkeypatch, flags, machine, expected):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    monkeypatch.setattr("platform.machine", lambda: machine)
    assert nchwc_block_size(str(cpuinfo)) == expected
    assert nchwc_block_size(str(tmp_path / "missing")) == 0


def test_cpu_target_resolves_auto_block_size():
    assert load_target("cpu").device("cpu").nchwc_block_size == nchwc_block_size()
    assert load_target("ascend910b").device("cpu").nchwc_block_size == 0  # ARM host


# --- user profiles -------------------------------------------------------------------------


def test_user_profile_loads(tmp_path):
    target, path = _load(tmp_path, _minimal())
    assert target.path == path and target.primary == "npu" and target.host == "cpu"
    npu = target.device("npu")
    assert npu.has_kernel("Conv", "", "float16") and not npu.has_kernel("Conv", "", "float32")
    assert npu.kernel("Relu") is None and target.transfer_bandwidth == 1e9
    with pytest.raises(KeyError, match="no device 'gpu'"):
        target.device("gpu")


def test_engine_defaults_apply(tmp_path):
    doc = _minimal()
    doc["devices"][0]["engines"]["vector"] = {
        "kind": "vector", "defaults": {"dtypes": ["float16"], "max_rank": 4},
        "ops": {"Relu": {}, "Cast": {"dtypes": ["float16", "int32"], "max_rank": None}}}
    npu = _load(tmp_path, doc)[0].device("npu")
    assert npu.kernel("Relu").dtypes == {"float16"} and npu.kernel("Relu").max_rank == 4
    assert npu.kernel("Cast").max_rank is None and "int32" in npu.kernel("Cast").dtypes


def _broken(change) -> dict:
    doc = copy.deepcopy(_minimal())
    change(doc)
    return doc


@pytest.mark.parametrize("change,expected", [
    (lambda d: d["devices"][0]["engines"].__setitem__("cube", "x"),
     "devices[0].engines.cube: expected an object, got 'x'"),
    (lambda d: d["devices"][0].__setitem__("engines", []),
     "devices[0].engines: expected an object, got an array"),
    (lambda d: d["devices"][0].__setitem__("memory_bandwidth", -1),
     "devices[0].memory_bandwidth: expected a number ≥ 1 and ≤ 1e+21, got -1"),
    (lambda d: d["transfer"].__setitem__("bandwidth", -5e9),
     "transfer.bandwidth: expected a number ≥ 1"),
    (lambda d: d["devices"][0].__setitem__("ai_cores", True),
     "devices[0].ai_cores: expected an integer ≥ 1 and ≤ 1048576 or null, got true"),
    # Figures past physical reason: estimates built from them would be inf or NaN.
    (lambda d: d["devices"][0].__setitem__("ai_cores", 10 ** 400),
     "devices[0].ai_cores: expected an integer ≥ 1 and ≤ 1048576 or null, got "
     "100000000000… (401 digits)"),
    (lambda d: d["devices"][0].__setitem__("memory_bandwidth", 1e-300),
     "devices[0].memory_bandwidth: expected a number ≥ 1 and ≤ 1e+21, got 1e-300"),
    (lambda d: d["devices"][0].__setitem__("launch_overhead_s", 1e308),
     "devices[0].launch_overhead_s: expected a number ≥ 0 and ≤ 3600, got 1e+308"),
    (lambda d: d["devices"][0].__setitem__("clock_hz", None),
     "devices[0].clock_hz: missing or null: a device with a cube engine needs it"),
    (lambda d: d["devices"][0].__setitem__("cube", {"int8": [16, 32, 16]}),
     "devices[0].cube: needs a 'float16' entry"),
    # The name goes into its partitions' names, which the artifact restricts.
    (lambda d: d["devices"][0].__setitem__("name", "my npu"),
     "devices[0].name: 'my npu' may hold only letters, digits"),
    (lambda d: d["devices"][0].__setitem__("colour", "red"), "devices[0].colour: unknown key"),
    (lambda d: d.pop("devices")[1], "(top level): missing key 'devices'"),
    (lambda d: d["devices"].pop(1), "devices: needs exactly one device of kind 'cpu'"),
    (lambda d: d.__setitem__("host", "npu"), "host: must name the cpu device 'cpu'"),
    (lambda d: d.__setitem__("primary", "gpu"), "primary: no device named 'gpu'"),
    (lambda d: d.pop("transfer"), "transfer: missing"),
    (lambda d: d["devices"][0]["engines"]["cube"]["ops"]["Conv"].__setitem__("dtypes", ["fp16"]),
     "devices[0].engines.cube.ops.Conv.dtypes[0]: expected one of"),
    (lambda d: d["devices"][0]["engines"]["cube"]["ops"].__setitem__(
        "com.microsoft::FusedConv", {"attributes": {"activation": []}}),
     ('devices[0].engines.cube.ops["com.microsoft::FusedConv"].attributes.activation: '
      "expected at least 1 item")),
    (lambda d: d["devices"][0]["engines"]["cube"]["ops"]["Conv"].__setitem__(
        "engine_for", {"int64": "aicpu"}),
     "devices[0].engines.cube.ops.Conv.engine_for.int64: no engine 'aicpu'"),
    (lambda d: d["devices"][0]["engines"].__setitem__(
        "vector", {"kind": "vector", "ops": {"Conv": {}}}),
     "devices[0].engines.vector.ops.Conv: also listed under engine 'cube'"),
    (lambda d: d["devices"][0].__setitem__("ops", "onnxruntime"),
     "devices[0]: needs exactly one of 'engines'"),
    (lambda d: d["devices"][0].__setitem__("host_ops", {"Conv": "kept on the host"}),
     "devices[0].host_ops.Conv: also listed under engine 'cube'"),
    (lambda d: d["devices"][0].__setitem__("host_ops", {"ai.onnx::TopK": "post-processing"}),
     'devices[0].host_ops["ai.onnx::TopK"]: write the default-domain op as \'TopK\''),
    (lambda d: d["devices"][0].__setitem__("host_ops", {"TopK": ""}),
     "devices[0].host_ops.TopK: expected a non-empty string"),
    (lambda d: d["devices"][1].__setitem__("host_ops", {"TopK": "post-processing"}),
     "devices[1].host_ops: only an npu device leaves ops to the host"),
    (lambda d: d["devices"][1].__setitem__("static_shapes", True),
     "devices[1].static_shapes: the cpu device is the host, which runs every node the others "
     "cannot, dynamic shapes included: only an npu device takes true"),
    (lambda d: d["devices"][1].__setitem__("nchwc_block_size", "fast"),
     "devices[1].nchwc_block_size: expected 'auto' or an integer ≥ 0 and ≤ 64, got 'fast'"),
    (lambda d: d.__setitem__("sources", {"npu.buffers.L2": "a datasheet"}),
     'sources["npu.buffers.L2"]: cites no figure of this profile'),
    (lambda d: d.__setitem__("schema_version", 2), "schema_version: expected 1, got 2"),
    (lambda d: d["devices"][0].pop("cube"),
     "devices[0].cube: missing or null: a device with a cube engine needs it"),
    (lambda d: d["devices"][0]["buffers"].pop("L0C"),
     "devices[0].buffers.L0C: missing: a device with a cube engine needs it"),
    (lambda d: d["devices"][1].__setitem__("nchwc_block_size", 7),
     "devices[1].nchwc_block_size: expected 'auto', 0 (no NCHWc), 8 (AVX2) or 16 (AVX-512F)"),
    (lambda d: d["devices"][0]["engines"]["cube"]["ops"].__setitem__("Convv", {}),
     "devices[0].engines.cube.ops.Convv: no ONNX or onnxruntime op of that name"),
    (lambda d: d["devices"][0]["engines"]["cube"]["ops"]["Conv"].__setitem__(
        "attributes", {"grop": [1]}),
     "devices[0].engines.cube.ops.Conv.attributes.grop: Conv has no attribute of that name "
     "(it has: auto_pad, dilations, group, kernel_shape, pads, strides)"),
    # A value of another type matched no node: every Conv fell back, "takes 1" its reason.
    (lambda d: d["devices"][0]["engines"]["cube"]["ops"]["Conv"].__setitem__(
        "attributes", {"group": ["1"]}),
     "devices[0].engines.cube.ops.Conv.attributes.group[0]: Conv's group is INT, got '1'"),
    (lambda d: d["devices"][0]["engines"]["cube"]["ops"]["Conv"].__setitem__(
        "attributes", {"pads": [1]}),
     "devices[0].engines.cube.ops.Conv.attributes.pads[0]: Conv's pads is INTS, got 1"),
    (lambda d: d["devices"][0]["engines"]["cube"]["ops"]["Conv"].__setitem__(
        "attribute_ranges", {"group": [1, 2 ** 70]}),
     "devices[0].engines.cube.ops.Conv.attribute_ranges.group[1]: Conv's group is INT, got "
     "1180591620717411303424"),
    (lambda d: d["devices"][0]["engines"]["cube"]["ops"]["Conv"].__setitem__(
        "absent_inputs", [-1]),
     "devices[0].engines.cube.ops.Conv.absent_inputs[0]: expected an integer ≥ 0 and ≤ 64, "
     "got -1"),
    (lambda d: d["devices"][0]["engines"]["cube"]["ops"]["Conv"].__setitem__(
        "attribute_ranges", {"group": [4, 1]}),
     "devices[0].engines.cube.ops.Conv.attribute_ranges.group: the lowest value 4 is above the "
     "highest 1"),
    (lambda d: d["devices"][0]["engines"]["cube"]["ops"]["Conv"].__setitem__(
        "attribute_ranges", {"group": [1]}),
     "devices[0].engines.cube.ops.Conv.attribute_ranges.group: expected at least 2 item(s), got 1"),
    (lambda d: d["devices"][0]["engines"]["cube"]["ops"]["Conv"].__setitem__(
        "attribute_ranges", {"grop": [1, 2]}),
     "devices[0].engines.cube.ops.Conv.attribute_ranges.grop: Conv has no attribute"),
    (lambda d: d["devices"][0]["engines"]["cube"]["ops"]["Conv"].__setitem__(
        "rank_attributes", {"5": {"grop": [1]}}),
     "devices[0].engines.cube.ops.Conv.rank_attributes.5.grop: Conv has no attribute"),
    (lambda d: d["devices"][0]["engines"]["cube"]["ops"]["Conv"].__setitem__(
        "rank_attributes", {"five": {"group": [1]}}),
     "devices[0].engines.cube.ops.Conv.rank_attributes.five: a rank is a whole number from "
     "1 to 64"),
    # The runtime takes a device named cpu for the host: an NPU so named lost its provider.
    (lambda d: (d["devices"][0].__setitem__("name", "cpu"),
                d["devices"][1].__setitem__("name", "host"), d.update(primary="cpu", host="host")),
     "devices[0].name: 'cpu' names the host; a device of kind 'npu' needs another name"),
    (lambda d: d.__setitem__("name", "a\nb"), "name: 'a\\nb' may hold only letters, digits"),
    # A kernel signature starts with the target's name and a "/": tune crashed on "a/b".
    (lambda d: d.__setitem__("name", "a/b"), "name: 'a/b' may hold only letters, digits"),
    # An empty list read as any dtype: emptied to switch an op off, it did the opposite.
    (lambda d: d["devices"][0]["engines"]["cube"]["ops"]["Conv"].__setitem__("dtypes", []),
     "devices[0].engines.cube.ops.Conv.dtypes: expected at least 1 item"),
    # The table offered a dtype the op refuses.
    (lambda d: d["devices"][0]["engines"]["cube"]["ops"]["Conv"].__setitem__(
        "engine_for", {"bfloat16": "cube"}),
     "devices[0].engines.cube.ops.Conv.engine_for.bfloat16: not one of the op's dtypes "
     "(float16)"),
    # A link of a one-device target was dropped, and citing it said it was not there.
    (lambda d: (d["devices"].pop(0), d.update(primary="cpu")),
     "transfer: a target of one device has no host <-> device link: remove it"),
    # Every tiling of every kernel would overflow it: refused here, not as a compile's crash.
    (lambda d: d["devices"][0]["buffers"].__setitem__("L0A", 10),
     "devices[0].buffers.L0A: 10 bytes cannot hold the smallest float16 tile (16x16x16 needs "
     "512 bytes)"),
])
def test_bad_profile_names_file_and_key(tmp_path, change, expected):
    assert expected in _error(tmp_path, _broken(change))


def test_whole_number_floats_become_ints(tmp_path):
    doc = _minimal()
    doc["devices"][0]["ai_cores"] = 2.0
    doc["devices"][0]["cube"]["float16"] = [16.0, 16, 16]
    path = tmp_path / "floats.json"
    path.write_text(json.dumps(doc))
    device = load_target(str(path)).device("npu")
    assert type(device.ai_cores) is int and all(type(d) is int for d in device.cube["float16"])
    # max_outputs was kept a float, and every MaxPool placement then crashed slicing with it.
    doc["devices"][0]["engines"]["cube"]["ops"]["MaxPool"] = {"dtypes": ["float32"],
                                                              "max_outputs": 1.0}
    path.write_text(json.dumps(doc))
    pool = parse_model("""
        g (float[1,4,8,8] x) => (float[1,4,4,4] y, int64[1,4,4,4] i) {
            y, i = MaxPool <kernel_shape = [2,2], strides = [2,2]> (x)
        }""")
    (placement,) = place(load_onnx(pool), load_target(str(path))).values()
    assert placement.device == "cpu" and "is read: the npu kernel computes only the first " \
        "output" in placement.reason


@pytest.mark.parametrize("target", NPU_TARGETS)
def test_a_5d_resize_runs_on_the_npu_in_linear_mode_only(target):
    # CANN's Resize takes 5-D input in linear mode alone: the profiles' note said so, and a
    # nearest 5-D Resize went to the NPU all the same.
    def resize(mode):
        return load_onnx(parse_model(f"""
            g (float[1,4,4,8,8] x) => (float[1,4,8,16,16] y) {{
                y = Resize <mode = "{mode}"> (x, roi, scales)
            }}""", roi=np.zeros(0, np.float32), scales=np.array([1, 1, 2, 2, 2], np.float32)))

    (nearest,) = place(resize("nearest"), load_target(target)).values()
    assert nearest.device == "cpu"
    assert nearest.reason == "attribute mode='nearest' of Resize at rank 5: takes linear"
    (linear,) = place(resize("linear"), load_target(target)).values()
    assert linear.device == "npu" and linear.reason is None


def test_an_attribute_left_at_its_default_is_checked_as_that_default(tmp_path):
    # A profile allowing Resize's linear mode alone took a Resize that sets no mode, whose
    # default is nearest: "the default is among the allowed values" held for built-ins only.
    doc = _minimal()
    doc["devices"][0]["engines"]["cube"]["ops"]["Resize"] = {
        "dtypes": ["float32"], "attributes": {"mode": ["linear"]}}
    target, _ = _load(tmp_path, doc)
    model = load_onnx(parse_model("""
        g (float[1,4,8,8] x) => (float[1,4,16,16] y) {
            y = Resize (x, roi, scales)
        }""", roi=np.zeros(0, np.float32), scales=np.array([1, 1, 2, 2], np.float32)))
    (placement,) = place(model, target).values()
    assert placement.device == "cpu"
    assert placement.reason == "attribute mode='nearest' of Resize: takes linear"
    # The default of the model's opset: GridSample's mode is bilinear at 16 (linear from 20).
    doc["devices"][0]["engines"]["cube"]["ops"]["GridSample"] = {
        "dtypes": ["float32"], "attributes": {"mode": ["bilinear", "nearest"]}}
    target, _ = _load(tmp_path, doc)
    grid = parse_model("""
        g (float[1,4,8,8] x, float[1,8,8,2] grid) => (float[1,4,8,8] y) {
            y = GridSample (x, grid)
        }""", header='<ir_version: 8, opset_import: ["" : 16]>\n')
    (placement,) = place(load_onnx(grid), target).values()
    assert placement.device == "npu" and placement.reason is None


def test_bad_json(tmp_path):
    assert "nested too deeply" in _error(tmp_path, "[" * 100000)
    message = _error(tmp_path, '{"name": "x",\n "devices": [}')
    assert "not valid JSON" in message and "line 2" in message
    assert "appears twice" in _error(tmp_path, '{"name": "a", "name": "b"}')
    assert "NaN" in _error(tmp_path, '{"name": NaN}')


def test_missing_file_and_unknown_name(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(OptionError, match=re.escape(f"target={str(missing)!r}: cannot read it: No such file")):
        load_target(str(missing))
    with pytest.raises(OptionError, match="unknown target .*ascend310, ascend310b, ascend9"):
        load_target("ascend999")
    with pytest.raises(OptionError, match=r"unknown target \(did you mean ascend310\? built-in"):
        load_target("ascend311")
    with pytest.raises(OptionError, match=r"unknown target \(built-in"):  # nothing near it
        load_target("gpu")
    # ATC's spelling of the chip was an unknown target.
    assert load_target("Ascend310").name == "ascend310"
    assert load_target("ASCEND910B").name == "ascend910b"


# --- the schema ----------------------------------------------------------------------------


def test_schema_is_draft_2020_12_within_the_checkers_keywords():
    assert TARGET_SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    used: set[str] = set()

    def walk(node, in_names=False):
        if isinstance(node, dict):
            for key, value in node.items():
                if not in_names:
                    used.add(key)
                # Children of these keywords are names (of properties, defs), not keywords.
                walk(value, in_names=key in ("properties", "$defs") and not in_names)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(TARGET_SCHEMA)
    assert used <= KEYWORDS, used - KEYWORDS


def test_schema_documents_every_key():
    defs = TARGET_SCHEMA["$defs"]
    undocumented = []

    def walk(schema, where):
        for key, prop in schema.get("properties", {}).items():
            target = defs[prop["$ref"].rsplit("/", 1)[-1]] if "$ref" in prop else prop
            if "description" not in target:
                undocumented.append(f"{where}.{key}")
            walk(target, f"{where}.{key}")
        if isinstance(schema.get("additionalProperties"), dict):
            walk(schema["additionalProperties"], f"{where}.*")
        if "items" in schema:
            walk(schema["items"], f"{where}[]")
        if "$ref" in schema:
            walk(defs[schema["$ref"].rsplit("/", 1)[-1]], where)

    walk(TARGET_SCHEMA, "")
    assert undocumented == []


# --- `graphopt targets` --------------------------------------------------------------------


def _run(argv, capsys) -> str:
    parser = argparse.ArgumentParser(prog="graphopt")
    add_targets_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    return capsys.readouterr().out


def test_cli_table(capsys):
    out = _run(["targets"], capsys)
    for name in builtin_targets():
        assert name in out
    assert "CANNExecutionProvider" in out and "8 TFLOPS float16" in out and "1.6 TB/s" in out


def test_cli_describe(capsys):
    out = _run(["targets", "ascend310"], capsys)
    assert "L0C 256 KiB" in out and "float16 16×16×16" in out and "int8 16×32×16" in out
    assert "engine cube of npu" in out and "FusedConv" in out and "mode in nearest/linear" in out
    assert "npu.buffers.L0C" in out and "Hot Chips" in out  # figures with their sources
    assert "kernels: the CPU kernels of the installed onnxruntime" in out


def test_cli_describe_wraps_its_prose_on_a_terminal_only(capsys, monkeypatch):
    from graphopt import table

    piped = _run(["targets", "ascend310"], capsys).splitlines()
    assert piped[0].startswith("ascend310: Ascend 310 (") and piped[0].endswith("x86 host")
    monkeypatch.setattr(table, "terminal_width", lambda: 60)
    lines = _run(["targets", "ascend310"], capsys).splitlines()
    head = lines[:lines.index("file: " + load_target("ascend310").path)]
    assert len(head) > 1 and all(len(line) <= 60 for line in head)
    assert head[1].startswith("  ")  # continuation lines hang under the first
    assert " ".join(line.strip() for line in head) == piped[0]
    device = lines.index("device npu (npu) via CANNExecutionProvider,")
    assert lines[device + 1] == "  CPUExecutionProvider; static shapes only"
    assert "    L1 1 MiB, UB 256 KiB" in lines  # an indented line hangs under its own indent
    monkeypatch.setattr(table, "terminal_width", lambda: 20)  # narrower than any path
    assert "file: " + load_target("ascend310").path in _run(["targets", "ascend310"], capsys)


def test_cli_json_round_trips(tmp_path, capsys):
    doc = json.loads(_run(["targets", "ascend910b", "--json"], capsys))
    assert doc["name"] == "ascend910b" and doc["devices"][0]["buffers"]["UB"] == 192 * KIB
    # The host's kernels are the installed onnxruntime's, as the profile says: a fixed copy
    # of that table had lost its float16 fallback, and --precision fp16 was refused on it.
    assert doc["devices"][1]["ops"] == "onnxruntime" and "engines" not in doc["devices"][1]
    reloaded, _ = _load(tmp_path, doc, "copy.json")
    original = load_target("ascend910b")
    for a, b in zip(original.devices, reloaded.devices, strict=True):
        assert set(a.kernels) == set(b.kernels) and a.kernel_source == b.kernel_source
        assert a.kernel("Add", "", "int64") == b.kernel("Add", "", "int64")
    assert isinstance(json.loads(_run(["targets", "--json"], capsys)), list)
    _, copy_of_cpu = _load(tmp_path, json.loads(_run(["targets", "cpu", "--json"], capsys)),
                           "cpu_copy.json")
    graphopt.optimize(graphopt.zoo.build("tiny"), target=copy_of_cpu, precision="fp16")


def test_cli_user_file_and_error(tmp_path, capsys):
    _, path = _load(tmp_path, _minimal())
    assert "board" in _run(["targets", path], capsys)
    with pytest.raises(OptionError, match="^nope: unknown target"):  # an argument, not --target
        _run(["targets", "nope"], capsys)


def _bf16_onehot_versions() -> list[tuple[int, int]]:
    return [tuple(k.version_range) for k in ort_c.get_all_opkernel_def()
            if k.provider == "CPUExecutionProvider" and k.op_name == "OneHot"
            and "tensor(bfloat16)" in k.type_constraints.get("T3", [])]


@pytest.mark.skipif(not _bf16_onehot_versions(),
                    reason="this onnxruntime has no bfloat16 OneHot kernel on the CPU")
def test_a_kernel_binds_at_the_nodes_version_and_for_all_its_dtypes():
    # The dtype table unions every version and kernel: it lists bfloat16 for OneHot, whose
    # bfloat16 kernels exist from one version on, and only for some index dtypes.
    assert "bfloat16" in ort_cpu_kernels()["OneHot"]
    first = min(a for a, _ in _bf16_onehot_versions())
    assert cpu_kernel_binds("OneHot", "", first, ["int64", "int64", "bfloat16"], ["bfloat16"])
    assert not cpu_kernel_binds("OneHot", "", first - 1, ["int64", "int64", "bfloat16"],
                                ["bfloat16"])
    assert not cpu_kernel_binds("OneHot", "", first, ["float64", "int64", "bfloat16"],
                                ["bfloat16"])


def test_a_variadic_input_binds_every_value_to_its_type_parameter():
    # Sum's CPU kernels take float32 and float64 alone: its third input counts too.
    assert ort_cpu_kernels()["Sum"] <= {"float32", "float64"}
    assert cpu_kernel_binds("Sum", "", 13, ["float32"] * 3, ["float32"])
    assert not cpu_kernel_binds("Sum", "", 13, ["float32", "float32", "int8"], ["float32"])
    assert cpu_kernel_binds("Relu", "", 14, [None], ["float32"])  # an untyped value binds nothing
    assert cpu_kernel_binds("NoSuchOp", "", 17, ["float32"], ["float32"]) is None


# --- placement by a custom profile's constraints -------------------------------------------


def _vector_profile(tmp_path, ops: dict, name="vec.json"):
    """_minimal() with a vector engine named 'vec' holding `ops` beside the cube's Conv."""
    doc = _minimal()
    doc["devices"][0]["static_shapes"] = False
    doc["devices"][0]["peak_ops_per_s"]["float32"] = 1e12
    doc["devices"][0]["engines"]["vec"] = {"kind": "vector", "ops": ops}
    return _load(tmp_path, doc, name)[0]


def test_a_float_attribute_matches_the_profiles_decimal(tmp_path):
    import graphopt
    from helpers import parse_model

    target = _vector_profile(tmp_path, {"LeakyRelu": {"attributes": {"alpha": [0.1, 0.2]}},
                                        "Relu": {}, "Neg": {}})
    proto = parse_model("""
        g (float[4, 8] x) => (float[4, 8] y) {
            r = Relu(x)
            l = LeakyRelu <alpha = 0.1> (r)
            y = Neg(l)
        }""")
    result = graphopt.optimize(proto, target=target)
    assert [p.device for p in result.partitioning.partitions] == ["npu"]
    proto = parse_model(proto_text := """
        g (float[4, 8] x) => (float[4, 8] y) {
            l = LeakyRelu <alpha = 0.3> (x)
            y = Neg(l)
        }""")
    reasons = dict((n.op_type, r) for n, r in
                   graphopt.optimize(proto, target=target).partitioning.fallbacks())
    assert reasons["LeakyRelu"] == "attribute alpha=0.3 of LeakyRelu: takes 0.1, 0.2", proto_text


def test_an_elementwise_group_meets_each_inner_ops_limits(tmp_path):
    import graphopt
    from helpers import parse_model

    from graphopt.partition.placement import place

    proto = parse_model("""
        g (float[2, 3, 4, 5] x) => (float[2, 3, 4, 5] y) {
            r = Relu(x)
            l = LeakyRelu <alpha = 0.1> (r)
            y = Neg(l)
        }""")
    rank_two = _vector_profile(tmp_path, {"LeakyRelu": {}, "Relu": {}, "Neg": {"max_rank": 2}},
                               "rank.json")
    alpha = _vector_profile(tmp_path, {"LeakyRelu": {"attributes": {"alpha": [0.5]}},
                                       "Relu": {}, "Neg": {}}, "alpha.json")
    fits = _vector_profile(tmp_path, {"LeakyRelu": {}, "Relu": {}, "Neg": {}}, "fits.json")
    # A group made without the target (a model compiled at -O3 for no target) is placed by
    # its body's ops; compiled for the target, the op it lacks is left out of the group.
    grouped = graphopt.optimize(proto, level=3).model
    for target, expected, alone, why in (
            (rank_two, "rank 4 above Neg's limit 2", "Neg",
             "rank 4 of %l [2,3,4,5] above Neg's limit 2"),
            (alpha, "attribute alpha=0.1 of LeakyRelu: takes 0.5", "LeakyRelu",
             "attribute alpha=0.1 of LeakyRelu: takes 0.5")):
        ((node, placed),) = [(n, p) for n, p in place(grouped, target).items() if p.reason]
        assert node.op_type.startswith("elementwise_")
        assert placed.reason.startswith(expected)
        assert "(inside graphopt::elementwise_" in placed.reason
        result = graphopt.optimize(proto, level=3, target=target)
        reasons = {n.op_type: r for n, r in result.partitioning.fallbacks()}
        assert reasons[alone].startswith(why)
        # Anything else on the host went back as an island, not for the op it lacks.
        assert all("inside" not in r for r in reasons.values()), reasons
    result = graphopt.optimize(proto, level=3, target=fits)
    (part,) = result.partitioning.partitions
    # The group runs on the engine its ops are on, whatever the profile calls it.
    assert part.device == "npu" and {result.partitioning.placements[n].engine
                                     for n in part.nodes} == {"vec"}


def test_a_fusion_the_profile_takes_only_with_other_attributes_is_not_made(tmp_path):
    import graphopt
    from helpers import parse_model

    doc = _minimal()
    doc["devices"][0]["peak_ops_per_s"]["float32"] = 1e12
    cube = doc["devices"][0]["engines"]["cube"]["ops"]
    cube["Conv"] = {"dtypes": ["float32"]}
    cube["com.microsoft::FusedConv"] = {"dtypes": ["float32"],
                                        "attributes": {"activation": ["Relu"]}}
    doc["devices"][0]["engines"]["vec"] = {"kind": "vector", "ops": {"Sigmoid": {}, "Relu": {}}}
    target = _load(tmp_path, doc)[0]
    rng = np.random.default_rng(0)
    proto = parse_model("""
        g (float[1, 4, 8, 8] x) => (float[1, 4, 8, 8] y) {
            c1 = Conv <pads = [1, 1, 1, 1]> (x, w1)
            s = Sigmoid(c1)
            c2 = Conv <pads = [1, 1, 1, 1]> (s, w2)
            y = Relu(c2)
        }""", w1=rng.standard_normal((4, 4, 3, 3)).astype(np.float32),
        w2=rng.standard_normal((4, 4, 3, 3)).astype(np.float32))
    result = graphopt.optimize(proto, level=3, target=target)
    ops = sorted(n.qualified_op for n in result.model.graph)
    assert ops == ["Conv", "Sigmoid", "com.microsoft::FusedConv"]  # Conv+Relu only
    assert [p.device for p in result.partitioning.partitions] == ["npu"]


def _fused_params_profile(tmp_path):
    """A cube engine whose FusedConv and FusedGemm take LeakyRelu with alpha 0.1 only; its
    vector engine takes LeakyRelu of any alpha."""
    doc = _minimal()
    doc["devices"][0]["static_shapes"] = False
    doc["devices"][0]["peak_ops_per_s"]["float32"] = 1e12
    cube = doc["devices"][0]["engines"]["cube"]["ops"]
    cube["Conv"] = cube["Gemm"] = {"dtypes": ["float32"]}
    cube["com.microsoft::FusedConv"] = {
        "dtypes": ["float32"],
        "attributes": {"activation": ["Relu", "LeakyRelu"], "activation_params": [[0.1]]}}
    cube["com.microsoft::FusedGemm"] = {
        "dtypes": ["float32"],
        "attributes": {"activation": ["Relu", "LeakyRelu"], "activation_alpha": [0.1]}}
    doc["devices"][0]["engines"]["vec"] = {"kind": "vector", "ops": {"LeakyRelu": {}}}
    return _load(tmp_path, doc)[0]


@pytest.mark.parametrize("alpha, fused", [(0.1, True), (0.2, False)])
def test_a_fusion_is_not_made_with_activation_parameters_the_profile_refuses(
        tmp_path, alpha, fused):
    import graphopt
    from helpers import parse_model

    target = _fused_params_profile(tmp_path)
    rng = np.random.default_rng(0)
    proto = parse_model(f"""
        g (float[1, 4, 8, 8] x, float[2, 16] a) => (float[1, 4, 8, 8] y, float[2, 16] z) {{
            c = Conv <pads = [1, 1, 1, 1]> (x, w)
            y = LeakyRelu <alpha = {alpha}> (c)
            m = Gemm <transB = 1> (a, k, bias)
            z = LeakyRelu <alpha = {alpha}> (m)
        }}""", w=rng.standard_normal((4, 4, 3, 3)).astype(np.float32),
        k=rng.standard_normal((16, 16)).astype(np.float32),
        bias=rng.standard_normal(16).astype(np.float32))
    result = graphopt.optimize(proto, level=3, target=target)
    ops = sorted(n.qualified_op for n in result.model.graph)
    expected = ["com.microsoft::FusedConv", "com.microsoft::FusedGemm"] if fused \
        else ["Conv", "Gemm", "LeakyRelu", "LeakyRelu"]
    assert ops == expected
    assert result.partitioning.fallbacks() == []


def test_a_refused_float_list_attribute_reads_as_its_decimals(tmp_path):
    import graphopt
    from helpers import parse_model

    rng = np.random.default_rng(0)
    proto = parse_model("""
        g (float[1, 4, 8, 8] x) => (float[1, 4, 8, 8] y) {
            y = com.microsoft.FusedConv <activation = "LeakyRelu", activation_params = [0.2],
                                         pads = [1, 1, 1, 1]> (x, w)
        }""", header='<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>\n',
        w=rng.standard_normal((4, 4, 3, 3)).astype(np.float32))
    result = graphopt.optimize(proto, level=1, target=_fused_params_profile(tmp_path))
    (_, reason), = result.partitioning.fallbacks()
    assert reason == ("attribute activation_params=(0.2,) of com.microsoft::FusedConv: "
                      "takes (0.1,)")


def test_a_profile_reads_as_json_does(tmp_path):
    # One number type (schema_version 1.0 is 1), a byte order mark (Windows Notepad's) read
    # past, "auto" dumped as auto (another CPU reads its own block), a size cap (/dev/zero).
    doc = _minimal()
    doc["schema_version"] = 1.0
    doc["devices"][1]["nchwc_block_size"] = "auto"
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(doc).encode())
    target = load_target(str(path))
    assert target.name == "board" and target.device("cpu").nchwc_auto
    from graphopt.cli_targets import target_json

    assert target_json(target)["devices"][1]["nchwc_block_size"] == "auto"
    import graphopt.partition.target as target_module

    big = tmp_path / "big.json"
    big.write_text(" " * 2048 + json.dumps(doc))
    original = target_module._MAX_PROFILE_BYTES
    try:
        target_module._MAX_PROFILE_BYTES = 1024
        with pytest.raises(OptionError, match="larger than 0 MiB, more than a target profile"):
            load_target(str(big))
    finally:
        target_module._MAX_PROFILE_BYTES = original


def test_a_custom_profile_is_told_from_the_builtin_of_its_name(tmp_path):
    # A user's file named cpu got this machine's calibration, and hints named it by its name,
    # which --target then read as the built-in.
    from graphopt.partition.target import as_given, is_builtin

    builtin = load_target("cpu")
    assert is_builtin(builtin) and as_given(builtin) == "cpu"
    doc = json.loads(open(builtin.path, encoding="utf-8").read())
    custom, path = _load(tmp_path, doc, "cpu.json")
    assert custom.name == "cpu" and not is_builtin(custom) and as_given(custom) == path


def test_an_om_of_a_custom_profile_named_as_a_builtin_says_so(tmp_path, capsys):
    # Its manifest's target is the profile's name: inspect read it as the built-in 910B.
    from helpers import run_cli

    from graphopt import zoo

    doc = json.loads(open(load_target("ascend910b").path, encoding="utf-8").read())
    _, path = _load(tmp_path, doc, "my910.json")
    onnx_path = tmp_path / "tiny.onnx"
    import onnx

    onnx.save(zoo.build("tiny"), onnx_path)
    for target, shown in ((path, "ascend910b (profile file my910.json, not the built-in of "
                                 "that name)"), ("ascend910b", "ascend910b\n")):
        rc, _, err = run_cli(capsys, "optimize", onnx_path, "-o", tmp_path / "t.om",
                             "--target", target, "--input-shape", "input:1,3,32,32")
        assert rc == 0, err
        rc, out, _ = run_cli(capsys, "inspect", tmp_path / "t.om")
        assert rc == 0 and f"target     {shown}" in out, out


def test_messages_name_the_file_of_a_custom_profile_named_as_a_builtin(tmp_path, capsys):
    # "target ascend310: 1 partition(s)" and "target ascend310 has no bfloat16 kernel" read as
    # the built-in's, which the user's file may well differ from.
    import onnx
    from helpers import run_cli

    from graphopt import zoo

    doc = json.loads(open(load_target("ascend310").path, encoding="utf-8").read())
    _, path = _load(tmp_path, doc, "my310.json")
    onnx_path = tmp_path / "tiny.onnx"
    onnx.save(zoo.build("tiny"), onnx_path)
    rc, out, _ = run_cli(capsys, "partition", onnx_path, "--target", path)
    assert rc == 0 and out.startswith("target ascend310 (profile file my310.json): 1 partition")
    rc, _, err = run_cli(capsys, "optimize", onnx_path, "-o", tmp_path / "t.om", "--target", path,
                         "--precision", "bf16")
    assert rc != 0 and "target ascend310 (profile file my310.json) has no bfloat16 kernel" in err
    rc, out, _ = run_cli(capsys, "partition", onnx_path, "--target", "ascend310")
    assert rc == 0 and out.startswith("target ascend310: 1 partition")


def test_an_npu_without_a_cube_prices_its_matmuls_on_their_engine(tmp_path, capsys):
    # The cost model took every MatMul for a cube op: "internal error: ValueError: device
    # 'npu' has no cube unit" from optimize, tune and partition.
    import onnx
    from helpers import run_cli
    from onnx import TensorProto, helper, numpy_helper

    doc = _minimal()
    npu = doc["devices"][0]
    for key in ("cube", "buffers", "ai_cores", "clock_hz"):
        npu.pop(key)
    npu["engines"] = {"vector": {"kind": "vector",
                                 "ops": {"MatMul": {"dtypes": ["float16", "float32"]}}}}
    _, profile = _load(tmp_path, doc)
    weight = numpy_helper.from_array(np.full((64, 64), 0.01, np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 64])],
                              [weight])
    model = tmp_path / "mm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), model)
    rc, out, err = run_cli(capsys, "optimize", model, "-o", tmp_path / "mm.om", "--target",
                           profile, "--verify")
    assert rc == 0 and "internal error" not in err, err
    rc, _, err = run_cli(capsys, "tune", model, "--target", profile, "--trials", "1",
                         "--tuning-db", tmp_path / "kb.db")
    assert rc == 1 and "no NPU cube kernel" in err and "internal error" not in err, err


def test_on_cube_follows_a_dtypes_engine(tmp_path):
    # An int8 MatMul a profile sends to its vector engine was tiled and laid out as a cube op:
    # on_cube asked the op's home engine alone.
    from graphopt.cli_targets import target_json

    doc = target_json(load_target("ascend310"))
    npu = next(d for d in doc["devices"] if d["name"] == "npu")
    npu["engines"]["cube"]["ops"]["MatMul"]["engine_for"] = {"int8": "vector"}
    npu["engines"]["cube"]["ops"]["MatMul"]["dtypes"].append("int8")
    doc["name"] = "int8_on_vector"
    target, _ = _load(tmp_path, doc)
    device = target.device("npu")
    assert device.on_cube("MatMul") and device.on_cube("MatMul", "", "float16")
    assert not device.on_cube("MatMul", "", "int8")


@pytest.mark.parametrize("size, device", [(128, "npu"), (80, "npu"), (24, "cpu"), (520, "cpu")])
def test_grouped_query_attention_goes_to_the_910b_at_the_head_sizes_cann_takes(size, device):
    # FusedInferAttentionScore: head sizes up to 512, multiples of 16 (sizes of 24 and 520 had
    # gone to the NPU).
    text = f"""
        g (float16[1, 64, {4 * size}] q, float16[1, 64, {size}] k, float16[1, 64, {size}] v,
           int32[1] lens, int32 total) => (float16[1, 64, {4 * size}] y) {{
            y = com.microsoft.GroupQueryAttention <num_heads = 4, kv_num_heads = 1>
                (q, k, v, , , lens, total)
        }}"""
    (placement,) = place(load_onnx(parse_model(text, header=CONTRIB)),
                         load_target("ascend910b")).values()
    assert placement.device == device, placement.reason
    if device == "cpu":
        assert placement.reason == f"head size {size} of com.microsoft::GroupQueryAttention: " \
                                   "the kernel takes up to 512, a multiple of 16"
