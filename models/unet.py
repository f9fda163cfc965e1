"""`unet`: the segmentation UNet of milesial/Pytorch-UNet, ConvTranspose up-sampling, BN unfused."""

from __future__ import annotations

import onnx

from ._builder import FLOAT, GraphBuilder, bn, conv


def _double_conv(gb: GraphBuilder, x: str, p: str, cin: int, cout: int) -> str:
    """DoubleConv: Sequential(Conv3×3, BN, ReLU, Conv3×3, BN, ReLU) in scope "double_conv"."""
    with gb.scope("double_conv"):
        for k, (a, b) in zip((0, 3), ((cin, cout), (cout, cout))):
            x = conv(gb, x, f"double_conv.{k}", f"{p}.double_conv.{k}", a, b, 3)
            x = bn(gb, x, f"double_conv.{k + 1}", f"{p}.double_conv.{k + 1}", b)
            with gb.scope(f"double_conv.{k + 2}"):
                x = gb.op("Relu", x)
        return x


def _down(gb: GraphBuilder, x: str, p: str, cin: int, cout: int) -> str:
    """Down: Sequential(MaxPool2d(2), DoubleConv) in scope "maxpool_conv"."""
    with gb.scope("maxpool_conv"):
        with gb.scope("maxpool_conv.0"):
            x = gb.op("MaxPool", x, ceil_mode=0, dilations=[1, 1], kernel_shape=[2, 2],
                      pads=[0, 0, 0, 0], strides=[2, 2])
        with gb.scope("maxpool_conv.1"):
            return _double_conv(gb, x, f"{p}.maxpool_conv.1", cin, cout)


def _up(gb: GraphBuilder, x: str, skip: str, p: str, cin: int, cout: int) -> str:
    """Up (bilinear=False): ConvTranspose2d(cin, cin/2, 2, stride 2), cat([skip, x]), DoubleConv.

    Its forward() also pads x to the skip's size; with image_size a multiple of 2**depth that
    pad is zero and the traced graph has none, so the builder writes none either.
    """
    half = cin // 2
    with gb.scope("up"):
        # torch's default init: fan_in of a ConvTranspose weight [in, out, k, k] is out·k·k.
        bound = (half * 4) ** -0.5
        # Each output pixel sums exactly one input pixel's cin channels: std 1/sqrt(cin) keeps
        # the activation scale, where He's formula over the weight's dims[1:] would not.
        w = gb.param(f"{p}.up.weight", [cin, half, 2, 2], std=cin ** -0.5)
        b = gb.uniform(f"{p}.up.bias", [half], -bound, bound)
        x = gb.op("ConvTranspose", x, w, b, dilations=[1, 1], group=1, kernel_shape=[2, 2],
                  output_padding=[0, 0], pads=[0, 0, 0, 0], strides=[2, 2])
    x = gb.op("Concat", skip, x, axis=1)
    with gb.scope("conv"):
        return _double_conv(gb, x, f"{p}.conv", cin, cout)


def build_unet(*, base_channels: int = 64, depth: int = 4, image_size: int = 256,
               num_classes: int = 2, in_channels: int = 3) -> onnx.ModelProto:
    """UNet (31,037,698 parameters at defaults), as torch.onnx exports milesial/Pytorch-UNet's
    UNet(n_channels=3, n_classes=2, bilinear=False): inc, down1..down`depth` (MaxPool 2×2 then
    DoubleConv; the last is the bottleneck at base_channels·2**depth), up1..up`depth`, outc.

    Up-sampling is nn.ConvTranspose2d(k=2, s=2), which both torch.onnx exporters (TorchScript and
    dynamo) emit as ConvTranspose; the bilinear=True variant's nn.Upsample would export as Resize
    (opset ≥ 11, constant scales) followed by a DoubleConv with halved middle channels instead.
    `image_size` must be a multiple of 2**depth so every skip tensor matches its up-sampled one.
    Output: per-pixel class logits [batch_size, num_classes, image_size, image_size].
    """
    if depth < 1 or image_size % 2 ** depth:
        raise ValueError(f"unet: image_size {image_size} must be a positive multiple of "
                         f"2**depth = {2 ** max(depth, 0)} (depth {depth} ≥ 1)")
    gb = GraphBuilder(seed=2015)
    widths = [base_channels * 2 ** i for i in range(depth + 1)]
    x = gb.input("input", FLOAT, ["batch_size", in_channels, image_size, image_size])
    with gb.scope("inc"):
        x = _double_conv(gb, x, "inc", in_channels, widths[0])
    skips = []
    for i in range(1, depth + 1):
        skips.append(x)  # alive until up(depth + 1 - i) concatenates it: the long skip
        with gb.scope(f"down{i}"):
            x = _down(gb, x, f"down{i}", widths[i - 1], widths[i])
    for i in range(1, depth + 1):
        with gb.scope(f"up{i}"):
            x = _up(gb, x, skips.pop(), f"up{i}", widths[depth + 1 - i], widths[depth - i])
    with gb.scope("outc", "conv"):
        cin = widths[0]
        bound = cin ** -0.5
        w = gb.uniform("outc.conv.weight", [num_classes, cin, 1, 1], -bound, bound)
        b = gb.uniform("outc.conv.bias", [num_classes], -bound, bound)
        gb.op("Conv", x, w, b, dilations=[1, 1], group=1, kernel_shape=[1, 1],
              pads=[0, 0, 0, 0], strides=[1, 1], out="logits")
    gb.output("logits", FLOAT, ["batch_size", num_classes, image_size, image_size])
    return gb.model("unet", f"UNet, base {base_channels} channels, depth {depth}, "
                            f"{image_size}x{image_size}, {num_classes} classes")
