"""Fused attention kernels in the cost models: their query-key pairs, not their output size."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphopt import numerics
from graphopt.ir import load_onnx
from graphopt.partition.target import load_target
from graphopt.tuner.attention import AttentionWork, attention_work
from graphopt.tuner.cpu_model import CpuCostModel, node_work
from graphopt.tuner.vector import vector_estimate

F16 = TensorProto.FLOAT16


def _node(op, inputs, attrs, domain="com.microsoft", outputs=1, initializers=()):
    """The one node of a model whose graph inputs are `inputs` (name -> shape, or None for an
    omitted optional input)."""
    names = [name if shape is not None else "" for name, shape in inputs.items()]
    node = helper.make_node(op, names, [f"y{i}" for i in range(outputs)], domain=domain,
                            **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, F16, s) for n, s in inputs.items() if s is not None],
        [helper.make_tensor_value_info(f"y{i}", F16, None) for i in range(outputs)],
        list(initializers))
    opsets = [helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]
    return next(iter(load_onnx(helper.make_model(graph, opset_imports=opsets)).graph))


def _gqa(seq, past, heads=32, kv_heads=8, size=128, packed=False):
    width = (heads + 2 * kv_heads) * size if packed else heads * size
    inputs = {"q": [1, seq, width],
              "k": None if packed else [1, seq, kv_heads * size],
              "v": None if packed else [1, seq, kv_heads * size],
              "pk": [1, kv_heads, past, size], "pv": [1, kv_heads, past, size]}
    return _node("GroupQueryAttention", inputs, {"num_heads": heads, "kv_num_heads": kv_heads},
                 outputs=3)


def test_group_query_attention_counts_past_keys_and_packed_heads():
    assert attention_work(_gqa(128, 0)) == AttentionWork(1, 32, 128, 128, 128, 128, True)
    assert attention_work(_gqa(1, 2047)) == AttentionWork(1, 32, 1, 2048, 128, 128, True)
    assert attention_work(_gqa(16, 100, packed=True)) == AttentionWork(1, 32, 16, 116, 128, 128,
                                                                      True)


def test_multi_head_attention_forms():
    self_attention = _node("MultiHeadAttention",
                           {"q": [2, 64, 512], "k": [2, 64, 512], "v": [2, 64, 256]},
                           {"num_heads": 8})
    assert attention_work(self_attention) == AttentionWork(2, 8, 64, 64, 64, 32, False)
    with_past = _node("MultiHeadAttention",
                      {"q": [2, 1, 512], "k": [2, 1, 512], "v": [2, 1, 512], "bias": None,
                       "mask": None, "attn_bias": None, "pk": [2, 8, 30, 64],
                       "pv": [2, 8, 30, 64]},
                      {"num_heads": 8, "unidirectional": 1})
    assert attention_work(with_past) == AttentionWork(2, 8, 1, 31, 64, 64, True)
    cross_cache = _node("MultiHeadAttention",  # BNSH keys: the encoder's, no past added
                        {"q": [1, 4, 512], "k": [1, 8, 1500, 64], "v": [1, 8, 1500, 64]},
                        {"num_heads": 8})
    assert attention_work(cross_cache) == AttentionWork(1, 8, 4, 1500, 64, 64, False)
    packed = _node("MultiHeadAttention", {"q": [1, 50, 12, 3, 64]}, {"num_heads": 12})
    assert attention_work(packed) == AttentionWork(1, 12, 50, 50, 64, 64, False)


def test_packed_attention_adds_its_projection():
    weights = onnx.numpy_helper.from_array(np.zeros((768, 2304), np.float16), "w")
    node = _node("Attention", {"x": [4, 128, 768], "w": [768, 2304]}, {"num_heads": 12},
                 initializers=[weights])
    work = attention_work(node)
    assert work == AttentionWork(4, 12, 128, 128, 64, 64, False,
                                 projection_macs=4 * 128 * 768 * 2304)
    assert work.macs() == 4 * 12 * 128 * 128 * 128 + 4 * 128 * 768 * 2304


def test_onnx_attention_of_opset_23():
    four_d = _node("Attention", {"q": [1, 8, 10, 64], "k": [1, 2, 10, 64], "v": [1, 2, 10, 32]},
                   {"is_causal": 1}, domain="")
    assert attention_work(four_d) == AttentionWork(1, 8, 10, 10, 64, 32, True)
    three_d = _node("Attention", {"q": [1, 10, 512], "k": [1, 12, 128], "v": [1, 12, 128]},
                    {"q_num_heads": 8, "kv_num_heads": 2}, domain="")
    assert attention_work(three_d) == AttentionWork(1, 8, 10, 12, 64, 64, False)


def test_dynamic_shapes_give_no_work():
    node = _node("MultiHeadAttention",
                 {"q": ["b", 64, 512], "k": ["b", 64, 512], "v": ["b", 64, 512]},
                 {"num_heads": 8})
    assert attention_work(node) is None


@pytest.mark.parametrize("queries, keys", [(1, 1), (1, 50), (7, 7), (7, 20), (64, 64)])
def test_causal_pairs_count_the_keys_each_query_sees(queries, keys):
    work = AttentionWork(2, 3, queries, keys, 8, 8, True)
    past = keys - queries
    seen = sum(past + i + 1 for i in range(queries))
    assert work.causal_pairs == 2 * 3 * seen
    assert AttentionWork(2, 3, queries, keys, 8, 8, False).causal_pairs == 2 * 3 * queries * keys


def test_the_host_prices_every_pair_and_grows_with_the_square_of_the_sequence():
    flops = {seq: node_work(_gqa(seq, 0))[0] for seq in (256, 512)}
    assert flops[256] == 2 * 32 * 256 * 256 * 256
    assert flops[512] == 4 * flops[256]
    host = CpuCostModel()
    assert host.node_seconds(_gqa(512, 0)) > 3 * host.node_seconds(_gqa(256, 0))


def test_the_npu_prices_a_flash_kernel():
    npu = load_target("ascend910b").device("npu")
    long = vector_estimate(_gqa(4096, 0), npu)
    assert long.breakdown["bound"] == "compute"  # 4096² pairs a head: the cube, not the bytes
    assert long.seconds > 8 * vector_estimate(_gqa(1024, 0), npu).seconds
    # One token against a long cache reads the cache: memory-bound.
    decode = vector_estimate(_gqa(1, 4095), npu)
    assert decode.breakdown["bound"] == "memory"
    # A causal kernel skips the masked half of the blocks that a full one scores.
    full = _node("MultiHeadAttention",
                 {"q": [1, 4096, 4096], "k": [1, 4096, 4096], "v": [1, 4096, 4096]},
                 {"num_heads": 32})
    causal = _node("MultiHeadAttention",
                   {"q": [1, 4096, 4096], "k": [1, 4096, 4096], "v": [1, 4096, 4096]},
                   {"num_heads": 32, "unidirectional": 1})
    ratio = vector_estimate(causal, npu).seconds / vector_estimate(full, npu).seconds
    assert 0.45 < ratio < 0.6


def test_a_group_query_attention_without_a_past_has_present_keys_of_its_own_tokens():
    # They had stayed of unknown rank, and the NPU left the node to the host as a dynamic shape.
    from graphopt.passes.infer_shapes import infer_shapes

    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "", "", "lens", "total"],
                            ["y", "pk", "pv"], domain="com.microsoft", num_heads=8,
                            kv_num_heads=2)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("q", F16, [1, 16, 512]),
         helper.make_tensor_value_info("k", F16, [1, 16, 128]),
         helper.make_tensor_value_info("v", F16, [1, 16, 128]),
         helper.make_tensor_value_info("lens", TensorProto.INT32, [1]),
         helper.make_tensor_value_info("total", TensorProto.INT32, [])],
        [helper.make_tensor_value_info(name, F16, None) for name in ("y", "pk", "pv")])
    model = load_onnx(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]))
    infer_shapes(model)
    shapes = {v.name: v.shape for v in next(iter(model.graph)).outputs}
    assert shapes == {"y": (1, 16, 512), "pk": (1, 2, 16, 64), "pv": (1, 2, 16, 64)}
    ran = numerics.run(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]),
        {"q": np.zeros((1, 16, 512), np.float16), "k": np.zeros((1, 16, 128), np.float16),
         "v": np.zeros((1, 16, 128), np.float16), "lens": np.array([15], np.int32),
         "total": np.array(16, np.int32)})
    assert ran["pk"].shape == (1, 2, 16, 64)
