"""QuantizeInt4Weights: the MatMulNBits packing against a numpy unpacker and onnxruntime, the
MatMul/Gemm rewrites, quant_skip, and gpt2_small's weight bytes and logits."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import ops, parse_model
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import graphopt
from graphopt import numerics, zoo
from graphopt.errors import OptionError
from graphopt.passes.precision.blockwise import (
    dequantize,
    pack_nibbles,
    quantize,
    unpack_nibbles,
)
from graphopt.tools.metrics import cosine_similarity

RNG = np.random.default_rng(0)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 8), st.integers(0, 2**31 - 1))
def test_nibble_packing_round_trips_exactly(rows, pairs, seed):
    values = np.random.default_rng(seed).integers(0, 16, (rows, 2 * pairs), dtype=np.uint8)
    packed = pack_nibbles(values)
    assert packed.shape == (rows, pairs)
    assert np.array_equal(unpack_nibbles(packed), values)
    assert packed[0, 0] == values[0, 0] | (values[0, 1] << 4)  # element 0 in the low nibble


@pytest.mark.parametrize("k,n,block,symmetric", [(64, 8, 16, False), (100, 5, 32, True),
                                                 (80, 3, 32, False), (256, 4, 128, False)])
def test_quantization_error_is_at_most_half_a_step(k, n, block, symmetric):
    w = RNG.standard_normal((k, n)).astype(np.float32)
    quant = quantize(w, block, symmetric)
    n_blocks = -(-k // block)
    assert quant.packed.shape == (n, n_blocks, block // 2)
    assert quant.scales.shape == (n * n_blocks,)
    assert (quant.zero_points is None) == symmetric
    if not symmetric:
        assert quant.zero_points.shape == (n * -(-n_blocks // 2),)
    step = np.repeat(quant.scales.reshape(n, n_blocks), block, axis=1)[:, :k].T
    assert np.all(np.abs(dequantize(quant) - w) <= step / 2 + 1e-6)


def _nbits_model(quant, k, n, dtype=TensorProto.FLOAT):
    names = ["a", "B", "scales"] + ([] if quant.zero_points is None else ["zp"])
    inits = [numpy_helper.from_array(quant.packed, "B"),
             numpy_helper.from_array(quant.scales, "scales")]
    if quant.zero_points is not None:
        inits.append(numpy_helper.from_array(quant.zero_points, "zp"))
    node = helper.make_node("MatMulNBits", names, ["y"], domain="com.microsoft", K=k, N=n,
                            bits=4, block_size=quant.block)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", dtype, [3, k])],
                              [helper.make_tensor_value_info("y", dtype, [3, n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("symmetric", [False, True])
def test_onnxruntime_reads_the_packing_as_the_numpy_unpacker_does(symmetric):
    # 80 rows in blocks of 32: three blocks, so a column's zero points end in half a byte.
    w = RNG.standard_normal((80, 6)).astype(np.float32)
    quant = quantize(w, 32, symmetric)
    a = RNG.standard_normal((3, 80)).astype(np.float32)
    actual = numerics.run(_nbits_model(quant, 80, 6), {"a": a})["y"]
    np.testing.assert_allclose(actual, a.astype(np.float64) @ dequantize(quant), rtol=0,
                               atol=1e-4)


MATMUL_ADD = """
g (float[2,4,64] x) => (float[2,4,16] y) {
  m = MatMul(x, w)
  y = Add(m, b)
}"""


def compile_int4(proto, level=1, **options):
    return graphopt.optimize(proto, level=level, pass_options={"quantize": "int4", **options})


def test_matmul_and_its_bias_become_one_matmulnbits():
    w = RNG.standard_normal((64, 16)).astype(np.float32)
    b = RNG.standard_normal(16).astype(np.float32)
    proto = parse_model(MATMUL_ADD, w=w, b=b)
    result = compile_int4(proto, int4_group_size=16)
    assert ops(result.model) == ["com.microsoft::MatMulNBits"]
    node = next(iter(result.model.graph))
    assert node.attr("K") == 64 and node.attr("N") == 16 and node.attr("block_size") == 16
    assert dict(result.log.totals()["QuantizeInt4Weights"]["rewrites"]) == {"MatMul_quantized": 1}
    out = result.to_onnx()
    onnx.checker.check_model(out)
    assert [o.name for o in out.graph.output] == ["y"]
    x = RNG.standard_normal((2, 4, 64)).astype(np.float32)
    reference = x.astype(np.float64) @ dequantize(quantize(w, 16)) + b
    np.testing.assert_allclose(numerics.run(out, {"x": x})["y"], reference, atol=1e-4, rtol=0)


@pytest.mark.parametrize("c_shape,ops_after", [
    ((16,), ["com.microsoft::MatMulNBits"]),
    ((3, 16), ["com.microsoft::MatMulNBits", "Add"]),
])
def test_gemm_with_transb_alpha_and_beta(c_shape, ops_after):
    w = RNG.standard_normal((16, 64)).astype(np.float32)  # [N, K]: transB
    c = RNG.standard_normal(c_shape).astype(np.float32)
    proto = parse_model("""
    g (float[3,64] x) => (float[3,16] y) {
      y = Gemm<transB=1, alpha=0.5, beta=2.0>(x, w, c)
    }""", w=w, c=c)
    result = compile_int4(proto)
    assert ops(result.model) == ops_after
    x = RNG.standard_normal((3, 64)).astype(np.float32)
    reference = x.astype(np.float64) @ dequantize(quantize(w.T * np.float32(0.5), 32)) + 2 * c
    np.testing.assert_allclose(numerics.run(result.to_onnx(), {"x": x})["y"], reference,
                               atol=1e-4, rtol=0)


def test_quant_skip_by_name_and_op_type_and_what_is_left_alone():
    w = RNG.standard_normal((64, 16)).astype(np.float32)
    proto = parse_model("""
    g (float[2,64] x, float[64,16] live) => (float[2,16] y, float[2,16] z, float[2,16] v) {
      y = MatMul(x, w)
      z = MatMul(x, w2)
      v = MatMul(x, live)
    }""", w=w, w2=w.copy())
    proto.graph.node[0].name = "keep_me"
    result = compile_int4(proto, quant_skip={"keep_me"})
    assert ops(result.model) == ["MatMul", "com.microsoft::MatMulNBits", "MatMul"]  # live B
    assert ops(compile_int4(proto, quant_skip={"MatMul"}).model) == ["MatMul"] * 3
    assert any("'keep-me' (nearest: 'keep_me')" in note
               for note in compile_int4(proto, quant_skip={"keep-me"}).notes)


def test_bad_group_sizes_are_refused():
    proto = parse_model(MATMUL_ADD, w=np.ones((64, 16), np.float32), b=np.ones(16, np.float32))
    for size in (8, 48):
        with pytest.raises(OptionError, match=f"--int4-group-size {size}: must be a power of 2"):
            compile_int4(proto, int4_group_size=size)


@pytest.mark.parametrize("group, block", [(4096, 64), (64, 64), (32, 16), (16, 16)])
def test_a_group_that_would_pad_k_gets_the_block_that_packs_smallest(group, block):
    # K = 48 per column: blocks of 4096 would store 4096 rows; 64 stores 64 rows and one
    # scale, fewer bytes than 16 (48 rows, three scales) or 32 (64 rows, two scales).
    w = RNG.standard_normal((48, 16)).astype(np.float32)
    proto = parse_model(MATMUL_ADD.replace("64", "48"), w=w, b=np.zeros(16, np.float32))
    result = compile_int4(proto, int4_group_size=group)
    node = next(iter(result.model.graph))
    assert node.attr("block_size") == block
    refitted = [n for n in result.notes if "would pad K" in n]
    assert len(refitted) == (block != group)
    if refitted:
        assert refitted[0] == (f"QuantizeInt4Weights: block {group} would pad K to a multiple "
                               f"of it; 1 weight(s) use {block}, which packs them smaller")
    (size,) = [n for n in result.notes if "MiB →" in n]
    assert "% smaller" in size
    x = RNG.standard_normal((2, 4, 48)).astype(np.float32)
    reference = x.astype(np.float64) @ dequantize(quantize(w, block))
    np.testing.assert_allclose(numerics.run(result.to_onnx(), {"x": x})["y"], reference,
                               atol=1e-4, rtol=0)


def test_block_for_picks_the_fewest_bytes_up_to_the_group():
    from graphopt.passes.precision.int4 import block_for

    assert block_for(768, 32, 4) == 32 and block_for(3072, 128, 4) == 128  # K divisible
    assert block_for(768, 4096, 4) == 256 and block_for(768, 512, 2) == 256
    assert block_for(16, 4096, 4) == 16


def _weight_bytes(model, op_types) -> int:
    """Bytes of the initializers read by nodes of `op_types` (weights, scales, zero points)."""
    inits = {t.name: t for t in model.graph.initializer}
    names = {i for n in model.graph.node if n.op_type in op_types for i in n.input[1:4]}
    return sum(numpy_helper.to_array(inits[n]).nbytes for n in names if n in inits)


def test_gpt2_small_int4_weights_and_logits():
    proto = zoo.build("gpt2_small")
    fp32 = graphopt.optimize(proto, level=2).to_onnx()
    fp16 = graphopt.optimize(proto, level=2, pass_options={"precision": "fp16"}).to_onnx()
    int4 = compile_int4(proto, level=2).to_onnx()
    onnx.checker.check_model(int4)
    before, half = _weight_bytes(fp32, {"MatMul"}), _weight_bytes(fp16, {"MatMul"})
    after = _weight_bytes(int4, {"MatMulNBits"})
    assert before == 2 * half > 0
    # 4 bits plus a float32 scale and a 4-bit zero point per 32 weights: 5.125 bits/weight,
    # 84% below float32 and 68% below float16 (4 bits alone would be 75% below float16).
    assert after <= 0.17 * before and after <= 0.33 * half
    feeds = {"input_ids": RNG.integers(0, 1000, (1, 16))}
    expected = numerics.run(proto, feeds)["logits"]
    for level in ("disable", "all"):
        assert cosine_similarity(expected, numerics.run(int4, feeds, level)["logits"]) >= 0.98
