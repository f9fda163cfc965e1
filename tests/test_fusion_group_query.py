"""GroupQueryCausalAttention: causal attention over K/V heads repeated for groups of query heads
becomes onnxruntime's GroupQueryAttention over the unrepeated heads; other repeats and masks
stay MultiHeadAttention; outputs hold at ORT_DISABLE_ALL."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from helpers import IR_VERSION, as_float16
from onnx import TensorProto, helper, numpy_helper

import graphopt
from graphopt import numerics

B, S, N, G, H = 2, 6, 4, 2, 8   # batch, tokens, query heads, K/V heads, head size
D = N * H
MIN = float(np.finfo(np.float32).min)


def grouped_attention(mask="add", repeat="in_place", batch=B,
                      rotated=False, open_heads=False, size=H) -> onnx.ModelProto:
    """A Llama-style self-attention block on x [batch, S, D]: Q over N heads, K and V over G
    heads repeated for the query heads as transformers' repeat_kv writes it (`in_place`: head n
    reads K/V head n // (N/G)), or tiled (`tiled`: head n reads head n % G), then scores,
    the mask, softmax, the context and the output projection. `rotated` scales Q's and K's split
    heads per token and channel, as a rotary embedding between the split and the repeat does.
    `open_heads` splits them as transformers does, view(B, S, -1, head_dim); `size` is the
    head size."""
    H = size  # noqa: N806 - the module's names, at this block's head size
    D = N * H  # noqa: N806
    rng = np.random.default_rng(7)
    nodes, inits = [], []

    def const(name, array, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(array, dtype), name))
        return name

    def op(op_type, *inputs, **attrs):
        out = f"{op_type.lower()}_{len(nodes)}"
        nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def heads(x, count, name):
        split = [0, S, -1 if open_heads else count, H]
        return op("Transpose", op("Reshape", x, const(f"{name}_split", split, np.int64)),
                  perm=[0, 2, 1, 3])

    def projected(width, name):
        return op("Add", op("MatMul", "x", const(f"w{name}", rng.standard_normal((D, width))
                                                 * 0.3)),
                  const(f"b{name}", rng.standard_normal(width) * 0.1))

    def repeated(x, name):
        if repeat == "in_place":   # [B,G,1,S,H] → [B,G,R,S,H] → [B,N,S,H]
            spread = op("Expand", op("Unsqueeze", x, const(f"{name}_at", [2], np.int64)),
                        const(f"{name}_to", [1, G, N // G, S, H], np.int64))
        else:                      # [B,1,G,S,H] → [B,R,G,S,H] → [B,N,S,H]
            spread = op("Expand", op("Unsqueeze", x, const(f"{name}_at", [1], np.int64)),
                        const(f"{name}_to", [1, N // G, G, S, H], np.int64))
        return op("Reshape", spread, const(f"{name}_merge", [0, N, S, H], np.int64))

    def rotate(x, name):
        if not rotated:
            return x
        if rotated == "scaled":
            return op("Mul", x, const(f"{name}_turn", rng.uniform(0.5, 1.5, (1, 1, S, H))))
        # Llama's rotary embedding: x·cos + rotate_half(x)·sin, tables of two equal halves.
        angles = np.outer(np.arange(S), 1.0 / 10000 ** (np.arange(0, H, 2) / H))
        table = np.concatenate([angles, angles], axis=1)[None, None]
        half = [const(f"{name}_{edge}", [value], np.int64)
                for edge, value in (("start", 0), ("mid", H // 2), ("end", H), ("axis", 3))]
        first = op("Slice", x, half[0], half[1], half[3])
        second = op("Slice", x, half[1], half[2], half[3])
        turned = op("Concat", op("Neg", second), first, axis=-1)
        return op("Add", op("Mul", x, const(f"{name}_cos", np.cos(table))),
                  op("Mul", turned, const(f"{name}_sin", np.sin(table))))

    q = rotate(heads(projected(D, "q"), N, "q"), "q")
    k = repeated(rotate(heads(projected(G * H, "k"), G, "k"), "k"), "k")
    v = repeated(heads(projected(G * H, "v"), G, "v"), "v")
    scores = op("Div", op("MatMul", q, op("Transpose", k, perm=[0, 1, 3, 2])),
                const("root", np.sqrt(H)))
    causal = np.tril(np.ones((S, S), bool))
    if mask == "add":
        scores = op("Add", scores, const("bias", np.where(causal, 0, MIN)[None, None]))
    elif mask == "where":
        scores = op("Where", const("keep", causal, np.bool_), scores, const("fill", MIN))
    elif mask in ("batched", "batched_padding"):  # [B,1,S,S], as a pinned batch expands it
        bias = np.broadcast_to(np.where(causal, 0, MIN), (batch, 1, S, S)).copy()
        if mask == "batched_padding":  # the second sequence's last key is padding
            bias[1, ..., -1] = MIN
        scores = op("Add", scores, const("bias", bias))
    elif mask == "padding":  # the last key masked for every query: no causal mask
        keep = np.ones((S, S), bool)
        keep[:, -1] = False
        scores = op("Add", scores, const("bias", np.where(keep, 0, MIN)[None, None]))
    context = op("MatMul", op("Softmax", scores, axis=-1), v)
    merged = op("Reshape", op("Transpose", context, perm=[0, 2, 1, 3]),
                const("merge", [0, S, D], np.int64))
    nodes.append(helper.make_node("MatMul", [merged, const("wo", rng.standard_normal((D, D))
                                                           * 0.3)], ["y"]))
    graph = helper.make_graph(
        nodes, "grouped", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, S, D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, S, D])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=IR_VERSION)


def compiled(proto, batch=B):
    result = graphopt.optimize(proto).to_onnx()
    onnx.checker.check_model(result, full_check=True)
    for size in {batch if isinstance(batch, int) else 3, 1}:
        feeds = numerics.random_feeds(proto, seed=size, dims={"batch": size})
        assert not numerics.compare(numerics.run(proto, feeds), numerics.run(result, feeds),
                                    1e-5, 1e-5)
    return Counter(node.op_type for node in result.graph.node)


@pytest.mark.parametrize("mask", ["add", "where"])
def test_grouped_heads_under_a_causal_mask_become_group_query_attention(mask):
    counts = compiled(grouped_attention(mask))
    assert counts["GroupQueryAttention"] == 1 and not counts["MultiHeadAttention"]
    # No repeat, no head split and no mask is left; Q, K and V are one packed GEMM.
    assert counts == {"MatMul": 2, "Add": 1, "GroupQueryAttention": 1}


def test_rotated_heads_are_merged_back_for_group_query_attention():
    counts = compiled(grouped_attention(rotated="scaled"))
    assert counts["GroupQueryAttention"] == 1 and not counts["Expand"]
    # Q and K come from their rotated heads, so the three projections stay apart.
    assert counts["MatMul"] == 4


def test_a_rotary_embedding_of_heads_merged_back_rotates_the_merged_tensor():
    counts = compiled(grouped_attention(rotated="rope"))
    # RotaryEmbedding reads Q's and K's projections as they are, its heads counted by
    # num_heads: no head split and no merge is left around it.
    assert counts == {"MatMul": 4, "Add": 3, "RotaryEmbedding": 2, "GroupQueryAttention": 1}


def test_a_head_size_the_910bs_kernel_refuses_stays_multi_head_attention():
    # FusedInferAttentionScore takes head sizes that are multiples of 16: at 8, the attention
    # stays where the NPU runs it rather than become a GroupQueryAttention for the host.
    result = graphopt.optimize(grouped_attention(batch=1), target="ascend910b",
                               trace_rules={"GroupQueryCausalAttention"})
    assert not any(n.op_type == "GroupQueryAttention" for n in result.model.graph)
    assert any("GroupQueryAttention takes head sizes up to 512, a multiple of 16, not 8" in line
               for line in result.traces), result.traces


def test_heads_split_with_an_open_count_are_rotated_merged_too():
    # transformers' Llama writes view(B, S, -1, head_dim): the rotary embedding had stayed on
    # split heads, and its layout ops and three projections with it.
    counts = compiled(grouped_attention(rotated="rope", open_heads=True))
    assert counts == {"MatMul": 4, "Add": 3, "RotaryEmbedding": 2, "GroupQueryAttention": 1}


def test_an_open_batch_reads_the_sequence_lengths_at_run_time():
    counts = compiled(grouped_attention(batch="batch"), batch="batch")
    assert counts["GroupQueryAttention"] == 1 and counts["Shape"] == 1


def test_heads_repeated_as_tiles_stay_multi_head_attention():
    # Head n reads K/V head n % G, not n // (N/G): not GroupQueryAttention's grouping.
    counts = compiled(grouped_attention(repeat="tiled"))
    assert counts["MultiHeadAttention"] == 1 and not counts["GroupQueryAttention"]


def test_a_causal_mask_expanded_over_the_batch_becomes_group_query_attention():
    # transformers expands its causal mask to [B, 1, S, S]: at a pinned batch of 2 it folds
    # to one constant whose every slice is the causal mask, which had kept the block unfused.
    counts = compiled(grouped_attention("batched"))
    assert counts["GroupQueryAttention"] == 1 and not counts["MultiHeadAttention"]


def test_a_mask_whose_sequences_differ_stays_multi_head_attention():
    result = graphopt.optimize(grouped_attention("batched_padding"),
                               trace_rules={"GroupQueryCausalAttention"})
    kinds = [n.op_type for n in result.model.graph]
    assert "MultiHeadAttention" in kinds and "GroupQueryAttention" not in kinds
    assert any("its sequences' masks differ" in line for line in result.traces), result.traces


def test_a_mask_that_is_not_causal_stays_multi_head_attention():
    counts = compiled(grouped_attention("padding"))
    assert counts["MultiHeadAttention"] == 1 and not counts["GroupQueryAttention"]


def test_the_refusal_says_what_grouped_attention_needs():
    result = graphopt.optimize(grouped_attention(repeat="tiled"),
                               trace_rules={"GroupQueryCausalAttention"})
    assert any("not a repeat of fewer heads for groups of the query's" in line
               for line in result.traces), result.traces


def test_a_head_size_the_cpu_kernel_refuses_stays_multi_head_attention():
    counts = compiled(grouped_attention(size=4))
    assert counts["MultiHeadAttention"] == 1 and not counts["GroupQueryAttention"]


def test_a_mask_over_a_past_and_the_new_tokens_is_no_causal_self_attention():
    from types import SimpleNamespace

    from graphopt.passes.fusion.group_query import causal_problem

    def bias(array):
        return SimpleNamespace(name="bias", constant=lambda: array)

    # One new token over 3 past ones: [1, 4] is not the [S, S] mask of S tokens of their own.
    decoding = np.zeros((1, 1, 1, 4), np.float32)
    assert "not one [4, 4] mask" in causal_problem(bias(decoding), 0, 4)
    square = np.where(np.tril(np.ones((4, 4), bool)), 0, MIN).astype(np.float32)
    assert causal_problem(bias(square[None, None]), 0, 4) is None
    square[3, 0] = MIN   # a sliding window: the last token no longer sees the first
    assert "not a causal mask" in causal_problem(bias(square), 0, 4)
    assert "causal only" in causal_problem(None, 0, 4)


@pytest.mark.parametrize("target, fused", [("ascend910b", True), ("ascend310", False)])
def test_the_910b_runs_grouped_query_attention_and_rotary_on_its_npu(target, fused):
    # Atlas A2 has FusedInferAttentionScore and RotaryPositionEmbedding; the 310 has neither,
    # so there the attention stays in ops its NPU runs.
    result = graphopt.optimize(grouped_attention(rotated="rope", batch=1, size=16),
                               target=target)
    ops = Counter(node.op_type for node in result.model.graph)
    assert bool(ops["GroupQueryAttention"]) == fused and bool(ops["RotaryEmbedding"]) == fused
    if fused:  # the NPU has their kernels (a block this small may still return to the host)
        reasons = {node.op_type: placement.reason or ""
                   for node, placement in result.partitioning.placements.items()}
        for op in ("GroupQueryAttention", "RotaryEmbedding"):
            assert reasons[op] == "" or reasons[op].startswith("returned to cpu"), reasons[op]


@pytest.mark.parametrize("mask", ["add", "where"])
def test_a_float16_block_becomes_group_query_attention_on_the_910b(mask):
    # Masked keys filled with float16's lowest, as exporters write them in float16: a causal
    # row keeps its diagonal, so they weigh 0 whether added to the scores or not.
    proto = as_float16(grouped_attention(mask, rotated="rope", batch=1, size=16))
    result = graphopt.optimize(proto, target="ascend910b")
    ops = Counter(node.op_type for node in result.model.graph)
    assert ops["GroupQueryAttention"] == 1 and ops["RotaryEmbedding"] == 2
    out = result.to_onnx()
    onnx.checker.check_model(out, full_check=True)
    feeds = numerics.random_feeds(proto, seed=3)
    (expected,), (actual,) = (numerics.run(m, feeds).values() for m in (proto, out))
    # The kernels sum in float32 where the ops round each step to float16.
    step = float(np.abs(expected).max()) * 2.0 ** -10
    assert actual.dtype == np.float16
    assert np.abs(actual.astype(np.float32) - expected.astype(np.float32)).max() <= 4 * step
