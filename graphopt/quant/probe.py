"""Whether onnxruntime's int8 GEMM saturates on this CPU, asked of onnxruntime itself.

x86 CPUs without VNNI multiply uint8 × int8 with vpmaddubsw, which adds each pair of products in
16 bits and saturates past 32767 (two 255 × 127 products make 64770). Large weights make that
likelier; per-column scales give every column a ±127 weight, where one scale per tensor leaves
most columns well inside the range. Measured on 12-layer bert_base (seq 128, AVX2 without VNNI):
per-column DynamicQuantizeMatMul keeps a cosine to FP32 of 0.99951, per-tensor 0.99963; a
[128,768]×[768,3072] product deviates from the exact integer result by 0.64 per-column and by
4e-7 per-tensor. QuantizeInt8 therefore gives dynamic MatMul weights one scale where this probe
finds saturation.
"""

from __future__ import annotations

import functools

import numpy as np


@functools.cache
def int8_gemm_saturates() -> bool:
    """True when DynamicQuantizeMatMul of all-255 activations by all-127 weights falls short of
    the exact product: the u8 × s8 pair sums saturated."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    k = 64
    node = helper.make_node("DynamicQuantizeMatMul", ["x", "w", "s", "z"], ["y"],
                            domain="com.microsoft")
    graph = helper.make_graph(
        [node], "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
        [numpy_helper.from_array(np.full((k, 16), 127, np.int8), "w"),
         numpy_helper.from_array(np.ones(16, np.float32), "s"),
         numpy_helper.from_array(np.zeros(16, np.int8), "z")])
    # IR 9: onnx's default is its newest IR version, which an older onnxruntime refuses.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)],
                              ir_version=9)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    # x = 1 quantizes to 255 at scale 1/255: the exact result is k · 127.
    y = session.run(None, {"x": np.ones((1, k), np.float32)})[0]
    return not np.allclose(y, k * 127.0, rtol=1e-3)
