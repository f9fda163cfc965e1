"""`lcnetv3`: a PP-LCNetV3-style text-detector backbone (PaddleOCR v4's) as Paddle2ONNX exports
it: Conv + BatchNormalization, hard-swish as `x · Clip(x + 3, 0, 6) / 6`, each activation
followed by a learned scalar scale and shift (`s · x + t`), squeeze-excitation late."""

from __future__ import annotations

import math

import onnx

from ._builder import FLOAT, GraphBuilder, bn

# (depthwise kernel, output channels, stride, squeeze-excitation) per block, PP-LCNetV3's
# detection configuration before its 0.75 width scale.
BLOCKS = [(3, 32, 1, False),
          (3, 64, 2, False), (3, 64, 1, False),
          (3, 128, 2, False), (3, 128, 1, False),
          (3, 256, 2, False), (5, 256, 1, False), (5, 256, 1, False), (5, 256, 1, False),
          (5, 512, 2, True), (5, 512, 1, True), (5, 512, 1, False)]


def _divisible(channels: float, by: int = 16) -> int:
    """PaddleClas's make_divisible: round to a multiple of `by`, never 10% below."""
    rounded = max(by, int(channels + by / 2) // by * by)
    return rounded + by if rounded < 0.9 * channels else rounded


def _conv_bn(gb: GraphBuilder, x: str, pname: str, cin: int, cout: int, k: int,
             stride: int = 1, group: int = 1) -> str:
    """Conv2D(bias_attr=False) + BatchNorm, Paddle's padding (k - 1) // 2 on every side."""
    with gb.scope(pname):
        w = gb.param(f"{pname}.conv.weight", [cout, cin // group, k, k],
                     std=math.sqrt(2.0 / (cin // group * k * k)))
        y = gb.op("Conv", x, w, dilations=[1, 1], group=group, kernel_shape=[k, k],
                  pads=[(k - 1) // 2] * 4, strides=[stride, stride])
        return bn(gb, y, "bn", f"{pname}.bn", cout)


def _act(gb: GraphBuilder, x: str, pname: str) -> str:
    """Paddle's hardswish, then the learnable affine block: a scalar scale and shift."""
    with gb.scope(pname):
        gate = gb.op("Clip", gb.op("Add", x, gb.const(3.0)), gb.const(0.0), gb.const(6.0))
        y = gb.op("Div", gb.op("Mul", x, gate), gb.const(6.0))
        scale = gb.param(f"{pname}.lab.scale", [1], std=0.1, mean=1.0)
        shift = gb.param(f"{pname}.lab.bias", [1], std=0.1)
        return gb.op("Add", gb.op("Mul", scale, y), shift)


def _se(gb: GraphBuilder, x: str, pname: str, channels: int) -> str:
    """Squeeze-excitation: pool, 1×1 down with ReLU, 1×1 up, hard-sigmoid, scale."""
    with gb.scope(pname):
        squeezed = gb.op("GlobalAveragePool", x)
        down, up = channels // 4, channels
        w1 = gb.param(f"{pname}.conv1.weight", [down, channels, 1, 1], std=math.sqrt(2 / channels))
        b1 = gb.param(f"{pname}.conv1.bias", [down], std=0.05)
        w2 = gb.param(f"{pname}.conv2.weight", [up, down, 1, 1], std=math.sqrt(2 / down))
        b2 = gb.param(f"{pname}.conv2.bias", [up], std=0.05)
        y = gb.op("Relu", gb.op("Conv", squeezed, w1, b1, kernel_shape=[1, 1]))
        y = gb.op("Conv", y, w2, b2, kernel_shape=[1, 1])
        return gb.op("Mul", x, gb.op("HardSigmoid", y, alpha=0.2, beta=0.5))


def build_lcnetv3(*, image_size: int = 320, scale: float = 0.75) -> onnx.ModelProto:
    """The backbone at `image_size` (a multiple of 32) with channels scaled by `scale`, and a
    1×1 conv + Sigmoid over the last stage (a probability map at 1/32 of the input)."""
    gb = GraphBuilder(seed=13)
    x = gb.input("x", FLOAT, ["batch_size", 3, image_size, image_size])
    cin = _divisible(16 * scale)
    x = _act(gb, _conv_bn(gb, x, "conv1", 3, cin, 3, stride=2), "conv1.act")
    for i, (k, channels, stride, se) in enumerate(BLOCKS):
        cout, p = _divisible(channels * scale), f"blocks.{i}"
        x = _act(gb, _conv_bn(gb, x, f"{p}.dw_conv", cin, cin, k, stride, group=cin),
                 f"{p}.dw_conv.act")
        if se:
            x = _se(gb, x, f"{p}.se", cin)
        x = _act(gb, _conv_bn(gb, x, f"{p}.pw_conv", cin, cout, 1), f"{p}.pw_conv.act")
        cin = cout
    with gb.scope("head"):
        w = gb.param("head.weight", [1, cin, 1, 1], std=math.sqrt(16 / cin))
        b = gb.param("head.bias", [1], std=0.05)
        gb.op("Sigmoid", gb.op("Conv", x, w, b, kernel_shape=[1, 1]), out="maps")
    cells = image_size // 32
    gb.output("maps", FLOAT, ["batch_size", 1, cells, cells])
    return gb.model("lcnetv3", f"PP-LCNetV3-style backbone, {image_size}x{image_size}, "
                               f"scale {scale}")
