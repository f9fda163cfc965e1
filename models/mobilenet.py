"""`mobilenetv2`: torchvision MobileNetV2, depthwise convs and ReLU6 exported as Clip(0, 6)."""

from __future__ import annotations

import onnx

from ._builder import FLOAT, GraphBuilder, bn, conv

# (expand ratio t, output channels c, repeats n, first stride s), from the paper's Table 2.
SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
            (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def _make_divisible(v: float, divisor: int = 8) -> int:
    """torchvision's channel rounding; reproducing it keeps parameter counts comparable."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def _conv_bn_relu6(gb: GraphBuilder, x: str, part: str, pname: str, cin: int, cout: int, k: int,
                   stride: int = 1, group: int = 1) -> str:
    """Conv2dNormActivation: a Sequential, so its children are scoped "<part>.0" .. "<part>.2"."""
    with gb.scope(part):
        x = conv(gb, x, f"{part}.0", f"{pname}.0", cin, cout, k, stride, group)
        x = bn(gb, x, f"{part}.1", f"{pname}.1", cout)
        with gb.scope(f"{part}.2"):
            # Opset 11 moved Clip's bounds from attributes to inputs; the exporter feeds Constants.
            return gb.op("Clip", x, gb.const(0.0), gb.const(6.0))


def _inverted_residual(gb: GraphBuilder, x: str, p: str, cin: int, cout: int, stride: int,
                       t: int) -> str:
    hidden = round(cin * t)
    with gb.scope("conv"):
        y, i = x, 0
        if t != 1:
            y = _conv_bn_relu6(gb, y, "conv.0", f"{p}.conv.0", cin, hidden, 1)
            i = 1
        y = _conv_bn_relu6(gb, y, f"conv.{i}", f"{p}.conv.{i}", hidden, hidden, 3, stride,
                           group=hidden)
        y = conv(gb, y, f"conv.{i + 1}", f"{p}.conv.{i + 1}", hidden, cout, 1)
        y = bn(gb, y, f"conv.{i + 2}", f"{p}.conv.{i + 2}", cout, gamma=0.2)
    # Only same-shape blocks are residual; a linear bottleneck has no activation after the add.
    return gb.op("Add", x, y) if stride == 1 and cin == cout else y


def build_mobilenetv2(*, width: float = 1.0, image_size: int = 224,
                      num_classes: int = 1000) -> onnx.ModelProto:
    """MobileNetV2 (3,504,872 parameters at defaults); `width` is the channel multiplier."""
    gb = GraphBuilder(seed=3)
    cin = _make_divisible(32 * width)
    last = _make_divisible(1280 * max(1.0, width))
    x = gb.input("input", FLOAT, ["batch_size", 3, image_size, image_size])
    with gb.scope("features"):
        x = _conv_bn_relu6(gb, x, "features.0", "features.0", 3, cin, 3, stride=2)
        idx = 0
        for t, c, n, s in SETTINGS:
            cout = _make_divisible(c * width)
            for r in range(n):
                idx += 1
                p = f"features.{idx}"
                with gb.scope(p):
                    x = _inverted_residual(gb, x, p, cin, cout, s if r == 0 else 1, t)
                cin = cout
        p = f"features.{idx + 1}"
        x = _conv_bn_relu6(gb, x, p, p, cin, last, 1)
    x = gb.op("GlobalAveragePool", x)  # F.adaptive_avg_pool2d(x, (1, 1)) in forward()
    x = gb.op("Flatten", x, axis=1)
    with gb.scope("classifier", "classifier.1"):  # classifier.0 is Dropout, gone in eval
        bound = last ** -0.5
        w = gb.uniform("classifier.1.weight", [num_classes, last], -bound, bound)
        b = gb.uniform("classifier.1.bias", [num_classes], -bound, bound)
        gb.op("Gemm", x, w, b, alpha=1.0, beta=1.0, transB=1, out="logits")
    gb.output("logits", FLOAT, ["batch_size", num_classes])
    return gb.model("mobilenetv2", f"MobileNetV2, width {width}")
