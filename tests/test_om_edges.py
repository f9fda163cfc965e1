"""Edge cases of a graph's outputs and kernels in an .om: an output listed twice, constant and
pass-through outputs beside device partitions, inputs no node reads, zero-size cube kernels."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from helpers import conv_classifier, parse_model, run_cli

import graphopt
from graphopt import numerics
from graphopt.codegen.om_manifest import route
from graphopt.errors import OptionError
from graphopt.ir import load_onnx
from graphopt.partition import load_target, partition
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.tuner import GemmShape, default_tiling, estimate
from graphopt.tuner.search import tune_kernel

RNG = np.random.default_rng(11)
W = np.array([1, 2], np.float32)
CST = 'cst = Constant <value = float[2] {7, 8}> ()'
K = {"k": np.array([4], np.int64)}


def weight(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.2).astype(np.float32)


def conv_topk(outputs: str, tail: str = "", batch: int | str = 1, **weights) -> onnx.ModelProto:
    """Convs and a classifier (an NPU partition on ascend310), a TopK (a host one), `tail`."""
    return conv_classifier("values, indices = TopK <axis = 1> (scores, k)\n" + tail, outputs,
                           batch=batch, **K, **weights)


def feeds_for(proto: onnx.ModelProto, batch: int = 1) -> dict[str, np.ndarray]:
    """Random feeds for every input a caller feeds, symbolic dims set to `batch`."""
    weights = {t.name for t in proto.graph.initializer}
    feeds = {}
    for vi in proto.graph.input:
        if vi.name in weights:
            continue
        tensor = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else batch for d in tensor.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        feeds[vi.name] = RNG.standard_normal(shape).astype(dtype)
    return feeds


def compile_and_load(proto: onnx.ModelProto, tmp_path, **options):
    """(the compile, the .om loaded with graphopt.load)."""
    result = graphopt.optimize(proto, **options)
    path = tmp_path / "model.om"
    graphopt.save(result, path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the CPU stand-in for the NPU
        return result, graphopt.load(path)


def assert_like_onnxruntime(proto: onnx.ModelProto, session, feeds: dict) -> None:
    """The .om lists the outputs onnxruntime does, position for position (a name listed twice
    included), and returns each one's values, dtype and shape (ORT_DISABLE_ALL)."""
    reference = numerics.session(proto, "disable")
    names = [o.name for o in reference.get_outputs()]
    assert [o["name"] for o in session.outputs] == names
    actual = session.run(feeds)
    for name, expected in zip(names, reference.run(None, feeds)):
        assert actual[name].dtype == expected.dtype and actual[name].shape == expected.shape
        np.testing.assert_allclose(actual[name], expected, rtol=1e-4, atol=1e-5, err_msg=name)


def partitions(session) -> list[tuple[str, list[str], list[str]]]:
    return [(p["name"], p["inputs"], p["outputs"])
            for p in session.artifact.manifest["partitions"]]


# --- an output listed twice ----------------------------------------------------------------


def test_route_takes_a_tensor_listed_twice_once():
    ins, outs, routing = route([("p0", ["x"], ["r", "r"])], ["r", "x", "r"], ["x"])
    assert (ins, outs) == (["x"], ["r", "x", "r"])
    assert [e for e in routing if e["to"] is None] == [
        {"tensor": "r", "from": "p0", "to": None}, {"tensor": "x", "from": None, "to": None}]


@pytest.mark.parametrize("target", [None, "cpu", "ascend310", "ascend910b"])
@pytest.mark.parametrize("outputs", ["float[2] r, float[2] r",
                                     "float[2] x, float[2] r, float[2] x"])
def test_an_output_listed_twice_comes_out_at_both_positions(outputs, target, tmp_path):
    proto = parse_model(f"g (float[2] x) => ({outputs}) {{ r = Relu (x) }}")
    onnx.checker.check_model(proto, full_check=True)
    _, session = compile_and_load(proto, tmp_path, target=target)
    assert_like_onnxruntime(proto, session, {"x": np.array([-1, 2], np.float32)})


@pytest.mark.parametrize("outputs", [
    "float[1,4] values, int64[1,4] indices, float[1,4] values",
    "float[1,4] values, float[1,64] scores, float[1,64] scores",
    "float[1,4] values, float[1,8,32,32] x, float[1,8,32,32] x",
])
def test_an_output_listed_twice_beside_a_host_partition(outputs, tmp_path):
    proto = conv_topk(outputs)
    result, session = compile_and_load(proto, tmp_path, target="ascend310")
    assert [p.device for p in result.partitioning.partitions] == ["npu", "cpu"]
    assert_like_onnxruntime(proto, session, feeds_for(proto))


