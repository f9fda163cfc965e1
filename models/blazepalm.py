"""`blazepalm`: a BlazePalm-style detector (MediaPipe's palm and face detectors, as PyTorch ports
export them): depthwise blocks with PReLU, residuals whose skip path pads channels."""

from __future__ import annotations

import math

import onnx

from ._builder import FLOAT, GraphBuilder

# (output channels, stride) per BlazeBlock after the stem; channel counts off the 8/16 block
# of onnxruntime's NCHWc layout, as the originals have them.
BLOCKS = [(24, 1), (28, 1), (32, 2), (36, 1), (42, 1), (48, 2), (56, 1), (64, 1), (72, 1),
          (80, 1), (88, 1), (96, 2), (96, 1), (96, 1), (96, 1), (96, 1)]
ANCHORS = 2       # per cell of the last feature map
BOX_VALUES = 17   # score, box (4) and 6 keypoints (12), as the palm detector's head


def _prelu(gb: GraphBuilder, x: str, pname: str, channels: int) -> str:
    """nn.PReLU(channels): its slope exports as [C, 1, 1] for an NCHW input."""
    with gb.scope("act"):
        slope = gb.param(f"{pname}.act.weight", [channels, 1, 1], std=0.05, mean=0.25)
        return gb.op("PRelu", x, slope)


def _conv(gb: GraphBuilder, x: str, part: str, pname: str, cin: int, cout: int, k: int,
          stride: int = 1, group: int = 1, gain: float = 1.0) -> str:
    """nn.Conv2d with bias (a TFLite model's BatchNorm is folded into it), TensorFlow's SAME
    padding: the extra row and column go after, so a stride-2 3×3 pads [0, 0, 1, 1]. `gain`
    scales the He-normal weights: a residual branch's last conv takes a small one, so that
    sixteen blocks do not grow the activations block after block."""
    with gb.scope(part):
        fan_in = cin // group * k * k
        w = gb.param(f"{pname}.weight", [cout, cin // group, k, k],
                     std=gain * math.sqrt(2.0 / fan_in))
        b = gb.param(f"{pname}.bias", [cout], std=0.05)
        pad = (k - 1) // 2
        pads = [pad, pad, pad, pad] if stride == 1 else [k // 2 - 1] * 2 + [k // 2] * 2
        return gb.op("Conv", x, w, b, dilations=[1, 1], group=group, kernel_shape=[k, k],
                     pads=pads, strides=[stride, stride])


def _blaze_block(gb: GraphBuilder, x: str, p: str, cin: int, cout: int, stride: int) -> str:
    """Depthwise 3×3, pointwise 1×1; the skip path max-pools at stride 2 and pads the extra
    channels with zeros (F.pad over the channel axis); PReLU of the sum."""
    y = _conv(gb, x, "convs.0", f"{p}.convs.0", cin, cin, 3, stride, group=cin)
    y = _conv(gb, y, "convs.1", f"{p}.convs.1", cin, cout, 1, gain=0.3)
    skip = x
    if stride == 2:
        skip = gb.op("MaxPool", skip, kernel_shape=[2, 2], strides=[2, 2])
    if cout > cin:
        pads = gb.const([0, 0, 0, 0, 0, cout - cin, 0, 0])
        skip = gb.op("Pad", skip, pads, gb.const(0.0), mode="constant")
    return _prelu(gb, gb.op("Add", y, skip), p, cout)


def build_blazepalm(*, image_size: int = 128, width: float = 1.0) -> onnx.ModelProto:
    """The detector at `image_size` (a multiple of 16) with channels scaled by `width`; output
    [batch, cells · ANCHORS, BOX_VALUES] over the last feature map's cells."""
    gb = GraphBuilder(seed=11)
    x = gb.input("input", FLOAT, ["batch_size", 3, image_size, image_size])
    stem = max(8, round(24 * width))
    with gb.scope("backbone"):
        x = _conv(gb, x, "stem", "backbone.stem", 3, stem, 5, stride=2)
        x = _prelu(gb, x, "backbone.stem", stem)
        cin = stem
        for i, (channels, stride) in enumerate(BLOCKS):
            cout = max(cin, round(channels * width))
            p = f"backbone.blocks.{i}"
            with gb.scope(p):
                x = _blaze_block(gb, x, p, cin, cout, stride)
            cin = cout
    with gb.scope("head"):
        x = _conv(gb, x, "regressor", "head.regressor", cin, ANCHORS * BOX_VALUES, 1)
        x = gb.op("Transpose", x, perm=[0, 2, 3, 1])
        gb.op("Reshape", x, gb.const([0, -1, BOX_VALUES]), out="detections")
    cells = (image_size // 16) ** 2
    gb.output("detections", FLOAT, ["batch_size", cells * ANCHORS, BOX_VALUES])
    return gb.model("blazepalm", f"BlazePalm-style detector, {image_size}x{image_size}, "
                                 f"width {width}")
