"""`tiny`: the bundled quick-start conv net, carrying redundant ops exporters typically leave."""

from __future__ import annotations

import onnx

from ._builder import FLOAT, GraphBuilder, bn, conv


def build_tiny(*, channels: tuple[int, int] = (16, 32), num_classes: int = 10,
               image_size: int = 32) -> onnx.ModelProto:
    """Conv-BN-ReLU ×2, global pool, classifier; input [1, 3, S, S] is static on purpose.

    The Identity, Dropout, float→float Cast, x.view(x.size(0), -1) chain, Flatten of an already
    2-D tensor and Mul by 1.0 are all no-ops: they give the quick-start demo something visible
    for the cleanup passes to remove without changing the numbers.
    """
    c1, c2 = channels
    gb = GraphBuilder(seed=1)
    x = gb.input("input", FLOAT, [1, 3, image_size, image_size])
    x = bn(gb, conv(gb, x, "conv1", "conv1", 3, c1, 3), "bn1", "bn1", c1)
    with gb.scope("relu"):
        x = gb.op("Relu", x)
    x = gb.op("Identity", x)
    x = bn(gb, conv(gb, x, "conv2", "conv2", c1, c2, 3, stride=2), "bn2", "bn2", c2)
    with gb.scope("relu_1"):  # the same nn.ReLU called twice: the exporter suffixes the scope
        x = gb.op("Relu", x)
    with gb.scope("dropout"):
        x = gb.op("Dropout", x, gb.const(0.1))  # no training_mode input: inference, an identity
    with gb.scope("pool"):
        x = gb.op("GlobalAveragePool", x)
    batch = gb.op("Unsqueeze", gb.op("Gather", gb.op("Shape", x), gb.const(0), axis=0),
                  gb.const([0]))
    x = gb.op("Reshape", x, gb.op("Concat", batch, gb.const([-1]), axis=0), allowzero=0)
    x = gb.op("Flatten", x, axis=1)
    x = gb.op("Cast", x, to=FLOAT)
    with gb.scope("fc"):
        w = gb.he("fc.weight", [num_classes, c2])
        b = gb.param("fc.bias", [num_classes], std=0.1)
        x = gb.op("Gemm", x, w, b, alpha=1.0, beta=1.0, transB=1)
    gb.op("Mul", x, gb.const(1.0), out="logits")
    gb.output("logits", FLOAT, [1, num_classes])
    return gb.model("tiny", "graphopt quick-start conv net with exporter leftovers to clean up")