def test_an_input_passed_through_beside_partitions_comes_out_as_a_copy(tmp_path):
    # No partition returns x: the runtime hands back the feed's values, in an array of its
    # own, as onnxruntime does (writing to the result must leave the caller's feed alone).
    proto = conv_topk("float[1,4] values, float[1,8,32,32] x")
    _, session = compile_and_load(proto, tmp_path, target="ascend310")
    feeds = feeds_for(proto)
    for names in (None, ["x"], ["values", "x"]):
        out = session.run(feeds, output_names=names)["x"]
        np.testing.assert_array_equal(out, feeds["x"])
        assert not np.shares_memory(out, feeds["x"])


# --- outputs that are constants ------------------------------------------------------------


@pytest.mark.parametrize("target", ["cpu", "ascend310", "ascend910b"])
def test_initializer_and_constant_outputs_come_out_of_one_partition(target, tmp_path):
    proto = parse_model(f"g (float[2,2] x) => (float[2,2] r, float[2] w, float[2] cst) "
                        f"{{ r = Relu (x)\n {CST} }}", w=W)
    result, session = compile_and_load(proto, tmp_path, target=target)
    # The Constant is data for the partition, not a host fallback with a partition of its own.
    assert len(result.partitioning.partitions) == 1
    assert not result.partitioning.fallbacks()
    assert_like_onnxruntime(proto, session, feeds_for(proto))


def test_constant_outputs_beside_a_host_partition_come_from_it(tmp_path):
    proto = conv_topk("float[1,4] values, float[2] w, float[2] cst, float[2] w", CST, w=W)
    result, session = compile_and_load(proto, tmp_path, target="ascend310")
    assert [(name, outs) for name, _, outs in partitions(session)] == [
        ("p0_npu", ["scores"]), ("p1_cpu", ["values", "cst", "w"])]
    assert [r.split(":")[0] for _, r in result.partitioning.fallbacks()] == [
        "npu profile leaves TopK to the host"]
    assert_like_onnxruntime(proto, session, feeds_for(proto))


def test_a_constant_joins_the_partition_that_reads_it():
    # Not optimized, so the Constants stay nodes: one read on the NPU (and a graph output),
    # one on the host; neither is a host fallback nor a partition of its own.
    halves = ", ".join(["0.5"] * 64)
    proto = conv_classifier(f"""
        half = Constant <value = float[64] {{{halves}}}> ()
        shifted = Add (scores, half)
        values, indices = TopK <axis = 1> (shifted, k)
        quad = Constant <value = float[4] {{1, 2, 3, 4}}> ()
        v = Mul (values, quad)""", "float[1,4] v, float[64] half", **K)
    model = load_onnx(proto)
    infer_shapes(model)
    result = partition(model, load_target("ascend310"))
    assert [(p.device, [n.outputs[0].name for n in p.nodes if n.op_type == "Constant"])
            for p in result.partitions] == [("npu", ["half"]), ("cpu", ["quad"])]
    # The Mul is an island returned to the host; the Constant it reads follows, uncounted.
    assert [(n.op_type, r.split(":")[0]) for n, r in result.fallbacks()] == [
        ("TopK", "npu profile leaves TopK to the host"), ("Mul", "returned to cpu")]
    assert result.returned[0].startswith("1 node(s) from Mul -> %v")


def test_a_graph_of_constants_alone_runs_on_the_host(tmp_path):
    proto = parse_model(f"g (float[2] x) => (float[2] cst, float[2] w) {{ {CST} }}", w=W)
    result, session = compile_and_load(proto, tmp_path, target="ascend310")
    assert [p.name for p in result.partitioning.partitions] == ["p0_cpu"]
    assert_like_onnxruntime(proto, session, feeds_for(proto))


def test_constant_outputs_in_every_shape_profile(tmp_path):
    proto = conv_topk("float[B,4] values, float[2] w, float[2] cst, float[2] cst", CST,
                      batch="B", w=W)
    _, session = compile_and_load(proto, tmp_path, target="ascend310", dynamic_dims="B:1,2")
    for batch in (1, 2):
        assert_like_onnxruntime(proto, session, feeds_for(proto, batch))


# --- inputs no node reads ------------------------------------------------------------------


@pytest.mark.parametrize("outputs", ["float[1,4] values",
                                     "float[1,4] values, float[3] unused, float[3] unused"])
