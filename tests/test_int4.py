"""QuantizeInt4Weights: the MatMulNBits packing against a numpy unpacker and onnxruntime, the
MatMul/Gemm rewrites, quant_skip, and gpt2_small's weight bytes and logits."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import IR_VERSION, ops, parse_model, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import graphopt
from graphopt import numerics, zoo
from graphopt.errors import GraphoptError, OptionError
from graphopt.ir import DType
from graphopt.passes.precision.blockwise import (
    dequantize,
    pack_nibbles,
    quantize,
    unpack_nibbles,
)
from graphopt.passes.precision.gptq import _inverse_cholesky, gptq_quantize
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


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("k, block", [(64, 32), (40, 16)])  # 40: K padded, 3 zero-point nibbles
def test_columns_quantized_in_pieces_join_into_the_whole(monkeypatch, symmetric, k, block):
    # A large weight is quantized a few columns at a time (a 2.3 GB table had peaked at 19 GB
    # quantized whole); each block lies in its column, so the pieces are the whole's bytes.
    from graphopt.passes.precision import blockwise

    w = np.random.default_rng(3).standard_normal((k, 11)).astype(np.float32)
    whole = quantize(w, block, symmetric)
    monkeypatch.setattr(blockwise, "_COLUMN_CHUNK_ELEMENTS", 4 * k)  # pieces of 4 columns
    pieces = quantize(w, block, symmetric)
    assert np.array_equal(pieces.packed, whole.packed)
    assert np.array_equal(pieces.scales, whole.scales)
    assert (pieces.zero_points is None) == symmetric
    if not symmetric:
        assert np.array_equal(pieces.zero_points, whole.zero_points)
    np.testing.assert_array_equal(dequantize(pieces), dequantize(whole))


def _minmax_squared_error(w: np.ndarray, block: int) -> np.ndarray:
    """Per [column, block], the squared error of plain min-max asymmetric rounding."""
    k, n = w.shape
    n_blocks = -(-k // block)
    padded = np.zeros((n_blocks * block, n))
    padded[:k] = w
    blocks = padded.T.reshape(n, n_blocks, block)
    low, high = np.minimum(blocks.min(-1), 0), np.maximum(blocks.max(-1), 0)
    scale = ((high - low) / 15).astype(np.float32).astype(np.float64)[..., None]
    zero = np.clip(np.round(-low[..., None] / scale), 0, 15)
    q = np.clip(np.round(blocks / scale) + zero, 0, 15)
    return np.square((q - zero) * scale - blocks).sum(-1)


@pytest.mark.parametrize("symmetric", [False, True])
def test_a_block_scale_below_float16s_smallest_step_is_not_divided_by_zero(symmetric):
    # A column of weights near 1e-7 (a layer its training barely used): its blocks' scales are
    # positive in float64 and 0 in float16, the scale type of an fp16 compile. Dividing by that
    # 0 made NaN levels (numpy's RuntimeWarnings on stderr) and a column read as zeros.
    w = RNG.standard_normal((64, 4)).astype(np.float32)
    w[:, 1] = RNG.standard_normal(64).astype(np.float32) * 1e-7
    with np.errstate(divide="raise", invalid="raise"):
        quant = quantize(w, 32, symmetric, scale_dtype=np.float16)
    restored = dequantize(quant)
    assert np.all(np.isfinite(restored)) and np.any(restored[:, 1] != 0)
    np.testing.assert_allclose(restored[:, 1], w[:, 1], atol=1.5e-7)


@pytest.mark.parametrize("k,n,block,symmetric", [(64, 8, 16, False), (100, 5, 32, True),
                                                 (80, 3, 32, False), (256, 4, 128, False)])
def test_quantization_error_is_at_most_half_a_step_inside_the_range(k, n, block, symmetric):
    w = RNG.standard_normal((k, n)).astype(np.float32)
    quant = quantize(w, block, symmetric)
    n_blocks = -(-k // block)
    assert quant.packed.shape == (n, n_blocks, block // 2)
    assert quant.scales.shape == (n * n_blocks,)
    assert (quant.zero_points is None) == symmetric
    if not symmetric:
        assert quant.zero_points.shape == (n * -(-n_blocks // 2),)
    zero = np.full((n, n_blocks), 8.0) if symmetric else unpack_nibbles(
        quant.zero_points.reshape(n, -1))[:, :n_blocks].astype(np.float64)
    per_weight = lambda a: np.repeat(a.reshape(n, n_blocks), block, axis=1)[:, :k].T  # noqa: E731
    step, zero = per_weight(quant.scales.astype(np.float64)), per_weight(zero)
    inside = (w >= -zero * step - 1e-6) & (w <= (15 - zero) * step + 1e-6)
    error = np.abs(dequantize(quant) - w)
    assert np.all(error[inside] <= step[inside] / 2 + 1e-6)
    if symmetric:
        assert inside.all()


@pytest.mark.parametrize("k,n,block", [(64, 8, 16), (80, 3, 32), (256, 16, 128)])
def test_the_fitted_range_never_loses_to_min_max(k, n, block):
    """Clipping a block's extremes is taken only where it lowers the block's squared error,
    and on Gaussian weights it does so overall."""
    w = RNG.standard_normal((k, n)).astype(np.float32)
    quant = quantize(w, block)
    n_blocks = -(-k // block)
    fitted = np.square(dequantize(quant) - w)
    fitted = np.pad(fitted, ((0, n_blocks * block - k), (0, 0))).T.reshape(n, n_blocks, block)
    minmax = _minmax_squared_error(w, block)
    assert np.all(fitted.sum(-1) <= minmax + 1e-9)
    assert fitted.sum() < 0.97 * minmax.sum()


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
                                                   helper.make_opsetid("com.microsoft", 1)],
                                                   ir_version=IR_VERSION)


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
    # Read back, an output read by another node was untyped (no inference knows MatMulNBits):
    # fp16 kept it float32, "their schema cannot be matched", in 4 of GPT-2's 9 4-bit GEMMs.
    inner = compile_int4(parse_model(MATMUL_ADD.replace("y = Add(m, b)", "a = Add(m, b)\n"
                                                        "  y = Relu(a)"), w=w, b=b),
                         int4_group_size=16).to_onnx()
    del inner.graph.value_info[:]  # as a saved model may hold none
    half = graphopt.optimize(inner, precision="fp16")
    (nbits,) = [n for n in half.model.graph if n.op_type == "MatMulNBits"]
    assert nbits.outputs[0].dtype == DType.FLOAT16 and nbits.inputs[2].dtype == DType.FLOAT16
    assert not any("MatMulNBits" in note for note in half.notes), half.notes


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
    # The notes count the layers skipped that the pass would have taken (not the live B).
    assert "QuantizeInt4Weights kept in float: 1 × named by quant_skip" in result.notes
    notes = compile_int4(proto, quant_skip={"MatMul"}).notes
    assert "QuantizeInt4Weights quantized nothing: no MatMul or Gemm weight it takes " \
           "(2 × named by quant_skip)" in notes, notes


def test_the_command_line_names_what_quant_skip_kept_float(tmp_path, capsys):
    proto = parse_model(MATMUL_ADD, w=RNG.standard_normal((64, 16)).astype(np.float32),
                        b=RNG.standard_normal(16).astype(np.float32))
    src = tmp_path / "m.onnx"
    onnx.save(proto, src)
    rc, stdout, err = run_cli(capsys, "optimize", src, "-o", tmp_path / "q.onnx", "--quantize",
                              "int4", "--quant-skip", "MatMul")
    assert rc == 0, err
    assert "QuantizeInt4Weights quantized nothing: no MatMul or Gemm weight it takes (1 × named " \
           "by --quant-skip)" in stdout


def test_a_report_on_seeded_inputs_says_so_even_where_it_warns_of_nothing(tmp_path, capsys):
    # A Llama's int4 compile read 0.992 on one seeded token and 0.986 on real sequences: with
    # no warning under the table, nothing had said the figure was the seeded data's.
    proto = parse_model(MATMUL_ADD, w=RNG.standard_normal((64, 16)).astype(np.float32),
                        b=RNG.standard_normal(16).astype(np.float32))
    src = tmp_path / "m.onnx"
    onnx.save(proto, src)
    rc, stdout, err = run_cli(capsys, "optimize", src, "-o", tmp_path / "q.onnx", "--quantize",
                              "int4")
    assert rc == 0, err
    assert "warning: cosine below" not in stdout + err
    assert "note: measured on seeded random inputs (standard normal floats, integers 0 and 1), " \
           "unlike a deployment's: --verify --inputs FILE.npz measures on real ones" in stdout


def test_quiet_leaves_out_the_report_but_not_its_warning(tmp_path, capsys, monkeypatch):
    # -q prints "nothing but errors and warnings": it had skipped the report and the warning
    # of a cosine below the rule with it (a MobileNetV2 at 0.957, exit 0, nothing printed).
    from graphopt.tools import accuracy_rule

    monkeypatch.setitem(accuracy_rule.LOSSY_PASSES, "QuantizeInt4Weights", 1.0)  # any error
    proto = parse_model(MATMUL_ADD, w=RNG.standard_normal((64, 16)).astype(np.float32),
                        b=RNG.standard_normal(16).astype(np.float32))
    src = tmp_path / "m.onnx"
    onnx.save(proto, src)
    rc, stdout, err = run_cli(capsys, "optimize", src, "-o", tmp_path / "q.onnx", "--quantize",
                              "int4", "-q")
    assert rc == 0 and stdout == "", stdout
    assert err.startswith("graphopt: warning: cosine below 1, the rule `graphopt compare` "
                          "and --verify judge this compile by: "), err


def test_a_weight_too_short_for_a_block_stays_float():
    # K = 1 packed into a 16-weight block took 13 bytes per column for 4: "225% larger".
    rng = np.random.default_rng(7)  # RNG's draws are the later tests' data
    for k, quantized in ((1, False), (2, False), (4, True)):
        proto = parse_model(f"g (float[2,{k}] x) => (y) {{ y = MatMul(x, w) }}",
                            w=rng.standard_normal((k, 64)).astype(np.float32))
        notes = compile_int4(proto).notes
        assert any("QuantizeInt4Weights: 1 weight(s)" in n for n in notes) == quantized, notes
        assert any(f"K = {k}: a 4-bit block of 16, its scale and zero point take more bytes "
                   "than the column it holds" in n for n in notes) != quantized, notes
    # Beside a weight that packs, the short one went unnamed ("0.00 MiB of float weights stay").
    proto = parse_model("""
        g (float[2,64] x, float[2,3] u) => (y, z) {
            y = MatMul(x, w)
            z = MatMul(u, v)
        }""", w=rng.standard_normal((64, 16)).astype(np.float32),
        v=rng.standard_normal((3, 16)).astype(np.float32))
    assert "QuantizeInt4Weights kept in float: 1 × K = 3: a 4-bit block of 16, its scale and " \
        "zero point take more bytes than the column it holds" in compile_int4(proto).notes


def test_calibration_the_model_cannot_run_is_named_in_the_report_warning(tmp_path, capsys):
    # Token ids past the table: the warning blamed the model, not the data it ran on.
    rng = np.random.default_rng(8)
    proto = parse_model("""
        g (int64[1,4] ids) => (float[1,4,16] y) {
            e = Gather (table, ids)
            y = MatMul (e, w)
        }""", table=rng.standard_normal((10, 64)).astype(np.float32),
        w=rng.standard_normal((64, 16)).astype(np.float32))
    src, data = tmp_path / "m.onnx", tmp_path / "ids.npz"
    onnx.save(proto, src)
    np.savez(data, ids=np.full((2, 1, 4), 50, np.int64))
    rc, _, err = run_cli(capsys, "optimize", src, "-o", tmp_path / "q.onnx", "--quantize", "int4",
                         "--calibration", data)
    assert rc == 0 and f"no accuracy report: on --calibration {data}: " in err, err


def test_int4_embeddings_says_which_tables_stay_float_and_why():
    proto, _, _ = _tied_lm(width=40)  # no block of 16 or more divides 40
    notes = compile_int4(proto, int4_embeddings=True).notes
    note = next(n for n in notes if "int4_embeddings" in n)
    assert "2 embedding table(s) stay float, none quantized" in note
    assert "%wpe is 40 wide, which no block of 16 or more divides" in note
    skipped = compile_int4(_tied_lm()[0], int4_embeddings=True, quant_skip={"Gather"}).notes
    assert any("%wte is read by a Gather that is skipped" in n for n in skipped), skipped
    plain = compile_int4(parse_model(MATMUL_ADD, w=np.ones((64, 16), np.float32),
                                     b=np.ones(16, np.float32)), int4_embeddings=True).notes
    assert any("int4_embeddings: the model has no embedding table" in n for n in plain), plain
    # Without the option, or with every table quantized, there is nothing to say.
    for notes in (compile_int4(proto).notes, compile_int4(_tied_lm()[0],
                                                          int4_embeddings=True).notes):
        assert not any("embedding table(s) stay float" in n for n in notes), notes


def test_a_table_gathered_inside_a_loop_is_named_as_staying_float():
    # torch exports nn.EmbeddingBag as a Loop whose body Gathers each bag's rows: the note had
    # said the model has no embedding table while 4.9 MiB of it stayed float.
    body = helper.make_graph(
        [helper.make_node("Gather", ["table", "i"], ["row"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "bag",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("row", TensorProto.FLOAT, [64])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "keep"], ["rows"], body=body),
         helper.make_node("MatMul", ["rows", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("n", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 16])],
        [numpy_helper.from_array(np.ones((100, 64), np.float32), "table"),
         numpy_helper.from_array(np.ones((64, 16), np.float32), "w"),
         numpy_helper.from_array(np.array(True), "keep")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION)
    notes = compile_int4(proto, int4_embeddings=True).notes
    assert any("1 embedding table(s) stay float, none quantized: %table is read inside a Loop "
               "body" in note for note in notes), notes


def test_bad_group_sizes_are_refused():
    proto = parse_model(MATMUL_ADD, w=np.ones((64, 16), np.float32), b=np.ones(16, np.float32))
    for size in (8, 48):
        with pytest.raises(OptionError, match=f"int4_group_size={size}: must be a power of 2"):
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
    assert "% smaller" in size and f"; block {block}, with scales" in size  # the block used
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


# A token model with a tied head: the head's weight is the embedding table transposed, stored
# a second time, as a TorchScript export of GPT-2 stores it; positions have their own table.
TIED_LM = """
g (int64[1,6] ids, int64[1,6] pos) => (float[1,6,40] logits) {
  tok = Gather(wte, ids)
  where = Gather(wpe, pos)
  h = Add(tok, where)
  logits = MatMul(h, head)
}"""


def _tied_lm(width=64):
    wte = RNG.standard_normal((40, width)).astype(np.float32)
    wpe = RNG.standard_normal((8, width)).astype(np.float32)
    return parse_model(TIED_LM, wte=wte, wpe=wpe, head=np.ascontiguousarray(wte.T)), wte, wpe


def _lm_feeds():
    return {"ids": np.array([[0, 39, 7, 7, -1, 12]]), "pos": np.arange(6)[None]}


def test_embedding_tables_and_a_tied_head_share_one_copy_of_4_bit_bytes():
    proto, wte, wpe = _tied_lm()
    result = compile_int4(proto, level=1, int4_embeddings=True)
    out = result.to_onnx()
    onnx.checker.check_model(out)
    assert sorted(ops(result.model)) == sorted([
        "Reshape", "com.microsoft::GatherBlockQuantized", "com.microsoft::GatherBlockQuantized",
        "Add", "com.microsoft::MatMulNBits"])
    nodes = {n.op_type: n for n in out.graph.node}
    reshape, head = nodes["Reshape"], nodes["MatMulNBits"]
    assert head.input[1] == reshape.input[0]  # the head's B is the table's packed bytes
    word = next(n for n in out.graph.node if n.op_type == "GatherBlockQuantized"
                and n.input[0] == reshape.output[0])
    assert word.input[2:4] == head.input[2:4]  # and so are its scales and zero points
    names = {t.name for t in out.graph.initializer}
    assert not names & {"wte", "wpe", "head"}
    # 40×64 + 8×64 float32 weights, and the head's copy, became 4 bits plus a float32 scale and
    # a 4-bit zero point per 32: the table is stored once.
    stored = sum(numpy_helper.to_array(t).nbytes for t in out.graph.initializer)
    assert stored <= (40 + 8) * 64 * 5.125 / 8 + 16
    assert any("2 embedding table(s), 1 shared with a tied output head" in n for n in result.notes)

    table = dequantize(quantize(wte.T, 32)).T  # [40, 64] as both ops read it
    positions = dequantize(quantize(wpe.T, 32)).T
    feeds = _lm_feeds()
    hidden = table[feeds["ids"]] + positions[feeds["pos"]]
    for level in ("disable", "all"):
        np.testing.assert_allclose(numerics.run(out, feeds, level)["logits"], hidden @ table.T,
                                   atol=1e-4, rtol=0)


@pytest.mark.parametrize("precision", ["keep", "mixed-fp16"])
def test_quantized_tables_scales_are_not_counted_as_float_weights_left(precision):
    # A table's scales are [rows, blocks]: the note said "float weights stay
    # (GatherBlockQuantized ×2, MatMulNBits)" of a model with no float weight left.
    result = compile_int4(_tied_lm()[0], int4_embeddings=True, precision=precision)
    note = next(n for n in result.notes if n.startswith("QuantizeInt4Weights: "))
    assert "float weights stay" not in note, note
    skipped = compile_int4(_tied_lm()[0], int4_embeddings=True, quant_skip={"Gather"}).notes
    assert any("float weights stay (Gather ×2)" in n for n in skipped), skipped


def test_embeddings_are_opt_in_and_left_float_when_skipped_shared_or_unblockable():
    proto, _, _ = _tied_lm()
    assert "Gather" in ops(compile_int4(proto).model)  # default: MatMul/Gemm weights only
    skipped = compile_int4(proto, int4_embeddings=True, quant_skip={"Gather"})
    assert ops(skipped.model).count("Gather") == 2
    assert "com.microsoft::MatMulNBits" in ops(skipped.model)  # the head alone, unshared
    # A table another op reads too stays float, so nothing is stored twice.
    shared = parse_model("""
    g (int64[1,6] ids, float[8,64] x) => (float[1,6,64] y, float[8,64] z) {
      y = Gather(wte, ids)
      z = Add(x, wte)
    }""", wte=RNG.standard_normal((8, 64)).astype(np.float32))
    assert ops(compile_int4(shared, int4_embeddings=True).model) == ["Gather", "Add"]
    # GatherBlockQuantized does not pad: a width no block of 16 divides stays float.
    odd, _, _ = _tied_lm(width=40)
    assert ops(compile_int4(odd, int4_embeddings=True).model).count("Gather") == 2


def test_an_om_refuses_ids_outside_a_4_bit_table_as_gather_does(tmp_path, capsys):
    proto, wte, wpe = _tied_lm()
    path = tmp_path / "lm.om"
    graphopt.save(graphopt.optimize(proto, level=1, target="cpu", pass_options={
        "quantize": "int4", "int4_embeddings": True}), path)
    session = graphopt.load(path)
    assert {e["name"]: e.get("index_rows") for e in session.inputs} == {"ids": 40, "pos": 8}
    feeds = _lm_feeds()
    table = dequantize(quantize(wte.T, 32)).T
    edge = {"ids": np.array([[0, 39, -40, -1, 5, 6]]), "pos": feeds["pos"]}  # both ends: valid
    expected = (table[edge["ids"]] + dequantize(quantize(wpe.T, 32)).T[edge["pos"]]) @ table.T
    np.testing.assert_allclose(session.run(edge)["logits"], expected, atol=1e-4, rtol=0)
    for name, value, where in (("ids", 40, 1), ("ids", -41, 4), ("pos", 8, 5)):
        bad = {key: array.copy() for key, array in feeds.items()}
        bad[name][0, where] = value
        with pytest.raises(Exception, match="out of"):  # what the original model does
            numerics.run(proto, bad)
        rows = 40 if name == "ids" else 8
        with pytest.raises(GraphoptError, match=rf"input '{name}' holds {value} at \[0, {where}\]: "
                           rf"the embedding table it indexes has {rows} rows \(ids -{rows} to "
                           rf"{rows - 1}\)"):
            session.run(bad)
    np.savez(tmp_path / "bad.npz", **bad)
    rc, _, err = run_cli(capsys, "run", path, "--inputs", tmp_path / "bad.npz")
    assert rc == 1 and "input 'pos' holds 8 at [0, 5]" in err
    rc, out, _ = run_cli(capsys, "inspect", path)
    assert rc == 0 and "ids -40 to 39" in out and "ids -8 to 7" in out


INDEXED = """
g (int64[2,3] ids, int64[6] flat) => (float[6,64] y, float[2,3,64] z) {
  shape = Constant <value = int64[1] {6}> ()
  row = Reshape(ids, shape)
  y = Gather(wte, row)
  one = Constant <value = int64[1] {1}> ()
  moved = Add(flat, one)
  wide = Reshape(moved, three)
  z = Gather(wte, wide)
}"""


def test_only_ids_that_reach_the_table_unchanged_are_bounded(tmp_path):
    # `ids` reaches the table through a Reshape; `flat` is shifted first, so the bound on it is
    # not the table's: only `ids` is checked.
    wte = RNG.standard_normal((16, 64)).astype(np.float32)
    proto = parse_model(INDEXED, wte=wte, three=np.array([2, 3], np.int64))
    path = tmp_path / "indexed.om"
    graphopt.save(graphopt.optimize(proto, level=1, target="cpu", pass_options={
        "quantize": "int4", "int4_embeddings": True}), path)
    session = graphopt.load(path)
    assert [(e["name"], e.get("index_rows")) for e in session.inputs] == [("ids", 16),
                                                                           ("flat", None)]
    with pytest.raises(GraphoptError, match=r"input 'ids' holds 16 at \[1, 2\]"):
        session.run({"ids": np.array([[0, 1, 2], [3, 4, 16]]), "flat": np.arange(6)})


# Positions counted from the sequence length, as GPT-2's exports compute them.
COUNTED_LM = """
g (int64[1,S] ids) => (float[1,S,40] logits) {
  tok = Gather(wte, ids)
  shape = Shape(ids)
  one = Constant <value = int64 {1}> ()
  zero = Constant <value = int64 {0}> ()
  n = Gather(shape, one)
  pos = Range(zero, n, one)
  where = Gather(wpe, pos)
  h = Add(tok, where)
  logits = MatMul(h, head)
}"""


def test_an_om_refuses_a_sequence_longer_than_its_4_bit_position_table(tmp_path, capsys):
    _, wte, wpe = _tied_lm()
    proto = parse_model(COUNTED_LM, wte=wte, wpe=wpe, head=np.ascontiguousarray(wte.T))
    path = tmp_path / "counted.om"
    graphopt.save(graphopt.optimize(proto, level=1, target="cpu", pass_options={
        "quantize": "int4", "int4_embeddings": True}), path)
    session = graphopt.load(path)
    (entry,) = session.inputs
    assert entry["index_rows"] == 40 and entry["index_dims"] == [[1, 8]]
    assert session.run({"ids": np.arange(8)[None]})["logits"].shape == (1, 8, 40)
    longer = {"ids": np.arange(9)[None]}
    with pytest.raises(Exception, match="out of"):  # what the original model does
        numerics.run(proto, longer)
    with pytest.raises(GraphoptError, match=r"input 'ids' has 9 along axis 1: positions 0 to 8 "
                       r"index an embedding table of 8 rows \(at most 8 along that axis\)"):
        session.run(longer)
    rc, out, _ = run_cli(capsys, "inspect", path)
    assert rc == 0 and "ids -40 to 39, dim 1 ≤ 8" in out


@pytest.mark.parametrize("width,group,block", [(96, 64, 32), (48, 32, 16), (256, 128, 128)])
def test_a_table_takes_the_largest_block_up_to_the_group_that_divides_its_width(
        width, group, block):
    proto, wte, wpe = _tied_lm(width)
    out = compile_int4(proto, int4_embeddings=True, int4_group_size=group).to_onnx()
    sizes = {next(a.i for a in n.attribute if a.name == "block_size")
             for n in out.graph.node if n.domain == "com.microsoft"}
    assert sizes == {block}
    table = dequantize(quantize(wte.T, block)).T
    positions = dequantize(quantize(wpe.T, block)).T
    feeds = _lm_feeds()
    expected = (table[feeds["ids"]] + positions[feeds["pos"]]) @ table.T
    # float32 sums of `width` products: logits in the hundreds carry ~1e-4 of rounding.
    np.testing.assert_allclose(numerics.run(out, feeds)["logits"], expected, atol=1e-4, rtol=2e-6)


def test_gpt2_small_int4_embeddings_store_the_tied_table_once():
    proto = zoo.build("gpt2_small")
    plain = compile_int4(proto, level=2).to_onnx()
    tables = compile_int4(proto, level=2, int4_embeddings=True).to_onnx()
    onnx.checker.check_model(tables)

    def stored(model):
        return sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)

    # Without tables: the float32 token table (1000×256) plus the head's 4-bit copy of it. With
    # them: one 4-bit copy that both read, and a 4-bit position table.
    weights = {t.name for t in tables.graph.initializer}
    assert not any(n.op_type == "Gather" and n.input[0] in weights for n in tables.graph.node)
    assert stored(tables) < stored(plain) - 1000 * 256 * 4 * 0.9
    feeds = {"input_ids": np.random.default_rng(7).integers(0, 1000, (1, 16))}
    expected = numerics.run(proto, feeds)["logits"]
    for level in ("disable", "all"):
        assert cosine_similarity(expected, numerics.run(tables, feeds, level)["logits"]) >= 0.975


def test_accuracy_level_4_multiplies_int8_activations_and_stays_close():
    w = RNG.standard_normal((64, 16)).astype(np.float32)
    proto = parse_model(MATMUL_ADD, w=w, b=RNG.standard_normal(16).astype(np.float32))
    result = compile_int4(proto, int4_accuracy_level=4)
    node = next(iter(result.model.graph))
    assert node.attr("accuracy_level") == 4
    x = RNG.standard_normal((2, 4, 64)).astype(np.float32)
    exact = numerics.run(compile_int4(proto).to_onnx(), {"x": x})["y"]
    fast = numerics.run(result.to_onnx(), {"x": x})["y"]
    assert not np.array_equal(fast, exact)  # A really went through int8
    assert cosine_similarity(exact, fast) > 0.999
    with pytest.raises(OptionError, match="int4_accuracy_level=5: must be"):
        compile_int4(proto, int4_accuracy_level=5)


@pytest.mark.parametrize("level,fold_limit,head_op", [
    (1, None, "MatMul"),          # MatMul(h, Transpose(wte)), left unfolded at -O1
    (2, 1000, "FusedMatMul"),     # a table over the fold limit: FusedMatMul(h, wte, transB=1)
    (2, None, "MatMul"),          # a small one: folded into a second initializer
])
def test_a_head_that_transposes_the_table_at_run_time_is_tied_too(level, fold_limit, head_op):
    # A dynamo export keeps one table and transposes it for the head (GPT-2's 50257×768 table
    # stays that way: FoldConstants will not store it twice, FuseMatMul reads it through
    # transB).
    wte = RNG.standard_normal((40, 64)).astype(np.float32)
    proto = parse_model("""
    g (int64[1,6] ids) => (float[1,6,40] logits) {
      h = Gather(wte, ids)
      head = Transpose(wte)
      logits = MatMul(h, head)
    }""", wte=wte)
    limit = {} if fold_limit is None else {"fold_size_limit": fold_limit}
    before = graphopt.optimize(proto, level=level, **limit).model
    assert head_op in [n.op_type for n in before.graph]
    result = graphopt.optimize(proto, level=level, **limit, pass_options={
        "quantize": "int4", "int4_embeddings": True})
    assert dict(result.log.totals()["QuantizeInt4Weights"]["rewrites"]) == {
        "Gather_quantized": 1, "tied_head": 1}
    out = result.to_onnx()
    assert sorted(n.op_type for n in out.graph.node) == [
        "GatherBlockQuantized", "MatMulNBits", "Reshape"]  # the Transpose went with the head
    assert len(out.graph.initializer) == 4  # packed bytes, scales, zero points, Reshape's shape
    table = dequantize(quantize(wte.T, 32)).T
    ids = _lm_feeds()["ids"]
    np.testing.assert_allclose(numerics.run(out, {"ids": ids})["logits"], table[ids] @ table.T,
                               atol=1e-4, rtol=0)


def test_a_fused_matmul_with_a_constant_transposed_b_is_quantized():
    w = RNG.standard_normal((16, 64)).astype(np.float32)  # [N, K]
    proto = parse_model("""
    g (float[2,3,64] x) => (float[2,3,16] y) {
      y = com.microsoft.FusedMatMul<transB=1, alpha=0.5>(x, w)
    }""", '<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>\n', w=w)
    result = compile_int4(proto)
    assert ops(result.model) == ["com.microsoft::MatMulNBits"]
    x = RNG.standard_normal((2, 3, 64)).astype(np.float32)
    reference = x.astype(np.float64) @ dequantize(quantize(w.T * np.float32(0.5), 32))
    np.testing.assert_allclose(numerics.run(result.to_onnx(), {"x": x})["y"], reference,
                               atol=1e-4, rtol=0)
    batched = parse_model("""
    g (float[2,64,3] x) => (float[2,3,16] y) {
      y = com.microsoft.FusedMatMul<transA=1>(x, w)
    }""", '<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>\n', w=w.T.copy())
    assert ops(compile_int4(batched).model) == ["com.microsoft::FusedMatMul"]


def test_gptq_with_uncorrelated_inputs_is_plain_rounding():
    # H = c·I: no row's error has anywhere better to go, and the fitted ranges are the same.
    w = RNG.standard_normal((96, 8)).astype(np.float32)
    plain = quantize(w, 32)
    gptq = gptq_quantize(w, 5.0 * np.eye(96), 32)
    assert np.array_equal(gptq.packed, plain.packed)
    assert np.array_equal(gptq.scales, plain.scales)
    assert np.array_equal(gptq.zero_points, plain.zero_points)


@pytest.mark.parametrize("k,n,block", [(128, 16, 32), (80, 6, 32), (64, 24, 64)])
def test_gptq_keeps_the_outputs_closer_than_rounding(k, n, block):
    # Correlated inputs with a non-zero mean, as after a GELU.
    mix = RNG.standard_normal((k, k)) / np.sqrt(k)
    x = RNG.standard_normal((512, k)) @ mix + 0.5
    w = RNG.standard_normal((k, n)).astype(np.float32)
    gptq = gptq_quantize(w, x.T @ x, block)
    assert gptq.packed.shape == (n, -(-k // block), block // 2)

    def output_error(quant):
        return np.linalg.norm(x @ dequantize(quant) - x @ w)

    assert output_error(gptq) < 0.8 * output_error(quantize(w, block))


def test_int4_method_gptq_needs_calibration_and_uses_it(tmp_path):
    w = RNG.standard_normal((64, 16)).astype(np.float32)
    proto = parse_model(MATMUL_ADD, w=w, b=RNG.standard_normal(16).astype(np.float32))
    with pytest.raises(OptionError, match="int4_method='gptq' needs calibration="):
        compile_int4(proto, int4_method="gptq")
    with pytest.raises(OptionError, match="int4_method='newton': unknown"):
        compile_int4(proto, int4_method="newton")
    mix = RNG.standard_normal((64, 64)) / 8
    # 256 rows for 64 features: fewer than the features would fit their subspace alone.
    samples = (RNG.standard_normal((32, 2, 4, 64)) @ mix + 0.5).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=samples)
    gptq = compile_int4(proto, int4_method="gptq", calibration=str(tmp_path / "calib.npz"))
    rtn = compile_int4(proto)
    out = gptq.to_onnx()
    onnx.checker.check_model(out)
    x = (RNG.standard_normal((2, 4, 64)) @ mix + 0.5).astype(np.float32)
    exact = numerics.run(proto, {"x": x})["y"]
    errors = {name: np.linalg.norm(numerics.run(model.to_onnx(), {"x": x})["y"] - exact)
              for name, model in (("gptq", gptq), ("rtn", rtn))}
    assert errors["gptq"] < 0.8 * errors["rtn"]
    assert not any("fewer rows than features" in note for note in gptq.notes)
    np.savez(tmp_path / "few.npz", x=samples[:4])  # 32 rows for 64 features
    few = compile_int4(proto, int4_method="gptq", calibration=str(tmp_path / "few.npz"))
    assert any("fewer rows than features for 1 layer input(s) (e.g. %x: 32 for 64)" in note
               for note in few.notes)
    assert not any("NaN" in note for note in gptq.notes)
    # Rows holding NaN are left out of the sums, as int8 leaves them out of its ranges, and
    # said so: the only sign had been a lower row count.
    poisoned = samples.copy()
    poisoned[:16, 0, 1, 3] = np.nan  # one row of 8 in each of 16 samples
    np.savez(tmp_path / "nan.npz", x=poisoned)
    nan = compile_int4(proto, int4_method="gptq", calibration=str(tmp_path / "nan.npz"))
    assert any("rows holding NaN or Inf were left out of 1 layer input(s)' sums (e.g. %x: 16 "
               "of 256 rows)" in note for note in nan.notes), nan.notes


# A table its Gathers read and a head tied to it reads, the head's input a graph input so that
# the calibration sets how it correlates.
TIED_HEAD = """
g (int64[1,6] ids, float[1,6,64] x) => (float[1,6,64] emb, float[1,6,40] logits) {
  emb = Gather(wte, ids)
  logits = MatMul(x, head)
}"""


def test_gptq_rounds_a_tied_head_against_its_inputs_and_its_gathers(tmp_path):
    # GPTQ against the head's XᵀX alone moves the head's error into the table's rows; balanced
    # with the identity (tied_gram), the head's outputs get closer than rounding's and the rows
    # the Gathers read stay about as close.
    wte = RNG.standard_normal((40, 64)).astype(np.float32)
    proto = parse_model(TIED_HEAD, wte=wte, head=np.ascontiguousarray(wte.T))
    mix = RNG.standard_normal((64, 64)) / 8
    np.savez(tmp_path / "calib.npz", ids=RNG.integers(0, 40, (64, 1, 6)),
             x=(RNG.standard_normal((64, 1, 6, 64)) @ mix + 0.5).astype(np.float32))
    options = {"int4_embeddings": True, "int4_group_size": 32}
    gptq = compile_int4(proto, int4_method="gptq", calibration=str(tmp_path / "calib.npz"),
                        **options)
    assert dict(gptq.log.totals()["QuantizeInt4Weights"]["rewrites"]) == {
        "tied_head": 1, "Gather_quantized": 1}
    feeds = {"ids": np.arange(40)[None, :6], "x": (RNG.standard_normal((1, 6, 64)) @ mix + 0.5)
             .astype(np.float32)}
    exact = numerics.run(proto, feeds)
    errors = {}
    for name, model in (("gptq", gptq), ("rtn", compile_int4(proto, **options))):
        got = numerics.run(model.to_onnx(), feeds)
        errors[name] = [np.linalg.norm(got[out] - exact[out]) for out in ("logits", "emb")]
    # Over 12 seeds: 0.71-0.88 of rounding's error for the head, 1.02-1.07 for the Gathers.
    assert errors["gptq"][0] < 0.93 * errors["rtn"][0]
    assert errors["gptq"][1] < 1.15 * errors["rtn"][1]


def test_gptq_profiles_the_calibration_data_does_not_fit_take_its_statistics(tmp_path):
    # Calibrated at seq 4, compiled for seq 8 and seq 4: XᵀX sums over rows, so the profile
    # of the other length quantizes with the same Gram matrices, to the same levels.
    w = RNG.standard_normal((64, 16)).astype(np.float32)
    proto = parse_model(MATMUL_ADD.replace("[2,4,", "[2,seq,"), w=w,
                        b=RNG.standard_normal(16).astype(np.float32))
    np.savez(tmp_path / "calib.npz", x=RNG.standard_normal((32, 2, 4, 64)).astype(np.float32))
    result = graphopt.optimize(proto, dynamic_dims="seq=8;seq=4", pass_options={
        "quantize": "int4", "int4_method": "gptq", "calibration": str(tmp_path / "calib.npz")})
    assert ("QuantizeInt4Weights: the calibration data fits profile profile1 (seq=4), not "
            "profile0 (seq=8): it takes GPTQ's input statistics measured there") in result.notes
    first, second = ({name: v.constant() for name, v in p.result.model.graph.initializers.items()}
                     for p in result.profiles)
    assert first.keys() == second.keys()
    for name, value in first.items():
        np.testing.assert_array_equal(second[name], value, err_msg=name)
    # Not plain rounding: GPTQ's levels differ from those of the compile without data.
    rtn = compile_int4(proto, input_shapes={"x": [2, 8, 64]})
    assert any(not np.array_equal(v.constant(), first[name])
               for name, v in rtn.model.graph.initializers.items() if name in first)


def test_a_table_a_loop_body_also_reads_stays_float():
    table = RNG.standard_normal((16, 64)).astype(np.float32)
    proto = parse_model("""
    g (int64[2] ids, int64 n, bool c, int64[2] more) => (float[2,64] y, float[2,64] z) {
      y = Gather(wte, ids)
      z = Loop(n, c, y) <body = b (int64 i, bool cond, float[2,64] acc) =>
                                  (bool cond_out, float[2,64] acc_out) {
        cond_out = Identity(cond)
        row = Gather(wte, more)
        acc_out = Add(acc, row)
      }>
    }""", wte=table)
    result = compile_int4(proto, int4_embeddings=True)
    assert "Gather" in ops(result.model)
    feeds = {"ids": np.array([1, 2]), "n": np.array(2), "c": np.array(True),
             "more": np.array([3, 4])}
    np.testing.assert_array_equal(numerics.run(result.to_onnx(), feeds)["z"],
                                  numerics.run(proto, feeds)["z"])


@pytest.mark.parametrize("n", [5, 128, 300])
def test_the_inverse_cholesky_factor_matches_the_direct_one(n):
    a = RNG.standard_normal((n, n))
    h = a @ a.T / n + 0.01 * np.eye(n)
    upper = _inverse_cholesky(h)
    np.testing.assert_allclose(upper, np.linalg.cholesky(np.linalg.inv(h)).T, rtol=0,
                               atol=1e-9 * np.abs(upper).max())
    assert np.array_equal(upper, np.triu(upper))


def test_the_command_line_compiles_with_gptq_embeddings_and_an_accuracy_level(tmp_path, capsys):
    proto, _, _ = _tied_lm()
    src, out = tmp_path / "lm.onnx", tmp_path / "lm_q4.onnx"
    onnx.save(proto, src)
    np.savez(tmp_path / "ids.npz", ids=RNG.integers(0, 40, (24, 1, 6)),
             pos=np.tile(np.arange(6), (24, 1, 1)))
    rc, stdout, err = run_cli(capsys, "optimize", src, "-o", out, "--quantize", "int4",
                              "--int4-method", "gptq", "--int4-embeddings",
                              "--int4-accuracy-level", "4", "--calibration",
                              tmp_path / "ids.npz")
    assert rc == 0, err
    assert "Gather_quantized=2" in stdout and "tied_head=1" in stdout
    assert "accuracy vs" in stdout
    written = onnx.load(out)
    onnx.checker.check_model(written)
    head = next(n for n in written.graph.node if n.op_type == "MatMulNBits")
    assert helper.get_attribute_value(
        next(a for a in head.attribute if a.name == "accuracy_level")) == 4


def test_a_float16_head_under_a_mixed_mode_still_shares_its_float32_table():
    # mixed-fp16 converts the head's MatMul and rounds its weight to float16; the Gathers keep
    # the float32 table. The shared tensors take float16 scales, and a Cast brings the rows the
    # Gather reads back to float32.
    proto, wte, wpe = _tied_lm()
    result = graphopt.optimize(proto, level=1, pass_options={
        "quantize": "int4", "int4_embeddings": True, "precision": "mixed-fp16"})
    assert dict(result.log.totals()["QuantizeInt4Weights"]["rewrites"]) == {
        "Gather_quantized": 2, "tied_head": 1}
    out = result.to_onnx()
    onnx.checker.check_model(out)
    nodes = {n.op_type: n for n in out.graph.node}
    assert nodes["MatMulNBits"].input[1] == nodes["Reshape"].input[0]
    table = dequantize(quantize(wte.astype(np.float16).T, 32, scale_dtype=np.float16)).T
    positions = dequantize(quantize(wpe.T, 32)).T
    feeds = _lm_feeds()
    expected = (table[feeds["ids"]] + positions[feeds["pos"]]) @ table.T
    got = numerics.run(out, feeds)["logits"]
    assert got.dtype == np.float32
    assert cosine_similarity(got, expected) > 0.9999


def test_o3_fused_gemms_quantize_as_at_o2():
    # -O3's FuseActivation made FusedGemm of MatMul + LeakyRelu and Gemm + Relu, which int4
    # did not take: nothing was quantized, under the note that the model had no such layer.
    weights = {f"w{i}": RNG.standard_normal((64, 64)).astype(np.float32) for i in range(3)}
    proto = parse_model("""
        g (float[4, 64] x) => (float[4, 64] y) {
            m0 = MatMul (x, w0)
            a0 = LeakyRelu <alpha = 0.1> (m0)
            m1 = Gemm <transB = 1> (a0, w1, b1)
            a1 = Relu (m1)
            y = Gemm <alpha = 0.5> (a1, w2)
        }""", b1=np.ones(64, np.float32), **weights)
    results = {level: compile_int4(proto, level=level, int4_group_size=16,
                                   quant_skip={"a1/GemmRelu/FusedGemm"}) for level in (2, 3)}
    assert ops(results[2].model).count("com.microsoft::MatMulNBits") == 3
    assert ops(results[3].model).count("com.microsoft::MatMulNBits") == 2
    assert "com.microsoft::FusedGemm" in ops(results[3].model)  # the skipped one, joined again
    out = results[3].to_onnx()
    onnx.checker.check_model(out)
    feeds = {"x": RNG.standard_normal((4, 64)).astype(np.float32)}
    assert cosine_similarity(numerics.run(out, feeds)["y"], numerics.run(proto, feeds)["y"]) \
        > 0.99


def test_a_compile_that_quantizes_nothing_says_why():
    conv = parse_model("""
    g (float[1,3,8,8] x) => (float[1,4,8,8] y) { y = Conv <pads = [1, 1, 1, 1]> (x, w) }""",
                       w=RNG.standard_normal((4, 3, 3, 3)).astype(np.float32))
    result = compile_int4(conv)
    assert any("QuantizeInt4Weights quantized nothing: the model has no MatMul or Gemm with a "
               "constant weight" in note for note in result.notes), result.notes
    computed = parse_model("g (float[2,8] a, float[8,4] b) => (float[2,4] y) { y = MatMul (a, b) }")
    note = next(n for n in compile_int4(computed).notes if "quantized nothing" in n)
    assert "1 × B is not a constant matrix" in note


def test_gptq_takes_two_layers_one_feeding_the_other(tmp_path):
    # Rewriting the first MatMul renames its output, the second's input: its Gram matrix was
    # looked up by the new name (a KeyError).
    rng = np.random.default_rng(3)
    proto = parse_model("""
        g (float[4, 64] x) => (float[4, 32] y) {
            h = MatMul(x, w1)
            a = Add(h, b1)
            y = MatMul(a, w2)
        }""", w1=(rng.standard_normal((64, 64)) * 0.1).astype(np.float32),
        b1=(rng.standard_normal(64) * 0.1).astype(np.float32),
        w2=(rng.standard_normal((64, 32)) * 0.1).astype(np.float32))
    calibration = tmp_path / "x.npz"
    np.savez(calibration, x=rng.standard_normal((64, 4, 64)).astype(np.float32))
    result = graphopt.optimize(proto, quantize="int4", calibration=calibration,
                               pass_options={"int4_method": "gptq", "int4_group_size": 16})
    model = result.to_onnx()
    assert [n.op_type for n in model.graph.node].count("MatMulNBits") == 2
    feeds = {"x": rng.standard_normal((4, 64)).astype(np.float32)}
    assert cosine_similarity(numerics.run(proto, feeds)["y"], numerics.run(model, feeds)["y"]) \
        > 0.99


# A table, a tied head and a layer, as TIED_LM, with a layer between the embeddings and the head.
LAYERED_LM = """
g (int64[1,6] ids, int64[1,6] pos) => (float[1,6,64] tok, float[1,6,40] logits) {
  tok = Gather(wte, ids)
  where = Gather(wpe, pos)
  h = Add(tok, where)
  m = MatMul(h, w)
  logits = MatMul(m, head)
}"""


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("method", ["rtn", "gptq"])
def test_a_weight_or_table_holding_nan_or_inf_stays_float_with_a_note(tmp_path, bad, method):
    # A block's range of a NaN or an Inf is NaN: its scale made every weight of the block NaN
    # (and GPTQ carried the NaN into the column's later blocks), without a word.
    rng = np.random.default_rng(4)
    wte = rng.standard_normal((40, 64)).astype(np.float32)
    wpe = rng.standard_normal((8, 64)).astype(np.float32)
    w = (rng.standard_normal((64, 64)) / 8).astype(np.float32)
    wte[3, 5] = w[7, 2] = bad
    proto = parse_model(LAYERED_LM, wte=wte, wpe=wpe, w=w, head=np.ascontiguousarray(wte.T))
    options = {"int4_embeddings": True}
    if method == "gptq":
        np.savez(tmp_path / "ids.npz", ids=rng.integers(0, 40, (32, 1, 6)),
                 pos=np.tile(np.arange(6), (32, 1, 1)))
        options.update(int4_method="gptq", calibration=str(tmp_path / "ids.npz"))
    result = compile_int4(proto, **options)
    out = result.to_onnx()
    onnx.checker.check_model(out)
    for tensor in out.graph.initializer:
        if tensor.name.endswith(("_scales", "_zero_points", "_q4")):
            assert np.isfinite(numpy_helper.to_array(tensor).astype(np.float64)).all(), \
                tensor.name
    assert sorted(ops(result.model)) == sorted([
        "Gather", "com.microsoft::GatherBlockQuantized", "Add", "MatMul", "MatMul"])
    notes = "\n".join(result.notes)
    assert "2 weight(s) hold NaN or Inf and stay float: %head, %w" in notes, notes
    assert "%wte holds NaN or Inf" in notes, notes
    # Row 3 of the table keeps its one NaN or Inf, not a block of NaN.
    feeds = {"ids": np.array([[0, 3, 2, 4, 3, 6]]), "pos": np.arange(6)[None]}
    exact, got = numerics.run(proto, feeds)["tok"], numerics.run(out, feeds)["tok"]
    np.testing.assert_array_equal(got, exact)


def test_gptq_rounds_a_tied_head_against_its_inputs_alone_when_its_table_stays_float(tmp_path):
    # A table that another op reads too stays float, so no Gather reads the head's levels:
    # balancing the head's XᵀX with the Gathers' identity (tied_gram) only lost the head
    # accuracy, against the compile without int4_embeddings (logits error 8.0 against 7.2).
    wte = RNG.standard_normal((40, 64)).astype(np.float32)
    proto = parse_model("""
    g (int64[1,6] ids, float[1,6,64] x, float[40,64] y) =>
      (float[1,6,64] emb, float[1,6,40] logits, float[40,64] z) {
      emb = Gather(wte, ids)
      logits = MatMul(x, head)
      z = Add(y, wte)
    }""", wte=wte, head=np.ascontiguousarray(wte.T))
    mix = RNG.standard_normal((64, 64)) / 8
    np.savez(tmp_path / "calib.npz", ids=RNG.integers(0, 40, (64, 1, 6)),
             x=(RNG.standard_normal((64, 1, 6, 64)) @ mix + 0.5).astype(np.float32),
             y=np.zeros((64, 40, 64), np.float32))
    options = {"int4_method": "gptq", "calibration": str(tmp_path / "calib.npz")}
    tied = compile_int4(proto, int4_embeddings=True, **options)
    assert any("%wte is read by other ops too" in note for note in tied.notes), tied.notes
    alone = compile_int4(proto, **options)

    def head_tensors(result):
        model = result.to_onnx()
        head = next(n for n in model.graph.node if n.op_type == "MatMulNBits")
        arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        return [arrays[name] for name in head.input[1:4]]

    for got, expected in zip(head_tensors(tied), head_tensors(alone)):  # a table's are 2-D
        np.testing.assert_array_equal(got.reshape(-1), expected.reshape(-1))


# One table, two heads tied to it, on inputs that correlate differently.
TWO_HEADS = """
g (int64[1,6] ids, float[1,6,64] x, float[1,6,64] x2) =>
  (float[1,6,64] emb, float[1,6,40] logits, float[1,6,40] logits2) {
  emb = Gather(wte, ids)
  logits = MatMul(x, head)
  logits2 = MatMul(x2, head2)
}"""


def test_gptq_rounds_a_table_two_heads_share_against_both_heads_inputs(tmp_path):
    # The first head's XᵀX alone decided the levels both heads read: which head came first in
    # the graph changed them, and the second head could lose to plain rounding (10.9 against
    # 10.1 here). Summed, the order makes no difference and each head beats rounding.
    rng = np.random.default_rng(0)
    wte = rng.standard_normal((40, 64)).astype(np.float32)
    mixes = [rng.standard_normal((64, 64)) / 8 for _ in range(2)]

    def inputs(shape):
        return {name: (rng.standard_normal((*shape, 64)) @ mix + shift).astype(np.float32)
                for name, mix, shift in (("x", mixes[0], 0.5), ("x2", mixes[1], -0.5))}

    np.savez(tmp_path / "calib.npz", ids=rng.integers(0, 40, (64, 1, 6)), **inputs((64, 1, 6)))
    feeds = {"ids": np.arange(40)[None, :6], **inputs((1, 6))}
    tables = {"wte": wte, "head": np.ascontiguousarray(wte.T),
              "head2": np.ascontiguousarray(wte.T)}
    proto = parse_model(TWO_HEADS, **tables)
    swapped = parse_model(TWO_HEADS.replace("""
  logits = MatMul(x, head)
  logits2 = MatMul(x2, head2)""", """
  logits2 = MatMul(x2, head2)
  logits = MatMul(x, head)"""), **tables)
    options = {"int4_embeddings": True, "int4_method": "gptq",
               "calibration": str(tmp_path / "calib.npz")}
    results = [compile_int4(model, **options) for model in (proto, swapped)]
    assert any("1 embedding table(s), 1 shared with 2 tied output heads" in note
               for note in results[0].notes), results[0].notes

    def bytes_of(result):
        model = result.to_onnx()
        head = next(n for n in model.graph.node if n.op_type == "MatMulNBits")
        arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        return [arrays[name] for name in head.input[1:4]]

    for first, second in zip(*map(bytes_of, results)):
        np.testing.assert_array_equal(first, second)
    exact = numerics.run(proto, feeds)
    gptq = numerics.run(results[0].to_onnx(), feeds)
    rtn = numerics.run(compile_int4(proto, int4_embeddings=True).to_onnx(), feeds)
    for out in ("logits", "logits2"):
        assert np.linalg.norm(gptq[out] - exact[out]) < np.linalg.norm(rtn[out] - exact[out])


def test_the_summary_says_a_tied_table_is_shared_only_when_it_is():
    # The head was counted as sharing a table whenever it was tied to one: here that table
    # stays float, and the note said the position table was shared with the head.
    wte = RNG.standard_normal((40, 64)).astype(np.float32)
    proto = parse_model("""
    g (int64[1,6] ids, int64[1,6] pos, float[40,64] y) =>
      (float[1,6,40] logits, float[40,64] z) {
      tok = Gather(wte, ids)
      where = Gather(wpe, pos)
      h = Add(tok, where)
      logits = MatMul(h, head)
      z = Add(y, wte)
    }""", wte=wte, wpe=RNG.standard_normal((8, 64)).astype(np.float32),
                        head=np.ascontiguousarray(wte.T))
    notes = compile_int4(proto, int4_embeddings=True).notes
    summary = next(n for n in notes if n.startswith("QuantizeInt4Weights: 1 weight(s)"))
    assert "1 weight(s) and 1 embedding table(s), " in summary and "shared" not in summary, notes


@pytest.mark.parametrize("method, precision", [("rtn", "keep"), ("gptq", "keep"),
                                               ("gptq", "fp16")])
def test_a_weight_two_matmuls_share_is_rounded_and_stored_once(tmp_path, method, precision):
    # GPTQ rounded it for each layer's inputs and stored both roundings; the note counted its
    # bytes twice on both sides of the arrow either way. In fp16 the second layer, a MatMul
    # and its bias Add fused into a Gemm, read the weight through alpha in float32: another.
    rng = np.random.default_rng(0)
    proto = parse_model("""
        g (float[16,256] x) => (float[16,256] y) {
            a = MatMul(x, w)
            r = Relu(a)
            m = MatMul(r, w)
            y = Add(m, b)
        }""", w=(rng.standard_normal((256, 256)) * 0.05).astype(np.float32),
        b=rng.standard_normal(256).astype(np.float32))
    calibration = tmp_path / "calib.npz"
    np.savez(calibration, x=rng.standard_normal((32, 16, 256)).astype(np.float32))
    extra = {"int4_method": "gptq", "calibration": str(calibration)} if method == "gptq" else {}
    result = compile_int4(proto, level=2, precision=precision, **extra)
    out = result.to_onnx()
    nbits = [n for n in out.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == 2 and nbits[0].input[1:4] == nbits[1].input[1:4]  # B, scales, zeros
    assert len([t for t in out.graph.initializer if t.name.endswith("_q4")]) == 1
    size = "0.25 MiB → 0.04 MiB" if precision == "keep" else "0.12 MiB → 0.04 MiB"
    assert any(f"1 weight(s) read by 2 layers, {size}" in note
               for note in result.notes), result.notes
    feeds = {"x": rng.standard_normal((16, 256)).astype(np.float32)}
    assert cosine_similarity(numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]) \
        > 0.99


def test_a_float16_int4_om_at_accuracy_level_4_runs_at_the_level_that_computes_it(tmp_path):
    # onnxruntime 1.32's float16 MatMulNBits at accuracy level 4 is wrong below "all" while it
    # pre-packs the weights; an -O2 .om recorded "extended", and a gated MLP read cosine 0.85.
    rng = np.random.default_rng(0)
    proto = parse_model("""
    g (float[1, 16, 64] x) => (float[1, 16, 64] y) {
        g = MatMul(x, wg)
        u = MatMul(x, wu)
        s = Sigmoid(g)
        silu = Mul(g, s)
        a = Mul(silu, u)
        d = MatMul(a, wd)
        y = Add(x, d)
    }""", **{name: (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
             for name, shape in (("wg", (64, 128)), ("wu", (64, 128)), ("wd", (128, 64)))})
    result = graphopt.optimize(proto, level=2, target="cpu", precision="fp16", pass_options={
        "quantize": "int4", "int4_accuracy_level": 4})
    path = tmp_path / "mlp.om"
    graphopt.save(result, path)
    session = graphopt.load(path)
    (part,) = session.artifact.manifest["partitions"]
    assert part["optimization_level"] == "all"
    x = rng.standard_normal((1, 16, 64)).astype(np.float32)
    as_onnx = numerics.run(result.to_onnx(), {"x": x}, "all")["y"]
    assert cosine_similarity(session.run({"x": x})["y"], as_onnx) > 0.9999
    assert cosine_similarity(as_onnx, numerics.run(proto, {"x": x})["y"]) > 0.99
