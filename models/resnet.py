"""`resnet50`: torchvision ResNet-50 v1.5 with BatchNormalization left unfused after every Conv."""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from ._builder import FLOAT, GraphBuilder, bn, conv

EXPANSION = 4


def _bottleneck(gb: GraphBuilder, x: str, p: str, cin: int, planes: int, stride: int) -> str:
    """torchvision Bottleneck: the stride sits on the 3×3 conv, which is what makes it v1.5."""
    cout = planes * EXPANSION
    y = bn(gb, conv(gb, x, "conv1", f"{p}.conv1", cin, planes, 1), "bn1", f"{p}.bn1", planes)
    with gb.scope("relu"):
        y = gb.op("Relu", y)
    y = conv(gb, y, "conv2", f"{p}.conv2", planes, planes, 3, stride=stride)
    y = bn(gb, y, "bn2", f"{p}.bn2", planes)
    with gb.scope("relu_1"):  # one nn.ReLU module called three times
        y = gb.op("Relu", y)
    y = conv(gb, y, "conv3", f"{p}.conv3", planes, cout, 1)
    y = bn(gb, y, "bn3", f"{p}.bn3", cout, gamma=0.2)
    if stride != 1 or cin != cout:
        with gb.scope("downsample"):
            x = conv(gb, x, "downsample.0", f"{p}.downsample.0", cin, cout, 1, stride=stride)
            x = bn(gb, x, "downsample.1", f"{p}.downsample.1", cout)
    y = gb.op("Add", y, x)
    with gb.scope("relu_2"):
        return gb.op("Relu", y)


def build_resnet50(*, blocks: Sequence[int] = (3, 4, 6, 3), width: float = 1.0,
                   image_size: int = 224, num_classes: int = 1000,
                   raw_dynamo: bool = False, nhwc: bool = False) -> onnx.ModelProto:
    """ResNet-50 (25,557,032 parameters at defaults); `blocks` per stage, `width` on channels;
    `raw_dynamo`: every Conv's zero bias computed at run time, as the dynamo exporter writes it
    before its optimizer runs (same weights); `nhwc`: as tf2onnx exports a TensorFlow ResNet,
    NHWC input and activations, each Conv and the max pool between Transposes, BatchNorm as
    Sub/Mul/Add over the channels and the average pool a ReduceMean."""
    gb = GraphBuilder(seed=50, runtime_zero_bias=raw_dynamo)
    gb.nhwc = nhwc
    stem = max(1, round(64 * width))
    x = gb.input("input", FLOAT, ["batch_size", image_size, image_size, 3] if nhwc
                 else ["batch_size", 3, image_size, image_size])
    x = bn(gb, conv(gb, x, "conv1", "conv1", 3, stem, 7, stride=2), "bn1", "bn1", stem)
    with gb.scope("relu"):
        x = gb.op("Relu", x)
    with gb.scope("maxpool"):
        if nhwc:
            x = gb.op("Transpose", x, perm=[0, 3, 1, 2])
        x = gb.op("MaxPool", x, ceil_mode=0, dilations=[1, 1], kernel_shape=[3, 3],
                  pads=[1, 1, 1, 1], strides=[2, 2])
        if nhwc:
            x = gb.op("Transpose", x, perm=[0, 2, 3, 1])
    cin = stem
    for stage, n in enumerate(blocks):
        planes = max(1, round(64 * 2 ** stage * width))
        layer = f"layer{stage + 1}"
        for i in range(n):
            p = f"{layer}.{i}"
            with gb.scope(layer, p):
                x = _bottleneck(gb, x, p, cin, planes, 2 if i == 0 and stage > 0 else 1)
            cin = planes * EXPANSION
    with gb.scope("avgpool"):
        if nhwc:
            x = gb.op("ReduceMean", x, axes=[1, 2], keepdims=0)
        else:
            x = gb.op("GlobalAveragePool", x)
    if not nhwc:
        x = gb.op("Flatten", x, axis=1)
    with gb.scope("fc"):
        w = gb.uniform("fc.weight", [num_classes, cin], -cin ** -0.5, cin ** -0.5)
        b = gb.uniform("fc.bias", [num_classes], -cin ** -0.5, cin ** -0.5)
        gb.op("Gemm", x, w, b, alpha=1.0, beta=1.0, transB=1, out="logits")
    gb.output("logits", FLOAT, ["batch_size", num_classes])
    return gb.model("resnet50", f"ResNet-50 v1.5, blocks {list(blocks)}, width {width}")