def test_an_input_no_node_reads_stays_an_input_of_a_partitioned_artifact(outputs, tmp_path):
    proto = conv_topk(outputs)
    proto.graph.input.append(onnx.helper.make_tensor_value_info("unused", 1, [3]))
    _, session = compile_and_load(proto, tmp_path, target="ascend310")
    assert [i["name"] for i in session.inputs] == ["x", "unused"]  # as onnxruntime requires
    assert_like_onnxruntime(proto, session, feeds_for(proto))


def test_an_input_only_a_folded_shape_read_stays_an_input_of_every_profile(tmp_path):
    # Pinning B folds Shape(y): no node reads y in either profile.
    proto = conv_topk("float[B,4] values, int64[2] t", "s = Shape (y)\n t = Mul (s, two)",
                      batch="B", two=np.array([2], np.int64))
    proto.graph.input.append(onnx.helper.make_tensor_value_info("y", 1, ["B", 3]))
    _, session = compile_and_load(proto, tmp_path, target="ascend310", dynamic_dims="B:1,2")
    assert [i["name"] for i in session.inputs] == ["x", "y"]
    for batch in (1, 2):
        assert_like_onnxruntime(proto, session, feeds_for(proto, batch))


# --- cube kernels without work -------------------------------------------------------------


ZERO_CONV = parse_model("g (float[0,3,4,4] x) => (float[0,2,2,2] y) { y = Conv (x, w) }",
                        w=np.ones((2, 3, 3, 3), np.float32))
ZERO_MATMUL = parse_model("g (float[0,3] x) => (float[0,4] y) { y = MatMul (x, w) }",
                          w=np.ones((3, 4), np.float32))
ZERO_K = parse_model("g (float[2,0] x) => (float[2,3] y) { y = MatMul (x, w) }",
                     w=np.ones((0, 3), np.float32))
MIXED = parse_model("g (float[16,32] x, float[0,32] z) => (float[16,64] y, float[0,64] t) "
                    "{ y = MatMul (x, w)\n t = MatMul (z, w) }", w=weight(32, 64))


@pytest.mark.parametrize("level", [2, 3])
@pytest.mark.parametrize("target", ["ascend310", "ascend910b"])
@pytest.mark.parametrize("proto", [ZERO_CONV, ZERO_MATMUL, ZERO_K], ids=["conv", "matmul", "k0"])
def test_a_zero_size_cube_kernel_compiles_without_a_tiling(proto, target, level, tmp_path):
    _, session = compile_and_load(proto, tmp_path, target=target, level=level)
    rows = [r for rows in session.artifact.extra["kernels"]["partitions"].values() for r in rows]
    assert rows and all("tiling" not in r and r["bound"] == "none" for r in rows)
    assert_like_onnxruntime(proto, session, feeds_for(proto))


def test_a_kernel_with_work_beside_one_without_keeps_its_tiling(tmp_path):
    _, session = compile_and_load(MIXED, tmp_path, target="ascend310")
    (rows,) = session.artifact.extra["kernels"]["partitions"].values()
    assert {r["node"]: "tiling" in r for r in rows} == {"%y": True, "%t": False}
    assert_like_onnxruntime(MIXED, session, feeds_for(MIXED))


def test_the_cost_model_prices_a_shape_without_work():
    npu = load_target("ascend310").device("npu")
    empty = GemmShape(1, 0, 27, 2, "float32")
    assert default_tiling(empty, npu).cores == 1
    assert estimate(empty, None, npu).seconds == npu.launch_overhead_s
    with pytest.raises(OptionError, match="zero-size dim"):
        tune_kernel(empty, npu, trials=1)


def test_tune_has_nothing_to_tune_in_a_zero_size_conv(tmp_path, capsys):
    path = tmp_path / "zero.onnx"
    onnx.save(ZERO_CONV, path)
    rc, out, err = run_cli(capsys, "tune", path, "--target", "ascend310", "--trials", "3",
                           "--tuning-db", tmp_path / "t.db", "-q")
    assert (rc, err) == (0, "")
    assert "skipped 1 NPU cube kernel(s) with a zero-size dim" in out
    assert "nothing to tune" in out


def test_tune_skips_the_kernel_without_work_and_tunes_the_other(tmp_path, capsys):
    path = tmp_path / "mixed.onnx"
    onnx.save(MIXED, path)
    rc, out, err = run_cli(capsys, "tune", path, "--target", "ascend310", "--trials", "3",
                           "--tuning-db", tmp_path / "t.db", "-q")
    assert (rc, err) == (0, "")
    assert "skipped 1 NPU cube kernel(s) with a zero-size dim (no work, so no tiling to " \
           "tune): %t" in out
    assert "ascend310/gemm/b1_m16_k32_n64/float16" in out
