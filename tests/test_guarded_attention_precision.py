"""Precision modes on PyTorch's NaN-guarded attention once packed (PackedGuardedSelfAttention,
whose guard reads V from Attention's `present`): fp16 converts it, int8 and int4 quantize its
QKV weight (MultiHeadAttention hands the guard V), and the zero rows of fully masked queries
stay exact."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from helpers import IR_VERSION
from onnx import TensorProto, helper, numpy_helper

import graphopt
from graphopt import numerics
from graphopt.ir import DType
from graphopt.passes import Options, PassContext
from graphopt.passes.precision.int4 import QuantizeInt4Weights
from graphopt.tools.metrics import cosine_similarity

B, S, N, H = 2, 6, 4, 16
D = N * H
MIN = float(np.finfo(np.float32).min)


def guarded_attention(B: int = B, S: int = S, N: int = N, H: int = H) -> onnx.ModelProto:
    """One self-attention block on x [B,S,D] with a padding mask, as PyTorch exports
    scaled_dot_product_attention: Where(IsNaN(P), 0, P) after the Softmax."""
    D = N * H
    rng = np.random.default_rng(11)
    nodes, inits = [], []

    def const(name, array, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(array, dtype), name))
        return name

    def op(op_type, inputs, out, **attrs):
        nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    const("heads_shape", [B, S, N, H], np.int64)
    for p in "qkv":
        op("MatMul", ["x", const(f"w{p}", rng.standard_normal((D, D)) * 0.2)], f"{p}_mm")
        op("Add", [f"{p}_mm", const(f"b{p}", rng.standard_normal(D) * 0.1)], f"{p}_proj")
        op("Reshape", [f"{p}_proj", "heads_shape"], f"{p}_heads")
    op("Transpose", ["q_heads"], "q", perm=[0, 2, 1, 3])
    op("Transpose", ["k_heads"], "kt", perm=[0, 2, 3, 1])
    op("Transpose", ["v_heads"], "v", perm=[0, 2, 1, 3])
    op("Div", [op("MatMul", ["q", "kt"], "qk"), const("root", np.sqrt(H))], "scores")
    op("Softmax", [op("Add", ["scores", "mask"], "masked")], "p", axis=-1)
    op("Where", [op("IsNaN", ["p"], "nan"), const("zero", 0.0), "p"], "p0")
    op("Transpose", [op("MatMul", ["p0", "v"], "ctx")], "ctx_t", perm=[0, 2, 1, 3])
    op("Reshape", ["ctx_t", const("merged", [B, S, D], np.int64)], "y")
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, S, D])]
    graph = helper.make_graph(nodes, "guarded", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, D]),
        helper.make_tensor_value_info("mask", TensorProto.FLOAT, [B, 1, 1, S])], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=IR_VERSION)


def _feeds(every_key_masked: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(4)
    mask = np.zeros((B, 1, 1, S), np.float32)
    mask[1, ..., 4:] = MIN  # the second sequence's last two keys are padding
    if every_key_masked:
        mask[1] = -np.inf  # every query of it is a NaN row, which the guard zeroes
    return {"x": rng.standard_normal((B, S, D)).astype(np.float32), "mask": mask}


def _counts(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def _calibration(tmp_path) -> str:
    path = tmp_path / "calibration.npz"
    np.savez(path, **{k: v[None] for k, v in _feeds(False).items()})
    return str(path)


MODES = {
    "fp16": ({"precision": "fp16"}, 0.9999),
    "int8": ({"quantize": "int8", "quant_keep_ends": False}, 0.999),
    "int4": ({"quantize": "int4"}, 0.98),  # the cosine --verify asks of int4
}


@pytest.mark.parametrize("mode", MODES)
def test_guarded_attention_is_converted_and_keeps_its_zero_rows(tmp_path, mode):
    options, min_cosine = MODES[mode]
    if mode == "int8":
        options = {**options, "calibration": _calibration(tmp_path)}
    proto = guarded_attention()
    out = graphopt.optimize(proto, pass_options=options).to_onnx()
    onnx.checker.check_model(out)
    ops = _counts(out)
    if mode == "fp16":
        (attention,) = [n for n in out.graph.node if n.op_type == "Attention"]
        weights = {i.name: i for i in out.graph.initializer}
        assert weights[attention.input[1]].data_type == TensorProto.FLOAT16
    else:
        gemm = "DynamicQuantizeMatMul" if mode == "int8" else "MatMulNBits"
        assert ops["Attention"] == 0 and ops["MultiHeadAttention"] == 1 and ops[gemm] == 1, ops
        assert ops["Gather"] == 0, ops  # the guard reads MultiHeadAttention's present_value
        (mha,) = [n for n in out.graph.node if n.op_type == "MultiHeadAttention"]
        readers = [n for n in out.graph.node if mha.output[2] in n.input]
        assert readers and mha.output[1] not in {i for n in out.graph.node for i in n.input}
    for every_key_masked in (False, True):
        feeds = _feeds(every_key_masked)
        expected, actual = numerics.run(proto, feeds)["y"], numerics.run(out, feeds)["y"]
        assert np.array_equal(np.isnan(expected), np.isnan(actual))
        if every_key_masked:
            assert np.all(expected[1] == 0) and np.all(actual[1] == 0)  # the guard's zero rows
        assert cosine_similarity(expected[0], actual[0]) > min_cosine, mode


def test_present_read_as_a_whole_keeps_the_attention_float():
    # A reader of `present` that is no Gather of K or V (here: the model's output) has no
    # counterpart in MultiHeadAttention's outputs, so the Attention stays as it is.
    model = graphopt.optimize(guarded_attention()).model
    (attention,) = [n for n in model.graph if n.op_type == "Attention"]
    present = attention.outputs[1]
    assert present.dtype == DType.FLOAT and present.shape == (2, B, N, S, H)  # typed for fp16
    model.graph.outputs.append(present)
    result = QuantizeInt4Weights().run(model, PassContext(Options(quantize="int4")))
    assert [n.op_type for n in model.graph if n.op_type == "Attention"] == ["Attention"]
    assert "Attention_quantized" not in result.stats
    # The same once the guard is gone: the model's output is the only reader left.
    model = graphopt.optimize(guarded_attention()).model
    (attention,) = [n for n in model.graph if n.op_type == "Attention"]
    present = attention.outputs[1]
    for reader, _ in list(present.uses):
        reader.set_inputs([None if v is present else v for v in reader.inputs])
    model.graph.outputs.append(present)
    QuantizeInt4Weights().run(model, PassContext(Options(quantize="int4")))
    assert [n.op_type for n in model.graph if n.op_type == "Attention"] == ["Attention"]


def test_int4_names_the_float_weights_it_leaves(tmp_path):
    # A Conv's weight stays float under weight-only int4: the note says how many bytes stay,
    # so that "84% smaller" is not read as the whole model's figure.
    rng = np.random.default_rng(2)
    proto = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "wc"], ["c"]),
         helper.make_node("Flatten", ["c"], ["f"]),
         helper.make_node("MatMul", ["f", "wm"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
        [numpy_helper.from_array(rng.standard_normal((8, 4, 1, 1)).astype(np.float32), "wc"),
         numpy_helper.from_array(rng.standard_normal((512, 16)).astype(np.float32), "wm")]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    notes = graphopt.optimize(proto, pass_options={"quantize": "int4"}).notes
    (note,) = [n for n in notes if n.startswith("QuantizeInt4Weights: 1 weight(s)")]
    assert note.endswith("; 128 B of float weights stay (Conv)"), note  # 8 × 4 floats
